// Parallel and optimizer combinations the executor runs beyond plain ZeRO
// (issue #20): each against the unsharded reference (numerics), plan's
// buckets (bytes, exact) and fit (memory), with one figure worked by hand.
//
// Megatron's layer-wise optimizer (parallel.optimizer_sharding: layer_wise,
// megatron/core/optimizer/layer_wise_optimizer.py on its ping-pong path):
// DDP all-reduces every gradient buffer, each data-parallel rank keeps the
// state of and steps the whole tensors dealt to it, and allgather_params
// gathers every rank's updated tensors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_parallel_more_test {
namespace {

/// Llama 3 8B scaled (h 16, ffn 16, vocab 40 padded to 8 x tp, 2 layers a
/// stage), Muon with the layer-wise deal over dp ranks.
Recipe LayerWise(int64_t dp, std::vector<Override> more) {
  std::vector<Override> sets = {
      {"parallel.optimizer_sharding", "layer_wise"}, {"parallel.zero", "1"}, {"model.repeat", "4"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("llama3-8b-h200.yaml", sets, /*max_world=*/dp);
}

int64_t MeasuredOnStage(const SimulationReport& rep, int64_t stage, SimCategory c) {
  int64_t most = 0;
  for (const RankMeasurement& m : rep.per_rank) {
    if (m.pipeline_rank == stage) most = std::max(most, m.peak_bytes[static_cast<size_t>(c)]);
  }
  return most;
}

/// Qwen3-30B-A3B scaled on one stage with ep 2, its routing padded to
/// capacity so the MoE activations compare exactly.
Recipe PaddedQwen3(std::vector<Override> more, int64_t max_world) {
  std::vector<Override> sets = {{"parallel.pp", "1"},
                                {"parallel.ep", "2"},
                                {"model.moe.dropless", "false"},
                                {"model.moe.pad_to_capacity", "true"},
                                {"model.moe.capacity_factor", "1.0"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("qwen3-30b-a3b-h200.yaml", sets, max_world);
}

TEST(SimulatorLayerWise, OneStageOverFourRanksAgrees) {
  const Recipe r = LayerWise(4, {});
  ASSERT_EQ(r.dp(), 4);
  const SimulationReport rep = Simulate(r);
  const SimComparison c = testing_sim::ExpectStepAgrees(r, rep);
  const StageComparison& s = testing_sim::Stage(c, 0);
  // DDP's all-reduce of every gradient buffer, the dealt tensors' gather; no
  // reduce-scatter and no Muon momentum gather.
  EXPECT_NE(testing_sim::FindComm(s, Axis::kDpCp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kGrads), nullptr);
  EXPECT_EQ(testing_sim::FindComm(s, Axis::kDpCp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kGrads),
            nullptr);
  EXPECT_EQ(testing_sim::FindComm(s, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonGather),
            nullptr);
  const CommAgreement* gather =
      testing_sim::FindComm(s, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams);
  ASSERT_NE(gather, nullptr);

  // By hand (h 16, 32 heads and 8 KV heads of 4, ffn 16, V_pad 40, one A
  // and one D block, bf16 with fp32 master, d = 4): Megatron's tensors sorted
  // by size, Muon's first among equals: the 3 norms of 16 (AdamW),
  // linear_fc2 16 x 16 and linear_fc1 16 x 32 (Muon), the embedding and the
  // head 40 x 16 (AdamW), linear_proj 128 x 16 and linear_qkv 16 x 192
  // (Muon), dealt to members 0 1 2 3 3 2 1 0 0.
  std::vector<std::pair<int64_t, bool>> sorted = {{16, false},  {16, false},  {16, false},  {256, true}, {512, true},
                                                  {640, false}, {640, false}, {2048, true}, {3072, true}};
  const int64_t loop[] = {0, 1, 2, 3, 3, 2, 1, 0};
  int64_t adam[4] = {}, mu[4] = {};
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int64_t member = loop[i % 8];
    if (sorted[i].second) {
      mu[member] += sorted[i].first;
    } else {
      adam[member] += sorted[i].first;
    }
  }
  EXPECT_EQ(adam[0] + mu[0], 16 + 2048 + 3072);
  EXPECT_EQ(adam[1], 16 + 640);
  // Muon state: momentum + master, fp32 each; AdamW: m, v and master. The
  // heaviest member (0) is fit's; member 1 or 2 holds the most AdamW state.
  int64_t adam_most = 0;
  for (int k = 0; k < 4; ++k) adam_most = std::max(adam_most, adam[k]);
  EXPECT_EQ(MeasuredOnStage(rep, 0, SimCategory::kOptimizerMuon), mu[0] * 8);
  EXPECT_EQ(MeasuredOnStage(rep, 0, SimCategory::kOptimizerAdamW), adam_most * 12);
  EXPECT_EQ(testing_sim::FindMemory(s, "optimizer state (one rank's sum)").modeled, mu[0] * 8 + adam[0] * 12);
  // The gather: member k sends every chunk but member k+1's, 2 B each.
  int64_t total = 0, sent = 0;
  for (int k = 0; k < 4; ++k) total += adam[k] + mu[k];
  for (int k = 0; k < 4; ++k) sent = std::max(sent, (total - adam[(k + 1) % 4] - mu[(k + 1) % 4]) * 2);
  EXPECT_EQ(gather->measured_sent, sent);
}

TEST(SimulatorLayerWise, TensorAndPipelineParallelAgree) {
  // TP 2: only the rank a TP-sharded matrix is dealt to gathers it over TP
  // for Newton-Schulz; two stages deal their own tensors.
  const SimComparison c = testing_sim::ExpectStepAgrees(
      LayerWise(8, {{"parallel.tp", "2"}, {"parallel.sp", "true"}, {"parallel.pp", "2"}}));
  for (const StageComparison& s : c.stages) {
    const CommAgreement* tp =
        testing_sim::FindComm(s, Axis::kTp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonTpGather);
    ASSERT_NE(tp, nullptr) << "stage " << s.pipeline_rank;
    EXPECT_GT(tp->measured_sent, 0);
  }
}

TEST(SimulatorLayerWise, ExpertsAreDealtOverTheirGroupAndAgree) {
  // Qwen3 MoE scaled: expert tensors (one per local expert) over the
  // expert-data-parallel group, dense ones over d x c.
  const Recipe r = PaddedQwen3(
      {{"parallel.optimizer_sharding", "layer_wise"}, {"parallel.zero", "1"}, {"training.optimizer.matrices", "muon"}},
      /*max_world=*/4);
  testing_sim::ExpectStepAgrees(r);
}

TEST(SimulatorLayerWise, LayerNormWeightAndBiasAreDealtApart) {
  // Megatron's LayerNorm holds weight and bias as two tensors, each dealt on
  // its own. By hand as above, with the 3 norms now 6 tensors of 16 (AdamW):
  // sorted 16 x 6, 256 and 512 (Muon), 640 x 2, 2048 and 3072 (Muon), dealt
  // to members 0 1 2 3 3 2 1 0 0 1 2 3.
  const Recipe r = LayerWise(4, {{"model.norm", "layernorm"}});
  const SimulationReport rep = Simulate(r);
  const SimComparison c = testing_sim::ExpectStepAgrees(r, rep);
  const int64_t adam[4] = {16 + 640, 16 + 640, 16 + 16, 16 + 16};
  const int64_t mu[4] = {512, 256, 2048, 3072};
  // The heaviest member by state bytes (Muon 8 B, AdamW 12 B) is member 3.
  EXPECT_EQ(testing_sim::FindMemory(testing_sim::Stage(c, 0), "optimizer state (one rank's sum)").measured,
            mu[3] * 8 + adam[3] * 12);
  EXPECT_EQ(MeasuredOnStage(rep, 0, SimCategory::kOptimizerAdamW), adam[0] * 12);
  EXPECT_EQ(MeasuredOnStage(rep, 0, SimCategory::kOptimizerMuon), mu[3] * 8);
  // The gather: member k sends every chunk but member k+1's, 2 B each.
  int64_t total = 0, sent = 0;
  for (int k = 0; k < 4; ++k) total += adam[k] + mu[k];
  for (int k = 0; k < 4; ++k) sent = std::max(sent, (total - adam[(k + 1) % 4] - mu[(k + 1) % 4]) * 2);
  const CommAgreement* gather = testing_sim::FindComm(testing_sim::Stage(c, 0), Axis::kDpCp, Collective::kAllGather,
                                                      Pass::kOptimizer, CommWhat::kParams);
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->measured_sent, sent);
}

// HSDP (parallel.dp_replicate r): the ZeRO groups are one replica's, and
// every reduce-scatter is followed by an all-reduce of the share across the
// replicas (Megatron's inter-instance all-reduce, torchtitan's FSDP2 HSDP).
Recipe Hsdp(int64_t zero, std::vector<Override> more) {
  std::vector<Override> sets = {
      {"parallel.dp_replicate", "2"}, {"parallel.zero", std::to_string(zero)}, {"model.repeat", "4"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("llama3-8b-h200.yaml", sets, /*max_world=*/4);
}

TEST(SimulatorHsdp, ZeroOneTwoThreeAgree) {
  for (int64_t zero : {1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const Recipe r = Hsdp(zero, {});
    ASSERT_EQ(r.dp(), 4);
    const SimComparison c = testing_sim::ExpectStepAgrees(r);
    const StageComparison& s = testing_sim::Stage(c, 0);
    const Pass pass = zero == 1 ? Pass::kOptimizer : Pass::kBackward;
    const CommAgreement* rs = testing_sim::FindComm(s, Axis::kDpCp, Collective::kReduceScatter, pass, CommWhat::kGrads);
    const CommAgreement* ar =
        testing_sim::FindComm(s, Axis::kDpReplica, Collective::kAllReduce, pass, CommWhat::kReplicaGrads);
    ASSERT_NE(rs, nullptr);
    ASSERT_NE(ar, nullptr);
    // By hand: a buffer of P bytes reduce-scattered over D = 2 sends P/2;
    // its share P/2 all-reduced over r = 2 sends 2 (r-1)/r x P/2 = P/2.
    EXPECT_EQ(ar->measured_sent, rs->measured_sent);
    EXPECT_GT(ar->measured_sent, 0);
  }
}

TEST(SimulatorHsdp, ExpertsAndTheRouterBiasAgree) {
  // Qwen3 MoE scaled with DeepSeek's router bias: the expert shares and the
  // bias counts are summed across the replicas too.
  const Recipe r = PaddedQwen3({{"parallel.dp_replicate", "2"},
                                {"parallel.zero", "1"},
                                {"model.moe.router", "sigmoid"},
                                {"model.moe.router_bias", "true"}},
                               /*max_world=*/8);
  const SimComparison c = testing_sim::ExpectStepAgrees(r);
  const StageComparison& s = testing_sim::Stage(c, 0);
  EXPECT_NE(testing_sim::FindComm(s, Axis::kExpertDpReplica, Collective::kAllReduce, Pass::kOptimizer,
                                  CommWhat::kExpertReplicaGrads),
            nullptr);
  EXPECT_NE(testing_sim::FindComm(s, Axis::kDpReplica, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias),
            nullptr);
}

// One MTP module shared by every depth (model.mtp_shared_layer, Megatron's
// --mtp-use-repeated-layer): built once, applied D times, its gradients summed.
TEST(SimulatorMtpShared, TwoDepthsOfOneModuleAgree) {
  const Recipe r = testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                             {{"model.mtp_layers", "2"},
                                              {"model.mtp_shared_layer", "true"},
                                              {"parallel.pp", "2"},
                                              {"training.recompute", "none"}},
                                             /*max_world=*/4);
  const SimulationReport rep = Simulate(r);
  testing_sim::ExpectStepAgrees(r, rep);
  // By hand: one module's tensors (mtp.0.*), none of a second depth's.
  int64_t module_params = 0;
  for (const ErrorStat& g : rep.gradients) {
    EXPECT_EQ(g.name.rfind("mtp.1.", 0), std::string::npos) << g.name;
    if (g.name.rfind("mtp.0.", 0) == 0) ++module_params;
  }
  EXPECT_GT(module_params, 0);
}

// DualPipe under ZeRO 2/3: each copy of a stage reduce-scatters its
// gradients unit by unit; the mirror pair sums the owned shares at the step.
Recipe DualPipeZero(int64_t zero) {
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml",
                                   {{"parallel.schedule", "dualpipe"},
                                    {"parallel.pp", "2"},
                                    {"parallel.ep", "1"},
                                    {"parallel.zero", std::to_string(zero)},
                                    {"training.recompute", "none"},
                                    {"model.mtp_layers", "0"},
                                    {"model.moe.router_bias", "false"},
                                    {"model.moe.dropless", "false"},
                                    {"model.moe.pad_to_capacity", "true"},
                                    {"model.moe.capacity_factor", "1.0"}},
                                   /*max_world=*/4);
}

TEST(SimulatorDualPipeZero, ShardedCopiesSumTheirShares) {
  std::vector<int64_t> sent;
  int64_t group = 0;
  for (int64_t zero : {1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const Recipe r = DualPipeZero(zero);
    group = r.dp() * r.parallel.cp;
    const SimComparison c = testing_sim::ExpectStepAgrees(r);
    const CommAgreement* a = testing_sim::FindComm(testing_sim::Stage(c, 0), Axis::kPpMirror, Collective::kAllReduce,
                                                   Pass::kOptimizer, CommWhat::kDualPipeCopyGrads);
    ASSERT_NE(a, nullptr);
    sent.push_back(a->measured_sent);
  }
  // By hand: ZeRO 1 sums the full padded buffers, ZeRO 2/3 the rank's 1/D
  // share of the same buffers (ep 1: the dense and the expert groups are
  // both the d = 2 ranks).
  ASSERT_EQ(group, 2);
  EXPECT_EQ(sent[0], group * sent[1]);
  EXPECT_EQ(sent[1], sent[2]);
}

}  // namespace
}  // namespace preflight::simulator_parallel_more_test

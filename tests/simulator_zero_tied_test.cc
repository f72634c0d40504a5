// A tied embedding's (or MTP's) two copies on the first and last pipeline
// stage under ZeRO 2 and 3 (simulator/dist_optimizer.h): each copy is a
// buffer of its own, reduce-scattered in every micro-batch's backward with
// its unit, and the embedding group sums the two stages' shares once per
// step, as Megatron FSDP does (finalize_model_grads.py
// _allreduce_embedding_grad on main_grad._local_tensor). Checked against the
// unsharded reference (gradients and updates, fp64), the ZeRO 1 run's loss,
// the planner's and the estimator's rows, and bytes worked by hand. One rank
// holding both ends (pp 1, DualPipe(V)'s end ranks): the head reads the
// rank's own embedding, whose unsharded gradient stays live from the head's
// backward to the embedding's and, under ZeRO 3, whose unit the head gathers
// (simulate.cc GatherLookup); the router's expert bias stays whole.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_zero_tied_test {
namespace {

using testing_sim::ExpectStepAgrees;
using testing_sim::FindComm;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

/// The default recipe as "AD" with tied embeddings over pp 2 at `zero`:
/// stage 0 the embedding and A, stage 1 D and the head's copy; dp 2 with
/// tp 2 and SP (8 ranks), or dp 3 with tp 1 (3 nodes of 2).
Recipe TiedTwoStages(int zero, int dp) {
  return ScaledDefault({{"model.pattern", "AD"},
                        {"model.tie_embeddings", "true"},
                        {"parallel.pp", "2"},
                        {"parallel.tp", dp == 2 ? "2" : "1"},
                        {"parallel.sp", dp == 2 ? "true" : "false"},
                        {"parallel.ep", "1"},
                        {"cluster.nodes", dp == 2 ? "1" : "3"},
                        {"cluster.gpus_per_node", dp == 2 ? "8" : "2"},
                        {"training.global_batch", dp == 2 ? "8" : "12"},
                        {"parallel.zero", std::to_string(zero)}},
                       /*max_world=*/8);
}

/// Sent bytes of one bucket on a stage (0 when absent).
int64_t Sent(const StageComparison& s, Axis axis, Collective kind, Pass pass, CommWhat what) {
  const CommAgreement* a = FindComm(s, axis, kind, pass, what);
  return a == nullptr ? 0 : a->measured_sent;
}

int64_t TiedSent(const StageComparison& s) {
  return Sent(s, Axis::kEmbedding, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kTiedEmbedding);
}

TEST(SimulatorZeroTied, ZeroTwoAndThreeSumTheShares) {
  // tp 2, dp 2: vocab 40 padded to 8 x 2 = 48, 24 rows of h 16 = 384
  // elements per rank. ZeRO 1 all-reduces them whole (fp32: 1536 B, a 2-rank
  // ring sends (2-1)/2 x 2 = 1 x the bytes); ZeRO 2/3 the rank's share of
  // the copy's own buffer, 384 / 2 = 192 elements = 768 B, on both stages.
  const SimulationReport one = Simulate(TiedTwoStages(1, 2));
  for (int zero : {1, 2, 3}) {
    const Recipe r = TiedTwoStages(zero, 2);
    ASSERT_EQ(r.world(), 8);
    ASSERT_EQ(r.dp(), 2);
    const SimulationReport rep = Simulate(r);
    const SimComparison c = ExpectStepAgrees(r, rep);
    EXPECT_DOUBLE_EQ(rep.loss_sharded, one.loss_sharded) << "zero " << zero;
    for (int64_t stage : {0, 1}) {
      EXPECT_EQ(TiedSent(Stage(c, stage)), zero == 1 ? 1536 : 768) << "zero " << zero << " stage " << stage;
    }
  }
}

int64_t GradsScattered(const StageComparison& s) {
  return Sent(s, Axis::kDpCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kGrads);
}

TEST(SimulatorZeroTied, TheCopyIsABufferOfItsOwn) {
  // tp 1, dp 3: the copy is 40 x 16 = 640 elements, padded alone to 642
  // (a share of 214), the final norm's 16 to 18. The group sums the share:
  // 214 x 4 B = 856 B. Untied, the head's 640 share the norm's buffer and
  // pad with it to 657: stage 1's reduce-scatter (3 ranks send 2/3 of each
  // padded buffer, fp32) moves 2/3 x (660 - 657) x 4 = 8 B less in each of
  // its 4 micro-batches.
  const Recipe r = TiedTwoStages(2, 3);
  ASSERT_EQ(r.dp(), 3);
  ASSERT_EQ(r.world(), 6);
  ASSERT_EQ(r.training.global_batch / r.training.micro_batch / r.dp(), 4);
  const SimComparison c = ExpectStepAgrees(r);
  for (int64_t stage : {0, 1}) EXPECT_EQ(TiedSent(Stage(c, stage)), 856) << "stage " << stage;
  Recipe untied = r;
  untied.model.tie_embeddings = false;
  const SimComparison u = ExpectStepAgrees(untied);
  EXPECT_EQ(GradsScattered(Stage(c, 1)) - GradsScattered(Stage(u, 1)), 4 * 8);
  EXPECT_EQ(GradsScattered(Stage(c, 0)), GradsScattered(Stage(u, 0)));
}

TEST(SimulatorZeroTied, MtpCopyAtZeroTwoAndThree) {
  // Llama 3 8B scaled with one MTP module over pp 2: the last stage's
  // embedding copy (MTP embeds the shifted ids), untied from the head.
  for (int zero : {2, 3}) {
    const Recipe r = testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                               {{"model.mtp_layers", "1"},
                                                {"training.recompute", "none"},
                                                {"parallel.tp", "2"},
                                                {"parallel.sp", "true"},
                                                {"parallel.pp", "2"},
                                                {"parallel.zero", std::to_string(zero)}},
                                               /*max_world=*/8);
    ASSERT_EQ(r.model.mtp_layers, 1);
    const SimComparison c = ExpectStepAgrees(r);
    for (int64_t stage : {0, 1}) EXPECT_GT(TiedSent(Stage(c, stage)), 0) << "zero " << zero;
  }
}

/// The default recipe as one MLP layer "D" with tied embeddings on one rank
/// (pp 1, tp 1, dp 1) at `zero`: h 16, ffn 16, vocab 40.
Recipe TiedOneRank(int zero, bool tied = true) {
  return ScaledDefault({{"model.pattern", "D"},
                        {"model.tie_embeddings", tied ? "true" : "false"},
                        {"parallel.pp", "1"},
                        {"parallel.tp", "1"},
                        {"parallel.sp", "false"},
                        {"parallel.ep", "1"},
                        {"parallel.zero", std::to_string(zero)}},
                       /*max_world=*/1);
}

int64_t Measured(const SimComparison& c, const std::string& row) {
  return testing_sim::FindMemory(Stage(c, 0), row).measured;
}

int64_t ParamBytes(const SimComparison& c) {
  return Measured(c, "replicated_params") + Measured(c, "tp_sharded_params") + Measured(c, "ep_sharded_params");
}

TEST(SimulatorZeroTied, OneRankHoldsTheEmbeddingGradientAcrossTheBackward) {
  // Units at dp 1 (a share is the whole buffer): the embedding 40 x 16 =
  // 640 elements, the layer D 784 (fc1 16 x 32, fc2 16 x 16, its norm 16),
  // the head's unit the final norm's 16 (the head reads the embedding).
  // ZeRO 1 keeps the full fp32 gradients; ZeRO 2 the same shares plus, from
  // the head's backward to the embedding's, the embedding's 640 unsharded
  // beside the unit running its backward, the largest D: (640 + 784) x 4 B.
  // Untied the embedding is just the largest unit but one: max(640, 784,
  // 640 + 16) x 4.
  const SimComparison one = ExpectStepAgrees(TiedOneRank(1));
  const SimComparison two = ExpectStepAgrees(TiedOneRank(2));
  ASSERT_EQ(TiedOneRank(2).world(), 1);
  EXPECT_EQ(Measured(two, "gradients") - Measured(one, "gradients"), (640 + 784) * 4);
  const SimComparison one_untied = ExpectStepAgrees(TiedOneRank(1, false));
  const SimComparison two_untied = ExpectStepAgrees(TiedOneRank(2, false));
  EXPECT_EQ(Measured(two_untied, "gradients") - Measured(one_untied, "gradients"), 784 * 4);
}

TEST(SimulatorZeroTied, OneRankGathersTheEmbeddingForTheHead) {
  // ZeRO 3 at dp 1: the shares are every bf16 parameter, as ZeRO 1 keeps
  // them; the gathered units peak in the head's backward: the head's 16, the
  // prefetched D's 784 and the embedding's 640 it reads, x 2 B (the
  // embedding's forward with D prefetched holds 640 + 784 only).
  const SimComparison one = ExpectStepAgrees(TiedOneRank(1));
  const SimComparison three = ExpectStepAgrees(TiedOneRank(3));
  EXPECT_EQ(ParamBytes(three) - ParamBytes(one), (16 + 784 + 640) * 2);
}

TEST(SimulatorZeroTied, OneRankAtTwoDataParallelRanksAgrees) {
  // dp 2, tp 2 with SP on one stage: the reduce-scatters and, under ZeRO 3,
  // the embedding's extra gathers (forward and backward of every
  // micro-batch) against plan; Mamba-2 and MTP read the same rank's embedding.
  for (int zero : {2, 3}) {
    ExpectStepAgrees(testing_sim::OneStage(
        {{"model.pattern", "AD"}, {"model.tie_embeddings", "true"}, {"parallel.zero", std::to_string(zero)}}));
    ExpectStepAgrees(testing_sim::ScaledRecipe("mamba2-2.7b-h200.yaml", {{"parallel.zero", std::to_string(zero)}},
                                               /*max_world=*/8));
    ExpectStepAgrees(testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                               {{"model.mtp_layers", "1"},
                                                {"training.recompute", "none"},
                                                {"parallel.pp", "1"},
                                                {"parallel.zero", std::to_string(zero)}},
                                               /*max_world=*/4));
  }
}

/// The scaled DeepSeek-V3 recipe on `schedule` over pp 2 (ranks 0 and 1 both
/// hold the embedding and the head), every layer MoE: MTP reads the rank's
/// embedding, tied or not.
Recipe DeepSeekBothEnds(const std::string& schedule, int zero, bool tied, bool router_bias = true) {
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml",
                                   {{"parallel.schedule", schedule},
                                    {"parallel.pp", "2"},
                                    {"parallel.ep", "2"},
                                    {"training.recompute", "none"},
                                    {"model.moe.first_k_dense", "0"},
                                    {"model.tie_embeddings", tied ? "true" : "false"},
                                    {"model.moe.router_bias", router_bias ? "true" : "false"},
                                    {"model.moe.dropless", "false"},
                                    {"model.moe.pad_to_capacity", "true"},
                                    {"model.moe.capacity_factor", "1.0"},
                                    {"parallel.zero", std::to_string(zero)}},
                                   /*max_world=*/4);
}

TEST(SimulatorZeroTied, DualPipeEndRanksAgree) {
  for (const char* schedule : {"dualpipe", "dualpipev"}) {
    for (int zero : {2, 3}) {
      for (bool tied : {false, true}) {
        SCOPED_TRACE(std::string(schedule) + " zero " + std::to_string(zero) + (tied ? " tied" : " MTP"));
        const Recipe r = DeepSeekBothEnds(schedule, zero, tied);
        ASSERT_EQ(r.model.mtp_layers, 1);
        const SimComparison c = ExpectStepAgrees(r);
        // No last-stage copy: nothing goes over the embedding group.
        for (const StageComparison& s : c.stages) EXPECT_EQ(TiedSent(s), 0);
      }
    }
  }
}

TEST(SimulatorZeroTied, RouterBiasStaysWholeUnderZeroThree) {
  // The expert bias is an fp32 buffer of E experts per MoE layer (and MTP
  // module), not a parameter: no share, no gather. Each DualPipe rank holds
  // every layer (its stage and the mirror's copy), so switching the bias on
  // adds experts x 4 B per MoE layer and module to its parameters, whole.
  const Recipe with = DeepSeekBothEnds("dualpipe", 3, false, true);
  const SimComparison a = ExpectStepAgrees(with);
  const SimComparison b = ExpectStepAgrees(DeepSeekBothEnds("dualpipe", 3, false, false));
  int64_t moe = 0;
  for (BlockKind k : with.model.layers) moe += k == BlockKind::kMoe ? 1 : 0;
  moe += with.model.mtp_layers;  // the MTP module's FFN is the last layer's kind (MoE)
  ASSERT_GT(moe, 0);
  const int64_t bias = moe * with.model.moe.experts * 4;
  EXPECT_EQ(ParamBytes(a) - ParamBytes(b), bias);
}

TEST(SimulatorZeroTied, FsdpCpuOffloadOverTiedStagesIsRefused) {
  // FSDP2's CPU offload keeps the shares on the host; Megatron's FSDP2 path
  // wants untied embeddings without a pipeline.
  Recipe offload = TiedTwoStages(3, 2);
  offload.parallel.fsdp_cpu_offload = true;
  offload.training.optimizer.matrices = OptimizerKind::kAdamW;
  EXPECT_THROW(Simulate(offload), SimUnsupported);
}

}  // namespace
}  // namespace preflight::simulator_zero_tied_test

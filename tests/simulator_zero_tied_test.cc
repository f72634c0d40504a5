// A tied embedding's (or MTP's) two copies on the first and last pipeline
// stage under ZeRO 2 and 3 (simulator/dist_optimizer.h): each copy is a
// buffer of its own, reduce-scattered in every micro-batch's backward with
// its unit, and the embedding group sums the two stages' shares once per
// step, as Megatron FSDP does (finalize_model_grads.py
// _allreduce_embedding_grad on main_grad._local_tensor). Checked against the
// unsharded reference (gradients and updates, fp64), the ZeRO 1 run's loss,
// the planner's and the estimator's rows, and bytes worked by hand. The
// router's expert bias stays whole under ZeRO 3; DualPipeV keeps no copy.
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

int64_t ParamBytes(const SimComparison& c) {
  const StageComparison& s = Stage(c, 0);
  return testing_sim::FindMemory(s, "replicated_params").measured +
         testing_sim::FindMemory(s, "tp_sharded_params").measured +
         testing_sim::FindMemory(s, "ep_sharded_params").measured;
}

/// The scaled DeepSeek-V3 recipe, every layer MoE, without MTP.
Recipe DeepSeek(const std::string& schedule, int64_t pp, int zero, bool tied, bool router_bias = true) {
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml",
                                   {{"parallel.schedule", schedule},
                                    {"parallel.pp", std::to_string(pp)},
                                    {"parallel.ep", "2"},
                                    {"training.recompute", "none"},
                                    {"model.mtp_layers", "0"},
                                    {"model.moe.first_k_dense", "0"},
                                    {"model.tie_embeddings", tied ? "true" : "false"},
                                    {"model.moe.router_bias", router_bias ? "true" : "false"},
                                    {"model.moe.dropless", "false"},
                                    {"model.moe.pad_to_capacity", "true"},
                                    {"model.moe.capacity_factor", "1.0"},
                                    {"parallel.zero", std::to_string(zero)}},
                                   /*max_world=*/4);
}

TEST(SimulatorZeroTied, DualPipeVKeepsNoCopy) {
  // DualPipeV's rank 0 holds the first and the last chunk: the tied head
  // reads its own embedding, nothing goes over the embedding group.
  for (int zero : {0, 1}) {
    const SimComparison c = ExpectStepAgrees(DeepSeek("dualpipev", 2, zero, true));
    for (const StageComparison& s : c.stages) EXPECT_EQ(TiedSent(s), 0) << "zero " << zero;
  }
}

TEST(SimulatorZeroTied, RouterBiasStaysWholeUnderZeroThree) {
  // The expert bias is an fp32 buffer of E experts per MoE layer, not a
  // parameter: no share, no gather. On one stage the rank holds every
  // layer, so switching the bias on adds experts x 4 B per MoE layer, whole.
  const Recipe with = DeepSeek("1f1b", 1, 3, false, true);
  const SimComparison a = ExpectStepAgrees(with);
  const SimComparison b = ExpectStepAgrees(DeepSeek("1f1b", 1, 3, false, false));
  int64_t moe = 0;
  for (BlockKind k : with.model.layers) moe += k == BlockKind::kMoe ? 1 : 0;
  ASSERT_GT(moe, 0);
  EXPECT_EQ(ParamBytes(a) - ParamBytes(b), moe * with.model.moe.experts * 4);
}

TEST(SimulatorZeroTied, OneRankHoldingBothEndsIsRefused) {
  // pp 1 or DualPipe(V)'s end ranks: the head reads the same rank's
  // embedding, whose gradient would stay live across the backward (and,
  // under ZeRO 3, need its unit gathered for the head), which fit does not price.
  for (int zero : {2, 3}) {
    Recipe r = testing_sim::OneStage({{"model.pattern", "AD"}, {"model.tie_embeddings", "true"}});
    r.parallel.zero = zero;
    EXPECT_THROW(Simulate(r), SimUnsupported) << "zero " << zero;
    EXPECT_THROW(Simulate(DeepSeek("dualpipev", 2, zero, true)), SimUnsupported) << "zero " << zero;
  }
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

// A tied embedding's (or MTP's) two copies on the first and last pipeline
// stage under ZeRO 2 and 3 (simulator/dist_optimizer.h): each copy is a
// buffer of its own, reduce-scattered in every micro-batch's backward with
// its unit, and the embedding group sums the two stages' shares once per
// step, as Megatron FSDP does (finalize_model_grads.py
// _allreduce_embedding_grad on main_grad._local_tensor). Checked against the
// unsharded reference (gradients and updates, fp64), the ZeRO 1 run's loss,
// the planner's and the estimator's rows, and bytes worked by hand.
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
/// stage 0 the embedding and A, stage 1 D and the head's copy.
Recipe TiedTwoStages(int zero, const std::string& tp, const std::string& dp) {
  return ScaledDefault({{"model.pattern", "AD"},
                        {"model.tie_embeddings", "true"},
                        {"parallel.pp", "2"},
                        {"parallel.tp", tp},
                        {"parallel.sp", tp == "1" ? "false" : "true"},
                        {"parallel.ep", "1"},
                        {"cluster.nodes", "1"},
                        {"cluster.gpus_per_node", "8"},
                        {"training.global_batch", dp == "2" ? "8" : "12"},
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
  const SimulationReport one = Simulate(TiedTwoStages(1, "2", "2"));
  for (int zero : {1, 2, 3}) {
    const Recipe r = TiedTwoStages(zero, "2", "2");
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

TEST(SimulatorZeroTied, TheCopyIsABufferOfItsOwn) {
  // tp 1, dp 3: the copy is 40 x 16 = 640 elements, padded alone to 642
  // (a share of 214), the final norm's 16 to 18. In one buffer they would
  // pad to 657. The group sums the share: 214 x 4 B = 856 B.
  // Stage 1's reduce-scatter in each of its 6 micro-batches (3 ranks send
  // 2/3 of each padded buffer, fp32): D's norm (16 -> 18) and its Muon
  // matrices (2 x 16 x 16 + 16 x 16 = 768), the final norm (18) and the
  // copy (642): 2/3 x 1446 x 4 = 3856 B, x 6 = 23136 B.
  const Recipe r = TiedTwoStages(2, "1", "3");
  ASSERT_EQ(r.dp(), 3);
  ASSERT_EQ(r.world(), 6);
  const SimComparison c = ExpectStepAgrees(r);
  for (int64_t stage : {0, 1}) EXPECT_EQ(TiedSent(Stage(c, stage)), 856) << "stage " << stage;
  EXPECT_EQ(Sent(Stage(c, 1), Axis::kDpCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kGrads),
            3856 * r.training.global_batch / r.training.micro_batch / r.dp());
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

}  // namespace
}  // namespace preflight::simulator_zero_tied_test

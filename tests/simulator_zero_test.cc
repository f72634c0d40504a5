// ZeRO 2 and 3 through the executor (simulator/dist_optimizer.h), compared
// with the planner's and the estimator's figures for the same scaled recipe,
// which must agree exactly: the per-micro-batch gradient reduce-scatters of
// every unit (and, with SP, the all-reduce of its replicated gradients over
// TP), ZeRO 3's parameter gathers before each unit's forward and backward,
// the owned gradient shares plus one unit's unsharded gradients, and ZeRO 3's
// parameter shares plus the adjacent units gathered at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_zero_test {
namespace {

using testing_sim::Disagreements;
using testing_sim::FindComm;
using testing_sim::FindMemory;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

/// tp 2 with SP, pp 2, dp `dp` (2: one node of 8; 3: three nodes of 4); ep 2
/// so the expert-data group d_e = t d / e = dp. One layer of each of A, E
/// (padded capacity: exact EP bytes), M (Mamba's A_log and D are fp32: their
/// own buffers) and D; 4 micro-batches. With dp 3 most buffers do not divide
/// by D = 3 (a norm of hidden 16) and are padded.
std::vector<Override> SmallHybrid(int zero, int dp = 2) {
  return {{"model.pattern", "AEMD"},
          {"model.moe.pad_to_capacity", "true"},
          {"cluster.nodes", dp == 2 ? "1" : "3"},
          {"cluster.gpus_per_node", dp == 2 ? "8" : "4"},
          {"parallel.tp", "2"},
          {"parallel.sp", "true"},
          {"parallel.pp", "2"},
          {"parallel.ep", "2"},
          {"training.global_batch", dp == 2 ? "8" : "12"},
          {"parallel.zero", std::to_string(zero)}};
}

/// Runs `r` and checks the comparison: numerics, every exact bucket and row.
SimComparison ExpectAgreement(const Recipe& r) { return testing_sim::ExpectStepAgrees(r); }

/// The bucket exists, is exact and agrees (bytes > 0).
void ExpectExactBucket(const StageComparison& s, Axis axis, Collective kind, Pass pass, CommWhat what) {
  const CommAgreement* a = FindComm(s, axis, kind, pass, what);
  ASSERT_NE(a, nullptr) << Key(axis) << " " << Key(kind) << " " << Key(pass) << " " << Key(what);
  EXPECT_TRUE(a->exact);
  EXPECT_GT(a->measured_sent, 0);
  EXPECT_EQ(a->measured_sent, a->modeled_sent) << "stage " << s.pipeline_rank << " " << Key(what);
}

void ExpectNoBucket(const StageComparison& s, Axis axis, Collective kind, Pass pass, CommWhat what) {
  const CommAgreement* a = FindComm(s, axis, kind, pass, what);
  EXPECT_TRUE(a == nullptr || (a->measured_sent == 0 && a->modeled_sent == 0)) << Key(pass) << " " << Key(what);
}

/// The stage holding the MoE layer (the partitioner balances time: stage 0
/// is the embedding and A, stage 1 E, M, D and the head).
const StageComparison& ExpertStage(const SimComparison& c) {
  for (const StageComparison& s : c.stages) {
    const CommAgreement* a =
        FindComm(s, Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonExpertGather);
    if (a != nullptr && a->measured_sent > 0) return s;
  }
  ADD_FAILURE() << "no stage with expert buffers";
  return c.stages.front();
}

TEST(SimulatorZero, SmallHybridPremise) {
  const Recipe r = ScaledDefault(SmallHybrid(2));
  EXPECT_EQ(r.dp(), 2);
  EXPECT_EQ(r.parallel.pp, 2);
  // Expert buffers (d_e = 2) and fp32 buffers (Mamba's A_log and D) exist.
  const Inventory inv = BuildInventory(r);
  int64_t expert = 0, fp32 = 0;
  for (const Layer& l : inv.layers) {
    expert += l.totals.of(ShardClass::kEpSharded);
    for (const auto& by_opt : l.totals.fp32_elements) fp32 += by_opt[0] + by_opt[1];
  }
  EXPECT_GT(expert, 0);
  EXPECT_GT(fp32, 0);
}

TEST(SimulatorZero, ZeroTwoSmallHybrid) {
  const SimComparison c = ExpectAgreement(ScaledDefault(SmallHybrid(2)));
  for (int64_t s = 0; s < 2; ++s) {
    const StageComparison& st = Stage(c, s);
    // Reduce-scattered unit by unit in every micro-batch's backward.
    ExpectExactBucket(st, Axis::kDpCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kGrads);
    ExpectExactBucket(st, Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kReplicatedGrads);
    ExpectNoBucket(st, Axis::kDpCp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kGrads);
    // Parameters gathered once, after the step.
    ExpectExactBucket(st, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams);
    EXPECT_EQ(FindMemory(st, "gradients").measured, FindMemory(st, "gradients").modeled);
  }
  ExpectExactBucket(ExpertStage(c), Axis::kExpertDp, Collective::kReduceScatter, Pass::kBackward,
                    CommWhat::kExpertGrads);
}

// A bf16 gradient buffer under ZeRO 0 and 1: the step's fp32 copies of each
// rank's gradient share (Megatron's model_grad.float()) are a temporary of the
// step, in no compared category, so both still agree.
TEST(SimulatorZero, Bf16GradientsAgreeAtZeroZeroAndOne) {
  for (int zero : {0, 1}) {
    std::vector<Override> o = SmallHybrid(zero);
    o.push_back({"training.precision.grads", "bf16"});
    ExpectAgreement(ScaledDefault(o));
  }
}

TEST(SimulatorZero, ZeroTwoOddBuffers) {
  const Recipe r = ScaledDefault(SmallHybrid(2, 3));
  ASSERT_EQ(r.dp(), 3);
  ASSERT_EQ(r.expert_dp(), 3);
  ASSERT_NE(r.model.hidden % 3, 0);
  ExpectAgreement(r);
}

TEST(SimulatorZero, ZeroThreeOddBuffers) {
  const Recipe r = ScaledDefault(SmallHybrid(3, 3));
  ASSERT_EQ(r.dp(), 3);
  ExpectAgreement(r);
}

TEST(SimulatorZero, ZeroThreeSmallHybrid) {
  const SimComparison c = ExpectAgreement(ScaledDefault(SmallHybrid(3)));
  for (int64_t s = 0; s < 2; ++s) {
    const StageComparison& st = Stage(c, s);
    ExpectExactBucket(st, Axis::kDpCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kGrads);
    // Gathered before each unit's forward and again before its backward.
    ExpectExactBucket(st, Axis::kDpCp, Collective::kAllGather, Pass::kForward, CommWhat::kParams);
    ExpectExactBucket(st, Axis::kDpCp, Collective::kAllGather, Pass::kBackward, CommWhat::kParams);
    ExpectNoBucket(st, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams);
    const MemoryAgreement& params = FindMemory(st, "params (sum of classes)");
    EXPECT_GT(params.measured, 0);
    EXPECT_EQ(params.measured, params.modeled);
  }
  ExpectExactBucket(ExpertStage(c), Axis::kExpertDp, Collective::kAllGather, Pass::kForward, CommWhat::kExpertParams);
  ExpectExactBucket(ExpertStage(c), Axis::kExpertDp, Collective::kAllGather, Pass::kBackward, CommWhat::kExpertParams);
}

/// The default recipe scaled as ScaledDefault does (tp 4 with SP, pp 4, dp 4,
/// ep 8, Muon; every family, MoE expert buffers over d_e = 2, Mamba's fp32
/// buffers), with 4 micro-batches instead of 2 x pp to keep the test fast.
Recipe DefaultRecipe(int zero) {
  return ScaledDefault({{"parallel.zero", std::to_string(zero)}}, /*max_world=*/64, /*microbatches=*/4);
}

// The default recipe (64 ranks) at ZeRO 2 and 3: every row exact. The
// blocks build full parameters and gradients, which the optimizer shards at
// once; the executor's peaks start after that (as DeepSpeed's zero.Init and
// FSDP's meta-device initialisation never hold the full copies).
TEST(SimulatorZero, ZeroTwoDefaultRecipe) {
  const Recipe r = DefaultRecipe(2);
  EXPECT_EQ(r.dp(), 4);
  ExpectAgreement(r);
}

TEST(SimulatorZero, ZeroThreeDefaultRecipe) {
  const Recipe r = DefaultRecipe(3);
  EXPECT_EQ(r.dp(), 4);
  ExpectAgreement(r);
}
}  // namespace
}  // namespace preflight::simulator_zero_test

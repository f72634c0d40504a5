// Micro-batches in flight per pipeline rank against hand-worked schedules
// (MATH.md 4.1; Megatron schedules.py get_pp_rank_microbatches), and their
// effect on a rank's activations.
#include <cstdint>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"
#include "preflight/memory_terms.h"

namespace preflight {
namespace {

TEST(InFlight, OneFOneB) {
  // p 4, m 8: rank r warms up p - r - 1 forwards, then holds one more: 4, 3, 2, 1.
  EXPECT_EQ(OneFOneBInFlight(4, 8, 0), 4);
  EXPECT_EQ(OneFOneBInFlight(4, 8, 1), 3);
  EXPECT_EQ(OneFOneBInFlight(4, 8, 2), 2);
  EXPECT_EQ(OneFOneBInFlight(4, 8, 3), 1);
  // m 2 < p: never more than the micro-batches there are.
  EXPECT_EQ(OneFOneBInFlight(4, 2, 0), 2);
}

TEST(InFlight, InterleavedRankZero) {
  // p 4, v 2, m 8, group g = p = 4: warmup 2(p-1) + (v-1)p = 6 + 4 = 10 forwards,
  // the 11th runs before the first backward: 11 live chunk-micro-batches.
  EXPECT_EQ(InterleavedWarmup(4, 2, 8, 0, 4), 10);
  EXPECT_EQ(InterleavedLive(4, 2, 8, 0, 4), 11);
  // Megatron's table order: mb 0-3 on chunk 0, mb 0-3 on chunk 1, mb 4-7 on
  // chunk 0, ...; the first 11 units are 4 + 3 = 7 on chunk 0 and 4 on chunk 1.
  EXPECT_EQ(InterleavedChunkLive(4, 2, 8, 0, 4, 0), 7);
  EXPECT_EQ(InterleavedChunkLive(4, 2, 8, 0, 4, 1), 4);
}

TEST(InFlight, InterleavedLastRankAndShortRuns) {
  // Rank 3 of 4: warmup 0 + (v-1)p = 4, live 5: mb 0-3 on chunk 0, mb 0 on chunk 1.
  EXPECT_EQ(InterleavedLive(4, 2, 8, 3, 4), 5);
  EXPECT_EQ(InterleavedChunkLive(4, 2, 8, 3, 4, 0), 4);
  EXPECT_EQ(InterleavedChunkLive(4, 2, 8, 3, 4, 1), 1);
  // m = p = 4: warmup min(10, m*v = 8) = 8, all warmup: every unit live, 4 per chunk.
  EXPECT_EQ(InterleavedLive(4, 2, 4, 0, 4), 8);
  EXPECT_EQ(InterleavedChunkLive(4, 2, 4, 0, 4, 0), 4);
  EXPECT_EQ(InterleavedChunkLive(4, 2, 4, 0, 4, 1), 4);
  // m 6, g 4 (a partial last group of 2): p 4, v 2, rank 0 keeps min(12, 11) = 11
  // units: mb 0-3 chunk 0, mb 0-3 chunk 1, then the group {4, 5}: chunk 0, chunk 1 (1 of 2).
  EXPECT_EQ(InterleavedChunkLive(4, 2, 6, 0, 4, 0), 6);
  EXPECT_EQ(InterleavedChunkLive(4, 2, 6, 0, 4, 1), 5);
}

TEST(InFlight, DualPipe) {
  // DeepSeek-V3 / DualPipe README: p + 1 stage-micro-batches per device.
  EXPECT_EQ(DualPipeInFlight(8, 20), 9);
}

/// 8 identical D layers on p 4 ranks, 2 per rank; only activations matter here.
Inventory DenseStack(int64_t layers) {
  Recipe r = testing::SmallRecipe();
  Inventory inv = testing::HybridInventory(r, "D", layers);
  return inv;
}

TEST(InFlight, StageActivationsFollowTheSchedule) {
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);  // dp 2, m = 64 / 2 = 32
  const StagePlan plan = EqualStagePlan(8, 4, 1);
  const Bytes per_layer = LayerActivations(inv.recipe, l, BlockKind::kDenseMlp);
  for (int64_t r = 0; r < 4; ++r) {
    const RankMemory m = EstimateRank(inv, l, plan, r);
    EXPECT_EQ(m.in_flight_microbatches, 4 - r);
    // 2 layers x (4 - r) micro-batches.
    EXPECT_EQ(m.activations_by_family[4], per_layer * (2 * (4 - r)));
  }
}

TEST(InFlight, InterleavedStageActivations) {
  // p 4, v 2: rank 0 holds chunks 0 and 4 (1 layer each); 7 + 4 = 11 layer-micro-batches.
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  l.vpp = 2;
  l.schedule = Schedule::kInterleaved;
  l.micro_batches = 8;
  const RankMemory m = EstimateRank(inv, l, EqualStagePlan(8, 4, 2), 0);
  EXPECT_EQ(m.in_flight_microbatches, 11);
  EXPECT_EQ(m.activations_by_family[4], LayerActivations(inv.recipe, l, BlockKind::kDenseMlp) * 11);
}

TEST(InFlight, DualPipeDoublesParams) {
  // DualPipe: rank r holds stages r and p-1-r, so twice the 1F1B parameters.
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  const StagePlan plan = EqualStagePlan(8, 4, 1);
  const Bytes one = EstimateRank(inv, l, plan, 1).of(Category::kTpShardedParams);
  l.schedule = Schedule::kDualPipe;
  const RankMemory dual = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(dual.of(Category::kTpShardedParams), one * 2);
  EXPECT_EQ(dual.in_flight_microbatches, 5);
  // 5 stage-micro-batches: 3 on its own stage, 2 on the mirror, 2 layers each.
  EXPECT_EQ(dual.activations_by_family[4], LayerActivations(inv.recipe, l, BlockKind::kDenseMlp) * 10);
}

TEST(InFlight, DualPipeVKeepsOneCopy) {
  // DualPipeV: 2p V-stages on p ranks, no duplicated params; 2p+1 = 9
  // V-stage-micro-batches per rank: the down stage (first of its 2 layers)
  // holds p+1 = 5, the up stage (second layer) p = 4.
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  const StagePlan plan = EqualStagePlan(8, 4, 1);
  const Bytes one = EstimateRank(inv, l, plan, 1).of(Category::kTpShardedParams);
  l.schedule = Schedule::kDualPipeV;
  const RankMemory v = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(v.of(Category::kTpShardedParams), one);
  EXPECT_EQ(v.in_flight_microbatches, 5);
  EXPECT_EQ(v.activations_by_family[4], LayerActivations(inv.recipe, l, BlockKind::kDenseMlp) * 9);
}

}  // namespace
}  // namespace preflight

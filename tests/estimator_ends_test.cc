// Pipeline-end parameters and activations (docs/formulas.md §1.1, 3.4), sharding of
// dense vs expert state over their own data-parallel groups (docs/formulas.md §2.2),
// and the verdict. Expected values are hand counts in the comments.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"
#include "preflight/estimator/memory_terms.h"

namespace preflight::estimator_ends_test {
namespace {

/// Two D layers with 1000 REP (AdamW) + 4000 TP (Muon) elements each, and the
/// recipe's ends: vocab 32000, h 1024.
Inventory TwoLayers(bool tied) {
  Recipe r = testing::SmallRecipe();
  r.model.vocab = 32000;
  r.model.tie_embeddings = tied;
  Inventory inv = testing::HybridInventory(r, "D", 2);
  for (Layer& l : inv.layers) {
    l.totals = ParamTotals{};
    testing::SetElements(l, ShardClass::kReplicated, OptimizerKind::kAdamW, 1000);
    testing::SetElements(l, ShardClass::kTpSharded, OptimizerKind::kMuon, 4000);
  }
  return inv;
}

TEST(Ends, VocabPaddingAndOwnership) {
  // t 4: vocab 32000 padded to a multiple of 128*4 = 512 -> 32256; 32256/4 = 8064
  // rows x 1024 = 8,257,536 elements, bf16 16,515,072 B, on the first stage;
  // the untied head the same on the last. Layers: 1000 REP + 4000/4 TP each.
  const Inventory inv = TwoLayers(false);
  const Layout l = testing::LayoutFor(inv.recipe, 8, 4, 2, 1);
  const StagePlan plan = EqualStagePlan(2, 2, 1);
  const RankMemory first = EstimateRank(inv, l, plan, 0);
  const RankMemory last = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(first.of(Category::kTpShardedParams).count(), 16'515'072 + 1000 * 2);
  EXPECT_EQ(last.of(Category::kTpShardedParams).count(), 16'515'072 + 1000 * 2);
  // Final norm (h = 1024, REP, bf16) only on the last stage.
  EXPECT_EQ(first.of(Category::kReplicatedParams).count(), 1000 * 2);
  EXPECT_EQ(last.of(Category::kReplicatedParams).count(), 1000 * 2 + 1024 * 2);
}

TEST(Ends, TiedEmbeddingKeepsASecondCopyOnTheLastStage) {
  // Tied, pp 2: Megatron keeps a V*h/t copy on the last stage (docs/formulas.md §1.1).
  const Inventory inv = TwoLayers(true);
  const Layout l = testing::LayoutFor(inv.recipe, 8, 4, 2, 1);
  const StagePlan plan = EqualStagePlan(2, 2, 1);
  EXPECT_EQ(EstimateRank(inv, l, plan, 1).of(Category::kTpShardedParams).count(), 16'515'072 + 1000 * 2);
  // pp 1: one copy only.
  const Layout one = testing::LayoutFor(inv.recipe, 8, 4, 1, 1);
  EXPECT_EQ(EstimateRank(inv, one, EqualStagePlan(2, 1, 1), 0).of(Category::kTpShardedParams).count(),
            16'515'072 + 2 * 1000 * 2);
}

TEST(Ends, FirstAndLastStageActivations) {
  // s 4096, b 1, c 1, t 4, SP. First stage: int64 ids 8 * 4096 = 32,768 B per
  // micro-batch in flight. Last stage: (2h*2 + 4) * 4096 / 4 = 4,198,400 for
  // the final-norm and head inputs and rstd, + 4096 * 8064 * (4 + 2) =
  // 198,180,864 for the fp32 CE softmax and the bf16 logits: 202,379,264.
  const Inventory inv = TwoLayers(false);
  const Layout l = testing::LayoutFor(inv.recipe, 8, 4, 2, 1);
  EXPECT_EQ(FirstStageActivations(inv.recipe, l).count(), 32'768);
  EXPECT_EQ(LastStageActivations(inv.recipe, l, PaddedVocab(inv.recipe.model, 4)).count(), 202'379'264);
  const StagePlan plan = EqualStagePlan(2, 2, 1);
  // m = 64 / (1 * dp 1) = 64; rank 0 of 2 holds 2 micro-batches in flight.
  EXPECT_EQ(EstimateRank(inv, l, plan, 0).activations_ends.count(), 2 * 32'768);
  EXPECT_EQ(EstimateRank(inv, l, plan, 1).activations_ends.count(), 202'379'264);
}

TEST(Sharding, DenseAndExpertStateUseTheirOwnGroups) {
  // One E layer: 1000 REP (AdamW), 4000 TP (Muon), 16000 EP (Muon); no ends.
  // t 2, d 8, e 4: D_dense = d*c = 8, D_exp = t*c*d/(e*t_e) = 4.
  // Local: REP 1000, TP 2000, EP 16000/4 = 4000.
  Recipe r = testing::SmallRecipe();
  Inventory inv = testing::HybridInventory(r, "E", 1);
  inv.layers[0].totals = ParamTotals{};
  testing::SetElements(inv.layers[0], ShardClass::kReplicated, OptimizerKind::kAdamW, 1000);
  testing::SetElements(inv.layers[0], ShardClass::kTpSharded, OptimizerKind::kMuon, 4000);
  testing::SetElements(inv.layers[0], ShardClass::kEpSharded, OptimizerKind::kMuon, 16000);
  inv.embedding = ParamTensor{};
  inv.final_norm = ParamTensor{};
  inv.head.clear();
  Layout l = testing::LayoutFor(inv.recipe, 16, 2, 1, 4);
  ASSERT_EQ(l.expert_dp(), 4);
  // ZeRO-1: Muon (4 momentum + 4 master) 2000*8/8 + 4000*8/4 = 2000 + 8000;
  // AdamW (8 + 4) 1000*12/8 = 1500; fp32 grads in full (1000+2000+4000)*4 = 28,000.
  RankMemory m = EstimateRank(inv, l, EqualStagePlan(1, 1, 1), 0);
  EXPECT_EQ(m.of(Category::kOptimizerMuon).count(), 10'000);
  EXPECT_EQ(m.of(Category::kOptimizerAdamW).count(), 1'500);
  EXPECT_EQ(m.of(Category::kGradients).count(), 28'000);
  // ZeRO-2: the owned shares, ceil(n/D) of each buffer: dense AdamW 1000/8 =
  // 125, dense Muon 2000/8 = 250, expert Muon 4000/4 = 1000 elements, * 4 B =
  // 1500 + 4000; plus the one unit (this layer) unsharded while its backward
  // runs: (1000 + 2000 + 4000) * 4 = 28,000.
  l.zero = 2;
  m = EstimateRank(inv, l, EqualStagePlan(1, 1, 1), 0);
  EXPECT_EQ(m.of(Category::kGradients).count(), 1'500 + 4'000 + 28'000);
  // ZeRO-3: the owned parameter shares, dense (1000 + 2000) * 2 / 8 = 750
  // (shown as ceil(REP 2000 / 8) = 250 replicated and 500 TP), expert
  // 4000 * 2 / 4 = 2000; plus the gathered unit, a one-unit chunk: the layer
  // in full, 2000 / 4000 / 8000 per class. The shares stay while it is gathered.
  l.zero = 3;
  m = EstimateRank(inv, l, EqualStagePlan(1, 1, 1), 0);
  EXPECT_EQ(m.of(Category::kReplicatedParams).count(), 250 + 2'000);
  EXPECT_EQ(m.of(Category::kTpShardedParams).count(), 500 + 4'000);
  EXPECT_EQ(m.of(Category::kEpShardedParams).count(), 2'000 + 8'000);
}

TEST(Verdict, FitsHeadroomAndReason) {
  const Inventory base = TwoLayers(false);
  const Layout l = testing::LayoutFor(base.recipe, 8, 4, 2, 1);
  const StagePlan plan = EqualStagePlan(2, 2, 1);
  Inventory small = base;
  small.recipe.cluster.spec.capacity_mib = 1024;  // 1 GiB: the 3 GiB reserve alone does not fit
  MemoryEstimate est = EstimateMemory(small, l, plan);
  EXPECT_FALSE(est.verdict.fits);
  EXPECT_FALSE(est.verdict.headroom_ok);
  EXPECT_EQ(est.verdict.reason.rfind("stage " + std::to_string(est.worst_stage) + " over capacity by ", 0), 0u)
      << est.verdict.reason;
  // The worst stage is the one with the largest total.
  for (const RankMemory& m : est.stages) EXPECT_LE(m.total(), est.stages[static_cast<size_t>(est.worst_stage)].total());

  est = EstimateMemory(base, l, plan);  // 143771 MiB
  EXPECT_TRUE(est.verdict.fits);
  EXPECT_TRUE(est.verdict.headroom_ok);
  Inventory tight = base;
  tight.recipe.cluster.min_headroom_gib = 1000.0;  // more than the device
  est = EstimateMemory(tight, l, plan);
  EXPECT_TRUE(est.verdict.fits);
  EXPECT_FALSE(est.verdict.headroom_ok);
  EXPECT_NE(est.verdict.reason.find("below the 1000.00 GiB floor"), std::string::npos) << est.verdict.reason;
}

TEST(Reserve, ReserveAndAllocatorLines) {
  // reserve_gib 3 -> 3 * 2^30; allocator overhead 5% of everything else, rounded up.
  const Inventory inv = TwoLayers(false);
  const Layout l = testing::LayoutFor(inv.recipe, 8, 4, 2, 1);
  const RankMemory m = EstimateRank(inv, l, EqualStagePlan(2, 2, 1), 1);
  EXPECT_EQ(m.of(Category::kRuntimeReserve).count(), 3 * kGiB);
  const int64_t managed =
      m.total().count() - m.of(Category::kRuntimeReserve).count() - m.of(Category::kAllocatorOverhead).count();
  EXPECT_EQ(m.of(Category::kAllocatorOverhead).count(), (managed * 5 + 99) / 100);
}

}  // namespace
}  // namespace preflight::estimator_ends_test

// The default recipe (recipes/nam56r-h200.yaml) through parser, inventory and
// estimator: it must fit on H200 with the recipe's headroom floor.
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::estimator_default_recipe_test {
namespace {

Inventory DefaultInventory() {
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"));
  EXPECT_TRUE(loaded.ok());
  return BuildInventory(*loaded.recipe);
}

TEST(DefaultRecipe, FitsOnH200) {
  const Inventory inv = DefaultInventory();
  const Layout l = LayoutOf(inv.recipe);
  const MemoryEstimate est = EstimateMemory(inv, l, EqualStagePlan(48, 4, 1));
  ASSERT_EQ(est.stages.size(), 4u);
  EXPECT_TRUE(est.verdict.fits) << est.verdict.reason;
  EXPECT_TRUE(est.verdict.headroom_ok) << est.verdict.reason;
  // H200 as CUDA reports it: 143771 MiB (docs/formulas.md §2.4).
  for (const RankMemory& m : est.stages) EXPECT_EQ(m.capacity.count(), 143771 * kMiB);
}

TEST(DefaultRecipe, StageZeroHandCounts) {
  // Stage 0 of 4 holds layers 0-11 = one AEMEAEMEAEMR period: 3 A, 3 M, 5 E, 1 R.
  // Routed experts (docs/formulas.md §1.5): 64 x 3 x 4096 x 2048 = 1,610,612,736 per E
  // layer; 5 layers / ep 8 x 2 B (bf16) = 2,013,265,920 B.
  // 1F1B at p 4, m = 512 / (1 x dp 4) = 128: rank 0 holds min(m, p) = 4 micro-batches.
  const Inventory inv = DefaultInventory();
  const Layout l = LayoutOf(inv.recipe);
  const RankMemory m = EstimateRank(inv, l, EqualStagePlan(48, 4, 1), 0);
  EXPECT_EQ(m.of(Category::kEpShardedParams).count(), 2'013'265'920);
  EXPECT_EQ(m.in_flight_microbatches, 4);
  // Embedding on stage 0: V 131072 (already a multiple of 128 x 4) / t 4 x 4096 x 2 B = 268,435,456 B.
  const RankMemory last = EstimateRank(inv, l, EqualStagePlan(48, 4, 1), 3);
  EXPECT_EQ((m.of(Category::kTpShardedParams) - last.of(Category::kTpShardedParams)).count(), 0)
      << "untied: the head on the last stage matches the embedding on the first";
  const RankMemory middle = EstimateRank(inv, l, EqualStagePlan(48, 4, 1), 1);
  EXPECT_EQ((m.of(Category::kTpShardedParams) - middle.of(Category::kTpShardedParams)).count(), 268'435'456);
}

TEST(CheckedInRecipes, EveryRankEstimatesAndExplainsConsistently) {
  // Every recipe in recipes/: each rank's categories equal the sums of its
  // --explain lines, the worst stage has the largest total, and the verdict
  // agrees with it.
  int recipes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::SourcePath("recipes"))) {
    if (entry.path().extension() != ".yaml") continue;
    ++recipes;
    const LoadResult loaded = LoadRecipeFile(entry.path().string());
    ASSERT_TRUE(loaded.ok()) << entry.path();
    const Inventory inv = BuildInventory(*loaded.recipe);
    const Layout l = LayoutOf(inv.recipe);
    const StagePlan plan =
        RecipeStagePlan(inv, l).value_or(EqualStagePlan(static_cast<int64_t>(inv.layers.size()), l.pp, l.vpp));
    const MemoryEstimate est = EstimateMemory(inv, l, plan);
    const RankMemory& worst = est.stages[static_cast<size_t>(est.worst_stage)];
    EXPECT_EQ(est.verdict.fits, worst.total() <= worst.capacity) << entry.path();
    for (int64_t r = 0; r < l.pp; ++r) {
      const RankMemory& m = est.stages[static_cast<size_t>(r)];
      EXPECT_LE(m.total(), worst.total()) << entry.path();
      std::array<Bytes, kNumCategories> sums{};
      for (const Explanation& e : ExplainRank(inv, l, plan, r)) sums[static_cast<size_t>(e.category)] += e.bytes;
      for (int c = 0; c < kNumCategories; ++c) {
        EXPECT_EQ(sums[static_cast<size_t>(c)], m.bytes[static_cast<size_t>(c)])
            << entry.path() << " rank " << r << " " << Key(static_cast<Category>(c));
      }
    }
  }
  EXPECT_GE(recipes, 1);
}

}  // namespace
}  // namespace preflight::estimator_default_recipe_test

// parallel.embedding: replicated, the design notes' variant of the word
// embedding (a whole copy on every TP rank), against the frameworks'
// vocab-parallel default, worked by hand on Llama 3 8B with tp 4 and SP.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::embedding_replicated_test {
namespace {

struct Priced {
  RankMemory memory;
  std::vector<CommItem> items;
};

Priced Price(const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
  EXPECT_TRUE(loaded.ok()) << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  const Inventory inv = BuildInventory(*loaded.recipe);
  const PlanResult planned = MakePlan(inv, LayoutOf(*loaded.recipe));
  EXPECT_TRUE(planned.plan.has_value());
  return {planned.plan->memory->stages.front(), planned.plan->comm.front().items};
}

const CommItem* Find(const std::vector<CommItem>& items, CommWhat what, Pass pass) {
  for (const CommItem& i : items) {
    if (i.what == what && i.pass == pass) return &i;
  }
  return nullptr;
}

TEST(ReplicatedEmbedding, WholeTableOnEveryTpRankAndNoLookupCollective) {
  const std::vector<std::string> base = {"parallel.tp=4", "parallel.sp=true"};
  std::vector<std::string> replicated = base;
  replicated.push_back("parallel.embedding=replicated");
  const Priced v = Price(base);
  const Priced r = Price(replicated);
  // Vocab-parallel: 128256 padded to a multiple of 128 x 4 = 128512 rows, 32128
  // a rank, x 4096 x 2 B (bf16) = 263,192,576 B of TP-sharded parameters.
  // Replicated: 128256 x 4096 x 2 B = 1,050,673,152 B on every TP rank.
  EXPECT_EQ(v.memory.of(Category::kTpShardedParams).count() - r.memory.of(Category::kTpShardedParams).count(),
            int64_t{32128} * 4096 * 2);
  EXPECT_EQ(r.memory.of(Category::kReplicatedParams).count() - v.memory.of(Category::kReplicatedParams).count(),
            int64_t{128256} * 4096 * 2);
  // The lookup's forward reduce-scatter and backward all-gather over TP go...
  const CommItem* fwd = Find(v.items, CommWhat::kEmbedding, Pass::kForward);
  ASSERT_NE(fwd, nullptr);
  EXPECT_GT(fwd->calls, 0);
  const CommItem* none = Find(r.items, CommWhat::kEmbedding, Pass::kForward);
  EXPECT_TRUE(none == nullptr || none->calls == 0);
  // ...and under SP each TP rank holds the gradient of its own tokens' rows:
  // the replicated-gradient all-reduce grows by the table, 128256 x 4096
  // fp32 (a multiple of t already) = 2,101,346,304 B.
  const CommItem* vg = Find(v.items, CommWhat::kReplicatedGrads, Pass::kOptimizer);
  const CommItem* rg = Find(r.items, CommWhat::kReplicatedGrads, Pass::kOptimizer);
  ASSERT_NE(vg, nullptr);
  ASSERT_NE(rg, nullptr);
  EXPECT_EQ((rg->payload - vg->payload).count(), int64_t{128256} * 4096 * 4);
}

TEST(ReplicatedEmbedding, RefusedWithATiedHead) {
  const LoadResult loaded =
      LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"),
                     {*ParseOverride("parallel.embedding=replicated"), *ParseOverride("model.tie_embeddings=true")});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.diagnostics.front().key_path, "parallel.embedding");
}

}  // namespace
}  // namespace preflight::embedding_replicated_test

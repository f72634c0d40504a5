// The design notes' routing-scratch worked example, by hand: 4,096 tokens on
// a rank, top-2 of 128 experts, capacity factor 1.2 (tokens past capacity
// dropped), hidden 4,096, ep 32 (4 local experts), bf16. The notes count
// capacity 77, a 32 KiB count surface and receive and combine buffers of
// C x 4 local experts x h x 2 B = 2.5 MB each (about 5 MB a layer); `fit
// --explain` names those terms and prices 250.06 MiB, for what the notes
// leave out (docs/formulas.md §5).
#include <string>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"

namespace preflight::routing_example_test {
namespace {

const char kRecipe[] = R"(name: routing-example
model:
  pattern: "AE"
  repeat: 1
  hidden: 4096
  vocab: 32000
  attention: {heads: 32, kv_heads: 8, head_dim: 128}
  mlp: {ffn_hidden: 14336, activation: swiglu}
  moe: {experts: 128, top_k: 2, ffn_hidden: 1408, capacity_factor: 1.2, dropless: false}
training:
  seq_len: 4096
  micro_batch: 1
  global_batch: 32
  recompute: selective
parallel: {tp: 1, sp: false, cp: 1, pp: 1, ep: 32, expert_tp: 1, zero: 1}
cluster: {gpu: h200, nodes: 4, gpus_per_node: 8}
)";

TEST(RoutingExample, NamesTheNotesTermsAndPricesWhatTheyLeaveOut) {
  const LoadResult loaded = LoadRecipeFromString(kRecipe, "routing.yaml");
  ASSERT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  const Inventory inv = BuildInventory(*loaded.recipe);
  const Layout l = LayoutOf(*loaded.recipe);
  const StagePlan plan = EqualStagePlan(2, 1, 1);
  std::string probs, counts, rows;
  Bytes sum;
  for (const Explanation& e : ExplainRank(inv, l, plan, 0)) {
    if (e.category != Category::kRoutingScratch) continue;
    sum += e.bytes;
    if (e.item.find("top-k") != std::string::npos) probs = e.inputs;
    if (e.item.find("count surface") != std::string::npos) counts = e.inputs;
    if (e.item.find("dispatch/combine") != std::string::npos) rows = e.inputs;
  }
  // C = ceil(4096 x 2 / 128 x 1.2) = ceil(76.8) = 77, per expert per source rank.
  EXPECT_NE(rows.find("C=77 "), std::string::npos) << rows;
  // The count surface: t_e x e x E int64 = 32 x 128 x 8 = 32,768 B (32 KiB).
  EXPECT_NE(counts.find("count_surface=32768"), std::string::npos) << counts;
  // A local expert receives C from each of the 32 source ranks: 32 x 77 =
  // 2,464 rows, N_recv = 4 x 2,464 = 9,856 = E x C, where the notes count 77.
  EXPECT_NE(rows.find("N_recv=9856 "), std::string::npos) << rows;
  EXPECT_NE(rows.find("N_recv_per_local_expert=2464 "), std::string::npos) << rows;
  EXPECT_FALSE(probs.empty());
  // Combine phase (the larger): sort copy 9,856 + receive 9,856 + this rank's
  // send copy T x k = 8,192 + the unpermuted output T = 4,096 = 32,000 rows x
  // 8,192 B = 262,144,000 B; top-k probs 4,096 x 2 x 4 = 32,768 B; counts
  // 8 x 128 + 32,768 = 33,792 B. Total 262,210,560 B = 250.06 MiB.
  const MemoryEstimate est = EstimateMemory(inv, l, plan);
  EXPECT_EQ(est.stages[0].of(Category::kRoutingScratch).count(), 262'210'560);
  EXPECT_EQ(sum.count(), 262'210'560);
}

}  // namespace
}  // namespace preflight::routing_example_test

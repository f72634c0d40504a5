// Megatron's layer-wise distributed optimizer (parallel.optimizer_sharding:
// layer_wise): whole tensors' optimizer state dealt to the data-parallel
// ranks by size, checked against the upstream docstring's example and the
// corpus's Muon run worked tensor by tensor.
#include <array>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../estimator/internal.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::layer_wise_optimizer_test {
namespace {

using estimator_detail::DealPingPong;
using estimator_detail::DealtTensor;

// LayerWiseDistributedOptimizer._shard_params_ping_pong's docstring
// (megatron/core/optimizer/layer_wise_optimizer.py at d98e8a6): "Example of 4
// ranks and 10 parameters p0-p9 after sorting, then dp_cp_params_list will be
// [[p0, p7, p8], [p1, p6, p9], [p2, p5], [p3, p4]]". p_i has 2^i elements, so
// each rank's sum names its set; the input is shuffled to test the sort.
TEST(LayerWiseOptimizer, DealsLikeTheUpstreamDocstring) {
  std::vector<DealtTensor> tensors;
  for (int i : {5, 0, 9, 3, 7, 1, 8, 2, 6, 4}) tensors.push_back({int64_t{1} << i, 0});
  std::vector<std::array<int64_t, 2>> owned;
  DealPingPong(tensors, 4, &owned);
  ASSERT_EQ(owned.size(), 4u);
  EXPECT_EQ(owned[0][0], 1 + 128 + 256);  // p0, p7, p8
  EXPECT_EQ(owned[1][0], 2 + 64 + 512);   // p1, p6, p9
  EXPECT_EQ(owned[2][0], 4 + 32);         // p2, p5
  EXPECT_EQ(owned[3][0], 8 + 16);         // p3, p4
}

TEST(LayerWiseOptimizer, OneRankOwnsEverythingPerOptimizer) {
  std::vector<DealtTensor> tensors = {{10, 0}, {20, 1}, {30, 0}};
  std::vector<std::array<int64_t, 2>> owned;
  DealPingPong(tensors, 1, &owned);
  ASSERT_EQ(owned.size(), 1u);
  EXPECT_EQ(owned[0][0], 40);
  EXPECT_EQ(owned[0][1], 20);
}

// moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon (Megatron-LM
// functional test at d98e8a6): 12 GPT layers with MoE (8 GeLU experts of
// 1024), h 512, LayerNorm, no linear biases, learned positions 1024, GPT-2
// vocabulary padded to 50,304, tied; Muon with --use-distributed-optimizer
// --no-use-layer-wise-param-layout, ep 8.
const char kRecipe[] = R"(name: dist_muon
model:
  layers: "AEAEAEAEAEAEAEAEAEAEAEAE"
  hidden: 512
  vocab: 50257
  vocab_pad_multiple: 128
  tie_embeddings: true
  norm: layernorm
  linear_bias: false
  learned_positions: 1024
  attention: {heads: 8, kv_heads: 8, head_dim: 64}
  moe: {experts: 8, top_k: 2, ffn_hidden: 1024, activation: gelu, grouped_gemm: true}
training:
  seq_len: 1024
  micro_batch: 4
  global_batch: 32
  recompute: none
  precision: {params: bf16, grads: fp32, master: fp32}
  optimizer: {matrices: muon, other: adamw, router: muon}
  transformer_engine: true
parallel: {tp: 1, pp: 1, ep: 8, zero: 1, optimizer_sharding: layer_wise}
cluster: {gpu: h100, nodes: 2, gpus_per_node: 4}
)";

RankMemory PriceOf(const std::string& text) {
  const LoadResult loaded = LoadRecipeFromString(text, "dist_muon.yaml");
  EXPECT_TRUE(loaded.ok()) << (loaded.ok() ? "" : Format(loaded.diagnostics.front()));
  if (!loaded.ok()) return {};
  const Inventory inv = BuildInventory(*loaded.recipe);
  const Layout layout = LayoutOf(*loaded.recipe);
  return EstimateMemory(inv, layout, EqualStagePlan(24, 1, 1)).stages.front();
}

std::string Edited(std::string text, const std::string& from, const std::string& to) {
  text.replace(text.find(from), from.size(), to);
  return text;
}

// By hand, the rank's 88 dense tensors sorted by size: 50 norm vectors of 512
// (Adam: two per sublayer, weight and bias, and the final norm's), 12 routers
// [8, 512] (Muon), 12 o_proj 512^2 (Muon), the positions 1024 x 512 (Adam),
// 12 qkv 512 x 1536 (Muon), the word embedding 50,304 x 512 (Adam). Over
// dp 8 the loop 0..7, 7..0 gives rank 7 the indices i with i mod 16 in {7, 8}:
// 6 norm vectors (7, 8, 23, 24, 39, 40), 2 routers (55, 56), 2 o_proj (71,
// 72) and the embedding (87). Expert dp is 1: the rank keeps its expert's 12
// x (512 x 1024 + 1024 x 512) Muon elements.
TEST(LayerWiseOptimizer, TheLastRankOfEightDrawsTheWordEmbedding) {
  const RankMemory m = PriceOf(kRecipe);
  const int64_t adam = 6 * 512 + 50304 * 512;
  const int64_t muon = 2 * 8 * 512 + 2 * 512 * 512 + 12 * 2 * 512 * 1024;
  EXPECT_EQ(m.of(Category::kOptimizerAdamW).count(), adam * 12);  // m, v, master
  EXPECT_EQ(m.of(Category::kOptimizerMuon).count(), muon * 8);    // momentum, master
  // The heaviest rank is the last one: Megatron's log shows the same figure.
  EXPECT_EQ(m.last_rank_allocated_static, m.allocated_static);
  EXPECT_EQ(m.last_rank_allocated_peak, m.allocated_peak);
  // The full gradient buffer stays (DDP without the distributed optimizer).
  const int64_t dense = 12 * (4 * 512 + 8 * 512 + 4 * 512 * 512) + 2 * 512 + 1024 * 512 + 50304 * 512;
  EXPECT_EQ(m.of(Category::kGradients).count(), (dense + 12 * 2 * 512 * 1024) * 4);
  // Flat shards would give every rank an eighth of the dense state instead.
  const RankMemory flat = PriceOf(Edited(kRecipe, "optimizer_sharding: layer_wise", "optimizer_sharding: flat"));
  EXPECT_LT(flat.of(Category::kOptimizerAdamW).count(), m.of(Category::kOptimizerAdamW).count() / 4);
}

// The _1node variant: ep 4 on 4 GPUs. Over dp 4 the loop 0..3, 3..0 gives
// rank 0 the indices with i mod 8 in {0, 7}, the embedding (87) among them,
// and rank 3 those in {3, 4}: 12 norm vectors, 4 routers (51, 52, 59, 60), 2
// o_proj (67, 68) and 4 qkv (75, 76, 83, 84). Each keeps 2 local experts.
TEST(LayerWiseOptimizer, TheStageShowsTheHeaviestRankAndTheLastRankItsOwn) {
  const RankMemory m = PriceOf(Edited(Edited(kRecipe, "ep: 8", "ep: 4"), "nodes: 2", "nodes: 1"));
  const int64_t experts = 2 * 12 * 2 * 512 * 1024;
  // Rank 0: 13 norm vectors (0, 7, 8, ..., 47, 48), routers 55, 56, o_proj 63, 64, 71, 72, qkv 79, 80.
  const int64_t adam0 = 13 * 512 + 50304 * 512;
  const int64_t muon0 = 2 * 8 * 512 + 4 * 512 * 512 + 2 * 512 * 1536 + experts;
  EXPECT_EQ(m.of(Category::kOptimizerAdamW).count(), adam0 * 12);
  EXPECT_EQ(m.of(Category::kOptimizerMuon).count(), muon0 * 8);
  const int64_t adam3 = 12 * 512;
  const int64_t muon3 = 4 * 8 * 512 + 2 * 512 * 512 + 4 * 512 * 1536 + experts;
  const int64_t less = adam0 * 12 + muon0 * 8 - (adam3 * 12 + muon3 * 8);
  EXPECT_EQ((m.allocated_static - m.last_rank_allocated_static).count(), less);
  EXPECT_EQ((m.allocated_peak - m.last_rank_allocated_peak).count(), less);
}

TEST(LayerWiseOptimizer, ValidationNamesWhatItNeeds) {
  const auto error = [](const std::string& text) {
    const LoadResult loaded = LoadRecipeFromString(text, "dist_muon.yaml");
    return loaded.ok() ? std::string() : Format(loaded.diagnostics.front());
  };
  EXPECT_EQ(error(kRecipe), "");
  EXPECT_NE(error(Edited(kRecipe, "zero: 1", "zero: 2")).find("ZeRO 1 only"), std::string::npos);
  EXPECT_NE(error(Edited(kRecipe, "matrices: muon", "matrices: adamw")).find("matrices: muon"), std::string::npos);
  EXPECT_NE(error(Edited(kRecipe, "optimizer_sharding: layer_wise", "optimizer_sharding: tensors"))
                .find("optimizer_sharding"),
            std::string::npos);
}

}  // namespace
}  // namespace preflight::layer_wise_optimizer_test

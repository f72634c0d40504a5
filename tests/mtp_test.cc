// Multi-token prediction (model.mtp_layers): the modules' parameters counted
// by hand, where they live (the last stage, with a word-embedding copy kept in
// step by the embedding group), one module's weights shared by every depth
// (--mtp-use-repeated-layer), and which stacks may carry them.
#include <array>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"

namespace preflight::mtp_test {
namespace {

// 2 transformer layers, h 64, 4 heads of 16 (MHA), SwiGLU 128, untied vocab 256
// (a multiple of 128: no padding at tp 1), RMSNorm, bf16, pp 2.
std::string Recipe(int mtp, const std::string& pattern = "AD", bool shared = false) {
  return "name: mtp\nmodel:\n  pattern: \"" + pattern + "\"\n  repeat: 2\n  hidden: 64\n  vocab: 256\n" +
         "  mtp_shared_layer: " + (shared ? "true" : "false") + "\n  mtp_layers: " + std::to_string(mtp) +
         "\n  attention: {heads: 4, kv_heads: 4, head_dim: 16}\n  mlp: {ffn_hidden: 128, activation: swiglu}\n"
         "  mamba: {d_state: 16, head_dim: 16, groups: 1}\n"
         "training: {seq_len: 64, micro_batch: 1, global_batch: 4, recompute: none}\n"
         "parallel: {tp: 1, pp: 2, zero: 0}\ncluster: {gpu: h100, nodes: 1, gpus_per_node: 2}\n";
}

Inventory Build(int mtp, const std::string& pattern = "AD", bool shared = false) {
  const LoadResult loaded = LoadRecipeFromString(Recipe(mtp, pattern, shared), "mtp.yaml");
  EXPECT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  return BuildInventory(*loaded.recipe);
}

TEST(Mtp, ModuleParametersByHand) {
  // Per module: enorm, hnorm, final norm (64 each); eh_proj 2h x h = 8192; an
  // attention block (norm 64 + QKV 64 x 192 + O 64 x 64 = 16448) and a SwiGLU
  // MLP block (norm 64 + gate/up 64 x 256 + down 128 x 64 = 24640): 49472.
  const int64_t module = 3 * 64 + 2 * 64 * 64 + (64 + 64 * 192 + 64 * 64) + (64 + 64 * 256 + 128 * 64);
  ASSERT_EQ(module, 49472);
  EXPECT_EQ(Build(2).total_params - Build(0).total_params, 2 * module);
}

TEST(Mtp, LivesOnTheLastStageWithAnEmbeddingCopy) {
  const auto params = [](int mtp) {
    const Inventory inv = Build(mtp);
    const Layout l = LayoutOf(inv.recipe);
    const MemoryEstimate m = EstimateMemory(inv, l, EqualStagePlan(4, 2, 1));
    std::array<int64_t, 2> out{};
    for (size_t s = 0; s < 2; ++s) {
      const RankMemory& r = m.stages[s];
      out[s] = (r.of(Category::kReplicatedParams) + r.of(Category::kTpShardedParams)).count();
    }
    return out;
  };
  const auto without = params(0), with = params(1);
  EXPECT_EQ(with[0], without[0]);
  // bf16: one module (49472) and the word embedding's copy (256 x 64).
  EXPECT_EQ(with[1] - without[1], 2 * (49472 + 256 * 64));
  // The embedding group all-reduces that copy's gradient, as for a tied head.
  const Inventory inv = Build(1);
  const PlanResult planned = MakePlan(inv, LayoutOf(inv.recipe));
  ASSERT_TRUE(planned.plan.has_value());
  bool tied_all_reduce = false;
  for (const CommItem& i : planned.plan->comm.back().items) tied_all_reduce |= i.what == CommWhat::kTiedEmbedding;
  EXPECT_TRUE(tied_all_reduce);
}

// The module of ModuleParametersByHand.
constexpr int64_t kModule = 49472;

TEST(Mtp, ASharedLayerHoldsOneModuleAndKeepsEveryDepthsActivations) {
  EXPECT_EQ(Build(3, "AD", true).total_params - Build(0).total_params, kModule);
  const auto last_stage = [](const Inventory& inv) {
    return EstimateMemory(inv, LayoutOf(inv.recipe), EqualStagePlan(4, 2, 1)).stages[1];
  };
  const RankMemory shared = last_stage(Build(3, "AD", true)), apart = last_stage(Build(3));
  EXPECT_EQ(shared.of(Category::kActivations), apart.of(Category::kActivations));
  // bf16 weights: two modules fewer.
  EXPECT_EQ((apart.of(Category::kTpShardedParams) + apart.of(Category::kReplicatedParams)).count() -
                (shared.of(Category::kTpShardedParams) + shared.of(Category::kReplicatedParams)).count(),
            2 * 2 * kModule);
}

TEST(Mtp, AHybridStackEndingInAnFfnCarriesThem) {
  // Megatron's "MDMD/*-": the module's layer is attention and the last FFN,
  // the same tensors as on the transformer stack.
  EXPECT_EQ(Build(1, "MD").total_params - Build(0, "MD").total_params, kModule);
}

TEST(Mtp, RefusedWhenTheStackDoesNotEndInAnFfn) {
  const LoadResult loaded = LoadRecipeFromString(Recipe(1, "AM"), "mtp.yaml");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.diagnostics.front().key_path, "model.mtp_layers");
}

}  // namespace
}  // namespace preflight::mtp_test

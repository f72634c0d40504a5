// The allocator figures (docs/allocated.md): what stays allocated between
// steps and what max_memory_allocated shows, on a dense model worked by hand.
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight {
namespace {

// 2 layers of AD, h 256, 4 heads x 64 (MHA), SwiGLU 512, RMSNorm, tied vocab 1024
// (a multiple of 128: no padding), DDP on one GPU, bf16 params, fp32 grads,
// fp32 master, AdamW everywhere.
const char kRecipe[] = R"(name: hand
model:
  layers: "ADAD"
  hidden: 256
  vocab: 1024
  tie_embeddings: true
  attention: {heads: 4, kv_heads: 4, head_dim: 64}
  mlp: {ffn_hidden: 512, activation: swiglu}
training:
  seq_len: 128
  micro_batch: 1
  global_batch: 1
  recompute: none
  precision: {params: bf16, grads: fp32, master: fp32}
  optimizer: {matrices: adamw, other: adamw}
parallel: {tp: 1, sp: false, pp: 1, zero: 0}
cluster: {gpu: h100, nodes: 1, gpus_per_node: 1}
)";

// Its parameters by hand: attention 4 x 256^2 + norm 256; MLP 3 x 256 x 512 + norm 256;
// embedding 1024 x 256; final norm 256.
constexpr int64_t kParams = 2 * (4 * 256 * 256 + 256) + 2 * (3 * 256 * 512 + 256) + 1024 * 256 + 256;

/// The first stage of kRecipe with each (from, to) edit applied.
RankMemory FirstStage(const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string text = kRecipe;
  for (const auto& [from, to] : edits) text.replace(text.find(from), from.size(), to);
  const LoadResult loaded = LoadRecipeFromString(text, "hand.yaml");
  if (!loaded.ok()) {
    ADD_FAILURE() << Format(loaded.diagnostics.front());
    return RankMemory{};
  }
  return EstimateMemory(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe), EqualStagePlan(4, 1, 1))
      .stages.front();
}

TEST(AllocatedFigures, StaticIsEighteenBytesAParameterAndPeakAddsActivations) {
  const LoadResult loaded = LoadRecipeFromString(kRecipe, "hand.yaml");
  ASSERT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  const Inventory inv = BuildInventory(*loaded.recipe);
  const int64_t params = kParams;
  ASSERT_EQ(inv.total_params, params);
  const Layout layout = LayoutOf(*loaded.recipe);
  const MemoryEstimate est = EstimateMemory(inv, layout, EqualStagePlan(4, 1, 1));
  const RankMemory& m = est.stages.front();
  // DDP with mixed precision: bf16 param 2 + fp32 grad 4 + fp32 master 4 + two fp32 moments 8,
  // plus three 32 MiB cuBLAS workspaces: Transformer Engine's one and PyTorch's two (the
  // output layer's torch matmul on the forward thread and on autograd's backward thread).
  const int64_t workspaces = 3 * 32 * 1024 * 1024;
  EXPECT_EQ(m.of(Category::kLibraryWorkspaces).count(), workspaces);
  EXPECT_EQ(m.allocated_static.count(), 18 * params + workspaces);
  EXPECT_EQ(m.allocated_peak.count(),
            18 * params + workspaces + m.of(Category::kActivations).count() + m.of(Category::kRoutingScratch).count());
  EXPECT_GT(m.of(Category::kActivations).count(), 0);
  // Neither figure contains what max_memory_allocated does not see.
  EXPECT_EQ(m.allocated_peak, m.total() - m.of(Category::kRuntimeReserve) - m.of(Category::kAllocatorOverhead));
}

TEST(AllocatedFigures, ABf16GradientBufferAddsTheStepsFp32CopiesBetweenStepsOnly) {
  // Megatron with --grad-reduce-in-bf16: the step's model_grad.float() gives every
  // fp32 main param an fp32 gradient, kept until the next zero_grad.
  const std::pair<std::string, std::string> bf16{"grads: fp32", "grads: bf16"};
  const RankMemory m = FirstStage({bf16});
  const int64_t params = kParams;
  const int64_t workspaces = 3 * 32 * 1024 * 1024;
  // bf16 param 2 + bf16 grad 2 + fp32 master 4 + moments 8 + the fp32 gradient copy 4.
  EXPECT_EQ(m.allocated_static.count(), 20 * params + workspaces);
  // At the activation peak the copies are gone, and no category holds them:
  // the peak is the larger phase, here the step's (4 B a parameter is more
  // than this 128-token micro-batch's activations).
  const int64_t forward =
      16 * params + workspaces + m.of(Category::kActivations).count() + m.of(Category::kRoutingScratch).count();
  EXPECT_EQ(forward, (m.total() - m.of(Category::kRuntimeReserve) - m.of(Category::kAllocatorOverhead)).count());
  ASSERT_LT(forward, 20 * params + workspaces);
  EXPECT_EQ(m.allocated_peak.count(), 20 * params + workspaces);
  // 8,192 tokens: the activations' phase is the peak.
  const RankMemory m8k = FirstStage({bf16, {"seq_len: 128", "seq_len: 8192"}});
  EXPECT_GT(m8k.of(Category::kActivations).count(), 4 * params);
  EXPECT_EQ(m8k.allocated_peak, m8k.total() - m8k.of(Category::kRuntimeReserve) - m8k.of(Category::kAllocatorOverhead));
  // Megatron-FSDP (ZeRO 3 here) returns before copying.
  EXPECT_EQ(FirstStage({bf16, {"zero: 0", "zero: 3"}}).allocated_static.count(), 16 * params + workspaces);
}

// The workspace count by mechanism, over the switches that change it.
TEST(AllocatedFigures, LibraryWorkspacesFollowTheLibrariesThatRunGemms) {
  // Each edit replaces one piece of kRecipe.
  const auto mib = [](const std::vector<std::pair<std::string, std::string>>& edits) {
    return FirstStage(edits).of(Category::kLibraryWorkspaces).count() / (1024 * 1024);
  };
  EXPECT_EQ(mib({}), 3 * 32);
  // Without TE every linear is a torch GEMM: PyTorch's two handles, no TE workspace.
  EXPECT_EQ(mib({{"recompute: none", "recompute: none\n  transformer_engine: false"}}), 2 * 32);
  // Pre-Hopper workspaces are 4 MiB.
  EXPECT_EQ(mib({{"gpus_per_node: 1}", "gpus_per_node: 1, cublas_workspace_mib: 4}"}}), 3 * 4);
  // Grouped-GEMM experts on TE add GroupedLinear's four per-stream workspaces.
  const std::pair<std::string, std::string> moe_layer{"\"ADAD\"", "\"ADAE\""};
  const std::string mlp = "activation: swiglu}";
  EXPECT_EQ(mib({moe_layer, {mlp, mlp + "\n  moe: {experts: 4, top_k: 1, ffn_hidden: 64}"}}), (3 + 4) * 32);
  EXPECT_EQ(mib({moe_layer, {mlp, mlp + "\n  moe: {experts: 4, top_k: 1, ffn_hidden: 64, grouped_gemm: false}"}}),
            3 * 32);
}

// The same switches against a measurement: PyTorch 2.11 on an H100 added
// 32 MiB at the first forward GEMM and 32 MiB more at the first backward GEMM
// (autograd's device thread has its own handle), nothing at the second step
// (tests/data/device/h100_cublas_workspaces.json, measured with
// bench/device/cublas_workspaces.py). A rank running every linear in torch
// must carry exactly that.
TEST(AllocatedFigures, TorchWorkspacesMatchTheH100Measurement) {
  std::ifstream in(testing::SourcePath("tests/data/device/h100_cublas_workspaces.json"));
  ASSERT_TRUE(in) << "missing measurement";
  const nlohmann::json measured = nlohmann::json::parse(in);
  EXPECT_EQ(measured.at("steady_state_extra_mib").get<double>(), 0.0);
  const double measured_mib = measured.at("total_workspace_mib_after_fwd_bwd").get<double>();
  const RankMemory m = FirstStage({{"recompute: none", "recompute: none\n  transformer_engine: false"}});
  EXPECT_EQ(static_cast<double>(m.of(Category::kLibraryWorkspaces).count()), measured_mib * 1024 * 1024);
}

// Megatron-FSDP with --overlap-param-gather: the optimizer step's
// start_param_sync all-gathers the first bucket and prefetches the following
// ones up to 500M elements (megatron_fsdp.py at d98e8a6), so between steps
// the whole unsharded model (well under the limit here) is allocated beside
// the ZeRO-3 shards: its bf16 copy, 2 bytes a parameter of the rank.
TEST(AllocatedFigures, MegatronFsdpKeepsTheNextStepsGatherBetweenSteps) {
  const auto rank = [](bool overlap) {
    return FirstStage(
        {{"zero: 0}", overlap ? "zero: 3, overlap_grad_reduce: true, overlap_param_gather: true}" : "zero: 3}"},
         {"gpus_per_node: 1", "gpus_per_node: 2"},
         {"global_batch: 1", "global_batch: 2"}});
  };
  const RankMemory with = rank(true), without = rank(false);
  EXPECT_EQ((with.allocated_static - without.allocated_static).count(), 2 * kParams);
  // The peak is later in the step, after the units' forward resharded them.
  EXPECT_EQ(with.allocated_peak, without.allocated_peak);
  EXPECT_GE(with.allocated_peak, with.allocated_static);
}

}  // namespace
}  // namespace preflight

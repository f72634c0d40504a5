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

namespace preflight::estimator_allocated_test {
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

// Megatron's local attention core takes its raw-score matmul input from the
// global memory buffer, allocated once at the largest size asked for:
// [b * heads/t, s, s] in bf16, here 1 x 4 x 128 x 128 x 2 B beside PyTorch's
// two cuBLAS workspaces. The measured local runs gpt3_mcore_tp1_pp{2,4}
// (b 4, 8 heads, s 1024: 64 MiB) kept 73.9 and 74.4 MiB more than modeled
// without it, 8 MiB of that the pipeline inputs.
TEST(AllocatedFigures, MegatronsLocalAttentionKeepsItsScoresBuffer) {
  const std::pair<std::string, std::string> local{"recompute: none", "recompute: none\n  transformer_engine: false"};
  const int64_t workspaces = 2 * 32 * 1024 * 1024;
  const int64_t scores = 4 * 128 * 128 * 2;
  const RankMemory unfused = FirstStage({local, {"seq_len: 128", "seq_len: 128\n  flash_attention: false"}});
  EXPECT_EQ(unfused.of(Category::kLibraryWorkspaces).count(), workspaces + scores);
  EXPECT_EQ(unfused.allocated_static.count(), 18 * kParams + workspaces + scores);
  // Flash attention (or Transformer Engine's core) allocates no such buffer.
  EXPECT_EQ(FirstStage({local}).of(Category::kLibraryWorkspaces).count(), workspaces);
}

// Megatron's model keeps the last micro-batch's pipeline input of each chunk
// that receives one (TransformerBlock.set_input_tensor) with the gradient
// backward_step retains on it, so memory_allocated between steps holds two
// residual-stream tensors a receiving chunk: here 128 tokens x h 256 x 2 B.
TEST(AllocatedFigures, PipelineInputsAndTheirGradientsStayBetweenSteps) {
  const auto stages = [](const std::string& parallel, int64_t gpus, int64_t pp, int64_t vpp) {
    std::string text = kRecipe;
    const std::string from = "parallel: {tp: 1, sp: false, pp: 1, zero: 0}";
    text.replace(text.find(from), from.size(), parallel);
    std::string node = "gpus_per_node: ";  // not literal + to_string: GCC 12's -Warray-bounds false positive
    node += std::to_string(gpus);
    text.replace(text.find("gpus_per_node: 1"), 16, node);
    text.replace(text.find("global_batch: 1"), 15, "global_batch: 2");
    text.replace(text.find("\"ADAD\""), 6, "\"ADADADAD\"");  // a layer a chunk at pp 2 x vpp 2
    const LoadResult loaded = LoadRecipeFromString(text, "hand.yaml");
    EXPECT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
    return EstimateMemory(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe), EqualStagePlan(8, pp, vpp)).stages;
  };
  // What stays besides the model state and the workspaces.
  const auto kept = [](const RankMemory& m) {
    Bytes state;
    for (Category c :
         {Category::kReplicatedParams, Category::kTpShardedParams, Category::kEpShardedParams, Category::kGradients,
          Category::kOptimizerMuon, Category::kOptimizerAdamW, Category::kLibraryWorkspaces}) {
      state += m.of(c);
    }
    return (m.allocated_static - state).count();
  };
  const int64_t stream = 128 * 256 * 2;
  EXPECT_EQ(kept(stages("parallel: {tp: 1, sp: false, pp: 1, zero: 0}", 1, 1, 1).front()), 0);
  const std::vector<RankMemory> p2 = stages("parallel: {tp: 1, sp: false, pp: 2, zero: 0}", 2, 2, 1);
  EXPECT_EQ(kept(p2[0]), 0);  // the pipeline's first chunk embeds its tokens
  EXPECT_EQ(kept(p2[1]), 2 * stream);
  // max_memory_allocated covers the instant between steps too.
  EXPECT_GE(p2[1].allocated_peak, p2[1].allocated_static);
  // Interleaved: rank 0's second chunk receives too, and both of rank 1's.
  const std::vector<RankMemory> v2 = stages("parallel: {tp: 1, sp: false, pp: 2, vpp: 2, zero: 0}", 2, 2, 2);
  EXPECT_EQ(kept(v2[0]), 2 * stream);
  EXPECT_EQ(kept(v2[1]), 4 * stream);
  // Sequence parallelism sends each TP rank its share of the tokens.
  EXPECT_EQ(kept(stages("parallel: {tp: 2, sp: true, pp: 2, zero: 0}", 4, 2, 1)[1]), stream);
}

// kRecipe with its second layer an MoE layer of 4 SwiGLU experts (k 2,
// dropless), ep 2 on 2 GPUs; only the dispatcher differs.
RankMemory MoeStage(const std::string& dispatcher) {
  std::string text = kRecipe;
  const auto edit = [&text](const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
  };
  edit("\"ADAD\"", "\"ADAE\"");
  std::string moe = "  moe: {experts: 4, top_k: 2, ffn_hidden: 128, dropless: true, grouped_gemm: true, dispatcher: ";
  moe += dispatcher;
  moe += "}\ntraining:";
  edit("training:", moe);
  edit("global_batch: 1", "global_batch: 2");
  edit("pp: 1, zero: 0}", "pp: 1, ep: 2, zero: 0}");
  edit("gpus_per_node: 1", "gpus_per_node: 2");
  const LoadResult loaded = LoadRecipeFromString(text, "moe.yaml");
  if (!loaded.ok()) {
    ADD_FAILURE() << Format(loaded.diagnostics.front());
    return RankMemory{};
  }
  return EstimateMemory(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe), EqualStagePlan(4, 1, 1))
      .stages.front();
}

// Megatron's all-gather dispatcher gathers the T tokens of each of the
// ETP x EP group's ranks into the global memory buffer, kept between steps
// (token_dispatcher.py MoEAllGatherTokenDispatcher.token_dispatch,
// use_global_buffer=True): T 128 x e 2 x h 256 x 2 B. Its combine holds the
// R expert-output rows, their unpermuted [G, h] copy and the reduce-scattered
// [T, h] (R = min(T e min(k, E/e), ceil(1.25 T k)) = min(512, 320)), beside
// the top-k probabilities, the expert counts and the gathered probs and map.
// The measured ep8 corpus runs (s 1024, b 4, e 8, h 512: 32 MiB) kept 33.3
// MiB more than modeled without the buffer.
TEST(AllocatedFigures, AllGatherDispatcherKeepsItsGatheredTokens) {
  const RankMemory a2a = MoeStage("alltoall");
  const RankMemory ag = MoeStage("allgather");
  const int64_t tokens = 128, gathered = 128 * 2, h = 256, experts = 4;
  EXPECT_EQ((ag.of(Category::kLibraryWorkspaces) - a2a.of(Category::kLibraryWorkspaces)).count(), gathered * h * 2);
  EXPECT_EQ((ag.allocated_static - a2a.allocated_static).count(), gathered * h * 2);
  const int64_t expert_rows = 320;
  const int64_t scratch =
      tokens * 2 * 4 + 8 * experts + gathered * experts * 5 + (expert_rows + gathered + tokens) * h * 2;
  EXPECT_EQ(ag.of(Category::kRoutingScratch).count(), scratch);
}

}  // namespace
}  // namespace preflight::estimator_allocated_test

// Megatron's --defer-embedding-wgrad-compute, priced by hand: the last stage
// keeps the output layer's input and output gradient of every deferred
// micro-batch whose backward has run until the pipeline flush.
#include <string>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/stages.h"
#include "preflight/recipe/recipe.h"

namespace preflight::estimator_deferred_wgrad_test {
namespace {

// The Megatron CI case gpt3_mcore_te_tp2_pp2_resume_torch_dist_defer_embedding_wgrad_compute:
// 12 layers of h 512, GPT-2 vocab (50,257, padded to a multiple of 128 x tp = 256: 50,432),
// seq 1024, micro-batch 4, global batch 32 on dp 2: 4 micro-batches a step.
const char kRecipe[] = R"(name: defer
model:
  pattern: "AD"
  repeat: 12
  hidden: 512
  vocab: 50257
  tie_embeddings: true
  norm: layernorm
  attention: {heads: 8, kv_heads: 8, head_dim: 64}
  mlp: {ffn_hidden: 2048, activation: gelu}
training:
  seq_len: 1024
  micro_batch: 4
  global_batch: 32
  recompute: none
  optimizer: {matrices: adamw}
parallel: {tp: 2, sp: false, pp: 2, zero: 0}
cluster: {gpu: h100, nodes: 2, gpus_per_node: 4}
)";

Bytes LastStageActivations(const std::string& training_extra) {
  std::string text = kRecipe;
  const std::string anchor = "  recompute: none\n";
  text.replace(text.find(anchor), anchor.size(), anchor + training_extra);
  const LoadResult loaded = LoadRecipeFromString(text, "defer.yaml");
  EXPECT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  const Inventory inv = BuildInventory(*loaded.recipe);
  const Layout layout = LayoutOf(*loaded.recipe);
  return EstimateMemory(inv, layout, PartitionStages(inv, layout)).stages.back().of(Category::kActivations);
}

TEST(DeferredHeadWgrad, KeepsInputAndGradOutputOfEachDeferredMicroBatch) {
  const Bytes base = LastStageActivations("");
  // Per micro-batch: input 4096 tokens x 512 (no SP) + grad_output 4096 x 50432/2, bf16.
  const int64_t per_micro_batch = (4096LL * 512 + 4096LL * 25216) * 2;
  EXPECT_EQ((LastStageActivations("  defer_head_wgrad: true\n  head_wgrad_deferral_limit: 2\n") - base).count(),
            2 * per_micro_batch);
  // Limit 0 defers every micro-batch of the step (4), but the last stage
  // peaks at its last micro-batch's head forward, when three have finished
  // their backward (1F1B keeps one in flight there; the reference executor
  // measures the same, simulator_options_test.cc).
  EXPECT_EQ((LastStageActivations("  defer_head_wgrad: true\n") - base).count(), 3 * per_micro_batch);
  // A limit above the step's micro-batches defers them all, no more.
  EXPECT_EQ((LastStageActivations("  defer_head_wgrad: true\n  head_wgrad_deferral_limit: 9\n") - base).count(),
            3 * per_micro_batch);
}

TEST(DeferredHeadWgrad, NeedsPipelineParallelism) {
  std::string text = kRecipe;
  text.replace(text.find("pp: 2"), 5, "pp: 1");
  text.replace(text.find("  recompute: none\n"), 18, "  recompute: none\n  defer_head_wgrad: true\n");
  const LoadResult loaded = LoadRecipeFromString(text, "defer.yaml");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.diagnostics.front().key_path, "training.defer_head_wgrad");
}

}  // namespace
}  // namespace preflight::estimator_deferred_wgrad_test

// fit's saved activations and the fp32-upcast loss against a real GPU:
// a torchtitan-style Llama 3 8B block on an H100 under PyTorch 2.11
// (tests/data/device/sac_activations_h100.json, measured with
// bench/device/sac_activations.py). The bytes a block keeps are measured as
// torch.cuda.memory_allocated after the forward of 8 blocks less 4, over 4
// blocks; fit is asked the same way (its activations at 8 layers less 4).
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::device_activations_test {
namespace {

nlohmann::json Measured() {
  std::ifstream in(testing::SourcePath("tests/data/device/sac_activations_h100.json"));
  EXPECT_TRUE(in) << "missing measurement";
  return nlohmann::json::parse(in);
}

// The measured block: Llama 3 8B's (the recipe's model), one sequence of
// 8192 tokens, bf16, flash SDPA, torch's own layers and loss.
Recipe Torchtitan(const std::string& recompute, int64_t blocks) {
  std::vector<Override> overrides;
  for (const std::string& s :
       {std::string("cluster.gpu=h100"), std::string("cluster.nodes=1"), std::string("training.micro_batch=1"),
        std::string("training.global_batch=8"), std::string("training.optimizer.matrices=adamw"),
        std::string("training.transformer_engine=false"), std::string("training.cross_entropy=fp32_upcast"),
        "training.recompute=" + recompute, "model.repeat=" + std::to_string(blocks)}) {
    overrides.push_back(*ParseOverride(s));
  }
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
  EXPECT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
  return *loaded.recipe;
}

int64_t Activations(const Recipe& r) {
  return MakePlan(BuildInventory(r), LayoutOf(r)).plan->memory->stages.front().of(Category::kActivations).count();
}

// Per block: fit's activations at 8 blocks less 4, over 4.
int64_t FitPerBlock(const std::string& recompute) {
  return (Activations(Torchtitan(recompute, 8)) - Activations(Torchtitan(recompute, 4))) / 4;
}

// Flash SDPA also keeps its RNG state (two small tensors, 1 KiB a block in
// the caching allocator's 512 B blocks), which fit leaves out.
constexpr double kRngStateBytes = 1024;

TEST(DeviceActivations, PerOpPolicyKeepsWhatTheH100Kept) {
  const double measured = Measured().at("policies").at("op").at("saved_per_block").get<double>();
  const double fit = static_cast<double>(FitPerBlock("selective_op"));
  EXPECT_EQ(fit, 63'616.0 * 8192);  // docs/recipe.md's per-token sum, by hand
  EXPECT_NEAR(fit, measured, kRngStateBytes) << "fit " << fit << " measured " << measured;
}

TEST(DeviceActivations, FullRecomputeKeepsTheBlockInput) {
  const double measured = Measured().at("policies").at("full").at("saved_per_block").get<double>();
  EXPECT_EQ(static_cast<double>(FitPerBlock("full")), measured);
}

// torch's cross_entropy(logits.float()): after the logits are deleted the
// loss keeps log_softmax's fp32 output (4 B a logit) and its backward adds
// nll_loss's and log_softmax's fp32 gradients (8 B); the forward's peak
// (the bf16 logits, their fp32 copy and the output: 10 B) stays below.
TEST(DeviceActivations, Fp32UpcastLossBytesPerLogitAreTheH100s) {
  const nlohmann::json loss = Measured().at("loss");
  const Recipe r = Torchtitan("selective_op", 4);
  const Layout l = LayoutOf(r);
  const int64_t logits = int64_t{8192} * PaddedVocab(r.model, 1);
  ASSERT_EQ(loss.at("logits").get<int64_t>(), logits);
  const double transient = static_cast<double>(LossTransientActivations(r, l, PaddedVocab(r.model, 1)).count());
  EXPECT_EQ(transient / static_cast<double>(logits), loss.at("backward_peak_over_saved_per_logit").get<double>());
  // fit's last stage less the transient and the final norm's and head's
  // inputs (2h bf16 and an fp32 rstd a token) is what the loss saves.
  const int64_t head_inputs = int64_t{8192} * (2 * 4096 * 2 + 4);
  const double saved =
      static_cast<double>((LastStageActivations(r, l, PaddedVocab(r.model, 1)).count() - head_inputs)) - transient;
  EXPECT_NEAR(saved, loss.at("saved_after_del_per_logit").get<double>() * static_cast<double>(logits), kRngStateBytes);
  EXPECT_LE(loss.at("forward_peak_per_logit").get<double>(), 4.0 + transient / static_cast<double>(logits));
}

}  // namespace
}  // namespace preflight::device_activations_test

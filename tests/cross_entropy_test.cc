// training.cross_entropy: the loss's memory on the last stage, Megatron's
// vocab-parallel cross entropy against torch's cross_entropy(logits.float())
// as torchtitan runs it. Hand-worked bytes for Llama 3.1 8B at torchtitan's
// local batch 2 x 8192, the recipe's refusals and both emitters.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::cross_entropy_test {
namespace {

// torchtitan's Table 1 job (FSDP over 8 H100s, local batch 2, seq 8192).
const std::vector<std::string> kTorchtitan = {"cluster.gpu=h100",
                                              "cluster.nodes=1",
                                              "parallel.zero=3",
                                              "training.micro_batch=2",
                                              "training.global_batch=16",
                                              "training.optimizer.matrices=adamw",
                                              "training.transformer_engine=false",
                                              "training.recompute=selective_op"};

LoadResult Load(const std::vector<std::string>& extra) {
  std::vector<Override> overrides;
  for (const std::string& s : kTorchtitan) overrides.push_back(*ParseOverride(s));
  for (const std::string& s : extra) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

Recipe RecipeWith(const char* loss) {
  const LoadResult loaded = Load({std::string("training.cross_entropy=") + loss});
  EXPECT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
  return *loaded.recipe;
}

// 2 x 8192 tokens x 128,256 logits (tp 1, the vocabulary already a multiple
// of 128) = 2,101,346,304 logits.
constexpr int64_t kLogits = int64_t{16384} * 128256;

TEST(CrossEntropy, VocabParallelHoldsSixBytesALogitFp32UpcastTwelve) {
  const Recipe megatron = RecipeWith("vocab_parallel"), torch = RecipeWith("fp32_upcast");
  const Layout l = LayoutOf(megatron);
  ASSERT_EQ(PaddedVocab(megatron.model, 1), 128256);
  // The transient beside the saved fp32 output: the bf16 logits (2 B), or
  // nll_loss's and log_softmax's fp32 gradients (8 B).
  EXPECT_EQ(LossTransientActivations(megatron, l, 128256).count(), 2 * kLogits);
  EXPECT_EQ(LossTransientActivations(torch, l, 128256).count(), 8 * kLogits);
  EXPECT_EQ((LastStageActivations(torch, l, 128256) - LastStageActivations(megatron, l, 128256)).count(), 6 * kLogits);
}

// At pp 1 the rank peaks at its loss: fit's activations and allocated peak
// grow by the 6 B a logit, 12,608,077,824 B (11.74 GiB), and nothing else moves.
TEST(CrossEntropy, Fp32UpcastMovesThePeakByItsTransient) {
  const auto memory = [](const char* loss) {
    const Recipe r = RecipeWith(loss);
    return MakePlan(BuildInventory(r), LayoutOf(r)).plan->memory->stages.front();
  };
  const RankMemory megatron = memory("vocab_parallel"), torch = memory("fp32_upcast");
  EXPECT_EQ((torch.of(Category::kActivations) - megatron.of(Category::kActivations)).count(), 12'608'077'824);
  EXPECT_EQ((torch.allocated_peak - megatron.allocated_peak).count(), 12'608'077'824);
  EXPECT_EQ(torch.allocated_static, megatron.allocated_static);
}

TEST(CrossEntropy, Fp32UpcastRefusesMtpAndDeferredHeadWgrad) {
  // Full recompute: selective_op refuses MTP itself.
  const std::string mtp = testing::FirstErrorText(
      Load({"training.recompute=full", "training.cross_entropy=fp32_upcast", "model.mtp_layers=1"}));
  EXPECT_NE(mtp.find("training.cross_entropy = fp32_upcast: is priced for the main head only"), std::string::npos)
      << mtp;
  const std::string deferred =
      testing::FirstErrorText(Load({"training.cross_entropy=fp32_upcast", "training.defer_head_wgrad=true"}));
  EXPECT_NE(deferred.find("training.cross_entropy = fp32_upcast: is not priced with training.defer_head_wgrad"),
            std::string::npos)
      << deferred;
  EXPECT_TRUE(Load({"training.recompute=full", "training.cross_entropy=vocab_parallel", "model.mtp_layers=1"}).ok());
}

std::vector<std::string> EmitArgs(const char* target, const char* loss) {
  std::vector<std::string> args = {"plan", "recipes/llama3-8b-h200.yaml", "--emit", target};
  for (const std::string& s : kTorchtitan) args.insert(args.end(), {"--set", s});
  // On H200s, where the job fits (an 80 GB H100 is 3.3 GiB short).
  args.insert(args.end(), {"--set", "cluster.gpu=h200", "--set", std::string("training.cross_entropy=") + loss});
  return args;
}

// torchtitan compiles its loss by default; the emitted module keeps it eager,
// as priced, and refuses the vocab-parallel loss torchtitan cannot run.
TEST(CrossEntropy, TorchtitanEmitsTheEagerLossAndRefusesVocabParallel) {
  const auto torch = testing::RunPreflight(EmitArgs("torchtitan", "fp32_upcast"));
  EXPECT_EQ(torch.exit_code, 0) << torch.out << torch.err;
  EXPECT_NE(torch.out.find(R"(compile=CompileConfig(enable=True, components=["model"]))"), std::string::npos)
      << torch.out;
  const auto megatron = testing::RunPreflight(EmitArgs("torchtitan", "vocab_parallel"));
  EXPECT_EQ(megatron.exit_code, 1) << megatron.out << megatron.err;
  EXPECT_NE(megatron.err.find("training.cross_entropy = vocab_parallel: --emit torchtitan: torchtitan's loss is"),
            std::string::npos)
      << megatron.err;
}

// Megatron-LM has no setting for torch's loss: the emission is refused.
TEST(CrossEntropy, MegatronRefusesFp32Upcast) {
  const auto r = testing::RunPreflight(EmitArgs("megatron", "fp32_upcast"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("Megatron-LM has no setting for training.cross_entropy = fp32_upcast"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace preflight::cross_entropy_test

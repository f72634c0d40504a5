// training.recompute: selective_op, torchtitan's per-op selective activation
// checkpointing (torchtitan/distributed/activation_checkpoint.py SelectiveAC;
// parallelize_llama.py _apply_ac_to_transformer_block @ 9dec370): each
// transformer block one checkpoint, its policy saving the SDPA outputs and
// every other matmul output. Checked against a hand-worked saved set for
// Llama 3.1 8B and against torchtitan's published peak memory.
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../bench/published_cases.h"
#include "preflight/estimator/estimate.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::torchtitan_sac_test {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Llama 3.1 8B as torchtitan's Table 1 runs it: FSDP over 8 GPUs, local
// batch 2, seq 8192, AdamW, eager bf16.
LoadResult Load(const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const char* s :
       {"cluster.gpu=h100", "cluster.nodes=1", "parallel.zero=3", "training.micro_batch=2", "training.global_batch=16",
        "training.optimizer.matrices=adamw", "training.transformer_engine=false", "training.recompute=selective_op"}) {
    overrides.push_back(*ParseOverride(s));
  }
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

Recipe RecipeOf(const std::vector<std::string>& sets) {
  const LoadResult loaded = Load(sets);
  EXPECT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
  return *loaded.recipe;
}

// Hand-worked, per token of one block, bf16 (2 B): the block input h = 4096;
// wq's output 32 x 128 = 4096; wv's 8 x 128 = 1024; the SDPA output 4096 and
// its fp32 logsumexp 32 x 4 B; w1's output 14336; w2's 4096. wk, wo and w3
// (the 2nd, 4th and 6th matmuls) are recomputed.
constexpr int64_t kAttentionBytes = (4096 + 4096 + 1024 + 4096) * 2 + 32 * 4;  // 26,752
constexpr int64_t kMlpBytes = (14336 + 4096) * 2;                              // 36,864

TEST(TorchtitanSac, SavedBytesPerTokenAreTheHandWorkedSet) {
  const Recipe r = RecipeOf({});
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kAttention, Recompute::kSelectiveOp, 1, 1).total(), kAttentionBytes);
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kDenseMlp, Recompute::kSelectiveOp, 1, 1).total(), kMlpBytes);
  EXPECT_EQ(kAttentionBytes + kMlpBytes, 63616);
}

// One block at local batch 2 x 8192 tokens: 63,616 B x 16,384 = 1,042,284,544
// B (0.97 GiB); saving every matmul would add wk, wo and w3 (1024 + 4096 +
// 14336 elements a token), and saving none would drop to the input alone.
TEST(TorchtitanSac, OneBlockOfLlama8BAtBatch2Seq8192) {
  const Recipe r = RecipeOf({});
  const Layout l = LayoutOf(r);
  const Bytes block = LayerActivations(r, l, BlockKind::kAttention) + LayerActivations(r, l, BlockKind::kDenseMlp);
  EXPECT_EQ(block.count(), int64_t{1'042'284'544});
}

// Between the policies torchtitan offers: more than full AC's block input,
// less than Megatron's core-attention rerun, which keeps every sublayer
// tensor but the softmax statistics.
TEST(TorchtitanSac, LiesBetweenFullAndModuleSelective) {
  const auto per_token = [](Recompute policy) {
    const Recipe r = RecipeOf({});
    return SavedBytesPerToken(r, BlockKind::kAttention, policy, 1, 1).total() +
           SavedBytesPerToken(r, BlockKind::kDenseMlp, policy, 1, 1).total();
  };
  EXPECT_GT(per_token(Recompute::kSelectiveOp), per_token(Recompute::kFull));
  EXPECT_LT(per_token(Recompute::kSelectiveOp), per_token(Recompute::kSelective));
}

// The recomputed matmuls' FLOPs share: attention reruns wk and wo, h x kv +
// q x h of h x q + 2 h x kv + q x h = 1/2 for any GQA shape; the SwiGLU MLP
// reruns w3, 1 of 3 equal matmuls.
TEST(TorchtitanSac, RecomputedMatmulShareIsTheEvenMatmuls) {
  const Recipe r = RecipeOf({});
  EXPECT_DOUBLE_EQ(SelectiveOpRecomputedMatmulShare(r, BlockKind::kAttention), 0.5);
  EXPECT_DOUBLE_EQ(SelectiveOpRecomputedMatmulShare(r, BlockKind::kDenseMlp), 1.0 / 3.0);
}

// The rerun is priced: the step takes longer than without recompute and
// shorter than with full recompute.
TEST(TorchtitanSac, StepTimeBetweenNoneAndFull) {
  const auto step = [](const char* policy) {
    const Recipe r = RecipeOf({std::string("training.recompute=") + policy});
    return MakePlan(BuildInventory(r), LayoutOf(r)).plan->time.step_s;
  };
  const double none = step("none"), op = step("selective_op"), full = step("full");
  EXPECT_GT(op, none);
  EXPECT_LT(op, full);
}

TEST(TorchtitanSac, RefusesWhatWasNotTraced) {
  const auto error = [](const std::vector<std::string>& sets) { return testing::FirstErrorText(Load(sets)); };
  EXPECT_NE(error({"parallel.tp=2"}).find("parallel.tp and parallel.cp must be 1"), std::string::npos);
  EXPECT_NE(error({"training.flash_attention=false"}).find("flash_attention: true"), std::string::npos);
  EXPECT_NE(error({"model.mlp.activation=gelu"}).find("bias-free SwiGLU"), std::string::npos);
  EXPECT_NE(error({"training.dropout=0.1"}).find("without dropout"), std::string::npos);
  EXPECT_NE(error({"training.precision.activations=fp8"}).find("bf16 matmuls only"), std::string::npos);
  const LoadResult moe = LoadRecipeFile(testing::SourcePath("recipes/deepseek-v3-h200.yaml"),
                                        {*ParseOverride("training.recompute=selective_op")});
  EXPECT_NE(testing::FirstErrorText(moe).find("dense transformer blocks only"), std::string::npos);
}

// The executor runs the per-op policy (tests/simulator_selective_op_test.cc):
// simulate agrees on the recipe as torchtitan would run it, pp 1 and 2.
TEST(TorchtitanSac, SimulateAgrees) {
  for (const char* pp : {"parallel.pp=1", "parallel.pp=2"}) {
    const auto r = testing::RunPreflight(
        {"simulate", "recipes/llama3-8b-h200.yaml", "--set", "training.recompute=selective_op", "--set",
         "training.transformer_engine=false", "--set", "training.cross_entropy=fp32_upcast", "--set", pp});
    EXPECT_EQ(r.exit_code, 0) << pp << "\n" << r.out << r.err;
  }
}

// torchtitan's published Table 1 and 3 (docs/performance.md @ eaea6f6,
// measured at torchtitan 9dec370): peak memory as torchtitan logs it, the
// caching allocator's reserved peak (metrics.py get_peak_stats,
// reserved_bytes.all.peak), which is fit's allocated peak plus its
// allocator overhead (the CUDA context and NCCL's buffers are outside it).
// Eager and torch.compile bf16 rows run the per-op policy; the Float8 rows
// save other ops (torchao's amax and scaled matmuls) and are not priced here.
struct MemoryRow {
  std::string id;
  double measured_gib = 0, modeled_gib = 0;
};

std::vector<MemoryRow> PublishedMemoryRows() {
  std::ifstream f(testing::SourcePath("tests/data/published/runs.json"));
  const nlohmann::json data = nlohmann::json::parse(f);
  std::vector<MemoryRow> out;
  for (const nlohmann::json& run : data["runs"]) {
    const std::string id = run["id"].get<std::string>();
    if (id.rfind("torchtitan", 0) != 0 || id.find("Float8") != std::string::npos) continue;
    const LoadResult loaded = LoadRecipeFromString(published::TorchtitanRecipe(run["inputs"]), id + ".yaml");
    EXPECT_TRUE(loaded.ok()) << id << ": " << testing::FirstErrorText(loaded);
    if (!loaded.ok()) continue;
    const Plan plan = *MakePlan(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe)).plan;
    const RankMemory& m = plan.memory->stages.front();
    const Bytes reserved = m.allocated_peak + m.of(Category::kAllocatorOverhead);
    out.push_back({id, run["expected"]["peak_memory_GiB"].get<double>(), static_cast<double>(reserved.count()) / kGiB});
  }
  return out;
}

// torchtitan at 9dec370 computes the loss eagerly even under torch.compile
// (train.py loss_fn, not compiled), cross_entropy(pred.float()): the rows
// run training.cross_entropy: fp32_upcast (12 B a logit at its backward,
// where Megatron's vocab-parallel loss holds 6: 11.7 GiB at 2 x 8192 tokens
// and 128,256 logits; priced as vocab_parallel the rows were -18, -12, -24
// and -18 %). Each row within the 10 % the memory model is held to. Seen and
// not modeled: FSDP2's root unit (embedding, final norm, output) stays
// gathered through the step (parallelize_llama.py fully_shard(model)), and
// its fp32 shard is the master copy.
TEST(TorchtitanSac, PublishedPeakMemoryWithinTenPercent) {
  const std::vector<MemoryRow> rows = PublishedMemoryRows();
  ASSERT_EQ(rows.size(), 4u);
  for (const MemoryRow& r : rows) {
    const double error_pct = (r.modeled_gib - r.measured_gib) / r.measured_gib * 100.0;
    EXPECT_LE(std::abs(error_pct), 10.0) << r.id << ": measured " << r.measured_gib << ", modeled " << r.modeled_gib;
  }
}

// The same job on 8 and on 128 GPUs differs only in how finely FSDP shards
// the parameters, gradients and AdamW state: the measured drop (82.4 - 67.0
// GiB) checks the sharded state within the published rows' 10 %.
TEST(TorchtitanSac, ShardedStateBetween8And128GpusWithinTenPercent) {
  const std::vector<MemoryRow> rows = PublishedMemoryRows();
  ASSERT_EQ(rows.size(), 4u);
  const double measured = rows[0].measured_gib - rows[2].measured_gib;
  const double modeled = rows[0].modeled_gib - rows[2].modeled_gib;
  EXPECT_NEAR(modeled, measured, 0.10 * measured) << "measured " << measured << " GiB, modeled " << modeled;
}

}  // namespace
}  // namespace preflight::torchtitan_sac_test

// EstimateMemory at extreme scale (issue 9): a 10-trillion-parameter recipe
// on a million GPUs, read through the YAML parser, gives exact figures; sizes
// whose products leave int64 raise ArithmeticOverflow instead of wrapping.
// Hand computations are written beside each expected value.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight::hardening_estimate_test {
namespace {

Recipe MustLoad(const std::string& yaml) {
  const LoadResult r = LoadRecipeFromString(yaml, "scale.yaml");
  std::string all;
  for (const Diagnostic& d : r.diagnostics) all += Format(d) + "\n";
  EXPECT_TRUE(r.ok()) << all;
  return r.ok() ? *r.recipe : Recipe{};
}

// As in hardening_scale_test.cc: 208 dense SwiGLU layers, h = 2^16,
// f = 2^18, vocab 2^18, on 2^20 H200s with tp 8, pp 16 (13 layers a stage),
// dp 8192. Defaults: bf16 params, fp32 grads, fp32 master, ZeRO-1.
constexpr const char* kTenTrillion = R"(name: ten-trillion
model:
  pattern: D
  repeat: 208
  hidden: 65536
  vocab: 262144
  mlp: {ffn_hidden: 262144}
training: {seq_len: 8192, micro_batch: 1, global_batch: 262144, recompute: full}
parallel: {tp: 8, pp: 16}
cluster: {gpu: h200, nodes: 131072, gpus_per_node: 8}
)";

TEST(HardeningEstimate, TenTrillionParametersOnAMillionGpus) {
  const Recipe recipe = MustLoad(kTenTrillion);
  const Inventory inv = BuildInventory(recipe);
  const Layout layout = LayoutOf(recipe);
  ASSERT_EQ(layout.dp, 8192);
  const MemoryEstimate est = EstimateMemory(inv, layout, EqualStagePlan(208, 16, 1));
  ASSERT_EQ(est.stages.size(), 16u);
  // A middle stage (pipeline rank 5) holds layers 65..77, 13 D layers, no
  // embedding or head:
  const RankMemory& mid = est.stages[5];
  // replicated: 13 RMSNorm weights of h, bf16: 13 x 65536 x 2 = 1,703,936 B.
  EXPECT_EQ(mid.of(Category::kReplicatedParams).count(), 1'703'936);
  // TP-sharded: 13 x (h x 2f + f x h) / tp, bf16: 13 x 51,539,607,552 / 8 x 2
  //   = 13 x 12,884,901,888 = 167,503,724,544 B.
  EXPECT_EQ(mid.of(Category::kTpShardedParams).count(), 167'503'724'544);
  EXPECT_EQ(mid.of(Category::kEpShardedParams).count(), 0);
  // Every figure is a non-negative byte count and the total is their sum:
  // no category wrapped. 167.5 GB of weights alone exceed the 143,771 MiB H200.
  int64_t sum = 0;
  for (int c = 0; c < kNumCategories; ++c) {
    EXPECT_GE(mid.bytes[static_cast<size_t>(c)].count(), 0) << Label(static_cast<Category>(c));
    sum = CheckedAdd(sum, mid.bytes[static_cast<size_t>(c)].count());
  }
  EXPECT_EQ(mid.total().count(), sum);
  EXPECT_GT(sum, 167'503'724'544);
  EXPECT_EQ(mid.capacity.count(), 143'771 * kMiB);
  EXPECT_FALSE(est.verdict.fits);
  EXPECT_LT(est.verdict.headroom.count(), 0);  // headroom is signed by design
}

TEST(HardeningEstimate, ActivationsBeyondInt64Throw) {
  // One GPU, seq_len 2^32 tokens x micro_batch 2^20 sequences x hidden 2^24
  // = 2^76 activation elements in the first saved tensor: past int64.
  const Recipe recipe = MustLoad(R"(model: {pattern: D, repeat: 1, hidden: 16777216, vocab: 1024,
        mlp: {ffn_hidden: 16777216}}
training: {seq_len: 4294967296, micro_batch: 1048576, global_batch: 1048576}
cluster: {nodes: 1, gpus_per_node: 1}
)");
  const Inventory inv = BuildInventory(recipe);
  EXPECT_THROW(EstimateMemory(inv, LayoutOf(recipe), EqualStagePlan(1, 1, 1)), ArithmeticOverflow);
}

}  // namespace
}  // namespace preflight::hardening_estimate_test

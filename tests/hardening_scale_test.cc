// Extreme scale (issue 9, docs/recipe.md "Diagnostics"): a 10-trillion-parameter
// recipe on a million GPUs must give exact figures, and sizes whose products
// leave int64 must raise ArithmeticOverflow, never wrap. Expected values are
// hand computations written out beside them.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "preflight/recipe/diagnostic.h"
#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight::hardening_scale_test {
namespace {

std::string FormatAll(const LoadResult& r) {
  std::string out;
  for (const Diagnostic& d : r.diagnostics) out += Format(d) + "\n";
  return out;
}

Recipe MustLoad(const std::string& yaml) {
  const LoadResult r = LoadRecipeFromString(yaml, "scale.yaml");
  EXPECT_TRUE(r.ok()) << FormatAll(r);
  return r.ok() ? *r.recipe : Recipe{};
}

// 208 dense SwiGLU layers (pattern D) of h = 2^16, f = 2^18, vocab 2^18,
// untied, on 131072 nodes x 8 = 2^20 GPUs (tp 8, pp 16 -> dp 8192).
constexpr const char* kTenTrillion = R"(name: ten-trillion
model:
  pattern: D
  repeat: 208
  hidden: 65536
  vocab: 262144
  mlp: {ffn_hidden: 262144}
training: {seq_len: 8192, micro_batch: 1, global_batch: 262144, optimizer: {matrices: muon}}
parallel: {tp: 8, pp: 16}
cluster: {gpu: h200, nodes: 131072, gpus_per_node: 8}
)";

TEST(HardeningScale, TenTrillionParametersOnAMillionGpusParse) {
  const Recipe r = MustLoad(kTenTrillion);
  EXPECT_EQ(r.model.layers.size(), 208u);
  EXPECT_EQ(r.world(), 1'048'576);        // 131072 x 8 = 2^20
  EXPECT_EQ(r.dp(), 8'192);               // 2^20 / (8 x 1 x 16)
  EXPECT_EQ(r.micro_batches(), 32);       // 262144 / (1 x 8192)
}

TEST(HardeningScale, TenTrillionParametersInventoryIsExact) {
  const Inventory inv = BuildInventory(MustLoad(kTenTrillion));
  // One D layer: RMSNorm weight h + gate_up h x 2f + down f x h
  //   = 65536 + 3 x 65536 x 262144 = 65536 + 51,539,607,552 = 51,539,673,088.
  ASSERT_EQ(inv.layers.size(), 208u);
  EXPECT_EQ(inv.layers[0].totals.total(), 51'539'673'088);
  EXPECT_EQ(inv.layers[207].totals.total(), 51'539'673'088);
  // Whole model: 208 x 51,539,673,088 = 10,720,252,002,304 (layers)
  //   + embedding 262144 x 65536 = 17,179,869,184 + head (untied) 17,179,869,184
  //   + final norm 65536 = 10,754,611,806,208 parameters (about 10.75 T).
  EXPECT_EQ(inv.layer_totals.total(), 10'720'252'002'304);
  EXPECT_EQ(inv.total_params, 10'754'611'806'208);
  EXPECT_EQ(inv.active_params, 10'754'611'806'208);  // dense: every parameter is active
  EXPECT_GT(inv.total_params, 10'000'000'000'000);
  // bf16 copies: 2 bytes each = 21,509,223,612,416 bytes.
  const ParamTotals all = inv.layer_totals + inv.embedding_totals + inv.final_norm_totals + inv.head_totals;
  EXPECT_EQ(all.param_bytes[0] + all.param_bytes[1] + all.param_bytes[2], 21'509'223'612'416);
  // Range sums agree with the per-layer figure: the middle 100 layers.
  EXPECT_EQ(inv.RangeTotals(50, 150).total(), 5'153'967'308'800);  // 100 x 51,539,673,088
  // Muon owns the two matrices of each layer (the recipe sets matrices: muon):
  // 208 x 51,539,607,552 = 10,720,238,370,816.
  EXPECT_EQ(inv.layer_totals.of(OptimizerKind::kMuon), 10'720'238'370'816);
  // Padded vocab: 262144 is already a multiple of 128 x 8 = 1024.
  EXPECT_EQ(PaddedVocab(inv.recipe.model, 8), 262'144);
}

TEST(HardeningScale, ByteFiguresOfTheTenTrillionModelFitInt64) {
  const Inventory inv = BuildInventory(MustLoad(kTenTrillion));
  // Mixed-precision AdamW (bf16 param + fp32 grad + fp32 master + 2 fp32
  // moments = 18 bytes a parameter) for the whole model, unsharded:
  // 18 x 10,754,611,806,208 = 193,583,012,511,744 bytes, far inside int64.
  EXPECT_EQ(BytesOf(inv.total_params, 18).count(), 193'583'012'511'744);
  // ... while the same figure times a million GPUs (a replicated-everywhere
  // bug) leaves int64 and must throw, not wrap: 1.9e14 x 2^20 = 2.0e20 > 9.2e18.
  EXPECT_THROW(BytesOf(inv.total_params, 18) * int64_t{1'048'576}, ArithmeticOverflow);
}

TEST(HardeningScale, ExpertStackBeyondInt64Throws) {
  // One MoE layer with 2^20 experts of h = 2^24, f_e = 2^24: the gate_up stack
  // alone is 2^20 x 2^24 x 2^25 = 2^69 elements, past int64 (2^63 - 1).
  const Recipe r = MustLoad(R"(model:
  pattern: E
  repeat: 1
  hidden: 16777216
  moe: {experts: 1048576, top_k: 1, ffn_hidden: 16777216}
)");
  EXPECT_THROW(BuildInventory(r), ArithmeticOverflow);
}

TEST(HardeningScale, LayerSumBeyondInt64Throws) {
  // 100000 D layers (the layer bound) of h = f = 2^24: each layer is
  // 2^24 + 3 x 2^48 = 844,424,946,909,184 elements (fits), but 100000 of them
  // are 8.4e19 > 9.2e18: the running sum must throw, not wrap.
  const Recipe r = MustLoad(R"(model:
  pattern: D
  repeat: 100000
  hidden: 16777216
  vocab: 1024
  mlp: {ffn_hidden: 16777216}
)");
  EXPECT_THROW(BuildInventory(r), ArithmeticOverflow);
}

TEST(HardeningScale, LargestBoundsStillValidate) {
  // Every degree at a large value: world = 2^24 nodes x 1024 = 2^34 ranks;
  // tp x cp x pp = 2^10 x 2^2 x 2^4 = 2^16 divides it; dp = 2^18.
  // global_batch 2^40 = micro_batch 2^2 x dp 2^18 x m 2^20.
  const Recipe r = MustLoad(R"(model: {pattern: D, repeat: 16, hidden: 16384, mlp: {ffn_hidden: 65536}}
training: {seq_len: 4294967296, micro_batch: 4, global_batch: 1099511627776}
parallel: {tp: 1024, cp: 4, pp: 16}
cluster: {nodes: 16777216, gpus_per_node: 1024}
)");
  EXPECT_EQ(r.world(), int64_t{1} << 34);
  EXPECT_EQ(r.dp(), int64_t{1} << 18);
  EXPECT_EQ(r.micro_batches(), int64_t{1} << 20);
}

TEST(HardeningScale, ProductsOfDegreesThatOverflowAreReported) {
  // tp x cp x pp = 2^24 x 2^24 x 2^24 = 2^72 would wrap int64; validation
  // reports it instead of dividing by a wrapped product.
  const LoadResult r = LoadRecipeFromString(R"(parallel: {tp: 16777216, cp: 16777216, pp: 16777216}
cluster: {nodes: 16777216, gpus_per_node: 1024}
)",
                                            "scale.yaml");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(HasErrors(r.diagnostics)) << FormatAll(r);
}

}  // namespace
}  // namespace preflight::hardening_scale_test

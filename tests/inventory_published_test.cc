// Whole-model parameter counts of published models against their published
// figures. Each expected value names its source. Rounded published figures
// ("46.7B") are checked to their stated precision: |ours - published| <= half
// a unit of the last published digit; exact figures (checkpoint sizes) with EXPECT_EQ.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "preflight/inventory.h"
#include "preflight/recipe.h"
#include "support/test_support.h"

namespace preflight {
namespace {

/// True when `value` rounds to `published` at the precision `half_unit` * 2.
void ExpectRoundsTo(int64_t value, double published, double half_unit) {
  EXPECT_LE(std::abs(static_cast<double>(value) - published), half_unit)
      << value << " does not round to " << published;
}

/// Bytes of all parameter copies, each tensor at its own dtype.
int64_t ParamBytes(const Inventory& inv) {
  const ParamTotals all = inv.layer_totals + inv.embedding_totals + inv.final_norm_totals + inv.head_totals;
  return all.param_bytes[0] + all.param_bytes[1] + all.param_bytes[2];
}

Recipe Llama3_8B() {
  Recipe r;
  r.model.pattern = "AD";
  r.model.repeat = 32;
  r.model.hidden = 4096;
  r.model.vocab = 128256;
  r.model.attention = AttentionConfig{.heads = 32, .kv_heads = 8, .head_dim = 128, .qk_norm = false};
  r.model.mlp = MlpConfig{.ffn_hidden = 14336, .activation = FfnActivation::kSwiglu};
  return r;
}

Recipe Mixtral8x7B() {
  Recipe r;
  r.model.pattern = "AE";
  r.model.repeat = 32;
  r.model.hidden = 4096;
  r.model.vocab = 32000;
  r.model.attention = AttentionConfig{.heads = 32, .kv_heads = 8, .head_dim = 128, .qk_norm = false};
  r.model.moe.experts = 8;
  r.model.moe.top_k = 2;
  r.model.moe.ffn_hidden = 14336;
  r.model.moe.shared_experts = 0;
  return r;
}

Recipe Mamba2_2_7B() {
  Recipe r;
  r.model.pattern = "M";
  r.model.repeat = 64;
  r.model.hidden = 2560;
  r.model.vocab = 50288;
  r.model.tie_embeddings = true;
  r.model.mamba = MambaConfig{.d_state = 128, .d_conv = 4, .expand = 2, .head_dim = 64, .groups = 1, .chunk = 256};
  r.training.precision.params = DType::kFp16;
  return r;
}

Recipe DeepSeekV3() {
  Recipe r;
  r.model.pattern = "AE";
  r.model.repeat = 61;
  r.model.hidden = 7168;
  r.model.vocab = 129280;
  r.model.mla = MlaConfig{};  // the defaults are DeepSeek-V3's ranks
  r.model.mlp = MlpConfig{.ffn_hidden = 18432, .activation = FfnActivation::kSwiglu};
  r.model.moe.experts = 256;
  r.model.moe.top_k = 8;
  r.model.moe.ffn_hidden = 2048;
  r.model.moe.shared_experts = 1;
  r.model.moe.router_bias = true;
  r.model.moe.first_k_dense = 3;
  return r;
}

TEST(InventoryPublished, Llama3_8B) {
  const Inventory inv = BuildInventory(Llama3_8B());
  // Meta-Llama-3-8B on Hugging Face: model.safetensors.index.json total_size 16,060,522,496 bytes
  // of bf16 = 8,030,261,248 parameters (the model page shows "8.03B params").
  EXPECT_EQ(inv.total_params, 8'030'261'248);
  EXPECT_EQ(ParamBytes(inv), 16'060'522'496);
  EXPECT_EQ(inv.active_params, inv.total_params);  // dense
  EXPECT_EQ(inv.layers.size(), 64u);
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kAttention)], 32);
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kDenseMlp)], 32);
}

TEST(InventoryPublished, Mixtral8x7B) {
  const Inventory inv = BuildInventory(Mixtral8x7B());
  // Mistral AI, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts, Dec 2023):
  // "46.7B total parameters but only uses 12.9B parameters per token".
  ExpectRoundsTo(inv.total_params, 46.7e9, 0.05e9);
  ExpectRoundsTo(inv.active_params, 12.9e9, 0.05e9);
  // Mixtral-8x7B-v0.1 model.safetensors.index.json total_size: 93,405,585,408 bytes of bf16.
  EXPECT_EQ(ParamBytes(inv), 93'405'585'408);
}

TEST(InventoryPublished, Mamba2_2_7B) {
  const Inventory inv = BuildInventory(Mamba2_2_7B());
  // Hand count (MATH.md 1.4 with h=2560, d_i=5120, H=80, G=1, N=128, K=4):
  // per layer 2560*10576 + 5376*5 + 3*80 + 5120 + 5120*2560 + 2560 = 40,216,560;
  // 64 layers 2,573,859,840 + tied embedding 50,288*2560 = 128,737,280 + final norm 2,560.
  EXPECT_EQ(inv.total_params, 2'702'599'680);
  // Published: state-spaces/mamba2-2.7b ("2.7b"); its pytorch_model.bin is 5.41 GB
  // (fp16 tensors plus fp32 A_log and D, as the pickle's Half/FloatStorage imports show):
  // 2 * 2,702,599,680 + 2 * (64 * 160) = 5,405,219,840 bytes -> 5.41 GB.
  ExpectRoundsTo(inv.total_params, 2.7e9, 0.05e9);
  EXPECT_EQ(ParamBytes(inv), 5'405'219'840);
  ExpectRoundsTo(ParamBytes(inv), 5.41e9, 0.005e9);
  EXPECT_TRUE(inv.head.empty());
}

TEST(InventoryPublished, DeepSeekV3) {
  const Inventory inv = BuildInventory(DeepSeekV3());
  // DeepSeek-V3 README_WEIGHTS.md: main model (without the 14B MTP module) 671B; the exact
  // element count of the main-model tensors in the HF checkpoint is 671,026,419,200.
  EXPECT_EQ(inv.total_params, 671'026'419'200);
  ExpectRoundsTo(inv.total_params, 671e9, 0.5e9);
  // README_WEIGHTS.md (commit 32950e4): "Activation parameters: 36.6B (including 0.9B for the output
  // Head)", i.e. without the input embedding, which our active_params includes.
  ExpectRoundsTo(inv.active_params - inv.embedding.elements(), 36.6e9, 0.05e9);
  // The paper's headline "37B activated" (arXiv:2412.19437 abstract) is the same figure rounded.
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kDenseMlp)], 3);
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kMoe)], 58);
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kAttention)], 61);
}

}  // namespace
}  // namespace preflight

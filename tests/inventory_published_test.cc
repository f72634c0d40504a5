// Whole-model parameter counts of published models against their published
// figures. Each expected value names its source. Rounded published figures
// ("46.7B") are checked to their stated precision: |ours - published| <= half
// a unit of the last published digit; exact figures (checkpoint sizes) with EXPECT_EQ.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::inventory_published_test {
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

/// Loads a checked-in recipe through the YAML parser; fails the test on any diagnostic.
Recipe Load(const std::string& file) {
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/" + file));
  for (const Diagnostic& d : loaded.diagnostics) ADD_FAILURE() << Format(d);
  return loaded.ok() ? *loaded.recipe : Recipe{};
}

TEST(InventoryPublished, Llama3_8B) {
  const Inventory inv = BuildInventory(Load("llama3-8b-h200.yaml"));
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
  const Inventory inv = BuildInventory(Load("mixtral-8x7b-h200.yaml"));
  // Mistral AI, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts, Dec 2023):
  // "46.7B total parameters but only uses 12.9B parameters per token".
  ExpectRoundsTo(inv.total_params, 46.7e9, 0.05e9);
  ExpectRoundsTo(inv.active_params, 12.9e9, 0.05e9);
  // Hugging Face lists Mixtral-8x7B checkpoints as "46.7B params". The exact bf16 byte count
  // 93,405,585,408 is the index total_size that a public Mixtral expert-selection script
  // hard-codes (found by code search, not read from the HF index file itself).
  EXPECT_EQ(ParamBytes(inv), 93'405'585'408);
}

TEST(InventoryPublished, Mamba2_2_7B) {
  const Inventory inv = BuildInventory(Load("mamba2-2.7b-h200.yaml"));
  // Hand count (docs/formulas.md §1.4 with h=2560, d_i=5120, H=80, G=1, N=128, K=4):
  // per layer 2560*10576 + 5376*5 + 3*80 + 5120 + 5120*2560 + 2560 = 40,216,560;
  // 64 layers 2,573,859,840 + tied embedding 50,288*2560 = 128,737,280 + final norm 2,560.
  EXPECT_EQ(inv.total_params, 2'702'599'680);
  // Published: state-spaces/mamba2-2.7b ("2.7b"); its pytorch_model.bin is 5.41 GB
  // (fp16 tensors plus fp32 A_log and D, as the pickle's Half/FloatStorage imports show;
  // the recipe trains in bf16, also 2 bytes):
  // 2 * 2,702,599,680 + 2 * (64 * 160) = 5,405,219,840 bytes -> 5.41 GB.
  ExpectRoundsTo(inv.total_params, 2.7e9, 0.05e9);
  EXPECT_EQ(ParamBytes(inv), 5'405'219'840);
  ExpectRoundsTo(ParamBytes(inv), 5.41e9, 0.005e9);
  EXPECT_TRUE(inv.head.empty());
}

TEST(InventoryPublished, DeepSeekV3) {
  const Inventory inv = BuildInventory(Load("deepseek-v3-h200.yaml"));
  // DeepSeek-V3 README_WEIGHTS.md: main model (without the MTP module) 671B; the exact
  // element count of the main-model tensors in the HF checkpoint is 671,026,419,200.
  const int64_t mtp = inv.mtp_totals.total();
  EXPECT_EQ(inv.total_params - mtp, 671'026'419'200);
  ExpectRoundsTo(inv.total_params - mtp, 671e9, 0.5e9);
  // The MTP module by hand: one more transformer layer like the last (MLA + MoE), enorm, hnorm
  // and the final norm (h each), and eh_proj 2h x h.
  const int64_t h = 7168;
  const int64_t last_layer = inv.layers[120].totals.total() + inv.layers[121].totals.total();
  EXPECT_EQ(mtp, last_layer + 3 * h + 2 * h * h);
  // README_WEIGHTS.md: "11.5B unique parameters (excluding the shared 0.9B Embedding and 0.9B
  // output Head)" and 2.4B activated including those two. Both match to their rounding without
  // eh_proj (2h x h = 0.10B), which the README's figures leave out; with it they would read 11.6B
  // and 2.5B.
  ExpectRoundsTo(mtp - 2 * h * h, 11.5e9, 0.05e9);
  const int64_t mtp_active = mtp - inv.mtp_inactive;
  ExpectRoundsTo(mtp_active - 2 * h * h + 2 * inv.embedding.elements(), 2.4e9, 0.05e9);
  // README_WEIGHTS.md (commit 32950e4): "Activation parameters: 36.6B (including 0.9B for the output
  // Head)", i.e. without the input embedding, which our active_params includes.
  ExpectRoundsTo(inv.active_params - mtp_active - inv.embedding.elements(), 36.6e9, 0.05e9);
  // The paper's headline "37B activated" (arXiv:2412.19437 abstract) is the same figure rounded.
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kDenseMlp)], 3);
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kMoe)], 58);
  EXPECT_EQ(inv.family_layers[FamilyIndex(BlockKind::kAttention)], 61);
}

TEST(InventoryPublished, DefaultRecipeHandCount) {
  // recipes/nam56r-h200.yaml, AEMEAEMEAEMR x 4 at h = 4096 (docs/formulas.md §1.2-1.6):
  //   A: 4096 x 6144 + 4096 x 4096 + 4096                                  =     41,947,136
  //   E: router 64 x 4096 = 262,144; routed 64 x 3 x 4096 x 2048 = 1,610,612,736;
  //      shared 3 x 4096 x 2048 = 25,165,824; norm 4096                    =  1,636,044,800
  //   M: docs/formulas.md §1.4 example                                               =    109,640,064
  //   R: 4096 + 2 x 4096^2 + 4096 x 5 + 2 (4096^2/32 + 4096) + 4096 + 4096^2 =   51,417,088
  //   period (A E M E A E M E A E M R) 3A + 5E + 3M + R = 8,686,402,688; x 4 = 34,745,610,752
  //   + embedding and head 2 x 131,072 x 4096 = 1,073,741,824 + final norm 4096.
  const Inventory inv = BuildInventory(Load("nam56r-h200.yaml"));
  EXPECT_EQ(inv.total_params, 35'819'356'672);
  // Active: 20 MoE layers touch 2 of 64 experts: minus 20 x 62 x 3 x 4096 x 2048 = 31,205,621,760.
  EXPECT_EQ(inv.active_params, 4'613'734'912);
  EXPECT_EQ(inv.family_layers, (std::array<int64_t, 5>{12, 12, 20, 4, 0}));
}

TEST(InventoryPublished, TensorNamesAreUnique) {
  // Every checked-in recipe names each tensor once (checkpoint-style names are keys).
  for (const char* file : {"nam56r-h200.yaml", "llama3-8b-h200.yaml", "mixtral-8x7b-h200.yaml",
                           "mamba2-2.7b-h200.yaml", "deepseek-v3-h200.yaml"}) {
    const Inventory inv = BuildInventory(Load(file));
    std::vector<std::string> all{inv.embedding.name};
    for (const ParamTensor& t : inv.final_norms) all.push_back(t.name);
    for (const ParamTensor& t : inv.head) all.push_back(t.name);
    for (const Layer& l : inv.layers) {
      for (const ParamTensor& t : l.params) all.push_back(t.name);
    }
    const std::set<std::string> unique(all.begin(), all.end());
    EXPECT_EQ(unique.size(), all.size()) << file;
  }
}

}  // namespace
}  // namespace preflight::inventory_published_test

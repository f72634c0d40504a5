// Whole-model inventory of a tiny hand-countable model: sharding-class and
// optimizer totals, tied vs untied head, padded vocabulary, layer expansion
// (first_k_dense, layer_freq) and the O(1) range queries.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"

namespace preflight::inventory_model_test {
namespace {

constexpr auto kRep = ShardClass::kReplicated;
constexpr auto kTp = ShardClass::kTpSharded;
constexpr auto kEp = ShardClass::kEpSharded;
constexpr auto kMuon = OptimizerKind::kMuon;
constexpr auto kAdamW = OptimizerKind::kAdamW;

/// "AE", h=64, vocab 100, GQA 4/2 heads of 16, 4 experts top-2 with f_e=32, no shared expert.
/// Hand count:
///   A: W_qkv 64 x 128 = 8,192 + W_o 64 x 64 = 4,096 (TP, Muon) + pre-norm 64 (REP)   = 12,352
///   E: routed [4,64,64] + [4,32,64] = 24,576 (EP, Muon) + router 256 + pre-norm 64 (REP, AdamW) = 24,896
///   embedding 100 x 64 = 6,400 and head 6,400 (TP, AdamW), final norm 64 (REP)
///   total 50,112 = REP 448 + TP 25,088 + EP 24,576; Muon 36,864 + AdamW 13,248.
Recipe Tiny() {
  Recipe r;
  r.model.pattern = "AE";
  r.model.repeat = 1;
  r.model.hidden = 64;
  r.model.vocab = 100;
  r.model.attention = AttentionConfig{.heads = 4, .kv_heads = 2, .head_dim = 16, .qk_norm = false};
  r.model.moe.experts = 4;
  r.model.moe.top_k = 2;
  r.model.moe.ffn_hidden = 32;
  r.model.moe.shared_experts = 0;
  r.training.optimizer.matrices = OptimizerKind::kMuon;  // the Muon / AdamW split above
  return r;
}

TEST(InventoryModel, ShardingClassTotals) {
  const Inventory inv = BuildInventory(Tiny());
  EXPECT_EQ(inv.total_params, 50'112);
  ParamTotals all = inv.layer_totals + inv.embedding_totals + inv.final_norm_totals + inv.head_totals;
  EXPECT_EQ(all.total(), 50'112);
  EXPECT_EQ(all.of(kRep), 448);
  EXPECT_EQ(all.of(kTp), 25'088);
  EXPECT_EQ(all.of(kEp), 24'576);
  // Fractions: REP 448/50,112 = 0.894 %, TP 50.06 %, EP 49.04 %.
  EXPECT_NEAR(static_cast<double>(all.of(kRep)) / 50'112.0, 0.00894, 1e-5);
  EXPECT_EQ(inv.embedding.split, Split::kVocab);
  EXPECT_EQ(inv.embedding.shape, (std::vector<int64_t>{100, 64}));
  ASSERT_EQ(inv.head.size(), 1u);
  EXPECT_EQ(inv.head[0].split, Split::kVocab);
  EXPECT_EQ(inv.final_norm.split, Split::kReplicated);
}

TEST(InventoryModel, OptimizerAssignment) {
  Recipe r = Tiny();
  const Inventory muon = BuildInventory(r);
  ParamTotals all = muon.layer_totals + muon.embedding_totals + muon.final_norm_totals + muon.head_totals;
  EXPECT_EQ(all.of(kMuon), 36'864);
  EXPECT_EQ(all.of(kAdamW), 13'248);  // norms 192 + router 256 + embedding and head 12,800
  EXPECT_EQ(muon.embedding.optimizer, kAdamW);
  EXPECT_EQ(muon.head[0].optimizer, kAdamW);

  // matrices: adamw sends every Muon tensor to AdamW.
  r.training.optimizer.matrices = kAdamW;
  r.training.optimizer.mamba_in_proj = kMuon;  // meaningless without Muon: stays AdamW
  const Inventory adamw = BuildInventory(r);
  EXPECT_EQ(adamw.layer_totals.of(kMuon), 0);
  EXPECT_EQ(adamw.layer_totals.of(kAdamW), 12'352 + 24'896);
  EXPECT_EQ(adamw.max_muon_matrix_elements, 0);
}

TEST(InventoryModel, LargestMuonMatrixIsPerExpert) {
  // W_qkv 64 x 128 = 8,192 is larger than any single expert matrix (64 x 64, 32 x 64); the
  // stack [4,64,64] (16,384) must not count as one matrix.
  const Inventory inv = BuildInventory(Tiny());
  EXPECT_EQ(inv.max_muon_matrix_elements, 8'192);
  EXPECT_EQ(inv.layers[0].max_muon_matrix_elements, 8'192);
  EXPECT_EQ(inv.layers[1].max_muon_matrix_elements, 4'096);  // one expert's gate+up, 64 x 64
}

TEST(InventoryModel, TiedHeadDropsTheHead) {
  Recipe r = Tiny();
  r.model.tie_embeddings = true;
  const Inventory inv = BuildInventory(r);
  EXPECT_TRUE(inv.head.empty());
  EXPECT_EQ(inv.head_totals.total(), 0);
  EXPECT_EQ(inv.total_params, 50'112 - 6'400);
  EXPECT_EQ(inv.active_params, BuildInventory(Tiny()).active_params - 6'400);
}

TEST(InventoryModel, ActiveParams) {
  // Active: A 12,352 + E (24,896 - 24,576 + 2 * 3 * 64 * 32 = 12,608) + 6,400 + 6,400 + 64 = 37,824.
  const Inventory inv = BuildInventory(Tiny());
  EXPECT_EQ(inv.layers[1].active_elements, 12'608);
  EXPECT_EQ(inv.active_params, 37'824);
}

TEST(InventoryModel, PaddedVocab) {
  ModelConfig m;
  m.vocab = 100;
  m.vocab_pad_multiple = 128;
  EXPECT_EQ(PaddedVocab(m, 1), 128);
  EXPECT_EQ(PaddedVocab(m, 4), 512);  // multiple of 128 * 4
  // Llama-3 vocab 128,256 = 1,002 * 128: unpadded at TP 1, 126 * 1,024 = 129,024 at TP 8.
  m.vocab = 128'256;
  EXPECT_EQ(PaddedVocab(m, 1), 128'256);
  EXPECT_EQ(PaddedVocab(m, 8), 129'024);
  // mamba_ssm pads vocab_size 50,277 with pad_vocab_size_multiple 16 to 50,288, the
  // embedding row count of the state-spaces/mamba2-* checkpoints (HF config.json).
  m.vocab = 50'277;
  m.vocab_pad_multiple = 16;
  EXPECT_EQ(PaddedVocab(m, 1), 50'288);
  // Counts stay logical: the embedding holds the configured vocab.
  EXPECT_EQ(BuildInventory(Tiny()).embedding.elements(), 6'400);
}

std::vector<BlockKind> Kinds(const char* letters) {
  std::vector<BlockKind> out;
  for (const char* c = letters; *c != '\0'; ++c) out.push_back(static_cast<BlockKind>(*c));
  return out;
}

std::vector<BlockKind> KindsOf(const Inventory& inv) {
  std::vector<BlockKind> out;
  for (const Layer& l : inv.layers) out.push_back(l.kind);
  return out;
}

TEST(InventoryModel, FirstKDenseAndLayerFreq) {
  Recipe r = Tiny();
  r.model.repeat = 4;
  r.model.mlp = MlpConfig{.ffn_hidden = 128, .activation = FfnActivation::kSwiglu};
  r.model.moe.first_k_dense = 1;
  Inventory inv = BuildInventory(r);
  EXPECT_EQ(KindsOf(inv), Kinds("ADAEAEAE"));
  EXPECT_EQ(inv.recipe.model.layers, Kinds("ADAEAEAE"));
  // The dense slot uses model.mlp: 64 x 256 + 128 x 64 + 64 = 24,640.
  EXPECT_EQ(inv.layers[1].totals.total(), 24'640);
  EXPECT_EQ(inv.family_layers, (std::array<int64_t, 5>{4, 0, 3, 0, 1}));
  EXPECT_EQ(inv.family_params, (std::array<int64_t, 5>{4 * 12'352, 0, 3 * 24'896, 0, 24'640}));
  // 4 A + 3 E + 1 D + embedding, head, final norm.
  EXPECT_EQ(inv.total_params, 4 * 12'352 + 3 * 24'896 + 24'640 + 12'864);

  // Every other E slot after the first dense one: slots 1 and 3 are MoE.
  r.model.moe.layer_freq = 2;
  EXPECT_EQ(KindsOf(BuildInventory(r)), Kinds("ADAEADAE"));
  r.model.moe.layer_offset = 1;
  EXPECT_EQ(KindsOf(BuildInventory(r)), Kinds("ADADAEAD"));
  r.model.moe.first_k_dense = 0;
  r.model.moe.layer_offset = 0;
  EXPECT_EQ(KindsOf(BuildInventory(r)), Kinds("AEADAEAD"));
}

TEST(InventoryModel, ExpansionAgreesWithTheParser) {
  // The same E-slot rule through the YAML parser (which fills model.layers) and through
  // ExpandedLayers (recipes built in C++): slots 0..3, first 1 dense, then j' = 0, 1, 2 with
  // j' % 2 == 1 MoE -> A D A D A E A D.
  const LoadResult loaded = LoadRecipeFromString(
      "model:\n"
      "  pattern: AE\n"
      "  repeat: 4\n"
      "  moe: {experts: 8, top_k: 2, ffn_hidden: 256, first_k_dense: 1, layer_freq: 2, layer_offset: 1}\n"
      "parallel: {tp: 1, sp: false, ep: 8}\n",
      "expansion.yaml");
  for (const Diagnostic& d : loaded.diagnostics) ADD_FAILURE() << Format(d);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded.recipe->model.layers, Kinds("ADADAEAD"));
  EXPECT_EQ(KindsOf(BuildInventory(*loaded.recipe)), Kinds("ADADAEAD"));
  Recipe unparsed = *loaded.recipe;
  unparsed.model.layers.clear();
  EXPECT_EQ(ExpandedLayers(unparsed.model), Kinds("ADADAEAD"));
}

TEST(InventoryModel, ParsedLayerListWins) {
  // When the parser has expanded the layers, the inventory takes them as they are.
  Recipe r = Tiny();
  r.model.layers = Kinds("EAA");
  const Inventory inv = BuildInventory(r);
  EXPECT_EQ(KindsOf(inv), Kinds("EAA"));
  EXPECT_EQ(inv.layers[2].params[0].name, "layers.2.norm.weight");
}

TEST(InventoryModel, RangeQueriesMatchLayerSums) {
  Recipe r = Tiny();
  r.model.repeat = 3;  // A E A E A E
  const Inventory inv = BuildInventory(r);
  ASSERT_EQ(inv.prefix_totals.size(), 7u);
  EXPECT_EQ(inv.RangeTotals(0, 6), inv.layer_totals);
  EXPECT_EQ(inv.RangeTotals(0, 6).total(), 3 * (12'352 + 24'896));
  EXPECT_EQ(inv.RangeTotals(1, 2), inv.layers[1].totals);
  EXPECT_EQ(inv.RangeTotals(2, 5).of(kEp), 24'576);  // layers A E A: one E
  EXPECT_EQ(inv.RangeTotals(3, 3).total(), 0);
  EXPECT_EQ(inv.RangeActive(0, 2), 12'352 + 12'608);
  EXPECT_EQ(inv.RangeFamilyLayers(1, 6), (std::array<int64_t, 5>{2, 0, 3, 0, 0}));
  EXPECT_EQ(inv.family_totals[2].of(kEp), 3 * 24'576);
}

TEST(InventoryModel, RecomputeDerivedAfterHandEdits) {
  // Fixtures may set per-layer totals by hand; the derived sums follow.
  Inventory inv = BuildInventory(Tiny());
  inv.layers[0].totals = ParamTotals{};
  inv.layers[0].totals.elements[0][0] = 1'000;  // REP, AdamW
  inv.layers[0].active_elements = 1'000;
  inv.head.clear();
  RecomputeDerived(inv);
  // 1,000 + E 24,896 + embedding 6,400 + final norm 64, no head.
  EXPECT_EQ(inv.total_params, 32'360);
  EXPECT_EQ(inv.RangeTotals(0, 1).total(), 1'000);
  EXPECT_EQ(inv.family_params[FamilyIndex(BlockKind::kAttention)], 1'000);
  EXPECT_EQ(inv.head_totals.total(), 0);
  EXPECT_EQ(inv.active_params, 1'000 + 12'608 + 6'464);
}

TEST(InventoryModel, AbsentTensorHasNoElements) {
  EXPECT_EQ(ParamTensor{}.elements(), 0);
  EXPECT_EQ((ParamTensor{.name = "x", .shape = {3, 0, 5}}).elements(), 0);
  EXPECT_EQ((ParamTensor{.name = "x", .shape = {3, 4, 5}}).elements(), 60);
}

TEST(InventoryModel, OverflowIsAnError) {
  Recipe r = Tiny();
  r.model.hidden = int64_t{1} << 40;  // the embedding, 2^40 x 2^40 elements, leaves int64
  r.model.vocab = int64_t{1} << 40;
  EXPECT_THROW(BuildInventory(r), ArithmeticOverflow);
}

}  // namespace
}  // namespace preflight::inventory_model_test

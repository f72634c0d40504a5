// Per-block parameter counts, shapes, splits and optimizers against hand
// counts written out beside each expected value (docs/formulas.md §1).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"

namespace preflight::inventory_blocks_test {
namespace {

/// A one-layer model of block `letter` with a small hidden size.
Recipe OneBlock(char letter, int64_t hidden) {
  Recipe r;
  r.model.pattern = std::string(1, letter);
  r.model.repeat = 1;
  r.model.hidden = hidden;
  r.model.vocab = 100;
  r.training.optimizer.matrices = OptimizerKind::kMuon;  // the owners below are Muon's split
  return r;
}

const ParamTensor& Find(const Layer& layer, const std::string& suffix) {
  for (const ParamTensor& t : layer.params) {
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return t;
    }
  }
  ADD_FAILURE() << "no tensor ending in " << suffix;
  static const ParamTensor kNone;
  return kNone;
}

constexpr auto kRep = ShardClass::kReplicated;
constexpr auto kTp = ShardClass::kTpSharded;
constexpr auto kEp = ShardClass::kEpSharded;
constexpr auto kMuon = OptimizerKind::kMuon;
constexpr auto kAdamW = OptimizerKind::kAdamW;

TEST(InventoryBlocks, MambaMatchesMathExample) {
  // docs/formulas.md §1.4 example: h=4096, d_i=8192, P=64 -> H=128, G=8, N=128, K=4: P_M = 109,640,064.
  Recipe r = OneBlock('M', 4096);
  r.model.mamba = MambaConfig{.d_state = 128, .d_conv = 4, .expand = 2, .head_dim = 64, .groups = 8, .chunk = 256};
  const Inventory inv = BuildInventory(r);
  ASSERT_EQ(inv.layers.size(), 1u);
  const Layer& m = inv.layers[0];
  EXPECT_EQ(m.totals.total(), 109'640'064);
  EXPECT_EQ(m.active_elements, 109'640'064);
  // in_proj: h x (2*8192 + 2*8*128 + 128) = 4096 x 18560, column-parallel, AdamW (Megatron in_proj.use_muon=False).
  const ParamTensor& in_proj = Find(m, "mixer.in_proj.weight");
  EXPECT_EQ(in_proj.name, "layers.0.mixer.in_proj.weight");
  EXPECT_EQ(in_proj.shape, (std::vector<int64_t>{4096, 18560}));
  EXPECT_EQ(in_proj.split, Split::kTpColumn);
  EXPECT_EQ(in_proj.optimizer, kAdamW);
  // conv over [x, B, C]: 8192 + 2048 = 10240 channels, K = 4.
  EXPECT_EQ(Find(m, "mixer.conv1d.weight").shape, (std::vector<int64_t>{10240, 4}));
  EXPECT_EQ(Find(m, "mixer.conv1d.bias").split, Split::kTpChannel);
  // A_log and D stay fp32 (Megatron), dt_bias takes the parameter dtype.
  EXPECT_EQ(Find(m, "mixer.A_log").dtype, DType::kFp32);
  EXPECT_EQ(Find(m, "mixer.D").dtype, DType::kFp32);
  EXPECT_EQ(Find(m, "mixer.dt_bias").dtype, DType::kBf16);
  EXPECT_EQ(Find(m, "mixer.norm.weight").shape, (std::vector<int64_t>{8192}));
  EXPECT_EQ(Find(m, "mixer.out_proj.weight").split, Split::kTpRow);
  // Muon owns only out_proj: 8192 * 4096 = 33,554,432. REP is the pre-norm alone (4096).
  EXPECT_EQ(m.totals.of(kMuon), 33'554'432);
  EXPECT_EQ(m.totals.of(kAdamW), 109'640'064 - 33'554'432);
  EXPECT_EQ(m.totals.of(kRep), 4096);
  EXPECT_EQ(m.totals.of(kTp), 109'640'064 - 4096);
  EXPECT_EQ(m.totals.of(kEp), 0);
  // Param-copy bytes: bf16 everywhere except A_log, D (2 x 128 fp32):
  // 2 * 109,640,064 + 2 * 256 = 219,280,640 (all but the pre-norm are TP).
  EXPECT_EQ(m.totals.param_bytes[1] + m.totals.param_bytes[0], 219'280'640);
}

TEST(InventoryBlocks, MambaInProjFollowsKnob) {
  Recipe r = OneBlock('M', 4096);
  r.model.mamba = MambaConfig{.d_state = 128, .d_conv = 4, .expand = 2, .head_dim = 64, .groups = 8, .chunk = 256};
  r.training.optimizer.mamba_in_proj = kMuon;
  const Inventory inv = BuildInventory(r);
  // Muon: out_proj 33,554,432 + in_proj 4096 * 18560 = 76,021,760.
  EXPECT_EQ(inv.layers[0].totals.of(kMuon), 33'554'432 + 76'021'760);
}

TEST(InventoryBlocks, SmallGqaBlock) {
  // h=64, n_q=4, n_kv=2, d_h=16: W_qkv 64 x (4+4)*16 = 8192, W_o 64 x 64 = 4096, pre-norm 64 -> 12,352.
  Recipe r = OneBlock('A', 64);
  r.model.attention = AttentionConfig{.heads = 4, .kv_heads = 2, .head_dim = 16, .qk_norm = false};
  const Inventory inv = BuildInventory(r);
  const Layer& a = inv.layers[0];
  EXPECT_EQ(a.totals.total(), 12'352);
  EXPECT_EQ(Find(a, "mixer.qkv_proj.weight").shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(Find(a, "mixer.qkv_proj.weight").split, Split::kTpColumn);
  EXPECT_EQ(Find(a, "mixer.o_proj.weight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(Find(a, "mixer.o_proj.weight").split, Split::kTpRow);
  EXPECT_EQ(Find(a, "norm.weight").name, "layers.0.norm.weight");
  EXPECT_EQ(a.totals.of(kTp, kMuon), 12'288);
  EXPECT_EQ(a.totals.of(kRep, kAdamW), 64);
  EXPECT_EQ(a.totals.of(kTp, kAdamW) + a.totals.of(kRep, kMuon) + a.totals.of(kEp), 0);

  // qk-norm adds two replicated d_h = 16 weights: 12,352 + 32.
  r.model.attention.qk_norm = true;
  const Inventory with_norm = BuildInventory(r);
  EXPECT_EQ(with_norm.layers[0].totals.total(), 12'384);
  EXPECT_EQ(with_norm.layers[0].totals.of(kRep, kAdamW), 96);
}

TEST(InventoryBlocks, MlaMatchesDeepSeekV3Table) {
  // docs/formulas.md §1.3 with DeepSeek-V3 ranks (h=7168, n_q=128, d_cq=1536, d_c=512, nope 128, rope 64, v 128):
  // W_dq 7168*1536 = 11,010,048; q-norm 1,536; W_uq 1536*128*192 = 37,748,736;
  // W_dkv 7168*576 = 4,128,768; kv-norm 512; W_ukv 512*128*256 = 16,777,216; W_o 16384*7168 = 117,440,512;
  // sum 187,107,328, plus the 7,168 pre-norm = 187,114,496.
  Recipe r = OneBlock('A', 7168);
  r.model.mla = MlaConfig{};
  const Inventory inv = BuildInventory(r);
  const Layer& a = inv.layers[0];
  EXPECT_EQ(a.totals.total(), 187'114'496);
  // REP: W_dq + q-norm + W_dkv + kv-norm + pre-norm = 11,010,048 + 1,536 + 4,128,768 + 512 + 7,168.
  EXPECT_EQ(a.totals.of(kRep), 15'148'032);
  EXPECT_EQ(a.totals.of(kTp), 37'748'736 + 16'777'216 + 117'440'512);
  // AdamW: the three norms 1,536 + 512 + 7,168; everything else is a Muon matrix.
  EXPECT_EQ(a.totals.of(kAdamW), 9'216);
  EXPECT_EQ(Find(a, "mixer.q_a_proj.weight").split, Split::kReplicated);
  EXPECT_EQ(Find(a, "mixer.q_a_proj.weight").optimizer, kMuon);
  EXPECT_EQ(Find(a, "mixer.kv_b_proj.weight").shape, (std::vector<int64_t>{512, 32768}));
}

TEST(InventoryBlocks, MlaWithoutQueryCompression) {
  // h=64, n_q=4, q_lora 0, d_c=16, nope 8, rope 4, v 8: W_q 64 x 4*12 = 3,072 (TP column, no q-norm);
  // W_dkv 64 x 20 = 1,280; kv-norm 16; W_ukv 16 x 4*16 = 1,024; W_o 32 x 64 = 2,048; pre-norm 64 -> 7,504.
  Recipe r = OneBlock('A', 64);
  r.model.mla = MlaConfig{.heads = 4, .q_lora_rank = 0, .kv_lora_rank = 16, .qk_rope_head_dim = 4,
                          .qk_nope_head_dim = 8, .v_head_dim = 8};
  const Inventory inv = BuildInventory(r);
  const Layer& a = inv.layers[0];
  EXPECT_EQ(a.totals.total(), 7'504);
  EXPECT_EQ(Find(a, "mixer.q_proj.weight").split, Split::kTpColumn);
  EXPECT_EQ(a.params.size(), 6u);  // norm, q_proj, kv_a_proj, kv_a_norm, kv_b_proj, o_proj
  EXPECT_EQ(a.totals.of(kTp), 3'072 + 1'024 + 2'048);
}

TEST(InventoryBlocks, RecurrentMatchesMathFormula) {
  // docs/formulas.md §1.6, h=64, d_r=96, n_b=4, K_r=4:
  // P_R = h + 2 h d_r + d_r (K_r+1) + 2 (d_r^2/n_b + d_r) + d_r + d_r h
  //     = 64 + 12,288 + 480 + 2 (2,304 + 96) + 96 + 6,144 = 23,872.
  Recipe r = OneBlock('R', 64);
  r.model.recurrent = RecurrentConfig{.width = 96, .heads = 4, .d_conv = 4};
  const Inventory inv = BuildInventory(r);
  const Layer& b = inv.layers[0];
  EXPECT_EQ(b.totals.total(), 23'872);
  // Muon: W_g, W_u (64 x 96 each) and W_o (96 x 64) = 18,432. The block-diagonal
  // gates [4, 24, 24] are AdamW with the other per-channel tensors: 64 + 480 + 4,800 + 96 = 5,440.
  EXPECT_EQ(b.totals.of(kMuon), 18'432);
  EXPECT_EQ(b.totals.of(kAdamW), 5'440);
  EXPECT_EQ(Find(b, "mixer.rg_lru.input_gate.weight").shape, (std::vector<int64_t>{4, 24, 24}));
  EXPECT_EQ(Find(b, "mixer.rg_lru.input_gate.weight").split, Split::kTpChannel);
  EXPECT_EQ(Find(b, "mixer.gate_proj.weight").split, Split::kTpColumn);
  EXPECT_EQ(Find(b, "mixer.out_proj.weight").split, Split::kTpRow);
  EXPECT_EQ(b.totals.of(kRep), 64);
}

TEST(InventoryBlocks, MoeWithSharedExpertRouterBiasAndGate) {
  // h=64, E=4, k=2, f_e=32, one shared expert (f_sh = 32), router bias, shared gate:
  // router 4 x 64 = 256, gate 64, pre-norm 64 (REP, trained: 384), and the
  // expert bias 4, an untrained fp32 buffer (Megatron router.py register_buffer);
  // routed [4,64,64] 16,384 + [4,32,64] 8,192 = 24,576 (EP);
  // shared 64 x 64 = 4,096 + 32 x 64 = 2,048 (TP: 6,144). Total 31,108.
  Recipe r = OneBlock('E', 64);
  r.model.moe.experts = 4;
  r.model.moe.top_k = 2;
  r.model.moe.ffn_hidden = 32;
  r.model.moe.shared_experts = 1;
  r.model.moe.router_bias = true;
  r.model.moe.shared_gate = true;
  const Inventory inv = BuildInventory(r);
  const Layer& e = inv.layers[0];
  EXPECT_EQ(e.totals.total(), 31'108);
  EXPECT_EQ(e.totals.of(kRep), 384);
  EXPECT_EQ(e.totals.buffer_elements[0], 4);
  EXPECT_EQ(e.totals.of(kTp), 6'144);
  EXPECT_EQ(e.totals.of(kEp), 24'576);
  EXPECT_EQ(e.totals.of(kEp, kMuon), 24'576);
  EXPECT_EQ(e.totals.of(kRep, kAdamW), 384);  // the router goes to AdamW by default (docs/formulas.md §2.4)
  // Active: all but routed experts, plus k * 3 h f_e = 2 * 3 * 64 * 32 = 12,288 -> 6,532 + 12,288.
  EXPECT_EQ(e.active_elements, 18'820);
  EXPECT_EQ(Find(e, "mlp.experts.gate_up_proj").shape, (std::vector<int64_t>{4, 64, 64}));
  EXPECT_EQ(Find(e, "mlp.experts.down_proj").shape, (std::vector<int64_t>{4, 32, 64}));

  // Router to Muon: its 256 elements move over.
  r.training.optimizer.router = kMuon;
  EXPECT_EQ(BuildInventory(r).layers[0].totals.of(kRep, kMuon), 256);

  // shared_ffn_hidden overrides shared_experts * ffn_hidden: f_sh = 48 -> 64*96 + 48*64 = 9,216.
  r.model.moe.shared_ffn_hidden = 48;
  EXPECT_EQ(BuildInventory(r).layers[0].totals.of(kTp), 9'216);
}

TEST(InventoryBlocks, DenseMlpSwigluAndGelu) {
  // SwiGLU h=64, f=128: 64 x 256 + 128 x 64 = 24,576, + pre-norm 64.
  Recipe r = OneBlock('D', 64);
  r.model.mlp = MlpConfig{.ffn_hidden = 128, .activation = FfnActivation::kSwiglu};
  EXPECT_EQ(BuildInventory(r).layers[0].totals.total(), 24'640);
  // GeLU: 64 x 128 + 128 x 64 = 16,384, + 64.
  r.model.mlp.activation = FfnActivation::kGelu;
  const Inventory gelu = BuildInventory(r);
  EXPECT_EQ(gelu.layers[0].totals.total(), 16'448);
  EXPECT_EQ(gelu.layers[0].totals.of(kMuon), 16'384);
}

TEST(InventoryBlocks, LayerNormAddsBiases) {
  // LayerNorm: weight + bias for the pre-norm and the final norm (h = 64 each).
  Recipe r = OneBlock('D', 64);
  r.model.mlp = MlpConfig{.ffn_hidden = 128, .activation = FfnActivation::kGelu};
  r.model.norm = NormKind::kLayerNorm;
  const Inventory inv = BuildInventory(r);
  EXPECT_EQ(inv.layers[0].totals.total(), 16'384 + 128);
  EXPECT_EQ(Find(inv.layers[0], "norm.bias").shape, (std::vector<int64_t>{64}));
  ASSERT_EQ(inv.final_norms.size(), 2u);
  EXPECT_EQ(inv.final_norms[1].name, "final_norm.bias");
  EXPECT_EQ(inv.final_norm_totals.total(), 128);
}

TEST(InventoryBlocks, ParamDtypeFollowsPrecision) {
  Recipe r = OneBlock('M', 64);
  r.model.mamba = MambaConfig{.d_state = 16, .d_conv = 4, .expand = 2, .head_dim = 16, .groups = 1, .chunk = 64};
  r.training.precision.params = DType::kFp8;
  const Inventory inv = BuildInventory(r);
  for (const ParamTensor& t : inv.layers[0].params) {
    const bool fp32 = t.name.ends_with("A_log") || t.name.ends_with(".D");
    EXPECT_EQ(t.dtype, fp32 ? DType::kFp32 : DType::kFp8) << t.name;
  }
  EXPECT_EQ(inv.embedding.dtype, DType::kFp8);
}

}  // namespace
}  // namespace preflight::inventory_blocks_test

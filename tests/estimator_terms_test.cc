// Per-term formulas against docs/formulas.md's hand-worked examples and the MoE
// capacity example of the estimator brief. Every expected value is worked out
// by hand in the comment beside it.
#include <cstdint>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"
#include "preflight/estimator/memory_terms.h"
#include "support/test_support.h"

namespace preflight::estimator_terms_test {
namespace {

/// docs/formulas.md §3.2's example shape: h 4096, 32 query / 8 KV heads of 128; Mamba
/// d_i 8192 (expand 2), P 64 -> H 128, G 8, N 128; bf16 activations, RMSNorm.
Recipe MathRecipe() {
  Recipe r = testing::SmallRecipe();
  r.model.hidden = 4096;
  r.model.attention = {32, 8, 128, false};
  r.model.mamba = {128, 4, 2, 64, 8, 256, false};
  return r;
}

TEST(ActivationPerToken, GqaAttentionMathExample) {
  // docs/formulas.md §3.2: a_A = 4h + 2(2n_q + 2n_kv)d_h + 4n_q + 4
  //            = 16384 + 2*80*128 + 128 + 4 = 36,996 B/token.
  const TokenBytes a = SavedBytesPerToken(MathRecipe(), BlockKind::kAttention, Recompute::kNone, 1, 1);
  EXPECT_EQ(a.total(), 36'996);
  // Selective (core_attn) drops only the fp32 LSE, 4 n_q = 128 B (docs/formulas.md §3.3).
  EXPECT_EQ(SavedBytesPerToken(MathRecipe(), BlockKind::kAttention, Recompute::kSelective, 1, 1).total(),
            36'996 - 128);
}

TEST(ActivationPerToken, KorthikantiAssumptionsOneAtATime) {
  // From a_A = 36,996 (docs/formulas.md §3.2, s 8192):
  // - no flash, no dropout: the LSE (4 n_q = 128) goes, the bf16 softmax output
  //   n_q * s * 2 = 32 * 8192 * 2 = 524,288 B/token comes, and K and V are
  //   kept repeated to the 32 query heads (Megatron's unfused core
  //   repeat_interleaves them), 2 (n_q - n_kv) d_h * 2 = 12,288 more: 573,444;
  // - flash with dropout 0.1: no s-term (flash regenerates its mask), but the
  //   residual dropout mask, 1 B x h = 4096: 41,092.
  Recipe r = MathRecipe();
  r.training.seq_len = 8192;
  r.training.flash_attention = false;
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kAttention, Recompute::kNone, 1, 1).total(), 573'444);
  r.training.flash_attention = true;
  r.training.dropout = 0.1;
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kAttention, Recompute::kNone, 1, 1).total(), 41'092);
}

TEST(ActivationPerToken, MlaDeepSeekV3Shape) {
  // docs/formulas.md §3.2, MLA, no recompute, at DeepSeek-V3's shape (h 7168, n_q 128,
  // d_cq 1536, d_c 512, d_rope 64, d_nope 128, d_v 128), bf16:
  // 2h + 2h + 2(d_cq + d_c + d_rope) + 2(d_cq + d_c) + 2 n_q (2(d_nope + d_rope) + d_v)
  // + 2 n_q d_v + 4 n_q = 14336 + 14336 + 4224 + 4096 + 131072 + 32768 + 512 = 201,344,
  // + fp32 rstd of the pre-norm, q-norm and kv-norm (3 x 4 B, not in docs/formulas.md).
  Recipe r = MathRecipe();
  r.model.hidden = 7168;
  r.model.mla = MlaConfig{};
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kAttention, Recompute::kNone, 1, 1).total(), 201'344 + 12);
  // Of which REP (residual stream, latents): 28672 + 4224 + 4096 + 12 = 37,004.
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kAttention, Recompute::kNone, 1, 1).replicated, 37'004);
}

TEST(ActivationPerToken, MambaMegatronAndFusedPaths) {
  // docs/formulas.md §3.2: a_M (MG) = 4h + 10d_i + 4GN + 2H + 4G = 102,688 B/token;
  // fused (MS) 4h + 6d_i + 4GN + 2H + 4G = 69,920. docs/formulas.md's a_M omits the
  // pre-norm rstd (fp32, 4 B) that its a_A counts; we charge it to every
  // block, so both add 4.
  Recipe r = MathRecipe();
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kMamba, Recompute::kNone, 1, 1).total(), 102'688 + 4);
  r.model.mamba.fused_norm_out_proj = true;
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kMamba, Recompute::kNone, 1, 1).total(), 69'920 + 4);
}

TEST(RecipeKnobs, FusedMambaPathAndCapacityOverride) {
  // nam56r's Mamba is docs/formulas.md's example shape; the fused path gives
  // 69,920 + 4 B/token (see above). cluster.capacity_mib overrides the preset
  // (H100 80GB HBM3 as nvidia-smi shows it: 81559 MiB).
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"),
                                           {{"model.mamba.fused_norm_out_proj", "true"},
                                            {"cluster.capacity_mib", "81559"}});
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(SavedBytesPerToken(*loaded.recipe, BlockKind::kMamba, Recompute::kNone, 1, 1).total(), 69'920 + 4);
  const Inventory inv = testing::HybridInventory(*loaded.recipe, "AEMR", 1);
  const Layout l = testing::LayoutFor(inv.recipe, 8, 1, 1, 1);
  EXPECT_EQ(EstimateRank(inv, l, EqualStagePlan(4, 1, 1), 0).capacity.count(), 81559 * kMiB);
}

TEST(ActivationPerToken, MambaGroupRepeatUnderContextParallel) {
  // G 8 over t 4 leaves 2 groups per TP rank; c 8 > 2 repeats B and C
  // r_g = 8/2 = 4 times (docs/formulas.md §1.4): the 4GN term becomes 4GN*4,
  // 4*8*128*3 = 12,288 B more per token.
  EXPECT_EQ(MambaGroupRepeat(MathRecipe().model.mamba, 4, 8), 4);
  EXPECT_EQ(SavedBytesPerToken(MathRecipe(), BlockKind::kMamba, Recompute::kNone, 4, 8).total(),
            102'688 + 4 + 12'288);
}

TEST(ActivationPerToken, MambaHandoffKeepsTheReceivedStatesAndRepeatsNothing) {
  // CP hand-off [OURS]: per received edge the conv tail (K-1) b (d_i + 2GN)/t
  // x 2 B = 3 x (8192 + 2048)/4 x 2 = 15,360 and the fp32 SSM state
  // b (H/t) P N x 4 = 32 x 64 x 128 x 4 = 1,048,576: 1,063,936 per edge; the
  // worst rank receives 2 with load balancing and c >= 3, else 1.
  Recipe r = MathRecipe();
  r.training.seq_len = 8192;
  Layout l;
  l.tp = 4;
  l.cp = 8;
  l.micro_batch = 1;
  l.recompute = Recompute::kNone;
  l.cp_recurrent = CpRecurrent::kHandoff;
  EXPECT_EQ(MambaHandoffStateBytes(r, l).count(), 2 * 1'063'936);
  l.cp_load_balance = false;
  EXPECT_EQ(MambaHandoffStateBytes(r, l).count(), 1'063'936);
  l.cp_load_balance = true;
  // Against all-to-all at the same degrees: no r_g = 4 repeat of B and C
  // (12,288 B/token global, /t = 3072 B x 1024 tokens = 3,145,728 B less), plus the states.
  Layout a2a = l;
  a2a.cp_recurrent = CpRecurrent::kAllToAll;
  EXPECT_EQ(MambaHandoffStateBytes(r, a2a).count(), 0);
  EXPECT_EQ(LayerActivations(r, l, BlockKind::kMamba).count(),
            LayerActivations(r, a2a, BlockKind::kMamba).count() - 3'145'728 + 2 * 1'063'936);
  l.cp = 1;
  EXPECT_EQ(MambaHandoffStateBytes(r, l).count(), 0);
}

TEST(ActivationPerToken, RecurrentAndDense) {
  // docs/formulas.md §3.2: a_R = 4h + 16d_r, d_r = 4096: 16384 + 65536 = 81,920, + 4 rstd.
  Recipe r = MathRecipe();
  r.model.recurrent.width = 4096;
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kRecurrent, Recompute::kNone, 1, 1).total(), 81'920 + 4);
  // Dense SwiGLU f 14336: 4h (norm in, fc1 in) + 4f (gate, up) + 2f (fc2 in) + 4 rstd
  // = 16384 + 86016 + 4 = 102,404.
  r.model.mlp.ffn_hidden = 14336;
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kDenseMlp, Recompute::kNone, 1, 1).total(), 102'404);
}

TEST(ActivationPerLayer, MoeUniformRouting) {
  // docs/formulas.md §3.2, E, uniform routing, t_e = 1: per router token
  // 4h + 9E + 16k + 6f_sh + k(4h + 6f_e + 4), + 4 rstd (not in docs/formulas.md's a_E).
  // h 4096, E 64, k 2, f_e 2048, f_sh 2048:
  // 16384 + 576 + 32 + 12288 + 2*(16384 + 12288 + 4) + 4 = 86,636 B/token.
  // s 8192, b 1, t 1: 8192 * 86,636 = 709,722,112 B. Dropless with skew 1.0 is
  // exactly uniform (N_recv = k*T).
  Recipe r = MathRecipe();
  r.model.moe = MoeConfig{};
  r.model.moe.experts = 64;
  r.model.moe.top_k = 2;
  r.model.moe.ffn_hidden = 2048;
  r.model.moe.shared_experts = 1;
  r.model.moe.dropless = true;
  r.model.moe.dropless_skew = 1.0;
  r.training.seq_len = 8192;
  Layout l;
  l.recompute = Recompute::kNone;
  l.ep = 8;
  EXPECT_EQ(LayerActivations(r, l, BlockKind::kMoe).count(), 709'722'112);
}

TEST(MoeRouting, CapacityExample) {
  // 4096 tokens, top-2 of 128 experts, capacity factor 1.2:
  // C = ceil(4096 * 2 / 128 * 1.2) = ceil(76.8) = 77.
  EXPECT_EQ(MoeCapacity(4096, 2, 128, 1.2), 77);
  // 64 * 1.25 = 80 exactly: no spurious round-up.
  EXPECT_EQ(MoeCapacity(4096, 2, 128, 1.25), 80);
}

TEST(MoeRouting, CapacityExampleBuffers) {
  // Hidden 4096, bf16, EP 32 -> 128/32 = 4 local experts, padded to capacity.
  ModelConfig m = MathRecipe().model;
  m.moe.experts = 128;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 1.2;
  m.moe.pad_to_capacity = true;
  const MoeRouting r = RouteMoe(m, DType::kBf16, 4096, 32, 1);
  EXPECT_EQ(r.capacity, 77);
  // The 32 KB figure: 4096 x 2 routing entries x 4 B. Megatron's top-k
  // indices are int64 (65,536 B, charged to activations); the 4-byte buffer
  // of that size is the fp32 top-k probabilities.
  EXPECT_EQ(r.topk_probs.count(), 32'768);
  // ~2.5 MB: 4 local experts x 77 x 4096 x 2 B = 2,523,136 B, the slice of
  // the receive buffer from one source rank.
  EXPECT_EQ(r.recv_per_peer.count(), 2'523'136);
  // Megatron computes C per rank from local tokens, so this rank's experts
  // receive C from each of the 32 source ranks: E*C*h*2 = 128 * 77 * 8192
  // = 80,740,352 B (= 32 x 2,523,136); the combine buffers mirror it.
  EXPECT_EQ(r.dispatch_recv.count(), 80'740'352);
  EXPECT_EQ(r.combine_send.count(), 80'740'352);
  EXPECT_EQ(r.combine_recv.count(), 80'740'352);
}

TEST(MoeRouting, DroplessSkewAndWorstCase) {
  // T 4096, k 2, E 128, e 32: worst case T*e*min(k, E/e) = 4096*32*2 = 262,144
  // tokens; with skew 1.25 the planned receive is ceil(1.25 * 8192) = 10,240.
  ModelConfig m = MathRecipe().model;
  m.moe.experts = 128;
  m.moe.top_k = 2;
  m.moe.dropless = true;
  m.moe.dropless_skew = 1.25;
  const MoeRouting r = RouteMoe(m, DType::kBf16, 4096, 32, 1);
  EXPECT_EQ(r.recv_worst, 262'144);
  EXPECT_EQ(r.recv_tokens, 10'240);
  EXPECT_EQ(r.send_tokens, 8'192);
  // Dispatch phase: send 8192 + recv 10240 + sort copy 10240 (4 local experts) rows of 8 KiB;
  // combine phase: sort copy 10240 + send 10240 + recv 8192 + unpermute 4096 rows.
  // Peak = combine = 32,768 rows * 8192 B = 268,435,456, + top-k probs 32,768
  // + counts 8 * (128 + 32*128) = 33,792.
  EXPECT_EQ(r.peak().count(), 268'435'456 + 32'768 + 33'792);
}

TEST(ServingState, KvCacheGqa) {
  // docs/formulas.md §6: GQA 8 x 128 bf16: 2 * 8 * 128 * 2 = 4096 B per token per layer.
  const ModelConfig m = MathRecipe().model;
  EXPECT_EQ(KvBytesPerToken(m, 1, DType::kBf16), 4096);
  EXPECT_EQ(KvBytesPerToken(m, 4, DType::kBf16), 1024);  // 2 KV heads per rank
  EXPECT_EQ(KvBytesPerToken(m, 16, DType::kBf16), 512);  // t > n_kv: one replicated head
}

TEST(ServingState, MlaLatent) {
  // docs/formulas.md §6: DeepSeek-V3 latent (512 + 64) x 2 B = 1152 B, replicated per TP rank.
  ModelConfig m = MathRecipe().model;
  m.mla = MlaConfig{};
  EXPECT_EQ(KvBytesPerToken(m, 1, DType::kBf16), 1152);
  EXPECT_EQ(KvBytesPerToken(m, 8, DType::kBf16), 1152);
}

TEST(ServingState, MambaState) {
  // docs/formulas.md §6: conv (K-1)(d_i + 2GN) bf16 = 3 * 10240 * 2 = 61,440 B, SSM
  // H*P*N fp32 = 128 * 64 * 128 * 4 = 4,194,304 B; 4,255,744 B = 4.06 MiB.
  const ModelConfig m = MathRecipe().model;
  EXPECT_EQ(MambaStateBytesPerSequence(m, 1, DType::kBf16, DType::kFp32), 4'255'744);
  EXPECT_EQ(MambaStateBytesPerSequence(m, 4, DType::kBf16, DType::kFp32), 4'255'744 / 4);
}

TEST(ServingState, RecurrentState) {
  // docs/formulas.md §6: (K_r - 1) d_r beta + 4 d_r, d_r 4096, K_r 4, bf16: 24,576 + 16,384 = 40,960.
  ModelConfig m = MathRecipe().model;
  m.recurrent = {4096, 32, 4};
  EXPECT_EQ(RecurrentStateBytesPerSequence(m, 1, DType::kBf16), 40'960);
}

TEST(ContextParallel, AttentionSplitsTheSequenceAndAddsRingBuffers) {
  // docs/formulas.md §3.4: with CP every saved attention tensor is /c. s 8192, c 2, t 1,
  // no recompute: 4096 tokens x 36,996 B = 151,535,616 B. The p2p ring keeps
  // two KV chunks in flight: 2 x 2 x (s/c) x b x (n_kv/t) x d_h x 2 B
  // = 2 x 2 x 4096 x 8 x 128 x 2 = 33,554,432 B. All-gather CP holds the whole
  // sequence's K,V and, in backward, dK,dV beside them: 2 x c x K_c = 67,108,864 B.
  Recipe r = MathRecipe();
  r.training.seq_len = 8192;
  Layout l;
  l.cp = 2;
  l.recompute = Recompute::kNone;
  EXPECT_EQ(LayerActivations(r, l, BlockKind::kAttention).count(), 151'535'616);
  EXPECT_EQ(LayerWorkspace(r, l, BlockKind::kAttention).count(), 33'554'432);
  l.cp_comm = CpComm::kAllGather;
  EXPECT_EQ(LayerWorkspace(r, l, BlockKind::kAttention).count(), 67'108'864);
  l.cp_comm = CpComm::kA2a;
  EXPECT_EQ(LayerWorkspace(r, l, BlockKind::kAttention).count(), 0);
}

TEST(Workspace, MambaChunkStates) {
  // docs/formulas.md §3.2: s 8192, Q 128, H 128, P 64, N 128, t = c = 1: the fp32 chunk
  // states alone are 64 * 128 * 64 * 128 * 4 = 256 MiB. With the bf16 copy
  // (128 MiB), CB 4*8192*128*8 = 32 MiB and dA_cumsum/dt 8*8192*128 = 8 MiB: 424 MiB.
  Recipe r = MathRecipe();
  r.training.seq_len = 8192;
  r.model.mamba.chunk = 128;
  Layout l;
  EXPECT_EQ(LayerWorkspace(r, l, BlockKind::kMamba).count(), (256 + 128 + 32 + 8) * kMiB);
}

}  // namespace
}  // namespace preflight::estimator_terms_test

// Per-term formulas of the capacity model (docs/formulas.md §3-6). Each function is a
// closed form in checked int64 arithmetic; the tests check each one against a
// paper's table or a hand-worked example.
#include "preflight/estimator/memory_terms.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "preflight/inventory/fp4_storage.h"
#include "preflight/inventory/inventory.h"

#include "internal.h"

namespace preflight {
namespace {

using estimator_detail::Add;
using estimator_detail::Mul;

/// Bytes of per-token norm statistics saved for backward: RMSNorm keeps rstd
/// (fp32), LayerNorm keeps mean and rstd (2 x fp32). Korthikanti neglects these.
int64_t NormStatBytes(NormKind n) { return n == NormKind::kLayerNorm ? 8 : 4; }

/// Bytes per token of a linear layer's input of width n that the layer saves
/// for backward: n elements of the activation dtype, or under FP4 GEMMs the
/// columnwise FP4 copy Transformer Engine keeps in its place (linear.py,
/// layernorm_linear.py, grouped_linear.py @ 01634950: the quantized input,
/// its rowwise data discarded after the forward GEMM), rounded up a token.
int64_t SavedGemmInput(const Recipe& r, int64_t n) {
  const Fp4Format f = r.training.precision.fp4;
  if (f == Fp4Format::kNone) return Mul(n, SizeOf(r.training.precision.activations));
  return CeilDiv(Mul(n, Fp4SavedInputThirtySeconds(f)), 32);
}

/// The FP4 copy a linear layer keeps beside a bf16 tensor another module
/// saves too (the attention output O, the MoE norm output a shared expert
/// reads); 0 without FP4, where both share one tensor.
int64_t ExtraFp4Copy(const Recipe& r, int64_t n) {
  return r.training.precision.fp4 == Fp4Format::kNone ? 0 : SavedGemmInput(r, n);
}

/// An FFN of width f per token: SwiGLU's fc1 out (gate and up, 2f) + fc2
/// input (f); GeLU's input (f) + output (the fc2 input, f).
int64_t FfnTerms(const Recipe& r, FfnActivation a, int64_t f) {
  const int64_t kept = a == FfnActivation::kSwiglu ? 2 : 1;
  return Add(Mul(Mul(kept, f), SizeOf(r.training.precision.activations)), SavedGemmInput(r, f));
}

/// The pre-norm's output per token: the first linear's input (with TE the
/// norm is fused into it, so under FP4 only the linear's FP4 copy is kept),
/// except before an MoE layer, whose bf16 router reads it.
int64_t NormOutputBytes(const Recipe& r, BlockKind kind) {
  const int64_t h = r.model.hidden;
  if (kind == BlockKind::kMoe) return Mul(h, SizeOf(r.training.precision.activations));
  return SavedGemmInput(r, h);
}

/// Residual-stream terms every block shares: pre-norm input and its output
/// (the first linear's input), the norm statistics, and the residual dropout
/// mask (1 byte/element) when dropout > 0 (Korthikanti's per-block mask).
int64_t ResidualTerms(const Recipe& r, BlockKind kind) {
  const int64_t h = r.model.hidden;
  const int64_t beta = SizeOf(r.training.precision.activations);
  int64_t out = Add(Add(Mul(h, beta), NormOutputBytes(r, kind)), NormStatBytes(r.model.norm));
  if (r.training.dropout > 0) out = Add(out, h);
  return out;
}

/// Backward reruns `m` (training.recompute_modules; full recompute is
/// priced apart, as one checkpoint a layer).
bool Reruns(const Recipe& r, Recompute recompute, RecomputeModule m) {
  return preflight::Reruns(r.training, recompute, m);
}

/// The pre-norm's output and statistics, which a rerun of the norm frees
/// (Megatron's "layernorm" module: CheckpointWithoutOutput discards the norm
/// output after its consumer saved it and recomputes it in backward).
int64_t NormOutputTerms(const Recipe& r, BlockKind kind) {
  return Add(NormOutputBytes(r, kind), NormStatBytes(r.model.norm));
}

/// Residual terms less the norm output when the norm is rerun.
int64_t KeptResidualTerms(const Recipe& r, BlockKind kind, Recompute recompute) {
  const int64_t all = ResidualTerms(r, kind);
  if (!Reruns(r, recompute, RecomputeModule::kLayernorm) || !NormIsOwnModule(r, kind)) return all;
  return all - NormOutputTerms(r, kind);
}

/// The K and V heads the attention core keeps: GQA's kv_heads, or without
/// flash attention one per query head (Megatron DotProductAttention.forward
/// repeat_interleaves K and V, and baddbmm and bmm keep the expanded copies).
int64_t CoreKvHeads(const Recipe& r) {
  return r.training.flash_attention ? r.model.attention.kv_heads : r.model.attention.heads;
}

/// Core attention terms that selective recompute drops: the fp32 softmax LSE
/// per query head with flash attention; without it the softmax output
/// (n_q * s per token), plus its dropout mask and dropout output when dropout > 0
/// (Korthikanti's 5as/h term).
int64_t CoreAttentionTerms(const Recipe& r, int64_t heads) {
  const int64_t beta = SizeOf(r.training.precision.activations);
  if (r.training.flash_attention) return Mul(4, heads);
  const int64_t scores = Mul(heads, r.training.seq_len);
  int64_t out = Mul(scores, beta);
  if (r.training.dropout > 0) out = Add(out, Mul(scores, Add(1, beta)));
  return out;
}

TokenBytes AttentionTokenBytes(const Recipe& r, Recompute recompute) {
  const ModelConfig& m = r.model;
  const int64_t beta = SizeOf(r.training.precision.activations);
  const bool drop_core = Reruns(r, recompute, RecomputeModule::kCoreAttn);
  TokenBytes out;
  out.replicated = KeptResidualTerms(r, BlockKind::kAttention, recompute);
  if (m.mla) {
    const MlaConfig& a = *m.mla;
    // Latents (down-projection outputs) and the up-projection inputs after
    // their norms, replicated across TP; one rstd per latent norm.
    out.replicated = Add(out.replicated, Mul(Add(Add(a.q_lora_rank, a.kv_lora_rank), a.qk_rope_head_dim), beta));
    out.replicated = Add(out.replicated, SavedGemmInput(r, Add(a.q_lora_rank, a.kv_lora_rank)));
    out.replicated = Add(out.replicated, Mul(NormStatBytes(m.norm), a.q_lora_rank > 0 ? 2 : 1));
    // Q, K, V to attention and the output O (the O-projection input); the
    // "mla_up_proj" rerun frees Q, K, V after the core attention and
    // recomputes them from the latents (multi_latent_attention.py).
    const int64_t qkv = Mul(a.heads, Add(Mul(2, Add(a.qk_nope_head_dim, a.qk_rope_head_dim)), a.v_head_dim));
    const bool rerun_up = Reruns(r, recompute, RecomputeModule::kMlaUpProj);
    out.sharded = Add(Mul(Add(rerun_up ? 0 : qkv, Mul(a.heads, a.v_head_dim)), beta),
                      ExtraFp4Copy(r, Mul(a.heads, a.v_head_dim)));
    if (!drop_core) out.sharded = Add(out.sharded, CoreAttentionTerms(r, a.heads));
    return out;
  }
  const AttentionConfig& a = m.attention;
  // Q, K, V after RoPE (GQA K, V not expanded) and O (the O-projection input).
  out.sharded = Mul(Mul(Add(Mul(2, a.heads), Mul(2, CoreKvHeads(r))), a.head_dim), beta);
  out.sharded = Add(out.sharded, ExtraFp4Copy(r, Mul(a.heads, a.head_dim)));  // O-projection's own copy
  if (a.qk_norm) {
    // Q and K before their norms, and one fp32 rstd per head.
    out.sharded = Add(out.sharded, Mul(Mul(Add(a.heads, a.kv_heads), a.head_dim), beta));
    out.sharded = Add(out.sharded, Mul(4, Add(a.heads, a.kv_heads)));
  }
  if (!drop_core) out.sharded = Add(out.sharded, CoreAttentionTerms(r, a.heads));
  return out;
}

TokenBytes MambaTokenBytes(const Recipe& r, int64_t tp, int64_t cp) {
  const ModelConfig& m = r.model;
  const MambaConfig& mb = m.mamba;
  const int64_t beta = SizeOf(r.training.precision.activations);
  const int64_t d_inner = mb.Inner(m.hidden);
  const int64_t heads = d_inner / mb.head_dim;
  const int64_t gn = Mul(Mul(mb.groups, mb.d_state), MambaGroupRepeat(mb, tp, cp));
  TokenBytes out;
  out.replicated = ResidualTerms(r, BlockKind::kMamba);
  // zxBCdt (the kernel's saved in_proj output) and out_x (SSM output before gating).
  out.sharded = Mul(Add(Add(Mul(2, d_inner), Mul(2, gn)), heads), beta);
  out.sharded = Add(out.sharded, Mul(d_inner, beta));
  // Megatron's path runs the gated RMSNorm and out_proj outside the kernel and
  // keeps the gated y and the norm output; the fused path recomputes both.
  // The norm output is out_proj's input.
  if (!mb.fused_norm_out_proj) out.sharded = Add(Add(out.sharded, Mul(d_inner, beta)), SavedGemmInput(r, d_inner));
  out.sharded = Add(out.sharded, Mul(4, mb.groups));  // gated-norm rstd, fp32 per group
  return out;
}

TokenBytes MoeTokenBytes(const Recipe& r, Recompute recompute) {
  const MoeConfig& e = r.model.moe;
  TokenBytes out;
  out.replicated = KeptResidualTerms(r, BlockKind::kMoe, recompute);
  // The "moe" rerun checkpoints the whole MoE layer on the pre-MLP norm's
  // output (moe_layer.py): only the residual terms stay.
  if (Reruns(r, recompute, RecomputeModule::kMoe)) return out;
  // Router scores and dense probs (fp32) and the routing map (bool): 9E;
  // top-k indices and permutation indices (int64): 16k.
  out.replicated = Add(Add(out.replicated, Mul(9, e.experts)), Mul(16, e.top_k));
  // Shared expert, TP column/row like a dense MLP: SwiGLU fc1 out (gate, up) +
  // fc2 in; non-gated activation input + output. Its rerun keeps only its
  // input, the norm output already counted.
  if (Reruns(r, recompute, RecomputeModule::kSharedExperts)) return out;
  out.sharded = FfnTerms(r, e.activation, e.SharedWidth());
  if (e.SharedWidth() > 0) out.replicated = Add(out.replicated, ExtraFp4Copy(r, r.model.hidden));  // shared fc1's
  // The sigmoid gate (Megatron SharedExpertMLP.forward: output *
  // sigmoid(linear(input, gate_weight)), outside TE): the product keeps the
  // shared output (h) and the score (1), per token of the rank's rows.
  if (e.SharedWidth() > 0 && e.shared_gate) {
    out.replicated = Add(out.replicated, Mul(Add(r.model.hidden, 1), SizeOf(r.training.precision.activations)));
  }
  return out;
}

TokenBytes RecurrentTokenBytes(const Recipe& r) {
  const int64_t beta = SizeOf(r.training.precision.activations);
  const int64_t d_r = r.model.recurrent.width;
  TokenBytes out;
  out.replicated = ResidualTerms(r, BlockKind::kRecurrent);
  // g_pre, u, conv(u), W_o input (1 each) and the r/i gate pre-activations (2),
  // all in the activation dtype, plus the h_t sequence in fp32 (docs/formulas.md §3.2:
  // a_R = 4h + 16 d_r, plus the norm rstd). The simulator's R block keeps
  // exactly this set; under the CP all-to-all it keeps the h that came back
  // in place of the W_o input (same width) and recomputes y = h * GeLU(g_pre).
  out.sharded = Add(Add(Mul(Mul(5, d_r), beta), SavedGemmInput(r, d_r)), Mul(4, d_r));
  return out;
}

TokenBytes DenseTokenBytes(const Recipe& r, Recompute recompute) {
  const int64_t f = r.model.mlp.ffn_hidden;
  TokenBytes out;
  out.replicated = KeptResidualTerms(r, BlockKind::kDenseMlp, recompute);
  if (Reruns(r, recompute, RecomputeModule::kMlp)) {
    // The "mlp" rerun checkpoints the MLP module on its input: with TE the
    // norm is inside it (fc1 is a LayerNormLinear), so only the residual
    // input stays; a separate norm's output is the checkpoint's input.
    if (!NormIsOwnModule(r, BlockKind::kDenseMlp)) {
      out.replicated = ResidualTerms(r, BlockKind::kDenseMlp) - NormOutputTerms(r, BlockKind::kDenseMlp);
    }
    return out;
  }
  out.sharded = FfnTerms(r, r.model.mlp.activation, f);
  return out;
}

/// Bytes of a per-token split over one micro-batch: replicated terms /t under
/// SP, sharded terms /t always (worst rank rounds up).
int64_t SpreadTokens(const TokenBytes& per_token, int64_t tokens, const Layout& l) {
  return Add(CeilDiv(Mul(tokens, per_token.replicated), l.sequence_parallel() ? l.tp : 1),
             CeilDiv(Mul(tokens, per_token.sharded), l.tp));
}

// Flextron's soft width masks (Megatron-LM d98e8a6,
// megatron/elastification/flextron_elasticity_hooks.py, soft_mask with a
// trained router): each hook multiplies an activation by a width mask or a
// blend weight built from the router's output, which requires grad, so
// autograd keeps the product's input for the router's gradient beside the
// masked tensor the next module saves in the plain model's place. n_e =
// len(emb_int_list) blend terms, n_m = len(mamba_int_list).

/// Per token of one layer (global widths, split as TokenBytes).
TokenBytes FlextronTokenBytes(const Recipe& r, BlockKind kind) {
  const TrainingConfig& t = r.training;
  const ModelConfig& m = r.model;
  const int64_t beta = SizeOf(t.precision.activations);
  const int64_t h = m.hidden, n_e = t.flextron_emb_choices;
  TokenBytes out;
  switch (kind) {
    case BlockKind::kAttention: {
      // FlextronAttentionElasticityManager: input_mask_hook keeps the
      // attention's input, output_mask_hook linear_proj's output (h each);
      // linear_qkv_post_hook's n_e terms qkv * sqrt(emb_per) * w_i each keep
      // their scaled qkv.
      const AttentionConfig& a = m.attention;
      out.replicated = Mul(Mul(2, h), beta);
      out.sharded = Mul(Mul(n_e, Mul(Add(a.heads, Mul(2, a.kv_heads)), a.head_dim)), beta);
      break;
    }
    case BlockKind::kMamba: {
      // FlextronMambaElasticityManager: input and output masks (h each);
      // in_proj_post_hook keeps zxBCdt twice (xz * w_i, then the blend * the
      // in_proj mask), before the CP exchange, so without the B/C repeat;
      // norm_post_hook's n_m terms output * sqrt(mamba_per) * w_i each keep
      // their scaled norm output.
      const MambaConfig& mb = m.mamba;
      const int64_t d_inner = mb.Inner(h);
      const int64_t zxbcdt = Add(Add(Mul(2, d_inner), Mul(Mul(2, mb.groups), mb.d_state)), d_inner / mb.head_dim);
      out.replicated = Mul(Mul(2, h), beta);
      out.sharded = Mul(Add(Mul(2, zxbcdt), Mul(t.flextron_mamba_choices, d_inner)), beta);
      break;
    }
    case BlockKind::kMoe:
      // FlextronTransformerLayerElasticityManager: pre_mlp_layernorm's input
      // mask keeps the layer input, its output hook's n_e terms their scaled
      // norm output; FlextronMoEElasticityManager's output mask the MoE
      // layer's output.
      out.replicated = Mul(Mul(Add(2, n_e), h), beta);
      break;
    case BlockKind::kDenseMlp:   // apply_flextron_elasticity_to_model hooks
    case BlockKind::kRecurrent:  // only 'M', '*' and 'E' layers
      break;
  }
  return out;
}

/// A sublayer's matmuls under the per-op policy, in forward order: Llama 3 /
/// Qwen3 Attention.forward runs wq, wk, wv, wo, FeedForward.forward w1, w3,
/// w2 (w2(silu(w1(x)) * w3(x))); the block's counter has seen `before` of
/// them. wq's and wk's outputs are read in backward only by Qwen3's q_norm
/// and k_norm (else RoPE consumes them), v by the SDPA's backward, w1's and
/// w3's by SwiGLU's.
struct OpMatmuls {
  std::vector<SelectiveOpMatmul> list;
  int64_t before = 0;
};

OpMatmuls SublayerMatmuls(const Recipe& r, BlockKind kind) {
  const int64_t h = r.model.hidden;
  const AttentionConfig& a = r.model.attention;
  const int64_t q = Mul(a.heads, a.head_dim), kv = Mul(a.kv_heads, a.head_dim);
  const bool normed = a.qk_norm;
  if (kind == BlockKind::kAttention) return {{{h, q, normed}, {h, kv, normed}, {h, kv, true}, {q, h, false}}, 0};
  const int64_t f = r.model.mlp.ffn_hidden;
  return {{{h, f, true}, {h, f, true}, {f, h, false}}, 4};
}

/// Whether the policy saves the i-th matmul of `m` (0-based): its counter
/// saves the odd ones of the block (1st, 3rd, ...) and recomputes every second.
bool SavesMatmul(const OpMatmuls& m, size_t i) { return (m.before + static_cast<int64_t>(i) + 1) % 2 == 1; }

/// Per token under torchtitan's per-op selective checkpointing (recompute:
/// selective_op). torchtitan/distributed/activation_checkpoint.py
/// SelectiveAC._wrap_block (and parallelize_llama.py
/// _apply_ac_to_transformer_block @ 9dec370, the published tables' version):
/// each transformer block is one checkpoint, its input kept; inside, the
/// policy saves the outputs of the SDPA ops (flash: the output and the fp32
/// logsumexp per head) and of aten.mm, except every second mm of the block's
/// forward (a counter per block). Llama 3 and Qwen3 blocks run wq, wk, wv, wo
/// (Attention.forward) then w1, w3, w2 (FeedForward.forward: w2(silu(w1(x)) *
/// w3(x))), so wq, wv, w1 and w2 are saved. Everything else (norms, RoPE, the
/// residual h, SwiGLU) is recomputed in backward. The attention (A) sublayer
/// carries the block input and its saves, the MLP (D) sublayer its own.
TokenBytes SelectiveOpTokenBytes(const Recipe& r, BlockKind kind) {
  const int64_t beta = SizeOf(r.training.precision.activations);
  const AttentionConfig& a = r.model.attention;
  const OpMatmuls m = SublayerMatmuls(r, kind);
  int64_t saved = 0;
  for (size_t i = 0; i < m.list.size(); ++i) {
    if (SavesMatmul(m, i)) saved = Add(saved, m.list[i].out);
  }
  TokenBytes out;
  if (kind == BlockKind::kAttention) {
    out.replicated = Mul(r.model.hidden, beta);    // the checkpoint's input
    saved = Add(saved, Mul(a.heads, a.head_dim));  // the SDPA output
    out.sharded = CoreAttentionTerms(r, a.heads);  // its fp32 logsumexp
  }
  out.sharded = Add(out.sharded, Mul(saved, beta));
  return out;
}

}  // namespace

double SelectiveOpRecomputedMatmulShare(const Recipe& r, BlockKind kind) {
  const OpMatmuls m = SublayerMatmuls(r, kind);
  double all = 0, rerun = 0;
  for (size_t i = 0; i < m.list.size(); ++i) {
    const double flops = static_cast<double>(m.list[i].in) * static_cast<double>(m.list[i].out);
    all += flops;
    if (!SavesMatmul(m, i)) rerun += flops;
  }
  return all > 0 ? rerun / all : 0.0;
}

int64_t SelectiveOpUnreadBytesPerToken(const Recipe& r, BlockKind kind) {
  const OpMatmuls m = SublayerMatmuls(r, kind);
  int64_t unread = 0;
  for (size_t i = 0; i < m.list.size(); ++i) {
    if (SavesMatmul(m, i) && !m.list[i].read) unread = Add(unread, m.list[i].out);
  }
  return Mul(unread, SizeOf(r.training.precision.activations));
}

int64_t MambaGroupRepeat(const MambaConfig& mamba, int64_t tp, int64_t cp) {
  const int64_t groups_per_tp = std::max<int64_t>(1, mamba.groups / tp);
  return cp > groups_per_tp ? cp / groups_per_tp : 1;
}

TokenBytes SavedBytesPerToken(const Recipe& r, BlockKind kind, Recompute recompute, int64_t tp, int64_t cp) {
  if (recompute == Recompute::kFull) {
    // Full recompute keeps only the layer input (Korthikanti: 2sbh, /t with SP).
    TokenBytes out;
    out.replicated = Mul(r.model.hidden, SizeOf(r.training.precision.activations));
    return out;
  }
  // Validation admits the per-op policy on attention + dense MLP blocks only.
  if (recompute == Recompute::kSelectiveOp && (kind == BlockKind::kAttention || kind == BlockKind::kDenseMlp)) {
    return SelectiveOpTokenBytes(r, kind);
  }
  switch (kind) {
    case BlockKind::kAttention: return AttentionTokenBytes(r, recompute);
    case BlockKind::kMamba: return MambaTokenBytes(r, tp, cp);
    case BlockKind::kMoe: return MoeTokenBytes(r, recompute);
    case BlockKind::kRecurrent: return RecurrentTokenBytes(r);
    case BlockKind::kDenseMlp: return DenseTokenBytes(r, recompute);
  }
  return {};
}

// 128-bit intermediate for n * (fraction in millionths); GCC/Clang builtin.
__extension__ typedef __int128 Int128;

int64_t CeilFraction(int64_t n, double f) {
  constexpr int64_t kMillion = 1'000'000;
  // The fraction in millionths, remembered for the last f (a sweep scales by
  // the same few fractions millions of times).
  thread_local double last_f = 0;
  thread_local long double last_scaled = 0;
  thread_local bool known = false;
  if (!known || f != last_f) {
    last_scaled = std::llround(static_cast<long double>(f) * kMillion);
    last_f = f;
    known = true;
  }
  const long double scaled = last_scaled;
  if (scaled >= static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    throw ArithmeticOverflow("int64 overflow in a fraction");
  }
  // In 64 bits when the product fits (the same quotient and remainder as in 128).
  int64_t narrow = 0;
  if (!__builtin_mul_overflow(n, static_cast<int64_t>(scaled), &narrow)) {
    return narrow / kMillion + (narrow % kMillion != 0 ? 1 : 0);
  }
  const Int128 product = static_cast<Int128>(n) * static_cast<int64_t>(scaled);
  const Int128 out = product / kMillion + (product % kMillion != 0 ? 1 : 0);
  if (out > std::numeric_limits<int64_t>::max()) throw ArithmeticOverflow("int64 overflow in scaling by a fraction");
  return static_cast<int64_t>(out);
}

Bytes MoeLayerActivations(const Recipe& r, const Layout& l, Recompute recompute) {
  const TokenBytes per_token = SavedBytesPerToken(r, BlockKind::kMoe, recompute, l.tp, l.cp);
  int64_t out = SpreadTokens(per_token, TokensOf(r, l).cp_rank, l);
  if (recompute == Recompute::kFull || Reruns(r, recompute, RecomputeModule::kMoe)) return Bytes(out);
  // Routed experts on the R rows they process: fc1 input, fc1 out (gate, up)
  // and SwiGLU out (non-gated: activation input and output). The expert output kept for d(probs) and the fp32 permuted
  // probs live at the source: Megatron multiplies the probs in unpermute, after
  // the combine all-to-all (and the expert-TP reduce-scatter), so they take the
  // N_send rows this rank dispatched, not the t_e-times-gathered R rows
  // (docs/formulas.md §8.3; the simulator measures it there).
  const MoeRouting routing = RouteMoeOn(r, l);
  const int64_t beta = SizeOf(r.training.precision.activations);
  const int64_t f_local = CeilDiv(r.model.moe.ffn_hidden, l.expert_tp);
  // The "moe_act" rerun frees the activation's output (the fc2 input) and
  // recomputes it from fc1's output (experts.py, CheckpointWithoutOutput).
  const int64_t fc1_out = r.model.moe.activation == FfnActivation::kSwiglu ? 2 : 1;
  const int64_t fc2_in = Reruns(r, recompute, RecomputeModule::kMoeAct) ? 0 : SavedGemmInput(r, f_local);
  const int64_t per_expert_row = Add(Add(SavedGemmInput(r, r.model.hidden), Mul(Mul(fc1_out, f_local), beta)), fc2_in);
  const int64_t per_source_row = Add(Mul(r.model.hidden, beta), 4);
  out = Add(out, Mul(routing.expert_tokens, per_expert_row));
  out = Add(out, Mul(routing.send_tokens, per_source_row));
  return Bytes(out);
}

namespace {
/// CP hand-off (cp_recurrent: handoff): chunks whose predecessor lives on
/// another CP rank, on the worst rank. Without load balancing rank r holds
/// chunk r: one (r > 0). With it, rank r holds chunks r and 2c-1-r: rank 0
/// one (chunk 2c-1), rank c-1 one (chunk c follows its own chunk c-1), ranks
/// 1..c-2 two; so two once c >= 3.
int64_t HandoffStatesReceived(const Layout& l) {
  if (l.cp <= 1 || l.cp_recurrent != CpRecurrent::kHandoff) return 0;
  return l.cp_load_balance && l.cp >= 3 ? 2 : 1;
}
}  // namespace

Bytes RecurrentHandoffStateBytes(const Recipe& r, const Layout& l) {
  // [OURS] Each received state (conv tail (K_r-1)*d_r/t in the activation
  // dtype + fp32 h of d_r/t, per sequence) is kept for the backward: the
  // conv weight gradient and the first step of the reverse scan read it.
  const int64_t per_sequence = RecurrentStateBytesPerSequence(r.model, l.tp, r.training.precision.activations);
  return Bytes(Mul(Mul(HandoffStatesReceived(l), l.micro_batch), per_sequence));
}

int64_t MambaRepeatCp(const Layout& l) { return l.cp_recurrent == CpRecurrent::kHandoff ? 1 : l.cp; }

Bytes MambaHandoffStateBytes(const Recipe& r, const Layout& l) {
  // Each received state (conv tail: the last K-1 positions of the conv input
  // [x, B, C] in the activation dtype; SSM state H/t x P x N in fp32, per
  // sequence) is kept for the backward, which restarts the recurrence from it.
  const int64_t per_sequence =
      MambaStateBytesPerSequence(r.model, l.tp, r.training.precision.activations, DType::kFp32);
  return Bytes(Mul(Mul(HandoffStatesReceived(l), l.micro_batch), per_sequence));
}

Bytes FlextronLayerActivations(const Recipe& r, const Layout& l, BlockKind kind) {
  if (!r.training.flextron() || l.recompute == Recompute::kFull) return Bytes(0);
  int64_t out = SpreadTokens(FlextronTokenBytes(r, kind), TokensOf(r, l).cp_rank, l);
  if (kind == BlockKind::kMoe && r.model.moe.grouped_gemm) {
    // FlextronGroupedMLPElasticityManager (TEGroupedMLP only): the input and
    // output masks keep the expert input and output rows (h each) and
    // fc1_post_hook the fc1 output twice (fc1 * w_i, then the blend * the
    // FFN mask), on the R rows the local experts process.
    const int64_t f_local = CeilDiv(r.model.moe.ffn_hidden, l.expert_tp);
    const int64_t fc1_out = r.model.moe.activation == FfnActivation::kSwiglu ? 2 : 1;
    const int64_t per_row =
        Mul(Add(Mul(2, r.model.hidden), Mul(Mul(2, fc1_out), f_local)), SizeOf(r.training.precision.activations));
    out = Add(out, Mul(RouteMoeOn(r, l).expert_tokens, per_row));
  }
  return Bytes(out);
}

Bytes FlextronFinalNormActivations(const Recipe& r, const Layout& l) {
  if (!r.training.flextron()) return Bytes(0);
  // FlextronStackElasticityManager final_norm_post_hook: n_e terms output *
  // sqrt(emb_per) * w_i, each keeping its scaled final-norm output.
  TokenBytes per_token;
  per_token.replicated =
      Mul(Mul(r.training.flextron_emb_choices, r.model.hidden), SizeOf(r.training.precision.activations));
  return Bytes(SpreadTokens(per_token, TokensOf(r, l).cp_rank, l));
}

namespace {
/// LayerActivations of the model without Flextron's masks.
Bytes PlainLayerActivations(const Recipe& r, const Layout& l, BlockKind kind) {
  if (kind == BlockKind::kMoe) return MoeLayerActivations(r, l, l.recompute);
  if (kind == BlockKind::kMamba) {
    // Under the CP hand-off the layout stays sequence-split: no B/C repeat,
    // and each received state is kept for the backward, which restarts the
    // recurrence from it (a recomputed forward too, so under every policy).
    const int64_t spread =
        SpreadTokens(SavedBytesPerToken(r, kind, l.recompute, l.tp, MambaRepeatCp(l)), TokensOf(r, l).cp_rank, l);
    return Bytes(spread) + MambaHandoffStateBytes(r, l);
  }
  Bytes out(SpreadTokens(SavedBytesPerToken(r, kind, l.recompute, l.tp, l.cp), TokensOf(r, l).cp_rank, l));
  // The received state is needed whatever the recompute policy: a recomputed
  // forward of the chunk starts from it too.
  if (kind == BlockKind::kRecurrent) out += RecurrentHandoffStateBytes(r, l);
  return out;
}
}  // namespace

Bytes LayerActivations(const Recipe& r, const Layout& l, BlockKind kind) {
  return PlainLayerActivations(r, l, kind) + FlextronLayerActivations(r, l, kind);
}

namespace {

/// Sums the offloaded tensors of one layer: each saved inside a listed
/// module's scope and of at least the recipe's minimum elements.
class OffloadSum {
 public:
  explicit OffloadSum(const Recipe& r)
      : set_(r.training.activation_offload), min_(r.training.activation_offload_min_elements) {}
  /// A tensor of `elements` elements and `bytes` bytes saved in `scope`.
  void Tensor(OffloadModule scope, int64_t elements, int64_t bytes) {
    if (!set_.has(scope) || elements == 0 || elements < min_) return;
    int64_t& b = by_module_[static_cast<size_t>(scope)];
    b = CheckedAdd(b, bytes);
  }
  void Add(OffloadModule scope, int64_t elements, int64_t bytes_per_element) {
    Tensor(scope, elements, Mul(elements, bytes_per_element));
  }
  const OffloadBytes& by_module() const { return by_module_; }

 private:
  OffloadSet set_;
  int64_t min_ = 0;
  OffloadBytes by_module_{};
};

/// The attention core's own saved state on `tokens` tokens and `heads` local
/// heads: the fp32 LSE with flash attention, else the s x s scores.
void CoreOffload(const Recipe& r, int64_t tokens, int64_t heads, OffloadSum* o) {
  const int64_t rows = Mul(tokens, heads);
  const int64_t elements = r.training.flash_attention ? rows : Mul(rows, r.training.seq_len);
  o->Tensor(OffloadModule::kCoreAttn, elements, Mul(rows, CoreAttentionTerms(r, 1)));
}

/// A pre-norm's saved tensors in `scope` on `res` residual tokens: its
/// input, and its statistics unless the "layernorm" module reruns it (the
/// CheckpointWithoutOutput runs the norm under no_grad and saves its input
/// alone, transformer_layer.py _run_input_layernorm; its output is freed
/// too, memory_terms' KeptResidualTerms).
void NormOffload(const Recipe& r, const Layout& l, BlockKind kind, OffloadModule scope, int64_t res, OffloadSum* o) {
  o->Add(scope, Mul(res, r.model.hidden), SizeOf(r.training.precision.activations));
  const bool rerun = NormIsOwnModule(r, kind) && Reruns(r, l.recompute, RecomputeModule::kLayernorm);
  if (!rerun) o->Add(scope, res, NormStatBytes(r.model.norm));
}

// The tensors each scope saves, as the estimator counts them in
// LayerActivations (so what leaves is a part of what is kept). `res` tokens
// of the residual stream (split by SP), `cp` tokens of the TP region, widths /t.
void AttentionOffload(const Recipe& r, const Layout& l, OffloadSum* o) {
  const ModelConfig& m = r.model;
  const TokenGeometry tok = TokensOf(r, l);
  const int64_t res = tok.router, cp = tok.cp_rank, t = l.tp, h = m.hidden;
  const int64_t beta = SizeOf(r.training.precision.activations);
  const bool own_norm = NormIsOwnModule(r, BlockKind::kAttention);
  const bool norm_rerun = own_norm && Reruns(r, l.recompute, RecomputeModule::kLayernorm);
  // The norm saves its input and statistics: in its own scope, or inside the
  // fused LayerNormLinear of the QKV projection (TE).
  const OffloadModule norm_scope = own_norm ? OffloadModule::kAttnNorm : OffloadModule::kQkvLinear;
  NormOffload(r, l, BlockKind::kAttention, norm_scope, res, o);
  if (!norm_rerun) o->Add(OffloadModule::kQkvLinear, Mul(res, h), beta);  // the projection's input
  // A "core_attn" rerun saves its inputs outside any scope (attention.py:
  // _checkpointed_attention_forward is not under the core_attn manager).
  const bool core_rerun = Reruns(r, l.recompute, RecomputeModule::kCoreAttn);
  if (m.mla) {
    const MlaConfig& a = *m.mla;
    for (int64_t w : {a.q_lora_rank, a.kv_lora_rank + a.qk_rope_head_dim, a.q_lora_rank, a.kv_lora_rank}) {
      o->Add(OffloadModule::kQkvLinear, Mul(res, w), beta);  // latents and their normed copies
    }
    o->Add(OffloadModule::kQkvLinear, res, NormStatBytes(m.norm) * (a.q_lora_rank > 0 ? 2 : 1));
    if (!core_rerun && !Reruns(r, l.recompute, RecomputeModule::kMlaUpProj)) {
      const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
      for (int64_t w : {qk, qk, a.v_head_dim}) o->Add(OffloadModule::kCoreAttn, Mul(cp, Mul(a.heads, w) / t), beta);
    }
    if (!core_rerun) CoreOffload(r, cp, a.heads / t, o);
    o->Add(OffloadModule::kAttnProj, Mul(cp, Mul(a.heads, a.v_head_dim) / t), beta);
    return;
  }
  const AttentionConfig& a = m.attention;
  const int64_t q = Mul(a.heads, a.head_dim) / t, kv = Mul(a.kv_heads, a.head_dim) / t;
  if (a.qk_norm) {
    for (int64_t w : {q, kv}) o->Add(OffloadModule::kQkvLinear, Mul(cp, w), beta);
    o->Add(OffloadModule::kQkvLinear, Mul(cp, (a.heads + a.kv_heads) / t), 4);
  }
  if (!core_rerun) {
    const int64_t core_kv = Mul(CoreKvHeads(r), a.head_dim) / t;
    for (int64_t w : {q, core_kv, core_kv}) o->Add(OffloadModule::kCoreAttn, Mul(cp, w), beta);
    CoreOffload(r, cp, a.heads / t, o);
  }
  o->Add(OffloadModule::kAttnProj, Mul(cp, q), beta);
}

void MoeOffload(const Recipe& r, const Layout& l, OffloadSum* o) {
  const int64_t res = TokensOf(r, l).router, h = r.model.hidden;
  const int64_t beta = SizeOf(r.training.precision.activations);
  NormOffload(r, l, BlockKind::kMoe, OffloadModule::kMlpNorm, res, o);
  if (Reruns(r, l.recompute, RecomputeModule::kMoe)) return;
  const int64_t rows = RouteMoeOn(r, l).expert_tokens;
  const int64_t f_local = CeilDiv(r.model.moe.ffn_hidden, l.expert_tp);
  o->Add(OffloadModule::kExpertFc1, Mul(rows, h), beta);
  const int64_t fc1_out = r.model.moe.activation == FfnActivation::kSwiglu ? 2 : 1;
  o->Add(OffloadModule::kMoeAct, Mul(rows, Mul(fc1_out, f_local)), beta);
}

}  // namespace

OffloadBytes LayerOffloadedByModule(const Recipe& r, const Layout& l, BlockKind kind) {
  if (r.training.activation_offload.empty() || l.recompute == Recompute::kFull) return {};
  OffloadSum o(r);
  if (kind == BlockKind::kAttention) AttentionOffload(r, l, &o);
  if (kind == BlockKind::kMoe) MoeOffload(r, l, &o);
  if (kind == BlockKind::kDenseMlp && NormIsOwnModule(r, kind)) {
    NormOffload(r, l, kind, OffloadModule::kMlpNorm, TokensOf(r, l).router, &o);
  }
  return o.by_module();
}

Bytes LayerOffloaded(const Recipe& r, const Layout& l, BlockKind kind) {
  int64_t sum = 0;
  for (int64_t b : LayerOffloadedByModule(r, l, kind)) sum = CheckedAdd(sum, b);
  return Bytes(sum);
}

OffloadSet OffloadGroupsOf(const Recipe& r, Recompute recompute, BlockKind kind) {
  OffloadSet runs;
  const auto add = [&](OffloadModule m) { runs.bits |= OffloadSet::Of(m).bits; };
  if (kind == BlockKind::kAttention) {
    if (NormIsOwnModule(r, kind)) add(OffloadModule::kAttnNorm);
    add(OffloadModule::kQkvLinear);
    if (!Reruns(r, recompute, RecomputeModule::kCoreAttn)) add(OffloadModule::kCoreAttn);
    add(OffloadModule::kAttnProj);
  } else if (kind == BlockKind::kMoe) {
    for (OffloadModule m : {OffloadModule::kMlpNorm, OffloadModule::kExpertFc1, OffloadModule::kMoeAct}) add(m);
  } else if (kind == BlockKind::kDenseMlp && NormIsOwnModule(r, kind)) {
    add(OffloadModule::kMlpNorm);
  }
  runs.bits &= r.training.activation_offload.bits;
  return runs;
}

namespace {

/// The groups of a layer still on the device when `g` commits: saved before
/// it, committed after. Megatron commits the norms' groups after the
/// bias-dropout-add (transformer_layer.py, attn_norm_manager /
/// mlp_norm_manager), and "moe_act" after linear_fc2, so fc1's output is on
/// the device when "expert_fc1" commits (moe/experts.py).
OffloadSet AliveAtCommit(OffloadModule g) {
  OffloadSet out;
  out.bits = OffloadSet::Of(OffloadModule::kAttnNorm).bits | OffloadSet::Of(OffloadModule::kMlpNorm).bits;
  if (g == OffloadModule::kExpertFc1) out.bits |= OffloadSet::Of(OffloadModule::kMoeAct).bits;
  out.bits &= ~OffloadSet::Of(g).bits;
  return out;
}

/// Of a layer's saved tensors that stay on the device, those saved after
/// group `g` commits, by data dependence: in a MoE layer the combined expert
/// output at the source rows comes after linear_fc2 ("moe_act"'s commit),
/// and fc2's input after linear_fc1 ("expert_fc1"'s). Whatever else a layer
/// saves is counted as saved before (an upper bound: the shared expert).
Bytes SavedAfterCommit(const Recipe& r, const Layout& l, BlockKind kind, OffloadModule g) {
  if (kind != BlockKind::kMoe || (g != OffloadModule::kMoeAct && g != OffloadModule::kExpertFc1) ||
      l.recompute == Recompute::kFull || Reruns(r, l.recompute, RecomputeModule::kMoe)) {
    return Bytes(0);
  }
  const MoeRouting routing = RouteMoeOn(r, l);
  int64_t out = Mul(routing.send_tokens, Mul(r.model.hidden, SizeOf(r.training.precision.activations)));
  if (g == OffloadModule::kExpertFc1 && !Reruns(r, l.recompute, RecomputeModule::kMoeAct)) {
    out = Add(out, Mul(routing.expert_tokens, SavedGemmInput(r, CeilDiv(r.model.moe.ffn_hidden, l.expert_tp))));
  }
  return Bytes(out);
}

/// OffloadOnRank::in_flight of one chunk: the most the filling micro-batch
/// holds at a group's commit above what it holds when its forward ends;
/// `keeps` when it keeps its last group of each name (the last stage),
/// `bytes_of` / `stay_of` a layer's offloaded bytes by module and what it
/// keeps on the device otherwise. Walked back from the chunk's last layer: a
/// commit in layer i exceeds the forward's end by what it holds of layer i
/// less what layers i.. hold at the end (`suffix`), and the names later
/// layers run are the ones already walked.
template <class BytesOf, class StayOf>
Bytes ChunkInFlight(const Recipe& r, const Layout& l, const StageChunk& chunk, bool keeps, const BytesOf& bytes_of,
                    const StayOf& stay_of) {
  Bytes suffix, most;
  OffloadSet later;  // module names a later layer of the chunk runs
  for (int64_t i = chunk.end_layer; i-- > chunk.first_layer;) {
    const BlockKind kind = r.model.layers.at(static_cast<size_t>(i));
    const OffloadBytes& bytes = bytes_of(i, kind);
    const OffloadSet groups = OffloadGroupsOf(r, l.recompute, kind);
    OffloadSet leaving = groups;
    if (keeps) leaving.bits &= later.bits;
    Bytes held = stay_of(kind);
    for (OffloadModule m : kAllOffloadModules) {
      if (groups.has(m) && !leaving.has(m)) held += Bytes(bytes[static_cast<size_t>(m)]);
    }
    suffix += held;
    for (OffloadModule g : kAllOffloadModules) {
      if (!leaving.has(g) || bytes[static_cast<size_t>(g)] == 0) continue;
      const OffloadSet alive_with = AliveAtCommit(g);
      Bytes alive(bytes[static_cast<size_t>(g)]);
      for (OffloadModule m : kAllOffloadModules) {
        if (leaving.has(m) && alive_with.has(m)) alive += Bytes(bytes[static_cast<size_t>(m)]);
      }
      most = std::max(most, held - SavedAfterCommit(r, l, kind, g) + alive - suffix);
    }
    later.bits |= groups.bits;
  }
  return most;
}

}  // namespace

std::vector<bool> CheckpointedSublayers(const Inventory& inv, const Layout& l, const StagePlan& plan) {
  std::vector<bool> out;
  if (inv.recipe.training.activation_offload.empty() || l.recompute != Recompute::kFull) return out;
  out.assign(inv.layers.size(), false);
  for (const StageChunk& c : plan.chunks) {
    for (int64_t i = c.first_layer; i < c.end_layer; ++i) {
      const estimator_detail::Kept kept = estimator_detail::KeptBy(
          inv.layers.at(static_cast<size_t>(i)), estimator_detail::LayerInChunk(inv, c.first_layer, i), l.recompute,
          inv.recipe.training);
      out[static_cast<size_t>(i)] = kept != estimator_detail::Kept::kAll;
    }
  }
  return out;
}

OffloadOnRank ActivationOffloadOnRank(const Recipe& r, const Layout& layout, const StagePlan& plan, int64_t rank,
                                      const std::vector<bool>& checkpointed) {
  OffloadOnRank out;
  if (r.training.activation_offload.empty()) return out;
  // Under full recompute the layers outside a checkpoint save what they
  // would without it; those inside save nothing in the scopes.
  Layout l = layout;
  if (l.recompute == Recompute::kFull) l.recompute = Recompute::kNone;
  std::array<OffloadBytes, 5> family{};
  std::array<bool, 5> known{};
  static constexpr OffloadBytes kEmpty{};
  const auto bytes_of = [&](int64_t i, BlockKind kind) -> const OffloadBytes& {
    if (!checkpointed.empty() && checkpointed.at(static_cast<size_t>(i))) return kEmpty;
    const size_t f = static_cast<size_t>(FamilyIndex(kind));
    if (!known[f]) family[f] = LayerOffloadedByModule(r, l, kind);
    known[f] = true;
    return family[f];
  };
  // post_warmup_callback's offload margin: the most module names one chunk runs.
  int64_t margin = 0;
  for (const StageChunk& chunk : plan.chunks) {
    if (chunk.pipeline_rank != rank) continue;
    OffloadSet names;
    for (int64_t i = chunk.first_layer; i < chunk.end_layer; ++i) {
      names.bits |= OffloadGroupsOf(r, l.recompute, r.model.layers.at(static_cast<size_t>(i))).bits;
    }
    margin = std::max<int64_t>(margin, std::popcount(names.bits));
  }
  OffloadSet seen;  // module names whose last group is counted (walking back)
  int64_t chunks = 0;
  for (size_t c = plan.chunks.size(); c-- > 0;) {
    const StageChunk& chunk = plan.chunks[c];
    if (chunk.pipeline_rank != rank) continue;
    int64_t left = margin;  // the chunk's last groups that come back ahead
    Bytes ahead;
    for (int64_t i = chunk.end_layer; i-- > chunk.first_layer;) {
      const BlockKind kind = r.model.layers.at(static_cast<size_t>(i));
      const OffloadBytes& bytes = bytes_of(i, kind);
      const OffloadSet groups = OffloadGroupsOf(r, l.recompute, kind);
      for (size_t j = std::size(kAllOffloadModules); j-- > 0;) {
        const OffloadModule m = kAllOffloadModules[j];
        if (!groups.has(m)) continue;
        const Bytes b(bytes[static_cast<size_t>(m)]);
        out.microbatch += b;
        if (!seen.has(m)) out.kept += b;
        if (left > 0) ahead += b;
        left = std::max<int64_t>(0, left - 1);
      }
      seen.bits |= groups.bits;
    }
    out.ahead = std::max(out.ahead, ahead);
    ++chunks;
  }
  // A lone chunk on the last stage never reloads ahead: the next chunk to run
  // backward has not run its forward yet (bulk_reload's check).
  if (rank == l.pp - 1 && chunks == 1) out.ahead = out.kept;
  // The group in flight: on the last stage each micro-batch keeps its last
  // groups (should_bulk_offload); elsewhere the filling one keeps none.
  std::array<Bytes, 5> stay{};
  std::array<bool, 5> stay_known{};
  const auto stay_of = [&](BlockKind kind) {
    const size_t f = static_cast<size_t>(FamilyIndex(kind));
    if (!stay_known[f]) stay[f] = LayerActivations(r, l, kind) - LayerOffloaded(r, l, kind);
    stay_known[f] = true;
    return stay[f];
  };
  for (const StageChunk& chunk : plan.chunks) {
    if (chunk.pipeline_rank != rank) continue;
    out.in_flight = std::max(out.in_flight, ChunkInFlight(r, l, chunk, rank == l.pp - 1, bytes_of, stay_of));
  }
  return out;
}

Bytes ActivationOffloadTransfer(const Recipe& r, const Layout& l, const StagePlan& plan, int64_t rank,
                                const std::vector<bool>& checkpointed) {
  const OffloadOnRank o = ActivationOffloadOnRank(r, l, plan, rank, checkpointed);
  const int64_t m = l.micro_batches;
  // The last stage runs each micro-batch's backward right after its forward,
  // so every micro-batch keeps its last group of each name; the others keep
  // them in the first micro-batch only (post_warmup_callback).
  const Bytes down = rank == l.pp - 1 ? (o.microbatch - o.kept) * m : o.microbatch * m - o.kept;
  return down * 2;
}

Bytes LayerWorkspace(const Recipe& r, const Layout& l, BlockKind kind) {
  const int64_t b = l.micro_batch;
  const int64_t s = r.training.seq_len;
  const int64_t beta = SizeOf(r.training.precision.activations);
  if (kind == BlockKind::kMamba) {
    // Mamba's all-to-all CP gives each rank the whole sequence and H/(t*c) heads.
    const MambaConfig& mb = r.model.mamba;
    const int64_t d_inner = mb.Inner(r.model.hidden);
    const int64_t heads = CeilDiv(d_inner / mb.head_dim, Mul(l.tp, l.cp));
    const int64_t groups = CeilDiv(Mul(mb.groups, MambaGroupRepeat(mb, l.tp, MambaRepeatCp(l))), Mul(l.tp, l.cp));
    const int64_t chunks = CeilDiv(s, mb.chunk);
    const int64_t states = Mul(Mul(Mul(Mul(b, chunks), heads), mb.head_dim), mb.d_state);
    int64_t out = Mul(states, Add(4, beta));                        // fp32 chunk states + re-emitted copy
    out = Add(out, Mul(Mul(Mul(Mul(4, b), s), mb.chunk), groups));  // CB, fp32
    out = Add(out, Mul(Mul(Mul(8, b), s), heads));                  // dA_cumsum and dt, fp32
    return Bytes(out);
  }
  if (kind == BlockKind::kAttention && l.cp > 1 && l.cp_comm != CpComm::kA2a) {
    // Ring attention (p2p): two KV chunks in flight (current + next),
    // 2*K_c = 2*2*(s/c)*b*(n_kv/t)*d_h*beta. All-gather: the whole sequence's
    // K,V (c*K_c) and, in backward, beside the re-gathered K,V the
    // whole-sequence dK,dV before their reduce-scatter (TransformerEngine
    // AttnFuncWithCPAndKVAllGather.backward allocates dk, dv of cp x the
    // local rows): 2*c*K_c.
    int64_t kv_width = 0;
    if (r.model.mla) {
      const MlaConfig& a = *r.model.mla;
      kv_width = Mul(CeilDiv(a.heads, l.tp), Add(Add(a.qk_nope_head_dim, a.qk_rope_head_dim), a.v_head_dim));
    } else {
      kv_width = Mul(Mul(2, CeilDiv(r.model.attention.kv_heads, l.tp)), r.model.attention.head_dim);
    }
    const int64_t kc = Mul(Mul(CeilDiv(Mul(s, b), l.cp), kv_width), beta);
    return Bytes(Mul(2, l.cp_comm == CpComm::kP2p ? kc : Mul(l.cp, kc)));
  }
  return Bytes(0);
}

Bytes FirstStageActivations(const Recipe& r, const Layout& l) {
  const int64_t tokens = TokensOf(r, l).cp_rank;
  int64_t out = Mul(8, tokens);  // int64 token ids
  if (r.training.dropout > 0) {
    out = Add(out, CeilDiv(Mul(tokens, r.model.hidden), l.sequence_parallel() ? l.tp : 1));
  }
  return Bytes(out);
}

namespace {

// The loss's bytes a logit: kept for the backward, and live beside them only
// while the head and its loss run.
struct LossBytes {
  int64_t saved = 0, transient = 0;
};

LossBytes LossBytesPerLogit(const TrainingConfig& t) {
  switch (t.cross_entropy) {
    case CrossEntropy::kVocabParallel:
      // Megatron cross_entropy.py _VocabParallelCrossEntropy: logits.float()
      // becomes the softmax in place and is saved (4 B); beside it the
      // head's logits while the forward runs, then the gradient written into
      // the softmax and cast back (beta): 4 + beta either way.
      return {4, SizeOf(t.precision.activations)};
    case CrossEntropy::kFp32Upcast:
      // torch cross_entropy(logits.float()) = log_softmax + nll_loss:
      // log_softmax saves its fp32 output (4 B). Forward: the logits and
      // their fp32 copy beside it (beta + 4 <= 8). Backward: nll_loss's fp32
      // gradient and log_softmax's, beside the saved output (8), before the
      // cast back. torchtitan train.py frees the logits (`del pred`) first.
      return {4, 8};
  }
  return {};
}

}  // namespace

Bytes LastStageActivations(const Recipe& r, const Layout& l, int64_t padded_vocab) {
  const int64_t tokens = TokensOf(r, l).cp_rank;
  const int64_t beta = SizeOf(r.training.precision.activations);
  const LossBytes loss = LossBytesPerLogit(r.training);
  // Final-norm input + head input (residual stream) and the norm statistics.
  TokenBytes per_token;
  per_token.replicated = Add(Mul(Mul(2, r.model.hidden), beta), NormStatBytes(r.model.norm));
  // The loss over V_pad/t logits: what it saves and its transient.
  per_token.sharded = Mul(padded_vocab, Add(loss.saved, loss.transient));
  return Bytes(SpreadTokens(per_token, tokens, l)) + FlextronFinalNormActivations(r, l);
}

Bytes LossTransientActivations(const Recipe& r, const Layout& l, int64_t padded_vocab) {
  TokenBytes per_token;
  per_token.sharded = Mul(padded_vocab, LossBytesPerLogit(r.training).transient);
  return Bytes(SpreadTokens(per_token, TokensOf(r, l).cp_rank, l));
}

int64_t OneFOneBInFlight(int64_t p, int64_t m, int64_t r) { return std::min(m, p - r); }

int64_t InterleavedWarmup(int64_t p, int64_t v, int64_t m, int64_t r, int64_t g) {
  return std::min(Add(Mul(2, p - r - 1), Mul(v - 1, g)), Mul(m, v));
}

int64_t InterleavedLive(int64_t p, int64_t v, int64_t m, int64_t r, int64_t g) {
  return std::min(Mul(m, v), InterleavedWarmup(p, v, m, r, g) + 1);
}

int64_t DualPipeInFlight(int64_t p, int64_t m) { return std::min(p + 1, m); }

int64_t KvBytesPerToken(const ModelConfig& m, int64_t tp, DType kv) {
  const int64_t beta = SizeOf(kv);
  if (m.mla) return Mul(Add(m.mla->kv_lora_rank, m.mla->qk_rope_head_dim), beta);
  const int64_t heads = m.attention.kv_heads >= tp ? CeilDiv(m.attention.kv_heads, tp) : 1;
  return Mul(Mul(Mul(2, heads), m.attention.head_dim), beta);
}

int64_t MambaStateBytesPerSequence(const ModelConfig& m, int64_t tp, DType conv, DType ssm) {
  const MambaConfig& mb = m.mamba;
  const int64_t d_inner = mb.Inner(m.hidden);
  const int64_t heads = d_inner / mb.head_dim;
  const int64_t conv_channels = CeilDiv(Add(d_inner, Mul(Mul(2, mb.groups), mb.d_state)), tp);
  const int64_t conv_bytes = Mul(Mul(mb.d_conv - 1, conv_channels), SizeOf(conv));
  const int64_t ssm_bytes = Mul(Mul(Mul(CeilDiv(heads, tp), mb.head_dim), mb.d_state), SizeOf(ssm));
  return Add(conv_bytes, ssm_bytes);
}

int64_t RecurrentStateBytesPerSequence(const ModelConfig& m, int64_t tp, DType conv) {
  const RecurrentConfig& rc = m.recurrent;
  return Mul(Add(Mul(rc.d_conv - 1, SizeOf(conv)), 4), CeilDiv(rc.width, tp));
}

}  // namespace preflight

// A (GQA attention with RoPE and a causal mask, optional per-head qk norms) and
// D (SwiGLU, GELU or squared-ReLU MLP), with optional linear biases, forward and
// backward, tensor- and sequence-parallel as Megatron (docs/formulas.md §8.1-8.3).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "attention_core.h"
#include "blocks.h"

namespace preflight::sim {
namespace {

/// GQA's RoPE: every head's whole head_dim rotates.
template <class T>
void Rope(Mat<T>* m, int64_t heads, const Dims& d, const SeqLayout& seq, int sign) {
  ApplyRope(m, RopeSpan{heads, d.head_dim, 0, d.head_dim}, d, seq, sign);
}

/// RMSNorm of each head of `m` (head_dim columns per head) with one weight
/// [1, head_dim] shared by the heads (Megatron's q_layernorm / k_layernorm,
/// built with hidden_size = head_dim); rstd gets one entry per (row, head).
template <class T>
Mat<T> HeadNorm(const Mat<T>& m, int64_t head_dim, const Mat<T>& w, double eps, Mat<T>* rstd) {
  const Mat<T> rows = Eigen::Map<const Mat<T>>(m.data(), m.size() / head_dim, head_dim);
  const Mat<T> y = RmsNormForward(rows, w, eps, rstd);
  return Eigen::Map<const Mat<T>>(y.data(), m.rows(), m.cols());
}

/// The input gradient of HeadNorm; adds into dw.
template <class T>
Mat<T> HeadNormBackward(const Mat<T>& dy, const Mat<T>& m, int64_t head_dim, const Mat<T>& rstd, const Mat<T>& w,
                        Mat<T>* dw) {
  const auto heads = [&](const Mat<T>& a) {
    return Mat<T>(Eigen::Map<const Mat<T>>(a.data(), a.size() / head_dim, head_dim));
  };
  const Mat<T> dx = RmsNormBackward(heads(dy), heads(m), rstd, w, dw);
  return Eigen::Map<const Mat<T>>(dx.data(), m.rows(), m.cols());
}

template <class T>
class AttentionBlock final : public Block<T> {
 public:
  AttentionBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) : d_(d) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const int64_t h = d.hidden;
    norm_ = &this->Add(MakeNorm<T>(ctx, d, p + "norm", seed, scale));
    // QKV columns are interleaved per KV group, [q heads of the group | k | v],
    // so a column split hands each rank whole groups (docs/formulas.md §1.2).
    qkv_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "attention.qkv.weight", h, (d.heads + 2 * d.kv_heads) * d.head_dim,
                                   ShardKind::kColumns, Init::kMatrix, seed, scale / std::sqrt(double(h)))), ParamRole::kMatrix);
    out_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "attention.out.weight", d.heads * d.head_dim, h, ShardKind::kRows,
                                   Init::kMatrix, seed, scale / std::sqrt(double(d.heads * d.head_dim)))), ParamRole::kMatrix);
    if (d.linear_bias) {
      // Megatron: the column-parallel bias is split with the output columns;
      // the row-parallel one is added once, after the reduction (replicated).
      qkv_b_ = &this->Add(MakeParam<T>(ctx, p + "attention.qkv.bias", 1, (d.heads + 2 * d.kv_heads) * d.head_dim,
                                       ShardKind::kColumns, Init::kMatrix, seed, 0.5 * scale));
      out_b_ = &this->Add(
          MakeParam<T>(ctx, p + "attention.out.bias", 1, h, ShardKind::kReplicated, Init::kMatrix, seed, 0.5 * scale));
    }
    if (d.qk_norm) {
      // Replicated, but each TP rank normalizes only its own heads: the
      // gradients are partial sums over TP, which Megatron all-reduces with
      // or without SP (finalize_model_grads.py: sequence_parallel or qk_layernorm).
      for (Param<T>** w : {&q_norm_, &k_norm_}) {
        *w = &this->Add(MakeParam<T>(ctx, p + (w == &q_norm_ ? "attention.q_norm.weight" : "attention.k_norm.weight"),
                                     1, d.head_dim, ShardKind::kReplicated, Init::kNormWeight, seed, scale));
        (*w)->tp_partial = true;
      }
    }
    if (ctx.dropout > 0 && d.flash_attention)
      throw SimUnsupported("dropout inside flash attention is not in the executor");
    kv_local_ = d.kv_heads / ctx.tp_size;
    q_local_ = d.heads / ctx.tp_size;
    CheckAttentionCp(d, ctx.tp_size, ctx.cp_size, ctx.cp_comm, ctx.seq.load_balanced);
  }

  Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) override {
    ctx.rank->set_what(CommWhat::kAttention);
    if (ctx.op.on()) return OpForward(ctx, x);
    const SimCategory act = SimCategory::kActivations;
    const int64_t ab = ctx.bytes.activation;
    Saved& s = saved_.Open(ctx.microbatch);
    const bool rerun_norm = RerunsNorm(ctx, ctx.transformer_engine);
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s.x, &s.n, &s.rstd, rerun_norm);
    Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
    Tensor<T> qkv(ctx.mem(), SimCategory::kTemporaries, ab, MatMul(ctx, n_full.m, qkv_->value.m));
    n_full.Release();
    AddBias(&qkv.m, qkv_b_);
    Mat<T> q, k, v;
    Split(qkv.m, &q, &k, &v);
    qkv.Release();
    if (q_norm_ != nullptr) {
      // Per-head norms before RoPE (Megatron SelfAttention.get_query_key_value_tensors);
      // their backward reads the inputs and an fp32 rstd per (token, head).
      Mat<T> rq, rk;
      s.q_in = Tensor<T>(ctx.mem(), act, ab, q);
      s.k_in = Tensor<T>(ctx.mem(), act, ab, k);
      q = HeadNorm(q, d_.head_dim, q_norm_->value.m, d_.norm_eps, &rq);
      k = HeadNorm(k, d_.head_dim, k_norm_->value.m, d_.norm_eps, &rk);
      s.q_rstd = Tensor<T>(ctx.mem(), act, 4, std::move(rq));
      s.k_rstd = Tensor<T>(ctx.mem(), act, 4, std::move(rk));
    }
    // attention.py: after get_query_key_value_tensors (the projection and the qk norms).
    this->HandOff(ctx, OffloadModule::kQkvLinear);
    Rope(&q, q_local_, d_, ctx.seq, 1);
    Rope(&k, kv_local_, d_, ctx.seq, 1);
    // The core runs the CP mode (attention_core.h); what it keeps is the
    // flash-attention set of docs/formulas.md §3.2 in the mode's layout (/c per rank).
    // Rerun in backward ("core_attn", Megatron's _checkpointed_attention_forward):
    // only the core's inputs q, k, v stay, and its state is dropped.
    const bool rerun = ctx.rerun.has(RecomputeModule::kCoreAttn);
    if (rerun) {
      s.q = Tensor<T>(ctx.mem(), act, ab, q);
      s.k = Tensor<T>(ctx.mem(), act, ab, k);
      s.v = Tensor<T>(ctx.mem(), act, ab, v);
    }
    Mat<T> o;
    if (!d_.flash_attention) {
      o = UnfusedCore(ctx, std::move(q), k, v, &s);
    } else {
      AttnState<T> core;
      o = AttentionCoreForward(ctx, Shape(), std::move(q), std::move(k), std::move(v), &core);
      if (!rerun) {
        s.q = Tensor<T>(ctx.mem(), act, ab, std::move(core.q));
        s.k = Tensor<T>(ctx.mem(), act, ab, std::move(core.k));
        s.v = Tensor<T>(ctx.mem(), act, ab, std::move(core.v));
        s.lse = Tensor<T>(ctx.mem(), act, 4, std::move(core.lse));
      }
    }
    this->HandOff(ctx, OffloadModule::kCoreAttn);  // attention.py: after core_attention
    s.o = Tensor<T>(ctx.mem(), act, ab, std::move(o));
    Tensor<T> partial(ctx.mem(), SimCategory::kTemporaries, ab, MatMul(ctx, s.o.m, out_->value.m));
    Mat<T> y = ReduceFromTpForward(ctx, partial.m);
    AddBias(&y, out_b_);
    this->HandOff(ctx, OffloadModule::kAttnProj);  // attention.py: after linear_proj
    if (rerun_norm) DiscardPreNorm(&s.n, &s.rstd);
    return y;
  }

  /// Megatron's scopes (attention.py get_query_key_value_tensors under
  /// "qkv_linear", the core under "core_attn", linear_proj under
  /// "attn_proj"; the input norm under "attn_norm" unless Transformer Engine
  /// fuses it into the QKV projection's LayerNormLinear).
  std::vector<SavedTensor> OffloadScopes(Ctx& ctx) override {
    Saved& s = *saved_.Find(ctx.microbatch);
    std::vector<SavedTensor> out;
    ScopedNorm(ctx.transformer_engine ? OffloadModule::kQkvLinear : OffloadModule::kAttnNorm, &s.x, &s.rstd, &out);
    out.push_back(Scoped(OffloadModule::kQkvLinear, {&s.n}));
    if (q_norm_ != nullptr) {
      for (Tensor<T>* t : {&s.q_in, &s.k_in}) out.push_back(Scoped(OffloadModule::kQkvLinear, {t}));
      out.push_back(Scoped(OffloadModule::kQkvLinear, {&s.q_rstd, &s.k_rstd}));
    }
    ScopedCoreAndProjection<T>(d_.flash_attention, ctx.rerun.has(RecomputeModule::kCoreAttn), s, &out);
    return out;
  }

  Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) override {
    ctx.rank->set_what(CommWhat::kAttention);
    const int64_t ab = ctx.bytes.activation;
    Saved s = saved_.Close(ctx.microbatch);
    if (RerunsNorm(ctx, ctx.transformer_engine)) RerunPreNorm(ctx, s.x.m, norm_->value.m, d_.norm_eps, &s.n, &s.rstd);
    AddBiasGrad(dy, out_b_);
    Tensor<T> dy_full(ctx.mem(), SimCategory::kTemporaries, ab, ReduceFromTpBackward(ctx, dy));
    out_->grad.m += MatMulTransA(ctx, s.o.m, dy_full.m);
    Mat<T> dout = MatMulTransB(ctx, dy_full.m, out_->value.m);
    dy_full.Release();
    if (ctx.rerun.has(RecomputeModule::kCoreAttn)) RerunCore(ctx, &s);
    const bool head_split = s.qc.m.size() > 0;  // the core's own layout, from a rerun
    Mat<T> dq, dk, dv;
    if (!d_.flash_attention) {
      Mat<T> dk_heads, dv_heads;
      const bool dropped = ctx.dropout > 0;
      UnfusedAttentionBackward(ctx, UnfusedShape(), s.q.m, s.k.m, s.v.m, s.probs.m, dropped ? &s.mask.m : nullptr,
                               dropped ? &s.dropped.m : nullptr, dout, &dq, &dk_heads, &dv_heads);
      dk = FoldHeads(dk_heads);
      dv = FoldHeads(dv_heads);
    } else {
      AttentionCoreBackward(ctx, Shape(), head_split ? s.qc.m : s.q.m, head_split ? s.kc.m : s.k.m,
                            head_split ? s.vc.m : s.v.m, s.lse.m, s.o.m, dout, &dq, &dk, &dv);
    }
    Rope(&dq, q_local_, d_, ctx.seq, -1);
    Rope(&dk, kv_local_, d_, ctx.seq, -1);
    if (q_norm_ != nullptr) {
      dq = HeadNormBackward(dq, s.q_in.m, d_.head_dim, s.q_rstd.m, q_norm_->value.m, &q_norm_->grad.m);
      dk = HeadNormBackward(dk, s.k_in.m, d_.head_dim, s.k_rstd.m, k_norm_->value.m, &k_norm_->grad.m);
    }
    Tensor<T> dqkv(ctx.mem(), SimCategory::kTemporaries, ab, Join(dq, dk, dv));
    AddBiasGrad(dqkv.m, qkv_b_);
    const Mat<T> dn = ColumnParallelBackward<T>(ctx, s.n.m, {{qkv_, &dqkv.m}});
    dqkv.Release();
    return NormBackward(dn, s.x.m, s.rstd.m, norm_->value.m, &norm_->grad.m);
  }

 private:
  /// What flash attention keeps for the backward (docs/formulas.md §3.2).
  struct Saved {
    Tensor<T> x, n, rstd, q, k, v, o, lse;
    Tensor<T> q_in, k_in, q_rstd, k_rstd;  // qk_norm only
    Tensor<T> qc, kc, vc;                  // a "core_attn" rerun under a2a: the core's head split
    Tensor<T> probs;                       // the unfused core's softmax output (flash_attention: false)
    Tensor<T> mask, dropped;               // and with dropout its mask and the dropped probabilities
  };

  /// Megatron's unfused core (DotProductAttention.forward): K and V
  /// repeat_interleaved to one head per query head, which baddbmm and bmm
  /// keep for their backward (GQA's K and V, expanded), with the softmax
  /// output in the activation dtype (FusedScaleMaskSoftmax's, which the bmm
  /// reads: one storage). With dropout the softmax output stays for the
  /// softmax's backward, and the dropout keeps its bool mask and the bmm the
  /// dropped probabilities (Korthikanti's 5as/h: 2 + 1 + 2 bytes).
  Mat<T> UnfusedCore(Ctx& ctx, Mat<T> q, const Mat<T>& k, const Mat<T>& v, Saved* s) const {
    const SimCategory act = SimCategory::kActivations;
    const int64_t ab = ctx.bytes.activation;
    s->k = Tensor<T>(ctx.mem(), act, ab, ExpandHeads(k));
    s->v = Tensor<T>(ctx.mem(), act, ab, ExpandHeads(v));
    Mat<T> probs, mask, dropped;
    const AttnDropout drop{this->layer(), ctx.tp_rank * q_local_, d_.heads};
    Mat<T> o = UnfusedAttentionForward(ctx, UnfusedShape(), q, s->k.m, s->v.m, &probs,
                                       ctx.dropout > 0 ? &drop : nullptr, &mask, &dropped);
    s->q = Tensor<T>(ctx.mem(), act, ab, std::move(q));
    s->probs = Tensor<T>(ctx.mem(), act, ab, std::move(probs));
    if (ctx.dropout > 0) {
      s->mask = Tensor<T>(ctx.mem(), act, 1, std::move(mask));
      s->dropped = Tensor<T>(ctx.mem(), act, ab, std::move(dropped));
    }
    return o;
  }

  /// The forward inside a checkpoint under torchtitan's per-op policy
  /// (op_policy.h), as torchtitan's Attention.forward runs it: wq, wk, wv
  /// (three aten.mm: the 1st and 3rd are saved), the qk norms, RoPE, the SDPA
  /// (its output and log-sum-exp saved), wo (the 4th, recomputed). The rerun
  /// takes the saved outputs back and runs the rest (the norm, wk, RoPE, wo),
  /// leaving the saved set the backward reads; validation admits it at tp =
  /// cp = 1, flash attention, no biases.
  Mat<T> OpForward(Ctx& ctx, const Mat<T>& x) {
    const SimCategory act = SimCategory::kActivations, tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation, mb = ctx.microbatch;
    const bool rerun = ctx.op.pass == OpPass::kRerun;
    Saved& s = saved_.Open(mb);
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s.x, &s.n, &s.rstd);
    Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
    Mat<T> wq, wk, wv;
    Split(qkv_->value.m, &wq, &wk, &wv);
    const auto mm = [&](const Mat<T>& w, SimCategory category) {
      return ops_.Matmul(ctx.op, ctx.mem(), category, ab, mb, [&] { return MatMul(ctx, n_full.m, w); });
    };
    // The qk norms read wq's and wk's outputs in backward; else RoPE consumes them.
    const SimCategory raw = q_norm_ != nullptr ? act : tmp;
    Tensor<T> q_raw = mm(wq, raw), k_raw = mm(wk, raw);
    s.v = mm(wv, act);
    n_full.Release();
    Mat<T> q = q_raw.m, k = k_raw.m;
    if (q_norm_ != nullptr) {
      Mat<T> rq, rk;
      q = HeadNorm(q, d_.head_dim, q_norm_->value.m, d_.norm_eps, &rq);
      k = HeadNorm(k, d_.head_dim, k_norm_->value.m, d_.norm_eps, &rk);
      s.q_rstd = Tensor<T>(ctx.mem(), act, 4, std::move(rq));
      s.k_rstd = Tensor<T>(ctx.mem(), act, 4, std::move(rk));
    }
    Rope(&q, q_local_, d_, ctx.seq, 1);
    Rope(&k, kv_local_, d_, ctx.seq, 1);
    s.q = Tensor<T>(ctx.mem(), act, ab, std::move(q));
    s.k = Tensor<T>(ctx.mem(), act, ab, std::move(k));
    if (q_norm_ != nullptr) {
      s.q_in = std::move(q_raw);
      s.k_in = std::move(k_raw);
    } else {
      q_raw.Release();
      k_raw.Release();
    }
    if (rerun) {
      s.o = ops_.Take(mb);
      s.lse = ops_.Take(mb);
    } else {
      AttnState<T> core;
      Mat<T> o = AttentionCoreForward(ctx, Shape(), s.q.m, s.k.m, s.v.m, &core);
      s.o = ops_.Keep(ctx.mem(), ab, mb, std::move(o));
      s.lse = ops_.Keep(ctx.mem(), 4, mb, std::move(core.lse));
    }
    const Tensor<T> partial =
        ops_.Matmul(ctx.op, ctx.mem(), tmp, ab, mb, [&] { return MatMul(ctx, s.o.m, out_->value.m); });
    return ReduceFromTpForward(ctx, partial.m);
  }

  /// KV head g's columns repeated for its Rep() query heads (repeat_interleave).
  Mat<T> ExpandHeads(const Mat<T>& kv) const {
    const int64_t dh = d_.head_dim, rep = Rep();
    Mat<T> out(kv.rows(), q_local_ * dh);
    for (int64_t h = 0; h < q_local_; ++h) out.middleCols(h * dh, dh) = kv.middleCols((h / rep) * dh, dh);
    return out;
  }

  /// The backward of ExpandHeads: each KV head sums its query heads' gradients.
  Mat<T> FoldHeads(const Mat<T>& per_head) const {
    const int64_t dh = d_.head_dim, rep = Rep();
    Mat<T> out = Mat<T>::Zero(per_head.rows(), kv_local_ * dh);
    for (int64_t h = 0; h < q_local_; ++h) out.middleCols((h / rep) * dh, dh) += per_head.middleCols(h * dh, dh);
    return out;
  }

  int64_t Rep() const { return d_.heads / d_.kv_heads; }

  /// The "core_attn" rerun (RerunAttentionCore) into the saved set.
  void RerunCore(Ctx& ctx, Saved* s) const {
    RerunAttentionCore(ctx, Shape(), s->q.m, s->k.m, s->v.m, &s->o.m, &s->lse, &s->qc, &s->kc, &s->vc);
  }

  void Split(const Mat<T>& qkv, Mat<T>* q, Mat<T>* k, Mat<T>* v) const {
    const int64_t dh = d_.head_dim, rep = Rep(), group = (rep + 2) * dh;
    q->resize(qkv.rows(), q_local_ * dh);
    k->resize(qkv.rows(), kv_local_ * dh);
    v->resize(qkv.rows(), kv_local_ * dh);
    for (int64_t g = 0; g < kv_local_; ++g) {
      q->middleCols(g * rep * dh, rep * dh) = qkv.middleCols(g * group, rep * dh);
      k->middleCols(g * dh, dh) = qkv.middleCols(g * group + rep * dh, dh);
      v->middleCols(g * dh, dh) = qkv.middleCols(g * group + (rep + 1) * dh, dh);
    }
  }

  Mat<T> Join(const Mat<T>& q, const Mat<T>& k, const Mat<T>& v) const {
    const int64_t dh = d_.head_dim, rep = Rep(), group = (rep + 2) * dh;
    Mat<T> qkv(q.rows(), kv_local_ * group);
    for (int64_t g = 0; g < kv_local_; ++g) {
      qkv.middleCols(g * group, rep * dh) = q.middleCols(g * rep * dh, rep * dh);
      qkv.middleCols(g * group + rep * dh, dh) = k.middleCols(g * dh, dh);
      qkv.middleCols(g * group + (rep + 1) * dh, dh) = v.middleCols(g * dh, dh);
    }
    return qkv;
  }

  AttnShape Shape() const { return AttnShape{d_.batch, d_.head_dim, Rep()}; }
  AttnShape UnfusedShape() const { return AttnShape{d_.batch, d_.head_dim, 1}; }

  Dims d_;
  int64_t q_local_ = 0, kv_local_ = 0;
  Param<T>* norm_ = nullptr;
  Param<T>* qkv_ = nullptr;
  Param<T>* out_ = nullptr;
  Param<T>* qkv_b_ = nullptr;  // linear_bias only
  Param<T>* out_b_ = nullptr;
  Param<T>* q_norm_ = nullptr;  // qk_norm only
  Param<T>* k_norm_ = nullptr;
  SavedPerMicrobatch<Saved> saved_;
  OpOutputs<T> ops_;  // recompute: selective_op
};

template <class T>
class MlpBlock final : public Block<T> {
 public:
  MlpBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) : act_(d.mlp_activation) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const int64_t h = d.hidden;
    eps_ = d.norm_eps;
    norm_ = &this->Add(MakeNorm<T>(ctx, d, p + "norm", seed, scale));
    // Gated (SwiGLU): fc1 = gate (activated) and up; else fc1 = up alone (activated).
    if (Gated(act_)) {
      gate_ = &WithRole(ctx,
                        this->Add(MakeParam<T>(ctx, p + "mlp.gate.weight", h, d.ffn, ShardKind::kColumns, Init::kMatrix,
                                               seed, scale / std::sqrt(double(h)))),
                        ParamRole::kMatrix);
    }
    up_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "mlp.up.weight", h, d.ffn, ShardKind::kColumns, Init::kMatrix,
                                                seed, scale / std::sqrt(double(h)))),
                    ParamRole::kMatrix);
    down_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "mlp.down.weight", d.ffn, h, ShardKind::kRows,
                                                  Init::kMatrix, seed, scale / std::sqrt(double(d.ffn)))),
                      ParamRole::kMatrix);
    // Megatron's linear_fc1 is one tensor: [gate; up] when gated.
    if (gate_ != nullptr) gate_->fused_tensor = up_->fused_tensor = p + "mlp.fc1.weight";
    if (d.linear_bias) {
      // fc1's biases split with its columns; fc2's added once, after the reduction.
      const auto bias = [&](const std::string& name, int64_t cols, ShardKind kind) {
        return &this->Add(MakeParam<T>(ctx, p + name, 1, cols, kind, Init::kMatrix, seed, 0.5 * scale));
      };
      if (gate_ != nullptr) gate_b_ = bias("mlp.gate.bias", d.ffn, ShardKind::kColumns);
      up_b_ = bias("mlp.up.bias", d.ffn, ShardKind::kColumns);
      down_b_ = bias("mlp.down.bias", h, ShardKind::kReplicated);
      if (gate_b_ != nullptr) gate_b_->fused_tensor = up_b_->fused_tensor = p + "mlp.fc1.bias";
    }
  }

  Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) override {
    ctx.rank->set_what(CommWhat::kMlp);
    if (ctx.op.on()) return OpForward(ctx, x);
    Saved& s = saved_.Open(ctx.microbatch);
    const bool rerun_norm = RerunsNorm(ctx, ctx.transformer_engine);
    SavePreNorm(ctx, x, norm_->value.m, eps_, &s.x, &s.n, &s.rstd, rerun_norm);
    const bool rerun = RerunsMlp(ctx);
    Mat<T> y = Mlp(ctx, &s, rerun ? SimCategory::kTemporaries : SimCategory::kActivations);
    if (rerun) {
      s.a.Release();
      s.u.Release();
      s.z.Release();
    }
    if (rerun_norm) DiscardPreNorm(&s.n, &s.rstd);
    return y;
  }

  /// Without Transformer Engine the pre-MLP norm is its own module
  /// ("mlp_norm"); with it, fused into fc1, it runs no offload group.
  std::vector<SavedTensor> OffloadScopes(Ctx& ctx) override {
    std::vector<SavedTensor> out;
    if (!ctx.transformer_engine)
      ScopedNorm(OffloadModule::kMlpNorm, &saved_.Find(ctx.microbatch)->x, &saved_.Find(ctx.microbatch)->rstd, &out);
    return out;
  }

  Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) override {
    ctx.rank->set_what(CommWhat::kMlp);
    const int64_t ab = ctx.bytes.activation;
    Saved s = saved_.Close(ctx.microbatch);
    if (RerunsNorm(ctx, ctx.transformer_engine)) RerunPreNorm(ctx, s.x.m, norm_->value.m, eps_, &s.n, &s.rstd);
    // The "mlp" checkpoint's rerun: the module's whole forward from the kept
    // norm output, its TP collectives included; the output is not used.
    if (RerunsMlp(ctx)) Mlp(ctx, &s, SimCategory::kRecomputed);
    AddBiasGrad(dy, down_b_);
    Tensor<T> dy_full(ctx.mem(), SimCategory::kTemporaries, ab, ReduceFromTpBackward(ctx, dy));
    down_->grad.m += MatMulTransA(ctx, s.z.m, dy_full.m);
    const Mat<T> dz = MatMulTransB(ctx, dy_full.m, down_->value.m);
    dy_full.Release();
    Mat<T> da, du;
    ActivateBackward(act_, dz, s.a.m, s.u.m, &da, &du);
    AddBiasGrad(da, ABias());
    if (gate_ != nullptr) AddBiasGrad(du, up_b_);
    const Mat<T> dn = gate_ != nullptr ? ColumnParallelBackward<T>(ctx, s.n.m, {{gate_, &da}, {up_, &du}})
                                       : ColumnParallelBackward<T>(ctx, s.n.m, {{up_, &da}});
    return NormBackward(dn, s.x.m, s.rstd.m, norm_->value.m, &norm_->grad.m);
  }

 private:
  struct Saved {
    Tensor<T> x, n, rstd, a, u, z;
  };

  /// Selective "mlp" without Transformer Engine: Megatron checkpoints the MLP
  /// module on the separate pre-MLP norm's output (transformer_layer.py
  /// _forward_mlp, tensor_parallel.checkpoint), so x, the norm output and
  /// the norm's statistics stay and the rest is rerun in backward. With
  /// Transformer Engine the norm is inside the module: the executor
  /// checkpoints the whole sublayer instead (recompute.h CheckpointGroups).
  static bool RerunsMlp(const Ctx& ctx) { return ctx.rerun.has(RecomputeModule::kMlp) && !ctx.transformer_engine; }

  /// The MLP on the saved norm output: fc1 (a, and u when gated), the
  /// activation z, fc2 and its TP reduction; a, u, z are charged to
  /// `category`. Returns fc2's output, this rank's rows.
  Mat<T> Mlp(Ctx& ctx, Saved* s, SimCategory category) {
    const int64_t ab = ctx.bytes.activation;
    Tensor<T> n_full = TpRegionInput(ctx, s->n.m);
    if (gate_ != nullptr) {
      s->a = Tensor<T>(ctx.mem(), category, ab, MatMul(ctx, n_full.m, gate_->value.m));
      s->u = Tensor<T>(ctx.mem(), category, ab, MatMul(ctx, n_full.m, up_->value.m));
      AddBias(&s->u.m, up_b_);
    } else {
      s->a = Tensor<T>(ctx.mem(), category, ab, MatMul(ctx, n_full.m, up_->value.m));
    }
    AddBias(&s->a.m, ABias());
    n_full.Release();
    s->z = Tensor<T>(ctx.mem(), category, ab, Activate(act_, s->a.m, s->u.m));
    Tensor<T> partial(ctx.mem(), SimCategory::kTemporaries, ab, MatMul(ctx, s->z.m, down_->value.m));
    Mat<T> y = ReduceFromTpForward(ctx, partial.m);
    AddBias(&y, down_b_);
    return y;
  }

  /// The forward inside a checkpoint under torchtitan's per-op policy
  /// (op_policy.h), as torchtitan's FeedForward runs it, w2(silu(w1(x)) *
  /// w3(x)): after the attention's four, w1 is the block's 5th aten.mm
  /// (saved: SiLU reads it in backward), w3 the 6th (recomputed), w2 the 7th
  /// (saved, though no backward reads the block's output: the rerun takes it
  /// back and drops it). Validation admits a bias-free SwiGLU at tp 1.
  Mat<T> OpForward(Ctx& ctx, const Mat<T>& x) {
    const SimCategory act = SimCategory::kActivations;
    const int64_t ab = ctx.bytes.activation, mb = ctx.microbatch;
    Saved& s = saved_.Open(mb);
    SavePreNorm(ctx, x, norm_->value.m, eps_, &s.x, &s.n, &s.rstd);
    Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
    const auto mm = [&](const Mat<T>& a, const Param<T>& w, SimCategory category) {
      return ops_.Matmul(ctx.op, ctx.mem(), category, ab, mb, [&] { return MatMul(ctx, a, w.value.m); });
    };
    s.a = mm(n_full.m, *gate_, act);
    s.u = mm(n_full.m, *up_, act);
    n_full.Release();
    s.z = Tensor<T>(ctx.mem(), act, ab, Activate(act_, s.a.m, s.u.m));
    const Tensor<T> out = mm(s.z.m, *down_, SimCategory::kTemporaries);
    return ReduceFromTpForward(ctx, out.m);
  }

  /// The bias of fc1's activated output a: the gate's when gated, else up's.
  Param<T>* ABias() const { return gate_ != nullptr ? gate_b_ : up_b_; }

  FfnActivation act_;
  double eps_ = 1e-5;
  Param<T>* norm_ = nullptr;
  Param<T>* gate_ = nullptr;  // gated activations only
  Param<T>* up_ = nullptr;
  Param<T>* down_ = nullptr;
  Param<T>* gate_b_ = nullptr;  // linear_bias only (gate_b_ also gated only)
  Param<T>* up_b_ = nullptr;
  Param<T>* down_b_ = nullptr;
  SavedPerMicrobatch<Saved> saved_;
  OpOutputs<T> ops_;  // recompute: selective_op
};

}  // namespace

template <class T>
void ApplyRope(Mat<T>* m, const RopeSpan& span, const Dims& d, const SeqLayout& seq, int sign) {
  const int64_t half = span.dim / 2;
  for (int64_t row = 0; row < m->rows(); ++row) {
    const double pos = static_cast<double>(seq.Position(row / d.batch));
    for (int64_t i = 0; i < half; ++i) {
      const double theta = std::pow(d.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(span.dim));
      const T c = T(std::cos(pos * theta));
      const T s = T(sign * std::sin(pos * theta));
      for (int64_t h = 0; h < span.heads; ++h) {
        T& a = (*m)(row, h * span.stride + span.offset + i);
        T& b = (*m)(row, h * span.stride + span.offset + i + half);
        const T a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
    }
  }
}

template <class T>
Mat<T> SwiGlu(const Mat<T>& a, const Mat<T>& u) {
  Mat<T> z(a.rows(), a.cols());
  for (int64_t i = 0; i < a.size(); ++i) z.data()[i] = a.data()[i] * Sigmoid(a.data()[i]) * u.data()[i];
  return z;
}

template <class T>
void SwiGluBackward(const Mat<T>& dz, const Mat<T>& a, const Mat<T>& u, Mat<T>* da, Mat<T>* du) {
  // silu'(a) = s(a)(1 + a(1 - s(a))) (docs/formulas.md §8.1).
  da->resize(a.rows(), a.cols());
  du->resize(a.rows(), a.cols());
  for (int64_t i = 0; i < a.size(); ++i) {
    const T x = a.data()[i], s = Sigmoid(x);
    du->data()[i] = dz.data()[i] * x * s;
    da->data()[i] = dz.data()[i] * u.data()[i] * s * (T(1) + x * (T(1) - s));
  }
}

template <class T>
Mat<T> Activate(FfnActivation f, const Mat<T>& a, const Mat<T>& u) {
  if (f == FfnActivation::kSwiglu) return SwiGlu(a, u);
  Mat<T> z(a.rows(), a.cols());
  for (int64_t i = 0; i < a.size(); ++i) {
    const T x = a.data()[i];
    if (f == FfnActivation::kGelu) {
      z.data()[i] = T(0.5) * x * (T(1) + std::erf(x / std::sqrt(T(2))));
    } else {
      const T r = std::max(x, T(0));
      z.data()[i] = r * r;
    }
  }
  return z;
}

template <class T>
void ActivateBackward(FfnActivation f, const Mat<T>& dz, const Mat<T>& a, const Mat<T>& u, Mat<T>* da, Mat<T>* du) {
  if (f == FfnActivation::kSwiglu) return SwiGluBackward(dz, a, u, da, du);
  da->resize(a.rows(), a.cols());
  for (int64_t i = 0; i < a.size(); ++i) {
    const T x = a.data()[i];
    T slope;
    if (f == FfnActivation::kGelu) {
      // GELU'(x) = Phi(x) + x phi(x), phi the standard normal density.
      const T pdf = std::exp(T(-0.5) * x * x) / std::sqrt(T(2) * std::numbers::pi_v<T>);
      slope = T(0.5) * (T(1) + std::erf(x / std::sqrt(T(2)))) + x * pdf;
    } else {
      slope = T(2) * std::max(x, T(0));
    }
    da->data()[i] = dz.data()[i] * slope;
  }
}

template <class T>
std::unique_ptr<Block<T>> MakeDenseBlock(char letter, Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed,
                                         double scale) {
  if (letter == 'A') return std::make_unique<AttentionBlock<T>>(ctx, d, layer, seed, scale);
  return std::make_unique<MlpBlock<T>>(ctx, d, layer, seed, scale);
}

template void ApplyRope<double>(Mat<double>*, const RopeSpan&, const Dims&, const SeqLayout&, int);
template void ApplyRope<float>(Mat<float>*, const RopeSpan&, const Dims&, const SeqLayout&, int);
template Mat<double> SwiGlu<double>(const Mat<double>&, const Mat<double>&);
template Mat<float> SwiGlu<float>(const Mat<float>&, const Mat<float>&);
template void SwiGluBackward<double>(const Mat<double>&, const Mat<double>&, const Mat<double>&, Mat<double>*,
                                     Mat<double>*);
template void SwiGluBackward<float>(const Mat<float>&, const Mat<float>&, const Mat<float>&, Mat<float>*,
                                    Mat<float>*);
template Mat<double> Activate<double>(FfnActivation, const Mat<double>&, const Mat<double>&);
template Mat<float> Activate<float>(FfnActivation, const Mat<float>&, const Mat<float>&);
template void ActivateBackward<double>(FfnActivation, const Mat<double>&, const Mat<double>&, const Mat<double>&,
                                       Mat<double>*, Mat<double>*);
template void ActivateBackward<float>(FfnActivation, const Mat<float>&, const Mat<float>&, const Mat<float>&,
                                      Mat<float>*, Mat<float>*);
template std::unique_ptr<Block<double>> MakeDenseBlock<double>(char, Ctx&, const Dims&, int64_t, uint64_t, double);
template std::unique_ptr<Block<float>> MakeDenseBlock<float>(char, Ctx&, const Dims&, int64_t, uint64_t, double);

}  // namespace preflight::sim

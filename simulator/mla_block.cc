// A as multi-head latent attention (DeepSeek-V2/V3; docs/formulas.md §1.3),
// forward and hand-written backward, sharded as Megatron-LM's
// multi_latent_attention.py (MLASelfAttention, NVIDIA/Megatron-LM d98e8a6):
//   - the down-projections W_dq [h, d_cq] and W_dkv [h, d_c + d_rope] are
//     replicated (TELinear parallel_mode "duplicated") and run on this rank's
//     rows (the SP slice);
//   - the latents go through their RMSNorms, then the column-parallel
//     up-projections W_uq [d_cq, n (d_nope + d_rope)] and W_ukv [d_c, n
//     (d_nope + d_v)], which all-gather their SP-sharded input as any
//     column-parallel linear does; without a query rank (q_lora 0) the query
//     is one column-parallel W_q [h, n (d_nope + d_rope)] from the norm output;
//   - the decoupled RoPE key k_pe (d_rope, shared by every head) is gathered
//     over SP (gather_from_sequence_parallel_region: all-gather forward,
//     reduce-scatter of its gradient backward);
//   - per head Q = [q_nope | rope(q_pe)], K = [k_nope | rope(k_pe)], V; the
//     attention core (attention_core.h, with CP) at d_nope + d_rope for Q, K
//     and d_v for V, O; W_o [n d_v, h] row-parallel.
// Saved for the backward (docs/formulas.md §3.2 "MLA"): x, the norm output and
// its rstd; the down-projection outputs (the latent norms' inputs; the KV one
// whole, since the norm reads a view of [c_kv | k_pe]), the normed latents
// (the up-projections' inputs, SP-sharded) and their rstd; Q, K, V, O and the
// log-sum-exp.
#include <cmath>

#include "attention_core.h"
#include "blocks.h"

namespace preflight::sim {
namespace {

template <class T>
class MlaBlock final : public Block<T> {
 public:
  MlaBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) : d_(d) {
    if (ctx.tp_size > 1 && !ctx.sp) {
      throw SimUnsupported(
          "MLA with parallel.tp > 1 runs with sequence parallelism in the executor (the replicated "
          "down-projections then see each token once); set parallel.sp: true");
    }
    CheckAttentionCp(d, ctx.tp_size, ctx.cp_size, ctx.cp_comm, ctx.seq.load_balanced);
    const std::string p = "layers." + std::to_string(layer) + ".";
    const int64_t h = d.hidden, qk = QkDim(), n = d.heads;
    const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, ShardKind shard) {
      return &WithRole(ctx,
                       this->Add(MakeParam<T>(ctx, p + name, rows, cols, shard, Init::kMatrix, seed,
                                              scale / std::sqrt(double(rows)))),
                       ParamRole::kMatrix);
    };
    const auto norm = [&](const std::string& name, int64_t width) {
      return &this->Add(MakeParam<T>(ctx, p + name, 1, width, ShardKind::kReplicated, Init::kNormWeight, seed, scale));
    };
    norm_ = norm("norm.weight", h);
    if (d.mla_q_lora > 0) {
      q_down_ = matrix("attention.q_down.weight", h, d.mla_q_lora, ShardKind::kReplicated);
      q_norm_ = norm("attention.q_norm.weight", d.mla_q_lora);
      q_up_ = matrix("attention.q_up.weight", d.mla_q_lora, n * qk, ShardKind::kColumns);
    } else {
      q_up_ = matrix("attention.q.weight", h, n * qk, ShardKind::kColumns);
    }
    kv_down_ = matrix("attention.kv_down.weight", h, d.mla_kv_lora + d.mla_rope, ShardKind::kReplicated);
    kv_norm_ = norm("attention.kv_norm.weight", d.mla_kv_lora);
    kv_up_ = matrix("attention.kv_up.weight", d.mla_kv_lora, n * (d.mla_nope + d.mla_v), ShardKind::kColumns);
    out_ = matrix("attention.out.weight", n * d.mla_v, h, ShardKind::kRows);
    heads_local_ = n / ctx.tp_size;
    if (ctx.dropout > 0 && d.flash_attention)
      throw SimUnsupported("dropout inside flash attention is not in the executor");
  }

  Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) override {
    ctx.rank->set_what(CommWhat::kAttention);
    const SimCategory act = SimCategory::kActivations, tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation;
    Saved& s = saved_.Open(ctx.microbatch);
    // MLA's input_layernorm is its own module with or without Transformer Engine.
    const bool rerun_norm = RerunsNorm(ctx, /*fused=*/false);
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s.x, &s.n, &s.rstd, rerun_norm);
    // The latents: the query's (down, norm) when q_lora > 0, and the KV
    // latent with k_pe beside it.
    if (q_down_ != nullptr) {
      s.cq = Tensor<T>(ctx.mem(), act, ab, MatMul(ctx, s.n.m, q_down_->value.m));
      Mat<T> rstd;
      s.cq_n = Tensor<T>(ctx.mem(), act, ab, RmsNormForward(s.cq.m, q_norm_->value.m, d_.norm_eps, &rstd));
      s.rstd_q = Tensor<T>(ctx.mem(), act, 4, std::move(rstd));
    }
    s.ckv = Tensor<T>(ctx.mem(), act, ab, MatMul(ctx, s.n.m, kv_down_->value.m));
    Mat<T> rstd;
    s.ckv_n =
        Tensor<T>(ctx.mem(), act, ab,
                  RmsNormForward(Mat<T>(s.ckv.m.leftCols(d_.mla_kv_lora)), kv_norm_->value.m, d_.norm_eps, &rstd));
    s.rstd_kv = Tensor<T>(ctx.mem(), act, 4, std::move(rstd));
    Mat<T> q, k, v;
    UpProject(ctx, s, &q, &k, &v);
    // multi_latent_attention.py: after get_query_key_value_tensors.
    this->HandOff(ctx, OffloadModule::kQkvLinear);
    // "core_attn" (Megatron's _checkpointed_attention_forward, as for GQA):
    // the core's inputs stay, its own state is rerun in backward.
    // "mla_up_proj": q, k, v are dropped after the core (RerunsUpProjection).
    const bool rerun_core = ctx.rerun.has(RecomputeModule::kCoreAttn), rerun_up = RerunsUpProjection(ctx);
    if (rerun_core && !rerun_up) {
      s.q = Tensor<T>(ctx.mem(), act, ab, q);
      s.k = Tensor<T>(ctx.mem(), act, ab, k);
      s.v = Tensor<T>(ctx.mem(), act, ab, v);
    }
    AttnState<T> core;
    Mat<T> o;
    if (!d_.flash_attention) {
      // Megatron's unfused core keeps q, k, v and the softmax output
      // (DotProductAttention; MLA has a key head per query head). Neither
      // rerun is in the executor with it (simulate.cc).
      Mat<T> mask, dropped;
      const AttnDropout drop{this->layer(), ctx.tp_rank * heads_local_, d_.heads};
      o = UnfusedAttentionForward(ctx, Shape(), q, k, v, &core.lse, ctx.dropout > 0 ? &drop : nullptr, &mask, &dropped);
      s.probs = Tensor<T>(ctx.mem(), act, ab, std::move(core.lse));
      if (ctx.dropout > 0) {  // the dropout's mask and the dropped probabilities the bmm keeps
        s.mask = Tensor<T>(ctx.mem(), act, 1, std::move(mask));
        s.dropped = Tensor<T>(ctx.mem(), act, ab, std::move(dropped));
      }
      core.q = std::move(q);
      core.k = std::move(k);
      core.v = std::move(v);
    } else {
      o = AttentionCoreForward(ctx, Shape(), std::move(q), std::move(k), std::move(v), &core);
      if (!rerun_core) s.lse = Tensor<T>(ctx.mem(), act, 4, std::move(core.lse));
    }
    if (!rerun_core && !rerun_up) {
      s.q = Tensor<T>(ctx.mem(), act, ab, std::move(core.q));
      s.k = Tensor<T>(ctx.mem(), act, ab, std::move(core.k));
      s.v = Tensor<T>(ctx.mem(), act, ab, std::move(core.v));
    }
    this->HandOff(ctx, OffloadModule::kCoreAttn);  // after core_attention
    s.o = Tensor<T>(ctx.mem(), act, ab, std::move(o));
    Tensor<T> partial(ctx.mem(), tmp, ab, MatMul(ctx, s.o.m, out_->value.m));
    if (rerun_norm) DiscardPreNorm(&s.n, &s.rstd);
    Mat<T> y = ReduceFromTpForward(ctx, partial.m);
    this->HandOff(ctx, OffloadModule::kAttnProj);  // after linear_proj
    return y;
  }

  /// Megatron's scopes: the input norm ("attn_norm", its own module), the
  /// down-projections, latent norms and up-projections ("qkv_linear"), the
  /// core ("core_attn") and the output projection ("attn_proj").
  std::vector<SavedTensor> OffloadScopes(Ctx& ctx) override {
    Saved& s = *saved_.Find(ctx.microbatch);
    std::vector<SavedTensor> out;
    ScopedNorm(OffloadModule::kAttnNorm, &s.x, &s.rstd, &out);
    for (Tensor<T>* t : {&s.n, &s.cq, &s.ckv, &s.cq_n, &s.ckv_n}) out.push_back(Scoped(OffloadModule::kQkvLinear, {t}));
    // The two latent norms' statistics, one entry per row each (the estimator's one tensor).
    out.push_back(Scoped(OffloadModule::kQkvLinear, {&s.rstd_q, &s.rstd_kv}, s.rstd_kv.m.rows()));
    ScopedCoreAndProjection<T>(d_.flash_attention, ctx.rerun.has(RecomputeModule::kCoreAttn), s, &out);
    return out;
  }

  Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) override {
    ctx.rank->set_what(CommWhat::kAttention);
    const SimCategory tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation, hl = heads_local_, nope = d_.mla_nope, rope = d_.mla_rope;
    Saved s = saved_.Close(ctx.microbatch);
    if (RerunsNorm(ctx, /*fused=*/false)) RerunPreNorm(ctx, s.x.m, norm_->value.m, d_.norm_eps, &s.n, &s.rstd);
    Tensor<T> dy_full(ctx.mem(), tmp, ab, ReduceFromTpBackward(ctx, dy));
    out_->grad.m += MatMulTransA(ctx, s.o.m, dy_full.m);
    const Mat<T> dout = MatMulTransB(ctx, dy_full.m, out_->value.m);
    dy_full.Release();
    if (RerunsUpProjection(ctx)) {
      // Q, K, V again from the kept latents, their TP gathers included.
      Mat<T> q, k, v;
      UpProject(ctx, s, &q, &k, &v);
      s.q = Tensor<T>(ctx.mem(), SimCategory::kRecomputed, ab, std::move(q));
      s.k = Tensor<T>(ctx.mem(), SimCategory::kRecomputed, ab, std::move(k));
      s.v = Tensor<T>(ctx.mem(), SimCategory::kRecomputed, ab, std::move(v));
    }
    if (ctx.rerun.has(RecomputeModule::kCoreAttn)) {
      RerunAttentionCore(ctx, Shape(), s.q.m, s.k.m, s.v.m, &s.o.m, &s.lse, &s.qc, &s.kc, &s.vc);
    }
    const bool head_split = s.qc.m.size() > 0;  // the core's own layout, from a rerun
    Mat<T> dq, dk, dv;
    if (!d_.flash_attention) {
      const bool dropped = ctx.dropout > 0;
      UnfusedAttentionBackward(ctx, Shape(), s.q.m, s.k.m, s.v.m, s.probs.m, dropped ? &s.mask.m : nullptr,
                               dropped ? &s.dropped.m : nullptr, dout, &dq, &dk, &dv);
    } else {
      AttentionCoreBackward(ctx, Shape(), head_split ? s.qc.m : s.q.m, head_split ? s.kc.m : s.k.m,
                            head_split ? s.vc.m : s.v.m, s.lse.m, s.o.m, dout, &dq, &dk, &dv);
    }
    ApplyRope(&dq, RopeSpan{hl, QkDim(), nope, rope}, d_, ctx.seq, -1);
    // k_pe feeds every head: its gradient sums the heads' rope parts (this
    // rank's heads; the SP reduce-scatter sums the TP ranks').
    Tensor<T> dkv(ctx.mem(), tmp, ab, Mat<T>(dk.rows(), hl * KvDim()));
    Mat<T> dk_pe = Mat<T>::Zero(dk.rows(), rope);
    for (int64_t i = 0; i < hl; ++i) {
      dkv.m.middleCols(i * KvDim(), nope) = dk.middleCols(i * QkDim(), nope);
      dkv.m.middleCols(i * KvDim() + nope, d_.mla_v) = dv.middleCols(i * d_.mla_v, d_.mla_v);
      dk_pe += dk.middleCols(i * QkDim() + nope, rope);
    }
    ApplyRope(&dk_pe, RopeSpan{1, rope, 0, rope}, d_, ctx.seq, -1);
    // KV latent: [d c_kv | d k_pe] on this rank's rows, through W_dkv.
    const Mat<T> dckv_n = ColumnParallelBackward<T>(ctx, s.ckv_n.m, {{kv_up_, &dkv.m}});
    dkv.Release();
    Mat<T> dckv(dckv_n.rows(), d_.mla_kv_lora + rope);
    dckv.leftCols(d_.mla_kv_lora) = RmsNormBackward(dckv_n, Mat<T>(s.ckv.m.leftCols(d_.mla_kv_lora)), s.rstd_kv.m,
                                                    kv_norm_->value.m, &kv_norm_->grad.m);
    dckv.rightCols(rope) = CopyToTpBackward(ctx, dk_pe);
    kv_down_->grad.m += MatMulTransA(ctx, s.n.m, dckv);
    Mat<T> dn = MatMulTransB(ctx, dckv, kv_down_->value.m);
    if (q_down_ != nullptr) {
      const Mat<T> dcq_n = ColumnParallelBackward<T>(ctx, s.cq_n.m, {{q_up_, &dq}});
      const Mat<T> dcq = RmsNormBackward(dcq_n, s.cq.m, s.rstd_q.m, q_norm_->value.m, &q_norm_->grad.m);
      q_down_->grad.m += MatMulTransA(ctx, s.n.m, dcq);
      dn += MatMulTransB(ctx, dcq, q_down_->value.m);
    } else {
      dn += ColumnParallelBackward<T>(ctx, s.n.m, {{q_up_, &dq}});
    }
    return RmsNormBackward(dn, s.x.m, s.rstd.m, norm_->value.m, &norm_->grad.m);
  }

 private:
  struct Saved {
    Tensor<T> x, n, rstd, cq, cq_n, rstd_q, ckv, ckv_n, rstd_kv, q, k, v, o, lse;
    Tensor<T> qc, kc, vc;  // a "core_attn" rerun under a2a: the core's head split
    Tensor<T> probs;       // the unfused core's softmax output (flash_attention: false)
    Tensor<T> mask, dropped;  // with dropout: its mask and the dropped probabilities
  };

  /// Selective "mla_up_proj": Megatron's MLASelfAttention runs the q and
  /// kv up-projections and RoPE under CheckpointWithoutOutput
  /// (multi_latent_attention.py qkv_up_checkpoint) and discards q, k, v once
  /// the core has run; they are recomputed from the latents when the core
  /// output's gradient arrives, after the O-projection's backward.
  static bool RerunsUpProjection(const Ctx& ctx) { return ctx.rerun.has(RecomputeModule::kMlaUpProj); }

  /// Q, K, V of this rank's heads from the saved latents: the q and kv
  /// up-projections (column-parallel: their inputs gathered over TP under
  /// SP), k_pe gathered likewise, RoPE on the rope parts, k_pe shared by
  /// every head.
  void UpProject(Ctx& ctx, const Saved& s, Mat<T>* q, Mat<T>* k, Mat<T>* v) const {
    const int64_t ab = ctx.bytes.activation, hl = heads_local_, nope = d_.mla_nope, rope = d_.mla_rope;
    {
      Tensor<T> in = TpRegionInput(ctx, q_down_ != nullptr ? s.cq_n.m : s.n.m);
      *q = MatMul(ctx, in.m, q_up_->value.m);
    }
    Tensor<T> kv;
    {
      Tensor<T> in = TpRegionInput(ctx, s.ckv_n.m);
      kv = Tensor<T>(ctx.mem(), SimCategory::kTemporaries, ab, MatMul(ctx, in.m, kv_up_->value.m));
    }
    Tensor<T> k_pe = TpRegionInput(ctx, Mat<T>(s.ckv.m.rightCols(rope)));
    ApplyRope(q, RopeSpan{hl, QkDim(), nope, rope}, d_, ctx.seq, 1);
    ApplyRope(&k_pe.m, RopeSpan{1, rope, 0, rope}, d_, ctx.seq, 1);
    k->resize(kv.m.rows(), hl * QkDim());
    v->resize(kv.m.rows(), hl * d_.mla_v);
    for (int64_t i = 0; i < hl; ++i) {
      k->middleCols(i * QkDim(), nope) = kv.m.middleCols(i * KvDim(), nope);
      k->middleCols(i * QkDim() + nope, rope) = k_pe.m;
      v->middleCols(i * d_.mla_v, d_.mla_v) = kv.m.middleCols(i * KvDim() + nope, d_.mla_v);
    }
  }

  int64_t QkDim() const { return d_.mla_nope + d_.mla_rope; }
  int64_t KvDim() const { return d_.mla_nope + d_.mla_v; }
  /// Every query head has its own key head (rep 1); softmax scale 1/sqrt(d_nope + d_rope).
  AttnShape Shape() const { return AttnShape{d_.batch, QkDim(), 1, d_.mla_v}; }

  Dims d_;
  int64_t heads_local_ = 0;
  Param<T>* norm_ = nullptr;
  Param<T>* q_down_ = nullptr;  // absent when q_lora is 0
  Param<T>* q_norm_ = nullptr;
  Param<T>* q_up_ = nullptr;  // W_uq, or W_q when q_lora is 0
  Param<T>* kv_down_ = nullptr;
  Param<T>* kv_norm_ = nullptr;
  Param<T>* kv_up_ = nullptr;
  Param<T>* out_ = nullptr;
  SavedPerMicrobatch<Saved> saved_;
};

}  // namespace

template <class T>
std::unique_ptr<Block<T>> MakeMlaBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) {
  return std::make_unique<MlaBlock<T>>(ctx, d, layer, seed, scale);
}
template std::unique_ptr<Block<double>> MakeMlaBlock<double>(Ctx&, const Dims&, int64_t, uint64_t, double);
template std::unique_ptr<Block<float>> MakeMlaBlock<float>(Ctx&, const Dims&, int64_t, uint64_t, double);

}  // namespace preflight::sim

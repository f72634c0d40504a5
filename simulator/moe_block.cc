// E: MoE FFN with a top-k router (softmax over the chosen logits, or
// DeepSeek-V3's sigmoid scores normalised over the chosen experts, chosen by
// score + expert bias when the router has one), capacity with token dropping (or
// dropless, or padded to capacity), experts (SwiGLU, GELU or squared ReLU) placed over EP and split
// over expert-TP, and a shared expert over TP (docs/formulas.md §5, 8.2, 8.3).
//
// Data flow on a rank (forward): route the local tokens; order the kept
// token-expert pairs by (destination EP rank, local expert, token) = (expert,
// token); exchange counts (all-to-all over EP, int64) unless padded; dispatch
// (all-to-all over EP); with expert_tp > 1 all-gather the received rows over
// ETP; run each local expert on its rows; reduce-scatter over ETP; combine
// (the inverse all-to-all); at the source sum p * y in ascending expert order.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "blocks.h"

namespace preflight::sim {
namespace {

/// Megatron's guard in the sigmoid router's normalisation: p = s / (sum s + 1e-20).
constexpr double kSigmoidNormEps = 1e-20;

/// Where the rows of a routed buffer come from: counts[source][local expert].
struct RowLayout {
  std::vector<std::vector<int64_t>> counts;
  int64_t rows() const {
    int64_t n = 0;
    for (const auto& c : counts) n += std::accumulate(c.begin(), c.end(), int64_t{0});
    return n;
  }
  int64_t rows_of(size_t source) const { return std::accumulate(counts[source].begin(), counts[source].end(), int64_t{0}); }
  /// Local expert of each row, in buffer order.
  std::vector<int64_t> ExpertOfRows() const {
    std::vector<int64_t> out;
    for (const auto& c : counts) {
      for (size_t le = 0; le < c.size(); ++le) out.insert(out.end(), static_cast<size_t>(c[le]), static_cast<int64_t>(le));
    }
    return out;
  }
};

std::vector<int64_t> Scaled(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> out;
  for (int64_t r : rows) out.push_back(r * width);
  return out;
}

template <class T>
class MoeBlock final : public Block<T> {
 public:
  MoeBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale)
      : d_(d), gated_(Gated(d.moe_activation)) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const int64_t h = d.hidden;
    local_experts_ = d.experts / ctx.ep_size;
    norm_ = &this->Add(MakeNorm<T>(ctx, d, p + "norm", seed, scale));
    router_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "moe.router.weight", h, d.experts, ShardKind::kReplicated,
                                                    Init::kMatrix, seed, 4.0 * scale / std::sqrt(double(h)))),
                        ParamRole::kRouter);
    if (d.router_bias) {
      // Megatron starts the bias at zero; a nonzero start makes the scaled
      // step's selection depend on it, so a bias that steered the weights
      // too would show.
      bias_.name = p + "moe.router.expert_bias";
      bias_.bias = Tensor<T>(ctx.mem(), SimCategory::kReplicatedParams, 4,
                             GlobalValue(bias_.name, 1, d.experts, Init::kMatrix, seed, 0.05).template cast<T>());
      bias_.counts = Tensor<T>(ctx.mem(), SimCategory::kRoutingScratch, 4, Mat<T>::Zero(1, d.experts));
    }
    for (int64_t le = 0; le < local_experts_; ++le) {
      const int64_t e = ctx.ep_rank * local_experts_ + le;
      const std::string q = p + "moe.experts." + std::to_string(e) + ".";
      const double s_in = scale / std::sqrt(double(h)), s_out = scale / std::sqrt(double(d.expert_ffn));
      // Gated experts: fc1 = gate (activated) and up; else up alone (activated).
      if (gated_) {
        gate_.push_back(&WithRole(ctx,
                                  this->Add(MakeParam<T>(ctx, q + "gate.weight", h, d.expert_ffn,
                                                         ShardKind::kExpertColumns, Init::kMatrix, seed, s_in, e)),
                                  ParamRole::kMatrix));
      }
      up_.push_back(&WithRole(ctx, this->Add(MakeParam<T>(ctx, q + "up.weight", h, d.expert_ffn, ShardKind::kExpertColumns,
                                            Init::kMatrix, seed, s_in, e)), ParamRole::kMatrix));
      down_.push_back(&WithRole(ctx, this->Add(MakeParam<T>(ctx, q + "down.weight", d.expert_ffn, h, ShardKind::kExpertRows,
                                              Init::kMatrix, seed, s_out, e)), ParamRole::kMatrix));
      if (d.linear_bias) {
        // Each expert's fc1 and fc2 biases (expert_tp 1: CheckSupported).
        const auto bias = [&](const std::string& name, int64_t cols) {
          return &this->Add(
              MakeParam<T>(ctx, q + name, 1, cols, ShardKind::kExpertColumns, Init::kMatrix, seed, 0.5 * scale, e));
        };
        if (gated_) gate_b_.push_back(bias("gate.bias", d.expert_ffn));
        up_b_.push_back(bias("up.bias", d.expert_ffn));
        down_b_.push_back(bias("down.bias", h));
        if (gated_) gate_b_.back()->fused_tensor = up_b_.back()->fused_tensor = q + "fc1.bias";
      }
      // Each expert's linear_fc1 is one tensor: [gate; up] when gated.
      if (gated_) gate_.back()->fused_tensor = up_.back()->fused_tensor = q + "fc1.weight";
    }
    if (d.shared_ffn > 0) {
      const double s_in = scale / std::sqrt(double(h)), s_out = scale / std::sqrt(double(d.shared_ffn));
      // Megatron's shared expert is an MLP with the experts' activation.
      if (gated_) {
        sh_gate_ = &WithRole(ctx,
                             this->Add(MakeParam<T>(ctx, p + "moe.shared.gate.weight", h, d.shared_ffn,
                                                    ShardKind::kColumns, Init::kMatrix, seed, s_in)),
                             ParamRole::kMatrix);
      }
      sh_up_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "moe.shared.up.weight", h, d.shared_ffn, ShardKind::kColumns,
                                       Init::kMatrix, seed, s_in)), ParamRole::kMatrix);
      sh_down_ = &WithRole(ctx, this->Add(MakeParam<T>(ctx, p + "moe.shared.down.weight", d.shared_ffn, h, ShardKind::kRows,
                                         Init::kMatrix, seed, s_out)), ParamRole::kMatrix);
      if (gated_) sh_gate_->fused_tensor = sh_up_->fused_tensor = p + "moe.shared.fc1.weight";
      if (d.shared_gate) {
        // Megatron SharedExpertMLP gate_weight [1, h]: replicated, its
        // gradient partial over TP with SP (sequence_parallel attribute).
        sh_score_w_ = &this->Add(MakeParam<T>(ctx, p + "moe.shared.score.weight", 1, h, ShardKind::kReplicated,
                                              Init::kMatrix, seed, 4.0 * scale / std::sqrt(double(h))));
      }
    }
  }

  ExpertBias<T>* expert_bias() override { return d_.router_bias ? &bias_ : nullptr; }

  Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) override {
    const bool rerun_norm = RerunsNorm(ctx, /*fused=*/false);  // the router reads it: always its own module
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s_.x, &s_.n, &s_.rstd, rerun_norm);
    const bool rerun = RerunsLayer(ctx);
    Mat<T> result = Layer(ctx, rerun ? SimCategory::kTemporaries : SimCategory::kActivations, false);
    if (rerun) {
      // The checkpoint keeps its input, the norm output; the norm keeps x and its statistics.
      State kept;
      kept.x = std::move(s_.x);
      kept.n = std::move(s_.n);
      kept.rstd = std::move(s_.rstd);
      s_ = std::move(kept);
    }
    if (rerun_norm) DiscardPreNorm(&s_.n, &s_.rstd);
    saved_.Open(ctx.microbatch) = std::exchange(s_, State());
    return result;
  }

  /// Megatron's scopes: the pre-MLP norm ("mlp_norm"), the routed experts'
  /// fc1 input ("expert_fc1") and fc1's output, which the activation saves
  /// as one tensor ([a | u] when gated: "moe_act"), moe/experts.py.
  std::vector<SavedTensor> OffloadScopes(Ctx& ctx) override {
    State* kept = saved_.Find(ctx.microbatch);
    State& s = kept != nullptr ? *kept : s_;  // s_ while the forward runs
    std::vector<SavedTensor> out;
    ScopedNorm(OffloadModule::kMlpNorm, &s.x, &s.rstd, &out);
    out.push_back(Scoped(OffloadModule::kExpertFc1, {&s.gathered}));
    out.push_back(Scoped(OffloadModule::kMoeAct, {&s.a, &s.u}));
    return out;
  }

  Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) override {
    const int64_t ab = ctx.bytes.activation, h = d_.hidden;
    const SimCategory scratch = SimCategory::kRoutingScratch;
    s_ = saved_.Close(ctx.microbatch);
    if (RerunsNorm(ctx, /*fused=*/false)) RerunPreNorm(ctx, s_.x.m, norm_->value.m, d_.norm_eps, &s_.n, &s_.rstd);
    // The "moe" checkpoint's rerun: the layer's forward again from the kept
    // norm output, its exchanges included; the output is not used.
    if (RerunsLayer(ctx)) Layer(ctx, SimCategory::kRecomputed, true);
    Mat<T> dn = Mat<T>::Zero(dy.rows(), h);
    ctx.rank->set_what(CommWhat::kMoeSharedExpert);
    if (sh_up_ != nullptr) {
      // The "shared_experts" checkpoint's rerun on the kept norm output, its
      // TP collectives and the gate included; the output is not used.
      if (RerunsShared(ctx)) SharedForward(ctx, SimCategory::kRecomputed);
      const Mat<T> dshared = SharedBackward(ctx, dy, &dn);
      dn += dshared;
    }

    // Through the unpermute: d y_pair = p dy[t]; d p = dy[t] . y_pair.
    const int64_t pairs = static_cast<int64_t>(s_.send_token.size());
    Tensor<T> dsend(ctx.mem(), scratch, ab, Mat<T>::Zero(pairs, h));
    std::vector<T> dprob(static_cast<size_t>(pairs), T(0));
    for (int64_t r = 0; r < pairs; ++r) {
      const int64_t t = s_.send_token[static_cast<size_t>(r)];
      if (t < 0) continue;
      dsend.m.row(r) = s_.send_prob.m(r, 0) * dy.row(t);
      dprob[static_cast<size_t>(r)] = dy.row(t).dot(s_.y_back.m.row(r));
    }
    ctx.rank->set_what(CommWhat::kMoeCombine);
    Tensor<T> drecv = Dispatch(ctx, std::move(dsend));  // the backward of combine moves like a dispatch
    ctx.rank->set_what(CommWhat::kMoeExperts);
    Tensor<T> dy_g = GatherOverEtp(ctx, std::move(drecv), scratch);
    Tensor<T> dxg(ctx.mem(), scratch, ab, Mat<T>(dy_g.m.rows(), h));
    // "moe_act": the activation's output (fc2's input) again from fc1's
    // kept output, before fc2's backward (Megatron experts.py: the
    // activation under CheckpointWithoutOutput, its output discarded after
    // fc2's forward and recomputed when fc2's output gradient arrives).
    if (ctx.rerun.has(RecomputeModule::kMoeAct)) {
      s_.z = Tensor<T>(ctx.mem(), SimCategory::kRecomputed, ab, Activate(d_.moe_activation, s_.a.m, s_.u.m));
    }
    for (int64_t le = 0; le < local_experts_; ++le) {
      const std::vector<int64_t> rows = RowsOf(le);
      const Mat<T> dyl = Take(dy_g.m, rows), in = Take(s_.gathered.m, rows);
      const Mat<T> a = Take(s_.a.m, rows), u = gated_ ? Take(s_.u.m, rows) : Mat<T>(), z = Take(s_.z.m, rows);
      const size_t i = static_cast<size_t>(le);
      Param<T>& uw = *up_[i];
      Param<T>& dw = *down_[i];
      dw.grad.m += MatMulTransA(ctx, z, dyl);
      AddBiasGrad(dyl, Bias(down_b_, i));
      const Mat<T> dz = MatMulTransB(ctx, dyl, dw.value.m);
      Mat<T> da, du;
      ActivateBackward(d_.moe_activation, dz, a, u, &da, &du);
      AddBiasGrad(da, ABias(i));
      if (gated_) AddBiasGrad(du, Bias(up_b_, i));
      if (gated_) {
        Param<T>& gw = *gate_[i];
        gw.grad.m += MatMulTransA(ctx, in, da);
        uw.grad.m += MatMulTransA(ctx, in, du);
        Put(&dxg.m, rows, Mat<T>(MatMulTransB(ctx, da, gw.value.m) + MatMulTransB(ctx, du, uw.value.m)));
      } else {
        uw.grad.m += MatMulTransA(ctx, in, da);
        Put(&dxg.m, rows, MatMulTransB(ctx, da, uw.value.m));
      }
    }
    dy_g.Release();
    // The backward of dispatch moves like a combine.
    Tensor<T> dx_own = ScatterOverEtp(ctx, std::move(dxg));
    ctx.rank->set_what(CommWhat::kMoeDispatch);
    Tensor<T> dback = Combine(ctx, std::move(dx_own), scratch);
    for (int64_t r = 0; r < pairs; ++r) {
      const int64_t t = s_.send_token[static_cast<size_t>(r)];
      if (t >= 0) dn.row(t) += dback.m.row(r);
    }
    dback.Release();

    // Router: p = softmax over the k selected logits, or p = s / (sum of
    // the selected s + 1e-20) with s = sigmoid(logit) (p = s when k = 1);
    // dropped pairs carry dp = 0. The expert bias chose the experts only: no
    // gradient reaches it.
    Mat<T> dlogits = Mat<T>::Zero(dy.rows(), d_.experts);
    const int64_t k = d_.top_k;
    for (int64_t t = 0; t < dy.rows(); ++t) {
      std::vector<T> g(static_cast<size_t>(k), T(0)), p(static_cast<size_t>(k));
      T dot = 0, selected = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = s_.topk.v[static_cast<size_t>(t * k + j)];
        p[static_cast<size_t>(j)] = s_.probs.m(t, e);
        const int64_t r = s_.pair_row.v[static_cast<size_t>(t * k + j)];
        if (r >= 0) g[static_cast<size_t>(j)] = dprob[static_cast<size_t>(r)];
        dot += p[static_cast<size_t>(j)] * g[static_cast<size_t>(j)];
        selected += Sigmoid(s_.logits.m(t, e));
      }
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = s_.topk.v[static_cast<size_t>(t * k + j)];
        const T gj = g[static_cast<size_t>(j)];
        if (!d_.router_sigmoid) {
          dlogits(t, e) = p[static_cast<size_t>(j)] * (gj - dot);
          continue;
        }
        const T s = Sigmoid(s_.logits.m(t, e));
        const T ds = k > 1 ? (gj - dot) / (selected + T(kSigmoidNormEps)) : gj;
        dlogits(t, e) = ds * s * (T(1) - s);
      }
    }
    router_->grad.m += MatMulTransA(ctx, s_.n.m, dlogits);
    dn += MatMulTransB(ctx, dlogits, router_->value.m);
    Mat<T> dx = NormBackward(dn, s_.x.m, s_.rstd.m, norm_->value.m, &norm_->grad.m);
    s_ = State();  // frees what the backward read
    return dx;
  }

 private:
  /// Selective "moe": Megatron's MoELayer.forward runs the whole layer
  /// (router, dispatch, experts, combine, shared expert) under
  /// tensor_parallel.checkpoint on the pre-MLP norm's output (moe_layer.py
  /// moe_layer_recompute), so only the norm's input, output and statistics stay.
  static bool RerunsLayer(const Ctx& ctx) { return ctx.rerun.has(RecomputeModule::kMoe); }

  /// The MoE layer on the norm output s_.n: returns its output (routed and
  /// shared); what the backward reads is charged to `act`. `rerun`: the
  /// "moe" checkpoint's rerun, which counts no dropped pair and no expert
  /// token again (Megatron's router counts local_tokens_per_expert only with
  /// grad enabled, so once: in the rerun; the executor counts the first).
  Mat<T> Layer(Ctx& ctx, SimCategory act, bool rerun) {
    const int64_t ab = ctx.bytes.activation, h = d_.hidden;
    const SimCategory scratch = SimCategory::kRoutingScratch;
    Route(ctx, act, rerun);

    // Dispatch: send buffer in (expert, token) order, padded slots are zero rows.
    Tensor<T> send(ctx.mem(), scratch, ab, Mat<T>::Zero(static_cast<int64_t>(s_.send_token.size()), h));
    for (size_t r = 0; r < s_.send_token.size(); ++r) {
      if (s_.send_token[r] >= 0) send.m.row(static_cast<int64_t>(r)) = s_.n.m.row(s_.send_token[r]);
    }
    ExchangeCounts(ctx);
    ctx.rank->set_what(CommWhat::kMoeDispatch);
    Tensor<T> recv = Dispatch(ctx, std::move(send));
    ctx.rank->set_what(CommWhat::kMoeExperts);
    s_.gathered = GatherOverEtp(ctx, std::move(recv), act);
    s_.expert_of_row = s_.gathered_layout.ExpertOfRows();

    // Experts, each on its rows of the gathered buffer: fc1 of every local
    // expert, then the activation and fc2 of each, as TEGroupedMLP's grouped
    // GEMMs run them (moe/experts.py), so that the offload groups end where
    // Megatron's do: "expert_fc1" (the gathered input) after linear_fc1,
    // "moe_act" (fc1's output) after linear_fc2.
    const int64_t f = up_.empty() ? 0 : up_[0]->value.m.cols();
    s_.a = Tensor<T>(ctx.mem(), act, ab, Mat<T>(s_.gathered.m.rows(), f));
    if (gated_) s_.u = Tensor<T>(ctx.mem(), act, ab, Mat<T>(s_.gathered.m.rows(), f));
    for (int64_t le = 0; le < local_experts_; ++le) {
      const std::vector<int64_t> rows = RowsOf(le);
      const Mat<T> in = Take(s_.gathered.m, rows);
      const size_t i = static_cast<size_t>(le);
      Mat<T> a = MatMul(ctx, in, gated_ ? gate_[i]->value.m : up_[i]->value.m);
      AddBias(&a, ABias(i));
      Put(&s_.a.m, rows, a);
      if (gated_) {
        Mat<T> u = MatMul(ctx, in, up_[i]->value.m);
        AddBias(&u, Bias(up_b_, i));
        Put(&s_.u.m, rows, u);
      }
    }
    // The "moe" checkpoint's rerun hands nothing off (Megatron refuses the
    // expert groups with it: transformer_config.py).
    if (!rerun) this->HandOff(ctx, OffloadModule::kExpertFc1);
    const bool rerun_act = ctx.rerun.has(RecomputeModule::kMoeAct);
    s_.z = Tensor<T>(ctx.mem(), rerun_act ? SimCategory::kTemporaries : act, ab, Mat<T>(s_.gathered.m.rows(), f));
    Tensor<T> y(ctx.mem(), scratch, ab, Mat<T>(s_.gathered.m.rows(), h));
    for (int64_t le = 0; le < local_experts_; ++le) {
      const std::vector<int64_t> rows = RowsOf(le);
      const size_t i = static_cast<size_t>(le);
      const Mat<T> z = Activate(d_.moe_activation, Take(s_.a.m, rows), gated_ ? Take(s_.u.m, rows) : Mat<T>());
      Put(&s_.z.m, rows, z);
      Mat<T> yl = MatMul(ctx, z, down_[i]->value.m);
      AddBias(&yl, Bias(down_b_, i));
      Put(&y.m, rows, yl);
    }
    // "moe_act": the checkpoint's output is discarded after fc2, before the
    // group commits (experts.py discard_output_and_register_recompute, then
    // moe_act_manager.group_offload).
    if (rerun_act) s_.z.Release();
    if (!rerun) this->HandOff(ctx, OffloadModule::kMoeAct);
    Tensor<T> y_own = ScatterOverEtp(ctx, std::move(y));
    ctx.rank->set_what(CommWhat::kMoeCombine);
    s_.y_back = Combine(ctx, std::move(y_own), act);

    Tensor<T> out(ctx.mem(), scratch, ab, Mat<T>::Zero(s_.n.m.rows(), h));
    for (size_t r = 0; r < s_.send_token.size(); ++r) {
      if (s_.send_token[r] >= 0)
        out.m.row(s_.send_token[r]) +=
            s_.send_prob.m(static_cast<int64_t>(r), 0) * s_.y_back.m.row(static_cast<int64_t>(r));
    }
    Mat<T> result = out.m;
    ctx.rank->set_what(CommWhat::kMoeSharedExpert);
    if (sh_up_ != nullptr) {
      result += SharedForward(ctx, RerunsShared(ctx) ? SimCategory::kTemporaries : act);
      if (RerunsShared(ctx)) ReleaseShared();
    }
    return result;
  }

  /// Top-k selection, softmax over the selected logits, capacity per router
  /// group (earliest tokens kept, docs/formulas.md §5), and the send order;
  /// what the backward reads charged to `act`. A `rerun` (Layer) counts
  /// no dropped pair and no expert token.
  void Route(Ctx& ctx, SimCategory act, bool rerun) {
    const int64_t tokens = s_.n.m.rows(), k = d_.top_k, experts = d_.experts;
    s_.logits = Tensor<T>(ctx.mem(), act, 4, MatMul(ctx, s_.n.m, router_->value.m));
    std::vector<int64_t> topk(static_cast<size_t>(tokens * k));
    Mat<T> probs = Mat<T>::Zero(tokens, experts);
    std::vector<T> key(static_cast<size_t>(experts));
    for (int64_t t = 0; t < tokens; ++t) {
      // What chooses: the logits (softmax), or the sigmoid scores plus the
      // expert bias (Megatron moe_utils.py topk_routing_with_score_function).
      for (int64_t e = 0; e < experts; ++e) {
        const T logit = s_.logits.m(t, e);
        key[static_cast<size_t>(e)] =
            !d_.router_sigmoid ? logit : Sigmoid(logit) + (d_.router_bias ? bias_.bias.m(0, e) : T(0));
      }
      std::vector<int64_t> order(static_cast<size_t>(experts));
      std::iota(order.begin(), order.end(), 0);
      // Ties go to the lower expert id (docs/formulas.md §8.2).
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return key[static_cast<size_t>(a)] > key[static_cast<size_t>(b)]; });
      T mx = s_.logits.m(t, order[0]), sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        const T logit = s_.logits.m(t, order[static_cast<size_t>(j)]);
        sum += d_.router_sigmoid ? Sigmoid(logit) : std::exp(logit - mx);
      }
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = order[static_cast<size_t>(j)];
        topk[static_cast<size_t>(t * k + j)] = e;
        if (!d_.router_sigmoid) {
          probs(t, e) = std::exp(s_.logits.m(t, e) - mx) / sum;
        } else {
          const T s = Sigmoid(s_.logits.m(t, e));
          probs(t, e) = k > 1 ? s / (sum + T(kSigmoidNormEps)) : s;
        }
      }
    }
    // Capacity per router-call group: C = ceil(T_g k / E * cf) (docs/formulas.md §5, Megatron get_capacity).
    const int64_t groups = ctx.router_groups, per_group = tokens / groups;
    const int64_t capacity =
        d_.dropless ? tokens * k
                    : static_cast<int64_t>(std::ceil(static_cast<double>(per_group * k) / static_cast<double>(experts) *
                                                     d_.capacity_factor));
    Mat<T> map = Mat<T>::Zero(tokens, experts);
    std::vector<std::vector<int64_t>> kept_tokens(static_cast<size_t>(experts));  // ascending token
    std::vector<int64_t> used(static_cast<size_t>(experts * groups), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = topk[static_cast<size_t>(t * k + j)];
        int64_t& u = used[static_cast<size_t>(ctx.RouterGroupOf(t, tokens) * experts + e)];
        if (u < capacity) {
          ++u;
          map(t, e) = 1;
          kept_tokens[static_cast<size_t>(e)].push_back(t);
        } else {
          if (!rerun) ++ctx.dropped_pairs;
        }
      }
    }
    if (d_.router_bias && !rerun) bias_.counts.m += map.colwise().sum();
    // Send order (expert, token); padded mode fills every expert to groups * C rows.
    s_.send_token.clear();
    std::vector<int64_t> pair_row(static_cast<size_t>(tokens * k), -1);
    std::vector<T> send_prob;
    s_.send_layout.counts.assign(static_cast<size_t>(ctx.ep_size), std::vector<int64_t>(static_cast<size_t>(local_experts_), 0));
    for (int64_t e = 0; e < experts; ++e) {
      const auto& kept = kept_tokens[static_cast<size_t>(e)];
      const int64_t slots = d_.pad_to_capacity && !d_.dropless ? groups * capacity : static_cast<int64_t>(kept.size());
      for (int64_t i = 0; i < slots; ++i) {
        const int64_t t = i < static_cast<int64_t>(kept.size()) ? kept[static_cast<size_t>(i)] : -1;
        if (t >= 0) {
          for (int64_t j = 0; j < k; ++j) {
            if (topk[static_cast<size_t>(t * k + j)] == e) pair_row[static_cast<size_t>(t * k + j)] = static_cast<int64_t>(s_.send_token.size());
          }
        }
        send_prob.push_back(t >= 0 ? probs(t, e) : T(0));
        s_.send_token.push_back(t);
      }
      s_.send_layout.counts[static_cast<size_t>(e / local_experts_)][static_cast<size_t>(e % local_experts_)] = slots;
    }
    s_.probs = Tensor<T>(ctx.mem(), act, 4, std::move(probs));
    s_.map = Tensor<T>(ctx.mem(), act, 1, std::move(map));
    s_.topk = IndexTensor(ctx.mem(), act, std::move(topk));
    s_.pair_row = IndexTensor(ctx.mem(), act, std::move(pair_row));
    Mat<T> sp(static_cast<int64_t>(send_prob.size()), 1);
    for (size_t r = 0; r < send_prob.size(); ++r) sp(static_cast<int64_t>(r), 0) = send_prob[r];
    s_.send_prob = Tensor<T>(ctx.mem(), act, 4, std::move(sp));
  }

  /// Receive layout: from each EP source, rows per local expert. Padded mode
  /// knows it statically; otherwise the counts travel in an int64 all-to-all.
  void ExchangeCounts(Ctx& ctx) {
    ctx.rank->set_what(CommWhat::kMoeCounts);
    const size_t n = static_cast<size_t>(ctx.ep_size), le = static_cast<size_t>(local_experts_);
    s_.recv_layout.counts.assign(n, std::vector<int64_t>(le, 0));
    if (ctx.ep_size == 1) {
      s_.recv_layout = s_.send_layout;
    } else if (d_.pad_to_capacity && !d_.dropless) {
      // Every source fills each of my experts to exactly its capacity (same T on every rank).
      for (size_t s = 0; s < n; ++s) s_.recv_layout.counts[s] = s_.send_layout.counts[static_cast<size_t>(ctx.ep_rank)];
    } else {
      std::vector<int64_t> out, in(n * le);
      for (const auto& c : s_.send_layout.counts) out.insert(out.end(), c.begin(), c.end());
      IndexTensor keep(ctx.mem(), SimCategory::kRoutingScratch, out);
      ctx.rank->AllToAll(*ctx.ep, out.data(), std::vector<int64_t>(n, static_cast<int64_t>(le)), in.data(),
                         std::vector<int64_t>(n, static_cast<int64_t>(le)), 8);
      for (size_t s = 0; s < n; ++s) {
        for (size_t l = 0; l < le; ++l) s_.recv_layout.counts[s][l] = in[s * le + l];
      }
    }
    s_.gathered_layout = s_.recv_layout;
    if (ctx.etp_size > 1) {
      // Rows of every ETP partner, partner-major: [partner][source][local expert].
      std::vector<int64_t> mine, all(n * le * static_cast<size_t>(ctx.etp_size));
      for (const auto& c : s_.recv_layout.counts) mine.insert(mine.end(), c.begin(), c.end());
      if (d_.pad_to_capacity && !d_.dropless) {
        for (int p = 0; p < ctx.etp_size; ++p) std::copy(mine.begin(), mine.end(), all.begin() + static_cast<int64_t>(static_cast<size_t>(p) * mine.size()));
      } else {
        ctx.rank->AllGather(*ctx.etp, mine.data(), all.data(),
                            std::vector<int64_t>(static_cast<size_t>(ctx.etp_size), static_cast<int64_t>(mine.size())), 8);
      }
      s_.gathered_layout.counts.clear();
      s_.partner_rows.clear();
      for (int p = 0; p < ctx.etp_size; ++p) {
        int64_t rows = 0;
        for (size_t s = 0; s < n; ++s) {
          std::vector<int64_t> c(all.begin() + static_cast<int64_t>((static_cast<size_t>(p) * n + s) * le),
                                 all.begin() + static_cast<int64_t>((static_cast<size_t>(p) * n + s + 1) * le));
          rows += std::accumulate(c.begin(), c.end(), int64_t{0});
          s_.gathered_layout.counts.push_back(std::move(c));
        }
        s_.partner_rows.push_back(rows);
      }
    }
  }

  /// All-to-all over EP from send order to receive order.
  Tensor<T> Dispatch(Ctx& ctx, Tensor<T> send_t) {
    if (ctx.ep_size == 1) return send_t;
    const Mat<T>& send = send_t.m;
    Tensor<T> recv(ctx.mem(), SimCategory::kRoutingScratch, ctx.bytes.activation, Mat<T>(s_.recv_layout.rows(), d_.hidden));
    std::vector<int64_t> sc, rc;
    for (size_t s = 0; s < s_.send_layout.counts.size(); ++s) {
      sc.push_back(s_.send_layout.rows_of(s) * d_.hidden);
      rc.push_back(s_.recv_layout.rows_of(s) * d_.hidden);
    }
    ctx.rank->AllToAll(*ctx.ep, send.data(), sc, recv.m.data(), rc, ctx.bytes.activation);
    return recv;
  }

  /// The inverse all-to-all: receive order back to send order.
  Tensor<T> Combine(Ctx& ctx, Tensor<T> recv_t, SimCategory category) {
    if (ctx.ep_size == 1) return Retag(ctx, std::move(recv_t), category);
    const Mat<T>& recv = recv_t.m;
    Tensor<T> back(ctx.mem(), category, ctx.bytes.activation, Mat<T>(static_cast<int64_t>(s_.send_token.size()), d_.hidden));
    std::vector<int64_t> sc, rc;
    for (size_t s = 0; s < s_.send_layout.counts.size(); ++s) {
      sc.push_back(s_.recv_layout.rows_of(s) * d_.hidden);
      rc.push_back(s_.send_layout.rows_of(s) * d_.hidden);
    }
    ctx.rank->AllToAll(*ctx.ep, recv.data(), sc, back.m.data(), rc, ctx.bytes.activation);
    return back;
  }

  // Buffers move in by value: with a group of 1 the received buffer *is* the
  // result (no copy in the modeled program), so it is re-tagged, not duplicated.
  Tensor<T> GatherOverEtp(Ctx& ctx, Tensor<T> recv, SimCategory category) {
    if (ctx.etp_size == 1) return Retag(ctx, std::move(recv), category);
    Tensor<T> all(ctx.mem(), category, ctx.bytes.activation, Mat<T>(s_.gathered_layout.rows(), d_.hidden));
    ctx.rank->AllGather(*ctx.etp, recv.m.data(), all.m.data(), Scaled(s_.partner_rows, d_.hidden), ctx.bytes.activation);
    return all;
  }

  Tensor<T> ScatterOverEtp(Ctx& ctx, Tensor<T> partial) {
    if (ctx.etp_size == 1) return partial;
    Tensor<T> own(ctx.mem(), SimCategory::kRoutingScratch, ctx.bytes.activation, Mat<T>(s_.recv_layout.rows(), d_.hidden));
    ctx.rank->ReduceScatter(*ctx.etp, partial.m.data(), own.m.data(), Scaled(s_.partner_rows, d_.hidden), ctx.bytes.activation);
    return own;
  }

  static Tensor<T> Retag(Ctx& ctx, Tensor<T> t, SimCategory category) {
    Mat<T> m = std::move(t.m);
    t.Release();
    return Tensor<T>(ctx.mem(), category, ctx.bytes.activation, std::move(m));
  }

  /// Selective "shared_experts": Megatron's MoELayer.shared_experts_compute
  /// runs the shared expert under tensor_parallel.checkpoint on the norm
  /// output (moe_layer.py), so it keeps nothing of its own.
  static bool RerunsShared(const Ctx& ctx) { return ctx.rerun.has(RecomputeModule::kSharedExperts); }
  void ReleaseShared() {
    s_.sh_a.Release();
    s_.sh_u.Release();
    s_.sh_z.Release();
    s_.sh_out.Release();
    s_.sh_score.Release();
  }

  /// The shared expert on the norm output; fc1's outputs and the
  /// activation's are charged to `act`.
  Mat<T> SharedForward(Ctx& ctx, SimCategory act) {
    const int64_t ab = ctx.bytes.activation;
    Tensor<T> n_full = TpRegionInput(ctx, s_.n.m);
    if (sh_gate_ != nullptr) {
      s_.sh_a = Tensor<T>(ctx.mem(), act, ab, MatMul(ctx, n_full.m, sh_gate_->value.m));
      s_.sh_u = Tensor<T>(ctx.mem(), act, ab, MatMul(ctx, n_full.m, sh_up_->value.m));
    } else {
      s_.sh_a = Tensor<T>(ctx.mem(), act, ab, MatMul(ctx, n_full.m, sh_up_->value.m));
    }
    n_full.Release();
    s_.sh_z = Tensor<T>(ctx.mem(), act, ab, Activate(d_.moe_activation, s_.sh_a.m, s_.sh_u.m));
    Tensor<T> partial(ctx.mem(), SimCategory::kTemporaries, ab, MatMul(ctx, s_.sh_z.m, sh_down_->value.m));
    Mat<T> out = ReduceFromTpForward(ctx, partial.m);
    if (sh_score_w_ == nullptr) return out;
    // Megatron SharedExpertMLP.forward: output * sigmoid(linear(input,
    // gate_weight)) on this rank's rows; autograd keeps the product's two
    // factors, the output and the score (the input is the norm output).
    const Mat<T> logit = MatMulTransB(ctx, s_.n.m, sh_score_w_->value.m);
    s_.sh_score = Tensor<T>(ctx.mem(), act, ab, logit.unaryExpr([](T v) { return T(1) / (T(1) + std::exp(-v)); }));
    s_.sh_out = Tensor<T>(ctx.mem(), act, ab, std::move(out));
    return s_.sh_out.m.array().colwise() * s_.sh_score.m.col(0).array();
  }

  /// The gate's backward: adds its share of the norm output's gradient to
  /// `dn` and returns the gradient of the shared expert's own output.
  Mat<T> SharedScoreBackward(Ctx& ctx, const Mat<T>& dy, Mat<T>* dn) {
    const Mat<T>& score = s_.sh_score.m;
    const Mat<T> dlogit =
        ((dy.cwiseProduct(s_.sh_out.m)).rowwise().sum().array() * score.array() * (T(1) - score.array())).matrix();
    sh_score_w_->grad.m += MatMulTransA(ctx, dlogit, s_.n.m);
    *dn += MatMul(ctx, dlogit, sh_score_w_->value.m);
    return dy.array().colwise() * score.col(0).array();
  }

  Mat<T> SharedBackward(Ctx& ctx, const Mat<T>& dy_gated, Mat<T>* dn) {
    const int64_t ab = ctx.bytes.activation;
    const Mat<T> dy = sh_score_w_ == nullptr ? dy_gated : SharedScoreBackward(ctx, dy_gated, dn);
    s_.sh_out.Release();
    s_.sh_score.Release();
    Tensor<T> dy_full(ctx.mem(), SimCategory::kTemporaries, ab, ReduceFromTpBackward(ctx, dy));
    sh_down_->grad.m += MatMulTransA(ctx, s_.sh_z.m, dy_full.m);
    const Mat<T> dz = MatMulTransB(ctx, dy_full.m, sh_down_->value.m);
    dy_full.Release();
    Mat<T> da, du;
    ActivateBackward(d_.moe_activation, dz, s_.sh_a.m, s_.sh_u.m, &da, &du);
    if (sh_gate_ == nullptr) return ColumnParallelBackward<T>(ctx, s_.n.m, {{sh_up_, &da}});
    return ColumnParallelBackward<T>(ctx, s_.n.m, {{sh_gate_, &da}, {sh_up_, &du}});
  }

  /// Local expert i's bias in `biases`; null without linear biases.
  static Param<T>* Bias(const std::vector<Param<T>*>& biases, size_t i) { return biases.empty() ? nullptr : biases[i]; }
  /// The bias of expert i's activated fc1 output a: the gate's when gated, else up's.
  Param<T>* ABias(size_t i) const { return Bias(gated_ ? gate_b_ : up_b_, i); }

  std::vector<int64_t> RowsOf(int64_t le) const {
    std::vector<int64_t> rows;
    for (size_t r = 0; r < s_.expert_of_row.size(); ++r) {
      if (s_.expert_of_row[r] == le) rows.push_back(static_cast<int64_t>(r));
    }
    return rows;
  }
  static Mat<T> Take(const Mat<T>& m, const std::vector<int64_t>& rows) {
    Mat<T> out(static_cast<int64_t>(rows.size()), m.cols());
    for (size_t i = 0; i < rows.size(); ++i) out.row(static_cast<int64_t>(i)) = m.row(rows[i]);
    return out;
  }
  static void Put(Mat<T>* m, const std::vector<int64_t>& rows, const Mat<T>& part) {
    for (size_t i = 0; i < rows.size(); ++i) m->row(rows[i]) = part.row(static_cast<int64_t>(i));
  }

  Dims d_;
  bool gated_ = true;  // fc1 is gate and up (SwiGLU), else up alone
  int64_t local_experts_ = 0;
  Param<T>* norm_ = nullptr;
  Param<T>* router_ = nullptr;
  std::vector<Param<T>*> gate_, up_, down_;  // gate_ empty unless gated
  std::vector<Param<T>*> gate_b_, up_b_, down_b_;  // empty without linear biases (gate_b_ also unless gated)
  Param<T>* sh_gate_ = nullptr;              // gated only
  Param<T>* sh_up_ = nullptr;
  Param<T>* sh_down_ = nullptr;
  Param<T>* sh_score_w_ = nullptr;  // the shared expert's sigmoid gate (moe.shared_gate)
  // The working set of the micro-batch being run; between its forward and
  // backward it waits in saved_ (tensors keep their memory tags when moved).
  struct State {
    // Saved for backward (activations).
    Tensor<T> x, n, rstd, logits, probs, map, gathered, a, u, z, y_back, send_prob, sh_a, sh_u, sh_z;
    Tensor<T> sh_out, sh_score;  // the gated shared expert's output and sigmoid score
    IndexTensor topk, pair_row;
    // Routing bookkeeping (small; not charged).
    std::vector<int64_t> send_token, expert_of_row, partner_rows;
    RowLayout send_layout, recv_layout, gathered_layout;
  };
  State s_;
  SavedPerMicrobatch<State> saved_;
  ExpertBias<T> bias_;  // when d_.router_bias
};

}  // namespace

template <class T>
void UpdateExpertBias(const Mat<T>& counts, ExpertBias<T>* b) {
  constexpr double kRate = 1e-3;
  const T mean = counts.sum() / T(counts.size());
  for (int64_t e = 0; e < counts.size(); ++e) {
    const T offset = mean - counts(0, e);
    b->bias.m(0, e) += T(kRate) * T((offset > 0) - (offset < 0));
  }
  b->counts.m.setZero();
}
template void UpdateExpertBias<double>(const Mat<double>&, ExpertBias<double>*);
template void UpdateExpertBias<float>(const Mat<float>&, ExpertBias<float>*);

template <class T>
std::unique_ptr<Block<T>> MakeMoeBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) {
  return std::make_unique<MoeBlock<T>>(ctx, d, layer, seed, scale);
}
template std::unique_ptr<Block<double>> MakeMoeBlock<double>(Ctx&, const Dims&, int64_t, uint64_t, double);
template std::unique_ptr<Block<float>> MakeMoeBlock<float>(Ctx&, const Dims&, int64_t, uint64_t, double);

}  // namespace preflight::sim

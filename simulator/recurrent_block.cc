// R: the RG-LRU recurrent block after Griffin (De et al. 2024,
// arXiv:2402.19427), forward and hand-written backward (docs/formulas.md §1.6, 8.2 "R"),
// tensor-parallel by whole gate blocks (docs/formulas.md §8.3) and context-parallel in
// two ways (docs/formulas.md §7.2, [OURS]).
//
// Forward on a rank, rows = tokens (row = position * batch + b):
//   n = RMSNorm(x)                                   residual stream (SP rows)
//   [TP region] g_pre = n W_g, u = n W_u             column-parallel, d_r/t channels
//   ũ = conv(u)                                      causal depthwise, K_r taps + bias, no activation
//   r = σ(ũ W_a + b_a), i = σ(ũ W_x + b_x)           block-diagonal: n_b blocks of (d_r/n_b)^2
//   log a = c_R r log σ(Λ), c_R = 8
//   h_τ = a_τ ⊙ h_{τ-1} + √(1 - a_τ²) ⊙ (i_τ ⊙ ũ_τ), h_{-1} = 0
//   y = h ⊙ GeLU(g_pre); x + y W_o                   row-parallel, then g (AR, or RS with SP)
// GeLU is the tanh approximation, as in Griffin's reference code
// (google-deepmind/recurrentgemma; HF RecurrentGemmaConfig.hidden_activation
// defaults to "gelu_pytorch_tanh"). As docs/formulas.md §8.2 we leave out two details of
// that code: the √(1 - a²) multiplier is not reset to 1 at a document start,
// and the derivative of the square root is not clipped (fp64 needs neither).
//
// Everything but the conv, the gates and the scan is per token. The conv and
// the scan run along positions, so context parallelism must do something:
//  - all-to-all (Megatron's Mamba CP pattern applied to R [OURS]): u goes from
//    sequence-split (this CP rank's rows, d_r/t channels) to channel-split
//    (every position in global order, d_r/(t*c) channels, whole gate blocks),
//    the conv and the scan run on it, and h comes back. g stays
//    sequence-split (it is per token), so exactly u in and h back travel:
//    width 2 d_r per pass (the backward moves dh in and du back).
//  - hand-off [OURS]: the recurrence runs along the CP chain; a chunk starts
//    from the state its predecessor chunk ends with: the conv input of the
//    last K_r - 1 positions (activation dtype) and h (fp32). The backward
//    sends the gradient of the same two tensors back along the chain.
//
// Saved for the backward (docs/formulas.md §3.2 a_R = 4h + 16 d_r, plus the norm rstd
// that ResidualTerms charges): x, n (2h each, SP rows), rstd (fp32), g_pre,
// u, ũ, r_pre, i_pre (2 d_r each), h (fp32, 4 d_r) and the W_o input y
// (2 d_r). Under the all-to-all the scan tensors are kept channel-split
// (same element count) and, in place of y, the h that came back (the gate
// product's input, 2 d_r too); y = h ⊙ GeLU(g_pre) is recomputed for dW_o.
// Under the hand-off each chunk whose predecessor is remote also keeps the
// state it received (the estimator's RecurrentHandoffStateBytes).
#include <cmath>
#include <numbers>
#include <utility>

#include "blocks.h"

namespace preflight::sim {
namespace {

constexpr double kGateExponent = 8.0;  // c_R (Griffin section 2.4; docs/formulas.md §8.2)

/// log σ(z), without overflow for large |z|.
template <class T>
T LogSigmoid(T z) {
  return z >= T(0) ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));
}

// ---- GeLU, tanh approximation: z/2 (1 + tanh(k (z + 0.044715 z^3))), k = √(2/π) ----

constexpr double kGeluCubic = 0.044715;

template <class T>
T GeluTanhArg(T z) {
  return T(std::sqrt(2.0 / std::numbers::pi)) * (z + T(kGeluCubic) * z * z * z);
}

template <class T>
Mat<T> Gelu(const Mat<T>& z) {
  return z.unaryExpr([](T v) { return T(0.5) * v * (T(1) + std::tanh(GeluTanhArg(v))); });
}

/// d GeLU / dz = (1 + t)/2 + z/2 (1 - t^2) k (1 + 3 * 0.044715 z^2), t = tanh(...).
template <class T>
Mat<T> GeluDerivative(const Mat<T>& z) {
  return z.unaryExpr([](T v) {
    const T t = std::tanh(GeluTanhArg(v));
    const T k = T(std::sqrt(2.0 / std::numbers::pi));
    return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * k * (T(1) + T(3 * kGeluCubic) * v * v);
  });
}

// ---- the per-channel mixer: conv, gates, decay ----

/// A range of this TP rank's d_r/t channels (all of them, or under the CP
/// all-to-all this CP rank's d_r/(t*c)).
struct Channels {
  int64_t begin = 0, count = 0;
};

template <class T>
struct MixerParams {
  Param<T>* conv_w = nullptr;  // [d_r, K_r], rows split
  Param<T>* conv_b = nullptr;  // [1, d_r]
  Param<T>* gate_a_w = nullptr;  // W_a: the n_b blocks stacked, [d_r, d_r/n_b], rows split (whole blocks)
  Param<T>* gate_a_b = nullptr;  // [1, d_r]
  Param<T>* gate_x_w = nullptr;  // W_x, as W_a
  Param<T>* gate_x_b = nullptr;
  Param<T>* lambda = nullptr;  // Λ, [1, d_r]
};

/// Values (or gradients) of the mixer parameters for a channel range.
template <class T>
struct MixerSlice {
  Mat<T> conv_w, conv_b, gate_a_w, gate_a_b, gate_x_w, gate_x_b, lambda;
};

template <class T>
MixerSlice<T> ValuesOf(const MixerParams<T>& p, Channels ch) {
  MixerSlice<T> s;
  s.conv_w = p.conv_w->value.m.middleRows(ch.begin, ch.count);
  s.conv_b = p.conv_b->value.m.middleCols(ch.begin, ch.count);
  s.gate_a_w = p.gate_a_w->value.m.middleRows(ch.begin, ch.count);
  s.gate_a_b = p.gate_a_b->value.m.middleCols(ch.begin, ch.count);
  s.gate_x_w = p.gate_x_w->value.m.middleRows(ch.begin, ch.count);
  s.gate_x_b = p.gate_x_b->value.m.middleCols(ch.begin, ch.count);
  s.lambda = p.lambda->value.m.middleCols(ch.begin, ch.count);
  return s;
}

template <class T>
MixerSlice<T> ZerosLike(const MixerSlice<T>& v) {
  MixerSlice<T> z;
  z.conv_w = Mat<T>::Zero(v.conv_w.rows(), v.conv_w.cols());
  z.conv_b = Mat<T>::Zero(1, v.conv_b.cols());
  z.gate_a_w = Mat<T>::Zero(v.gate_a_w.rows(), v.gate_a_w.cols());
  z.gate_a_b = Mat<T>::Zero(1, v.gate_a_b.cols());
  z.gate_x_w = Mat<T>::Zero(v.gate_x_w.rows(), v.gate_x_w.cols());
  z.gate_x_b = Mat<T>::Zero(1, v.gate_x_b.cols());
  z.lambda = Mat<T>::Zero(1, v.lambda.cols());
  return z;
}

template <class T>
void AddGrads(const MixerParams<T>& p, Channels ch, const MixerSlice<T>& g) {
  p.conv_w->grad.m.middleRows(ch.begin, ch.count) += g.conv_w;
  p.conv_b->grad.m.middleCols(ch.begin, ch.count) += g.conv_b;
  p.gate_a_w->grad.m.middleRows(ch.begin, ch.count) += g.gate_a_w;
  p.gate_a_b->grad.m.middleCols(ch.begin, ch.count) += g.gate_a_b;
  p.gate_x_w->grad.m.middleRows(ch.begin, ch.count) += g.gate_x_w;
  p.gate_x_b->grad.m.middleCols(ch.begin, ch.count) += g.gate_x_b;
  p.lambda->grad.m.middleCols(ch.begin, ch.count) += g.lambda;
}

/// What a run of positions hands to the next one (docs/formulas.md §6 "R state"):
/// the conv input of the last K_r - 1 positions ((K_r - 1) * batch rows,
/// position-major) and the recurrent state h (batch rows). Also used for the
/// gradient of that state in the backward.
template <class T>
struct ScanState {
  Mat<T> tail, h;
};

template <class T>
ScanState<T> ZeroState(int64_t taps, int64_t batch, int64_t channels) {
  return {Mat<T>::Zero((taps - 1) * batch, channels), Mat<T>::Zero(batch, channels)};
}

/// The conv input of a segment: the incoming tail, then the segment's u.
template <class T>
Mat<T> Extend(const Mat<T>& tail, const Mat<T>& u) {
  Mat<T> ext(tail.rows() + u.rows(), u.cols());
  ext.topRows(tail.rows()) = tail;
  ext.bottomRows(u.rows()) = u;
  return ext;
}

/// The state after a segment with conv input `ext` and outputs `h`.
template <class T>
ScanState<T> StateAfter(const Mat<T>& ext, const Mat<T>& h, int64_t tail_rows, int64_t batch) {
  return {ext.bottomRows(tail_rows), h.bottomRows(batch)};
}

// ---- causal depthwise conv (docs/formulas.md §8.1, without the silu) ----

/// ũ[τ] = b + Σ_κ w[κ] ⊙ u[τ - K + 1 + κ], with ext = [tail; u] so that
/// u[τ - K + 1 + κ] = ext[τ + κ]. `w` is channels x K, `bias` 1 x channels.
template <class T>
Mat<T> ConvForward(const Mat<T>& ext, const Mat<T>& w, const Mat<T>& bias, int64_t batch) {
  const int64_t taps = w.cols(), len = ext.rows() / batch - (taps - 1);
  Mat<T> out(len * batch, ext.cols());
  for (int64_t row = 0; row < out.rows(); ++row) {
    out.row(row) = bias.row(0);
    for (int64_t k = 0; k < taps; ++k) out.row(row) += ext.row(row + k * batch).cwiseProduct(w.col(k).transpose());
  }
  return out;
}

/// Adds d ext, d w and d bias for the output gradient `duc`.
template <class T>
void ConvBackward(const Mat<T>& duc, const Mat<T>& ext, const Mat<T>& w, int64_t batch, Mat<T>* dext, Mat<T>* dw,
                  Mat<T>* dbias) {
  for (int64_t row = 0; row < duc.rows(); ++row) {
    dbias->row(0) += duc.row(row);
    for (int64_t k = 0; k < w.cols(); ++k) {
      dext->row(row + k * batch) += duc.row(row).cwiseProduct(w.col(k).transpose());
      dw->col(k) += duc.row(row).cwiseProduct(ext.row(row + k * batch)).transpose();
    }
  }
}

// ---- block-diagonal gate linears ----

/// z = x · blockdiag(W_1, ..., W_n) + bias, where `w` stacks the blocks (block
/// j is rows [jB, (j+1)B), input x output) and block j maps channels [jB, (j+1)B).
template <class T>
Mat<T> BlockDiagForward(Ctx& ctx, const Mat<T>& x, const Mat<T>& w, const Mat<T>& bias) {
  const int64_t block = w.cols();
  Mat<T> z(x.rows(), x.cols());
  for (int64_t j = 0; j < x.cols() / block; ++j) {
    z.middleCols(j * block, block) =
        MatMul(ctx, Mat<T>(x.middleCols(j * block, block)), Mat<T>(w.middleRows(j * block, block)));
  }
  z.rowwise() += bias.row(0);
  return z;
}

/// Adds dx, dw and dbias for the output gradient `dz`.
template <class T>
void BlockDiagBackward(Ctx& ctx, const Mat<T>& dz, const Mat<T>& x, const Mat<T>& w, Mat<T>* dx, Mat<T>* dw,
                       Mat<T>* dbias) {
  const int64_t block = w.cols();
  for (int64_t j = 0; j < x.cols() / block; ++j) {
    const Mat<T> dzj = dz.middleCols(j * block, block);
    dw->middleRows(j * block, block) += MatMulTransA(ctx, Mat<T>(x.middleCols(j * block, block)), dzj);
    dx->middleCols(j * block, block) += MatMulTransB(ctx, dzj, Mat<T>(w.middleRows(j * block, block)));
  }
  dbias->row(0) += dz.colwise().sum();
}

// ---- the RG-LRU scan (Griffin eq. 4-6, docs/formulas.md §8.2) ----

/// The gates of one channel at one position.
template <class T>
struct Gates {
  T r, i, a, m;  // recurrence gate, input gate, decay a, multiplier √(1 - a²)
};

template <class T>
Gates<T> GatesAt(T r_pre, T i_pre, T log_sigmoid_lambda) {
  Gates<T> g;
  g.r = Sigmoid(r_pre);
  g.i = Sigmoid(i_pre);
  const T log_a = T(kGateExponent) * g.r * log_sigmoid_lambda;
  g.a = std::exp(log_a);
  g.m = std::sqrt(-std::expm1(T(2) * log_a));
  return g;
}

/// h over one segment, from h0 (batch x channels).
template <class T>
Mat<T> ScanForward(const Mat<T>& uc, const Mat<T>& r_pre, const Mat<T>& i_pre, const Mat<T>& lambda, const Mat<T>& h0,
                   int64_t batch) {
  const Mat<T> lsl = lambda.unaryExpr([](T v) { return LogSigmoid(v); });
  Mat<T> h(uc.rows(), uc.cols());
  for (int64_t row = 0; row < uc.rows(); ++row) {
    for (int64_t c = 0; c < uc.cols(); ++c) {
      const T prev = row < batch ? h0(row, c) : h(row - batch, c);
      const Gates<T> g = GatesAt(r_pre(row, c), i_pre(row, c), lsl(0, c));
      h(row, c) = g.a * prev + g.m * g.i * uc(row, c);
    }
  }
  return h;
}

template <class T>
struct ScanGrads {
  Mat<T> duc, dr_pre, di_pre, dlambda, dh0;
};

/// The reverse scan: `dh` is the gradient of every h from outside the scan
/// (the gate product), `dh_last` that of the state handed on.
template <class T>
ScanGrads<T> ScanBackward(const Mat<T>& dh, const Mat<T>& uc, const Mat<T>& r_pre, const Mat<T>& i_pre,
                          const Mat<T>& lambda, const Mat<T>& h, const Mat<T>& h0, const Mat<T>& dh_last,
                          int64_t batch) {
  const int64_t cols = uc.cols();
  const Mat<T> lsl = lambda.unaryExpr([](T v) { return LogSigmoid(v); });
  ScanGrads<T> g;
  g.duc.resize(uc.rows(), cols);
  g.dr_pre.resize(uc.rows(), cols);
  g.di_pre.resize(uc.rows(), cols);
  Mat<T> dlsl = Mat<T>::Zero(1, cols);
  Mat<T> carry = dh_last;  // d h_τ from h_{τ+1} (and, at the end, from the next segment)
  for (int64_t row = uc.rows() - 1; row >= 0; --row) {
    const int64_t b = row % batch;
    for (int64_t c = 0; c < cols; ++c) {
      const T prev = row < batch ? h0(row, c) : h(row - batch, c);
      const Gates<T> s = GatesAt(r_pre(row, c), i_pre(row, c), lsl(0, c));
      const T d = dh(row, c) + carry(b, c);
      const T x_in = s.i * uc(row, c);
      // h = a prev + m x_in, m = √(1 - a²): dm/da = -a/m.
      const T d_xin = d * s.m;
      const T d_log_a = d * (prev - s.a / s.m * x_in) * s.a;
      g.duc(row, c) = d_xin * s.i;
      g.di_pre(row, c) = d_xin * uc(row, c) * s.i * (T(1) - s.i);
      g.dr_pre(row, c) = d_log_a * T(kGateExponent) * lsl(0, c) * s.r * (T(1) - s.r);
      dlsl(0, c) += d_log_a * T(kGateExponent) * s.r;
      carry(b, c) = d * s.a;
    }
  }
  // d log σ(Λ) / dΛ = σ(-Λ).
  g.dlambda = dlsl.cwiseProduct(lambda.unaryExpr([](T v) { return Sigmoid(-v); }));
  g.dh0 = carry;
  return g;
}

// ---- one segment: a run of consecutive positions from a given state ----

/// The tensors a segment produces (and the backward reads).
template <class T>
struct SegmentActs {
  Mat<T> uc, r_pre, i_pre, h;
};

template <class T>
SegmentActs<T> SegmentForward(Ctx& ctx, const Mat<T>& u, const ScanState<T>& in, const MixerSlice<T>& p, int64_t batch,
                              ScanState<T>* out) {
  const Mat<T> ext = Extend(in.tail, u);
  SegmentActs<T> a;
  a.uc = ConvForward(ext, p.conv_w, p.conv_b, batch);
  a.r_pre = BlockDiagForward(ctx, a.uc, p.gate_a_w, p.gate_a_b);
  a.i_pre = BlockDiagForward(ctx, a.uc, p.gate_x_w, p.gate_x_b);
  a.h = ScanForward(a.uc, a.r_pre, a.i_pre, p.lambda, in.h, batch);
  *out = StateAfter(ext, a.h, in.tail.rows(), batch);
  return a;
}

/// Returns du of the segment and sets *d_in, the gradient of the state it
/// started from, given dh (gradient of its h from the gate product) and
/// d_out (gradient of the state it handed on); adds parameter gradients to *g.
template <class T>
Mat<T> SegmentBackward(Ctx& ctx, const Mat<T>& u, const ScanState<T>& in, const SegmentActs<T>& a,
                       const MixerSlice<T>& p, const Mat<T>& dh, const ScanState<T>& d_out, int64_t batch,
                       MixerSlice<T>* g, ScanState<T>* d_in) {
  const Mat<T> ext = Extend(in.tail, u);
  const int64_t tail_rows = in.tail.rows();
  ScanGrads<T> s = ScanBackward(dh, a.uc, a.r_pre, a.i_pre, p.lambda, a.h, in.h, d_out.h, batch);
  g->lambda += s.dlambda;
  BlockDiagBackward(ctx, s.dr_pre, a.uc, p.gate_a_w, &s.duc, &g->gate_a_w, &g->gate_a_b);
  BlockDiagBackward(ctx, s.di_pre, a.uc, p.gate_x_w, &s.duc, &g->gate_x_w, &g->gate_x_b);
  Mat<T> dext = Mat<T>::Zero(ext.rows(), ext.cols());
  dext.bottomRows(tail_rows) += d_out.tail;  // the tail handed on is the last K_r - 1 positions of ext
  ConvBackward(s.duc, ext, p.conv_w, batch, &dext, &g->conv_w, &g->conv_b);
  *d_in = {dext.topRows(tail_rows), s.dh0};
  return dext.bottomRows(u.rows());
}

// ---- the block ----

template <class T>
class RecurrentBlock final : public Block<T> {
 public:
  RecurrentBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale, const RecurrentOptions& options)
      : d_(d), options_(options) {
    Validate(ctx, d);
    const std::string p = "layers." + std::to_string(layer) + ".";
    const std::string q = p + "mixer.";
    const int64_t h = d.hidden, w = d.recurrent_width, block = w / d.recurrent_heads, taps = d.recurrent_d_conv;
    const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, ShardKind kind, double s) -> Param<T>* {
      return &WithRole(ctx, this->Add(MakeParam<T>(ctx, q + name, rows, cols, kind, Init::kMatrix, seed, s)),
                       ParamRole::kMatrix);
    };
    const auto per_channel = [&](const std::string& name, int64_t rows, int64_t cols, ShardKind kind, double s) -> Param<T>* {
      return &WithRole(ctx, this->Add(MakeParam<T>(ctx, q + name, rows, cols, kind, Init::kMatrix, seed, s)),
                       ParamRole::kVector);
    };
    // Names, shapes (input x output) and splits of the inventory (src/inventory/build.cc AddRecurrent);
    // the 3-D gate stacks [n_b, B, B] are held as [n_b * B, B] and split by rows, so whole blocks.
    norm_ = &WithRole(ctx, this->Add(MakeNorm<T>(ctx, d, p + "norm", seed, scale)), ParamRole::kVector);
    gate_ = matrix("gate_proj.weight", h, w, ShardKind::kColumns, scale / std::sqrt(double(h)));
    in_ = matrix("input_proj.weight", h, w, ShardKind::kColumns, scale / std::sqrt(double(h)));
    mixer_.conv_w = per_channel("conv1d.weight", w, taps, ShardKind::kRows, scale / std::sqrt(double(taps)));
    mixer_.conv_b = per_channel("conv1d.bias", 1, w, ShardKind::kColumns, 0.1 * scale);
    mixer_.gate_a_w = per_channel("rg_lru.recurrent_gate.weight", w, block, ShardKind::kRows, scale / std::sqrt(double(block)));
    mixer_.gate_a_b = per_channel("rg_lru.recurrent_gate.bias", 1, w, ShardKind::kColumns, scale);
    mixer_.gate_x_w = per_channel("rg_lru.input_gate.weight", w, block, ShardKind::kRows, scale / std::sqrt(double(block)));
    mixer_.gate_x_b = per_channel("rg_lru.input_gate.bias", 1, w, ShardKind::kColumns, scale);
    mixer_.lambda = per_channel("rg_lru.recurrent_param", 1, w, ShardKind::kColumns, 1.0);
    InitLambda(&mixer_.lambda->value.m);
    out_ = matrix("out_proj.weight", w, h, ShardKind::kRows, scale / std::sqrt(double(w)));
  }

  Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) override {
    ctx.rank->set_what(CommWhat::kRecurrent);
    const SimCategory act = SimCategory::kActivations, tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation;
    Saved& s = saved_.Open(ctx.microbatch);
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s.x, &s.n, &s.rstd);
    Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
    s.g_pre = Tensor<T>(ctx.mem(), act, ab, MatMul(ctx, n_full.m, gate_->value.m));
    Tensor<T> u(ctx.mem(), tmp, ab, MatMul(ctx, n_full.m, in_->value.m));
    n_full.Release();
    const bool a2a = AllToAll(ctx);
    if (a2a) {
      s.u = Tensor<T>(ctx.mem(), act, ab, SeqToChannels(ctx, u.m));
    } else {
      s.u = Tensor<T>(ctx.mem(), act, ab, std::move(u.m));
    }
    u.Release();
    Recurrence(ctx, &s);
    const Mat<T> gelu = Gelu(s.g_pre.m);
    // The W_o input y = h ⊙ GeLU(g_pre): saved, or under the all-to-all built
    // from the h that came back (saved instead, the gate product's input).
    Tensor<T> y_a2a(ctx.mem(), tmp, ab, Mat<T>());
    if (a2a) {
      s.h_seq = Tensor<T>(ctx.mem(), act, ab, ChannelsToSeq(ctx, s.h.m));
      y_a2a = Tensor<T>(ctx.mem(), tmp, ab, s.h_seq.m.cwiseProduct(gelu));
    } else {
      s.y = Tensor<T>(ctx.mem(), act, ab, s.h.m.cwiseProduct(gelu));
    }
    Tensor<T> partial(ctx.mem(), tmp, ab, MatMul(ctx, a2a ? y_a2a.m : s.y.m, out_->value.m));
    y_a2a.Release();
    return ReduceFromTpForward(ctx, partial.m);
  }

  Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) override {
    ctx.rank->set_what(CommWhat::kRecurrent);
    const SimCategory tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation;
    Saved s = saved_.Close(ctx.microbatch);
    const bool a2a = AllToAll(ctx);
    const Mat<T>& h_seq = a2a ? s.h_seq.m : s.h.m;  // h in the layout of g
    const Mat<T> gelu = Gelu(s.g_pre.m);
    Tensor<T> dy_full(ctx.mem(), tmp, ab, ReduceFromTpBackward(ctx, dy));
    Tensor<T> y_a2a(ctx.mem(), tmp, ab, a2a ? Mat<T>(h_seq.cwiseProduct(gelu)) : Mat<T>());
    out_->grad.m += MatMulTransA(ctx, a2a ? y_a2a.m : s.y.m, dy_full.m);
    y_a2a.Release();
    const Mat<T> dyo = MatMulTransB(ctx, dy_full.m, out_->value.m);
    dy_full.Release();
    Tensor<T> dg_pre(ctx.mem(), tmp, ab, dyo.cwiseProduct(h_seq).cwiseProduct(GeluDerivative(s.g_pre.m)));
    Tensor<T> du(ctx.mem(), tmp, ab, Mat<T>());
    if (a2a) {
      const Mat<T> dh = SeqToChannels(ctx, Mat<T>(dyo.cwiseProduct(gelu)));
      du.m = ChannelsToSeq(ctx, RecurrenceBackward(ctx, s, dh));
    } else {
      du.m = RecurrenceBackward(ctx, s, dyo.cwiseProduct(gelu));
    }
    const Mat<T> dn = ColumnParallelBackward<T>(ctx, s.n.m, {{gate_, &dg_pre.m}, {in_, &du.m}});
    return NormBackward(dn, s.x.m, s.rstd.m, norm_->value.m, &norm_->grad.m);
  }

 private:
  struct StateTensors {
    Tensor<T> tail, h;
  };
  struct Saved {
    Tensor<T> x, n, rstd, g_pre;       // sequence layout
    Tensor<T> u, uc, r_pre, i_pre, h;  // scan layout (channel-split under the CP all-to-all)
    Tensor<T> y;                       // W_o input (not under the all-to-all)
    Tensor<T> h_seq;                   // all-to-all: h back in the sequence layout
    std::vector<StateTensors> received;  // hand-off: per own chunk, the state received (empty if none)
  };

  static void Validate(const Ctx& ctx, const Dims& d) {
    const int64_t w = d.recurrent_width, n_b = d.recurrent_heads;
    if (w <= 0 || n_b <= 0 || d.recurrent_d_conv < 1) {
      throw SimUnsupported("recurrent block needs width, heads and d_conv >= 1");
    }
    if (w % n_b != 0) {
      throw SimUnsupported("recurrent width " + std::to_string(w) + " is not a multiple of its " + std::to_string(n_b) +
                           " gate blocks");
    }
    if (n_b % ctx.tp_size != 0) {
      throw SimUnsupported("tp = " + std::to_string(ctx.tp_size) + " does not divide the " + std::to_string(n_b) +
                           " recurrent gate blocks (they are split whole over TP, docs/formulas.md §1.6)");
    }
    if (ctx.cp_size > 1 && ctx.cp_recurrent == CpRecurrent::kAllToAll && n_b % (ctx.tp_size * ctx.cp_size) != 0) {
      throw SimUnsupported("recurrent all-to-all CP splits the " + std::to_string(n_b) + " gate blocks over tp*cp = " +
                           std::to_string(ctx.tp_size * ctx.cp_size) + ", which does not divide them");
    }
  }

  /// Griffin's initialisation of Λ (section 2.4): a^c_R = σ(Λ)^8 uniform in
  /// [0.9, 0.999], from the [-1, 1) values MakeParam drew (so a shard is a
  /// slice of the global tensor). Slow decays: the state matters across chunks.
  static void InitLambda(Mat<T>* lambda) {
    *lambda = lambda->unaryExpr([](T v) {
      const double a_c = 0.9 + 0.099 * (static_cast<double>(v) + 1.0) / 2.0;
      const double sig = std::pow(a_c, 1.0 / kGateExponent);
      return T(std::log(sig / (1.0 - sig)));
    });
  }

  static bool AllToAll(const Ctx& ctx) { return ctx.cp_size > 1 && ctx.cp_recurrent == CpRecurrent::kAllToAll; }
  static bool HandsOff(const Ctx& ctx) { return ctx.cp_size > 1 && ctx.cp_recurrent == CpRecurrent::kHandoff; }

  int64_t LocalChannels(const Ctx& ctx) const { return d_.recurrent_width / ctx.tp_size; }
  /// The channels the scan runs on: this CP rank's whole-block share under the all-to-all.
  Channels ScanChannels(const Ctx& ctx) const {
    if (!AllToAll(ctx)) return {0, LocalChannels(ctx)};
    const int64_t count = LocalChannels(ctx) / ctx.cp_size;
    return {ctx.cp_rank * count, count};
  }
  int64_t TailRows() const { return (d_.recurrent_d_conv - 1) * d_.batch; }

  // ---- CP all-to-all: sequence-split <-> channel-split ----

  /// This rank's rows of d_r/t channels -> every position (global order) of
  /// this CP rank's d_r/(t*c) channels. Member j gets its channel slice of
  /// our rows; we place member i's rows at i's global positions.
  Mat<T> SeqToChannels(Ctx& ctx, const Mat<T>& local) const {
    const int c = ctx.cp_size;
    const int64_t rows = local.rows(), width = local.cols() / c;
    Mat<T> send(rows * c, width), recv(rows * c, width);
    for (int j = 0; j < c; ++j) send.middleRows(j * rows, rows) = local.middleCols(j * width, width);
    const std::vector<int64_t> counts(static_cast<size_t>(c), rows * width);
    ctx.rank->AllToAll(*ctx.cp, send.data(), counts, recv.data(), counts, ctx.bytes.activation);
    Mat<T> global(rows * c, width);
    for (int i = 0; i < c; ++i) {
      const SeqLayout from = SeqLayout::Make(ctx.seq.seq, c, i, ctx.seq.load_balanced);
      for (int64_t r = 0; r < rows; ++r) {
        global.row(from.Position(r / d_.batch) * d_.batch + r % d_.batch) = recv.row(i * rows + r);
      }
    }
    return global;
  }

  /// The inverse: member j gets its rows of our channel slice.
  Mat<T> ChannelsToSeq(Ctx& ctx, const Mat<T>& global) const {
    const int c = ctx.cp_size;
    const int64_t rows = global.rows() / c, width = global.cols();
    Mat<T> send(rows * c, width), recv(rows * c, width);
    for (int j = 0; j < c; ++j) {
      const SeqLayout to = SeqLayout::Make(ctx.seq.seq, c, j, ctx.seq.load_balanced);
      for (int64_t r = 0; r < rows; ++r) {
        send.row(j * rows + r) = global.row(to.Position(r / d_.batch) * d_.batch + r % d_.batch);
      }
    }
    const std::vector<int64_t> counts(static_cast<size_t>(c), rows * width);
    ctx.rank->AllToAll(*ctx.cp, send.data(), counts, recv.data(), counts, ctx.bytes.activation);
    Mat<T> local(rows, width * c);
    for (int i = 0; i < c; ++i) local.middleCols(i * width, width) = recv.middleRows(i * rows, rows);
    return local;
  }

  // ---- CP hand-off: the state along the chain of chunks ----

  /// The runs of positions the scan takes one at a time: this rank's chunks
  /// (ascending) under the hand-off, else one run from a zero state.
  std::vector<int64_t> Runs(const Ctx& ctx) const { return HandsOff(ctx) ? ctx.seq.chunks : std::vector<int64_t>{0}; }
  bool RemotePredecessor(const Ctx& ctx, int64_t chunk) const {
    return HandsOff(ctx) && chunk > 0 && ctx.seq.OwnerOf(chunk - 1) != ctx.cp_rank;
  }
  bool RemoteSuccessor(const Ctx& ctx, int64_t chunk) const {
    return HandsOff(ctx) && chunk + 1 < ctx.seq.num_chunks() && ctx.seq.OwnerOf(chunk + 1) != ctx.cp_rank;
  }

  /// Two eager sends to CP member `to`: the conv tail (activation dtype) and h (fp32).
  void SendState(Ctx& ctx, int to, const ScanState<T>& st) const {
    const int dest = ctx.cp->members[static_cast<size_t>(to)];
    ctx.rank->set_what(CommWhat::kRecurrentState);
    if (st.tail.size() > 0) ctx.rank->Send(ctx.cp->axis, dest, st.tail.data(), st.tail.size(), ctx.bytes.activation);
    ctx.rank->Send(ctx.cp->axis, dest, st.h.data(), st.h.size(), 4);
    ctx.rank->set_what(CommWhat::kRecurrent);
  }
  ScanState<T> RecvState(Ctx& ctx, int from, int64_t channels) const {
    const int src = ctx.cp->members[static_cast<size_t>(from)];
    ScanState<T> st = ZeroState<T>(d_.recurrent_d_conv, d_.batch, channels);
    if (st.tail.size() > 0) ctx.rank->Recv(ctx.cp->axis, src, st.tail.data(), st.tail.size(), ctx.bytes.activation);
    ctx.rank->Recv(ctx.cp->axis, src, st.h.data(), st.h.size(), 4);
    return st;
  }

  /// Runs conv, gates and scan over s->u (scan layout), run by run; saves
  /// ũ, r_pre, i_pre, h and the received states.
  void Recurrence(Ctx& ctx, Saved* s) {
    const Channels ch = ScanChannels(ctx);
    const MixerSlice<T> p = ValuesOf(mixer_, ch);
    const std::vector<int64_t> runs = Runs(ctx);
    const int64_t rows = s->u.m.rows(), run_rows = rows / static_cast<int64_t>(runs.size());
    SegmentActs<T> all{Mat<T>(rows, ch.count), Mat<T>(rows, ch.count), Mat<T>(rows, ch.count), Mat<T>(rows, ch.count)};
    s->received.resize(runs.size());
    ScanState<T> state = ZeroState<T>(d_.recurrent_d_conv, d_.batch, ch.count);
    for (size_t k = 0; k < runs.size(); ++k) {
      const int64_t chunk = runs[k];
      // A run starts from zero (chunk 0), the state the previous run left
      // (its predecessor is ours), or the state its predecessor's owner sent.
      if (chunk == 0) state = ZeroState<T>(d_.recurrent_d_conv, d_.batch, ch.count);
      if (RemotePredecessor(ctx, chunk)) {
        state = options_.drop_handoff ? ZeroState<T>(d_.recurrent_d_conv, d_.batch, ch.count)
                                      : RecvState(ctx, ctx.seq.OwnerOf(chunk - 1), ch.count);
        if (!options_.drop_handoff) {
          s->received[k].tail = Tensor<T>(ctx.mem(), SimCategory::kActivations, ctx.bytes.activation, state.tail);
          s->received[k].h = Tensor<T>(ctx.mem(), SimCategory::kActivations, 4, state.h);
        }
      }
      ScanState<T> next;
      const SegmentActs<T> a =
          SegmentForward(ctx, Mat<T>(s->u.m.middleRows(static_cast<int64_t>(k) * run_rows, run_rows)), state, p, d_.batch, &next);
      all.uc.middleRows(static_cast<int64_t>(k) * run_rows, run_rows) = a.uc;
      all.r_pre.middleRows(static_cast<int64_t>(k) * run_rows, run_rows) = a.r_pre;
      all.i_pre.middleRows(static_cast<int64_t>(k) * run_rows, run_rows) = a.i_pre;
      all.h.middleRows(static_cast<int64_t>(k) * run_rows, run_rows) = a.h;
      state = std::move(next);
      if (RemoteSuccessor(ctx, chunk) && !options_.drop_handoff) SendState(ctx, ctx.seq.OwnerOf(chunk + 1), state);
    }
    const SimCategory act = SimCategory::kActivations;
    s->uc = Tensor<T>(ctx.mem(), act, ctx.bytes.activation, std::move(all.uc));
    s->r_pre = Tensor<T>(ctx.mem(), act, ctx.bytes.activation, std::move(all.r_pre));
    s->i_pre = Tensor<T>(ctx.mem(), act, ctx.bytes.activation, std::move(all.i_pre));
    s->h = Tensor<T>(ctx.mem(), act, 4, std::move(all.h));  // the fp32 h sequence
  }

  /// The reverse of Recurrence: returns du (scan layout) for dh (scan layout);
  /// runs are taken in descending order, the state gradient flowing back.
  Mat<T> RecurrenceBackward(Ctx& ctx, const Saved& s, const Mat<T>& dh) {
    const Channels ch = ScanChannels(ctx);
    const MixerSlice<T> p = ValuesOf(mixer_, ch);
    const std::vector<int64_t> runs = Runs(ctx);
    const int64_t rows = s.u.m.rows(), run_rows = rows / static_cast<int64_t>(runs.size());
    const auto rows_of = [&](const Mat<T>& m, size_t k) {
      return Mat<T>(m.middleRows(static_cast<int64_t>(k) * run_rows, run_rows));
    };
    // The state each run started from, rebuilt in ascending order.
    std::vector<ScanState<T>> in(runs.size());
    for (size_t k = 0; k < runs.size(); ++k) {
      const int64_t chunk = runs[k];
      if (RemotePredecessor(ctx, chunk) && !options_.drop_handoff) {
        in[k] = {s.received[k].tail.m, s.received[k].h.m};
      } else if (chunk == 0 || RemotePredecessor(ctx, chunk)) {
        in[k] = ZeroState<T>(d_.recurrent_d_conv, d_.batch, ch.count);
      } else {
        in[k] = StateAfter(Extend(in[k - 1].tail, rows_of(s.u.m, k - 1)), rows_of(s.h.m, k - 1), TailRows(), d_.batch);
      }
    }
    MixerSlice<T> g = ZerosLike(p);
    Mat<T> du(rows, ch.count);
    // Gradient of the state the current run hands on: zero after the last
    // chunk, received when the successor is remote, else the d_in of the
    // (local) successor run taken just before.
    ScanState<T> d_next = ZeroState<T>(d_.recurrent_d_conv, d_.batch, ch.count);
    for (size_t k = runs.size(); k-- > 0;) {
      const int64_t chunk = runs[k];
      if (RemoteSuccessor(ctx, chunk)) {
        d_next = options_.drop_handoff ? ZeroState<T>(d_.recurrent_d_conv, d_.batch, ch.count)
                                       : RecvState(ctx, ctx.seq.OwnerOf(chunk + 1), ch.count);
      }
      const SegmentActs<T> a{rows_of(s.uc.m, k), rows_of(s.r_pre.m, k), rows_of(s.i_pre.m, k), rows_of(s.h.m, k)};
      ScanState<T> d_in;
      du.middleRows(static_cast<int64_t>(k) * run_rows, run_rows) =
          SegmentBackward(ctx, rows_of(s.u.m, k), in[k], a, p, rows_of(dh, k), d_next, d_.batch, &g, &d_in);
      if (RemotePredecessor(ctx, chunk) && !options_.drop_handoff) SendState(ctx, ctx.seq.OwnerOf(chunk - 1), d_in);
      d_next = std::move(d_in);
    }
    AddGrads(mixer_, ch, g);
    return du;
  }

  Dims d_;
  RecurrentOptions options_;
  Param<T>* norm_ = nullptr;
  Param<T>* gate_ = nullptr;  // W_g
  Param<T>* in_ = nullptr;    // W_u
  Param<T>* out_ = nullptr;   // W_o
  MixerParams<T> mixer_;
  SavedPerMicrobatch<Saved> saved_;
};

}  // namespace

template <class T>
std::unique_ptr<Block<T>> MakeRecurrentBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale,
                                             const RecurrentOptions& options) {
  return std::make_unique<RecurrentBlock<T>>(ctx, d, layer, seed, scale, options);
}

template std::unique_ptr<Block<double>> MakeRecurrentBlock<double>(Ctx&, const Dims&, int64_t, uint64_t, double,
                                                                   const RecurrentOptions&);
template std::unique_ptr<Block<float>> MakeRecurrentBlock<float>(Ctx&, const Dims&, int64_t, uint64_t, double,
                                                                 const RecurrentOptions&);

}  // namespace preflight::sim

// M: the Mamba-2 mixer (docs/formulas.md §1.4, 3.2, 8.2, 8.3), forward and backward,
// sharded over TP by heads and groups as Megatron's mamba_mixer.py, and over
// CP either by Megatron's all-to-all (mamba_context_parallel.py) or by a state
// hand-off along the CP chain [OURS].
//
// Data flow on a rank (forward), following Megatron's `_ssm_training`:
//   x -> RMSNorm -> f (identity / SP all-gather) -> in_proj (column-parallel,
//   each of the segments [z, x, B, C, dt] split on its own) -> [CP all-to-all:
//   sequence-split -> head-split] -> the kernel (conv1d + SiLU over [x, B, C],
//   dt = softplus(dt_raw + dt_bias), A = -exp(A_log), the SSD, D skip,
//   y * silu(z)) -> [CP all-to-all back] -> grouped RMSNorm (group d_i/G,
//   norm_before_gate = False) -> out_proj (row-parallel) -> g -> + x.
//
// The SSD: the forward runs the chunked form (chunk Q = Dims::mamba_chunk),
// as mamba_ssm's kernel does; the backward differentiates the recurrence
// (docs/formulas.md §8.2's sequential form), recomputing the conv output and every
// state from the saved kernel input, as the fused kernel recomputes its chunk
// states (docs/formulas.md §3.2). Tests check that the scan and the chunked form agree
// to 1e-12 and the backward against finite differences of this forward.
//
// Saved for backward (docs/formulas.md §3.2 a_M; mamba_ssm MambaSplitConv1dScanCombinedFn
// saves zxbcdt, out_x and the norm rstd): pre-norm input, in_proj input,
// pre-norm rstd (fp32), zxBCdt (the kernel input, in the kernel's layout),
// out_x (y before the gate), the per-group rstd (fp32) and, on Megatron's path
// (fused_norm_out_proj = false), the gated y (norm input) and the norm output
// (out_proj input). The fused path recomputes those two in backward. Under
// the CP hand-off, each segment that received a state keeps it (the backward
// restarts the recurrence from it).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "blocks.h"
#include "mamba.h"

namespace preflight::sim {

namespace mamba {

template <class T>
Mat<T> SsmScan(const SsmShape& s, const SsmInputs<T>& in, const Mat<T>& h0, Mat<T>* h_final) {
  const int64_t p = s.head_dim, n = s.d_state, len = in.x.rows() / s.batch;
  Mat<T> y(in.x.rows(), s.heads * p);
  *h_final = h0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t e = 0; e < s.heads; ++e) {
      const int64_t g = e / s.heads_per_group();
      Eigen::Map<Mat<T>> h(h_final->row(b * s.heads + e).data(), p, n);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t r = t * s.batch + b;
        const T dt = in.dt(r, e);
        const auto x = in.x.row(r).segment(e * p, p);
        h = std::exp(dt * in.a(0, e)) * h + dt * x.transpose() * in.b.row(r).segment(g * n, n);
        y.row(r).segment(e * p, p) = (h * in.c.row(r).segment(g * n, n).transpose()).transpose() + in.d(0, e) * x;
      }
    }
  }
  return y;
}

template <class T>
Mat<T> SsmChunked(const SsmShape& s, const SsmInputs<T>& in, int64_t chunk, const Mat<T>& h0, Mat<T>* h_final) {
  const int64_t p = s.head_dim, n = s.d_state, len = in.x.rows() / s.batch;
  Mat<T> y(in.x.rows(), s.heads * p);
  *h_final = h0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t e = 0; e < s.heads; ++e) {
      const int64_t g = e / s.heads_per_group();
      const T a = in.a(0, e), dd = in.d(0, e);
      Eigen::Map<Mat<T>> h(h_final->row(b * s.heads + e).data(), p, n);
      for (int64_t c0 = 0; c0 < len; c0 += chunk) {
        const int64_t q = std::min(chunk, len - c0);
        auto row = [&](int64_t i) { return (c0 + i) * s.batch + b; };
        std::vector<T> cum(static_cast<size_t>(q));  // cumulative dt*A inside the chunk
        T acc = 0;
        for (int64_t i = 0; i < q; ++i) cum[static_cast<size_t>(i)] = acc += in.dt(row(i), e) * a;
        const T last = cum[static_cast<size_t>(q - 1)];
        Mat<T> next = std::exp(last) * h;  // state passing: the carried state decayed over the chunk
        for (int64_t i = 0; i < q; ++i) {
          const int64_t ri = row(i);
          const T ci = cum[static_cast<size_t>(i)];
          const auto c_i = in.c.row(ri).segment(g * n, n);
          // Off-diagonal block: the state carried into the chunk, read at i.
          Mat<T> yi = std::exp(ci) * (h * c_i.transpose()).transpose() + dd * in.x.row(ri).segment(e * p, p);
          // Diagonal block: the causal quadratic form inside the chunk.
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t rj = row(j);
            const T w =
                std::exp(ci - cum[static_cast<size_t>(j)]) * in.dt(rj, e) * c_i.dot(in.b.row(rj).segment(g * n, n));
            yi += w * in.x.row(rj).segment(e * p, p);
          }
          y.row(ri).segment(e * p, p) = yi;
          next += std::exp(last - ci) * in.dt(ri, e) * in.x.row(ri).segment(e * p, p).transpose() *
                  in.b.row(ri).segment(g * n, n);
        }
        h = next;
      }
    }
  }
  return y;
}

template <class T>
SsmGrads<T> SsmScanBackward(const SsmShape& s, const SsmInputs<T>& in, const Mat<T>& h0, const Mat<T>& dy,
                            const Mat<T>& dh_final) {
  const int64_t p = s.head_dim, n = s.d_state, len = in.x.rows() / s.batch;
  SsmGrads<T> g;
  g.x = Mat<T>::Zero(in.x.rows(), in.x.cols());
  g.dt = Mat<T>::Zero(in.dt.rows(), in.dt.cols());
  g.b = Mat<T>::Zero(in.b.rows(), in.b.cols());
  g.c = Mat<T>::Zero(in.c.rows(), in.c.cols());
  g.a = Mat<T>::Zero(1, s.heads);
  g.d = Mat<T>::Zero(1, s.heads);
  g.h0.resize(h0.rows(), h0.cols());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t e = 0; e < s.heads; ++e) {
      const int64_t grp = e / s.heads_per_group();
      const T a = in.a(0, e);
      auto row = [&](int64_t t) { return t * s.batch + b; };
      // Recompute h_0 .. h_len (h_0 = the initial state).
      std::vector<Mat<T>> h(static_cast<size_t>(len + 1));
      h[0] = Eigen::Map<const Mat<T>>(h0.row(b * s.heads + e).data(), p, n);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t r = row(t);
        const T dt = in.dt(r, e);
        h[static_cast<size_t>(t + 1)] =
            std::exp(dt * a) * h[static_cast<size_t>(t)] +
            dt * in.x.row(r).segment(e * p, p).transpose() * in.b.row(r).segment(grp * n, n);
      }
      // dh = dL/dh_t, accumulated from y_t and from h_{t+1} = decay h_t + ...
      Mat<T> dh = Eigen::Map<const Mat<T>>(dh_final.row(b * s.heads + e).data(), p, n);
      for (int64_t t = len - 1; t >= 0; --t) {
        const int64_t r = row(t);
        const T dt = in.dt(r, e), decay = std::exp(dt * a);
        const auto x = in.x.row(r).segment(e * p, p);
        const auto bv = in.b.row(r).segment(grp * n, n);
        const auto gy = dy.row(r).segment(e * p, p);
        const Mat<T>& h_now = h[static_cast<size_t>(t + 1)];
        const Mat<T>& h_before = h[static_cast<size_t>(t)];
        // y_t = h_t C_t + D x_t
        dh += gy.transpose() * in.c.row(r).segment(grp * n, n);
        g.c.row(r).segment(grp * n, n) += gy * h_now;
        g.d(0, e) += gy.dot(x);
        // h_t = exp(dt A) h_{t-1} + dt x_t B_t^T
        g.x.row(r).segment(e * p, p) += in.d(0, e) * gy + dt * (dh * bv.transpose()).transpose();
        g.b.row(r).segment(grp * n, n) += dt * x * dh;
        const T through = dh.cwiseProduct(h_before).sum() * decay;  // dL/d(dt A)
        const Mat<T> input = x.transpose() * bv;
        g.dt(r, e) += dh.cwiseProduct(input).sum() + through * a;
        g.a(0, e) += through * dt;
        dh *= decay;
      }
      Eigen::Map<Mat<T>>(g.h0.row(b * s.heads + e).data(), p, n) = dh;
    }
  }
  return g;
}

template <class T>
Mat<T> CausalConv(const Mat<T>& ext, const Mat<T>& w, const Mat<T>& bias, int64_t batch) {
  const int64_t k = w.cols(), rows = ext.rows() - (k - 1) * batch;
  Mat<T> out = bias.replicate(rows, 1);
  for (int64_t j = 0; j < k; ++j) {
    out.array() += ext.middleRows(j * batch, rows).array().rowwise() * w.col(j).transpose().array();
  }
  return out;
}

template <class T>
Mat<T> CausalConvBackward(const Mat<T>& dout, const Mat<T>& ext, const Mat<T>& w, int64_t batch, Mat<T>* dw,
                          Mat<T>* dbias) {
  const int64_t k = w.cols(), rows = dout.rows();
  Mat<T> dext = Mat<T>::Zero(ext.rows(), ext.cols());
  dbias->row(0) += dout.colwise().sum();
  for (int64_t j = 0; j < k; ++j) {
    dext.middleRows(j * batch, rows).array() += dout.array().rowwise() * w.col(j).transpose().array();
    dw->col(j) += dout.cwiseProduct(ext.middleRows(j * batch, rows)).colwise().sum().transpose();
  }
  return dext;
}

}  // namespace mamba

namespace {

using mamba::SsmInputs;
using mamba::SsmShape;

/// Mamba's gated RMSNorm epsilon: Megatron builds ExtendedRMSNorm(eps=1e-5)
/// (mamba_mixer.py; docs/formulas.md §8.1).
constexpr double kGroupNormEps = 1e-5;

/// Column (or row) ranges [offset, length) of a packed dimension.
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

int64_t Width(const Ranges& r) {
  int64_t w = 0;
  for (const auto& x : r) w += x.second;
  return w;
}

template <class T>
Mat<T> PickCols(const Mat<T>& m, const Ranges& cols) {
  Mat<T> out(m.rows(), Width(cols));
  int64_t at = 0;
  for (const auto& [offset, len] : cols) {
    out.middleCols(at, len) = m.middleCols(offset, len);
    at += len;
  }
  return out;
}

template <class T>
void AddCols(Mat<T>* m, const Ranges& cols, const Mat<T>& part) {
  int64_t at = 0;
  for (const auto& [offset, len] : cols) {
    m->middleCols(offset, len) += part.middleCols(at, len);
    at += len;
  }
}

template <class T>
Mat<T> PickRows(const Mat<T>& m, const Ranges& rows) {
  Mat<T> out(Width(rows), m.cols());
  int64_t at = 0;
  for (const auto& [offset, len] : rows) {
    out.middleRows(at, len) = m.middleRows(offset, len);
    at += len;
  }
  return out;
}

template <class T>
void AddRows(Mat<T>* m, const Ranges& rows, const Mat<T>& part) {
  int64_t at = 0;
  for (const auto& [offset, len] : rows) {
    m->middleRows(offset, len) += part.middleRows(at, len);
    at += len;
  }
}

template <class T>
Mat<T> Silu(const Mat<T>& v) {
  return v.unaryExpr([](T a) { return a * Sigmoid(a); });
}

/// d silu(v) / dv = s(v)(1 + v(1 - s(v))) (docs/formulas.md §8.1).
template <class T>
Mat<T> SiluGrad(const Mat<T>& v) {
  return v.unaryExpr([](T a) {
    const T s = Sigmoid(a);
    return s * (T(1) + a * (T(1) - s));
  });
}

template <class T>
Mat<T> Softplus(const Mat<T>& v) {
  return v.unaryExpr([](T a) { return a > T(20) ? a : std::log1p(std::exp(a)); });
}

/// Sizes of the kernel on one rank: its heads and groups (TP-local, or the
/// head-split share under all-to-all CP), head dim P, state N, conv width K.
struct CoreDims {
  SsmShape ssm;
  int64_t d_conv = 4;
  int64_t inner() const { return ssm.heads * ssm.head_dim; }
  int64_t gn() const { return ssm.groups * ssm.d_state; }
  int64_t conv_channels() const { return inner() + 2 * gn(); }
  /// Columns of zxBCdt: [z (inner), x (inner), B (gn), C (gn), dt (heads)].
  int64_t proj() const { return 2 * inner() + 2 * gn() + ssm.heads; }
  int64_t tail_rows() const { return (d_conv - 1) * ssm.batch; }
};

/// The kernel's parameters on this rank (slices of the TP-local tensors) or
/// their gradients.
template <class T>
struct CoreParams {
  Mat<T> conv_w, conv_b, dt_bias, a_log, d;  // [channels, K], [1, channels], [1, heads] x 3
};

/// What a segment of the recurrence hands to the next one [OURS]: the last
/// K-1 positions of the conv input [x, B, C] and the SSM state (mamba.h).
template <class T>
struct Carry {
  Mat<T> conv;  // (K-1)*batch rows x conv channels, oldest position first
  Mat<T> ssm;   // batch*heads x P*N
};

template <class T>
Carry<T> ZeroCarry(const CoreDims& k) {
  return {Mat<T>::Zero(k.tail_rows(), k.conv_channels()), Mat<T>::Zero(k.ssm.state_rows(), k.ssm.state_cols())};
}

/// A run of consecutive positions the recurrence walks in one go, and the
/// global ranks holding the positions just before and after it (-1: none).
struct Segment {
  int64_t row0 = 0, rows = 0;
  int prev = -1, next = -1;
};

/// The kernel's inputs of one segment: the conv input with its history
/// (`ext`, docs/formulas.md §8.1), the conv output before SiLU, and the SSM inputs.
template <class T>
struct KernelIn {
  Mat<T> ext, pre;
  SsmInputs<T> ssm;
};

template <class T>
KernelIn<T> PrepareKernel(const CoreDims& k, const CoreParams<T>& p, const Mat<T>& zxbcdt, const Mat<T>& tail) {
  KernelIn<T> in;
  const int64_t rows = zxbcdt.rows();
  in.ext.resize(tail.rows() + rows, k.conv_channels());
  in.ext.topRows(tail.rows()) = tail;
  in.ext.bottomRows(rows) = zxbcdt.middleCols(k.inner(), k.conv_channels());
  in.pre = mamba::CausalConv(in.ext, p.conv_w, p.conv_b, k.ssm.batch);
  const Mat<T> xbc = Silu(in.pre);
  in.ssm.x = xbc.leftCols(k.inner());
  in.ssm.b = xbc.middleCols(k.inner(), k.gn());
  in.ssm.c = xbc.rightCols(k.gn());
  // dt = softplus(dt_raw + dt_bias) (mamba2.py dt_softplus=True; no dt_limit).
  in.ssm.dt = Softplus(Mat<T>(zxbcdt.rightCols(k.ssm.heads).rowwise() + p.dt_bias.row(0)));
  in.ssm.a = -p.a_log.array().exp().matrix();  // A = -exp(A_log)
  in.ssm.d = p.d;
  return in;
}

/// The kernel on one segment starting from `in`: returns out_x = y (before
/// the gate) and writes the state it hands on.
template <class T>
Mat<T> KernelForward(const CoreDims& k, const CoreParams<T>& p, const Mat<T>& zxbcdt, const Carry<T>& in, int64_t chunk,
                     Carry<T>* out) {
  const KernelIn<T> kin = PrepareKernel(k, p, zxbcdt, in.conv);
  out->conv = kin.ext.bottomRows(k.tail_rows());
  return mamba::SsmChunked(k.ssm, kin.ssm, chunk, in.ssm, &out->ssm);
}

/// Backward of KernelForward for d(out_x) = `dout` and the gradient `dnext`
/// of the state it handed on. Returns d(zxBCdt) with zero z columns; adds
/// the parameter gradients into `grads`; writes the gradient of `in`.
template <class T>
Mat<T> KernelBackward(const CoreDims& k, const CoreParams<T>& p, const Mat<T>& zxbcdt, const Carry<T>& in,
                      const Mat<T>& dout, const Carry<T>& dnext, CoreParams<T>* grads, Carry<T>* dprev) {
  const KernelIn<T> kin = PrepareKernel(k, p, zxbcdt, in.conv);
  const mamba::SsmGrads<T> g = mamba::SsmScanBackward(k.ssm, kin.ssm, in.ssm, dout, dnext.ssm);
  Mat<T> dxbc(zxbcdt.rows(), k.conv_channels());
  dxbc << g.x, g.b, g.c;
  const Mat<T> dpre = dxbc.cwiseProduct(SiluGrad(kin.pre));
  Mat<T> dext = mamba::CausalConvBackward(dpre, kin.ext, p.conv_w, k.ssm.batch, &grads->conv_w, &grads->conv_b);
  dext.bottomRows(k.tail_rows()) += dnext.conv;  // the tail handed on is a copy of these inputs
  dprev->conv = dext.topRows(k.tail_rows());
  dprev->ssm = g.h0;
  Mat<T> dk = Mat<T>::Zero(zxbcdt.rows(), zxbcdt.cols());
  dk.middleCols(k.inner(), k.conv_channels()) = dext.bottomRows(zxbcdt.rows());
  // dt = softplus(v), v = dt_raw + dt_bias: d/dv = sigmoid(v).
  const Mat<T> v = zxbcdt.rightCols(k.ssm.heads).rowwise() + p.dt_bias.row(0);
  const Mat<T> dv = g.dt.cwiseProduct(v.unaryExpr([](T a) { return Sigmoid(a); }));
  dk.rightCols(k.ssm.heads) = dv;
  grads->dt_bias.row(0) += dv.colwise().sum();
  grads->a_log += g.a.cwiseProduct(kin.ssm.a);  // dA/dA_log = -exp(A_log) = A
  grads->d += g.d;
  return dk;
}

/// Grouped RMSNorm over groups of `group` channels (Megatron RMSNormGated
/// with z = None: the gate was applied in the kernel, norm_before_gate = False).
template <class T>
Mat<T> GroupNormForward(const Mat<T>& v, const Mat<T>& w, int64_t group, Mat<T>* rstd) {
  const int64_t groups = v.cols() / group;
  Mat<T> out(v.rows(), v.cols());
  rstd->resize(v.rows(), groups);
  for (int64_t g = 0; g < groups; ++g) {
    Mat<T> r;
    out.middleCols(g * group, group) = RmsNormForward(Mat<T>(v.middleCols(g * group, group)),
                                                      Mat<T>(w.middleCols(g * group, group)), kGroupNormEps, &r);
    rstd->col(g) = r.col(0);
  }
  return out;
}

/// The norm output from the saved rstd (the fused path's recompute).
template <class T>
Mat<T> GroupNormApply(const Mat<T>& v, const Mat<T>& w, int64_t group, const Mat<T>& rstd) {
  Mat<T> out(v.rows(), v.cols());
  for (int64_t g = 0; g < rstd.cols(); ++g) {
    out.middleCols(g * group, group) =
        ((v.middleCols(g * group, group).array().colwise() * rstd.col(g).array()).rowwise() *
         w.middleCols(g * group, group).row(0).array())
            .matrix();
  }
  return out;
}

template <class T>
Mat<T> GroupNormBackward(const Mat<T>& dy, const Mat<T>& v, const Mat<T>& w, int64_t group, const Mat<T>& rstd,
                         Mat<T>* dw) {
  Mat<T> dv(v.rows(), v.cols());
  for (int64_t g = 0; g < rstd.cols(); ++g) {
    Mat<T> dwg = Mat<T>::Zero(1, group);
    dv.middleCols(g * group, group) =
        RmsNormBackward(Mat<T>(dy.middleCols(g * group, group)), Mat<T>(v.middleCols(g * group, group)),
                        Mat<T>(rstd.col(g)), Mat<T>(w.middleCols(g * group, group)), &dwg);
    dw->middleCols(g * group, group) += dwg;
  }
  return dv;
}

/// Global row of each local row of every CP rank (its chunks in ascending
/// order, docs/formulas.md §3.4): out[j][i].
std::vector<std::vector<int64_t>> GlobalRows(const Ctx& ctx, int64_t local_rows, int64_t batch) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(ctx.cp_size));
  for (int j = 0; j < ctx.cp_size; ++j) {
    const SeqLayout l = SeqLayout::Make(ctx.seq.seq, ctx.cp_size, j, ctx.seq.load_balanced);
    for (int64_t i = 0; i < local_rows; ++i)
      out[static_cast<size_t>(j)].push_back(l.Position(i / batch) * batch + i % batch);
  }
  return out;
}

/// All-to-all from sequence-split to head-split (Megatron _all_to_all_cp2hp,
/// then _undo_attention_load_balancing): CP rank j receives every rank's
/// rows restricted to its columns cols[j]; the result holds the whole
/// sequence in global order. A column range listed for several ranks is
/// sent to each (Megatron's repeat of B and C, r_g > 1).
template <class T>
Mat<T> SeqToHeads(Ctx& ctx, const Mat<T>& local, const std::vector<Ranges>& cols, int64_t batch) {
  const int c = ctx.cp_size;
  const int64_t rows = local.rows(), width = Width(cols[static_cast<size_t>(ctx.cp_rank)]);
  std::vector<T> send;
  std::vector<int64_t> send_counts, recv_counts;
  for (int j = 0; j < c; ++j) {
    const Mat<T> part = PickCols(local, cols[static_cast<size_t>(j)]);
    send.insert(send.end(), part.data(), part.data() + part.size());
    send_counts.push_back(part.size());
    recv_counts.push_back(rows * width);
  }
  std::vector<T> recv(static_cast<size_t>(rows * width * c));
  ctx.rank->AllToAll(*ctx.cp, send.data(), send_counts, recv.data(), recv_counts, ctx.bytes.activation);
  const auto global = GlobalRows(ctx, rows, batch);
  Mat<T> out(rows * c, width);
  for (int j = 0; j < c; ++j) {
    const Eigen::Map<const Mat<T>> part(recv.data() + j * rows * width, rows, width);
    for (int64_t i = 0; i < rows; ++i) out.row(global[static_cast<size_t>(j)][static_cast<size_t>(i)]) = part.row(i);
  }
  return out;
}

/// The inverse (Megatron _redo_attention_load_balancing, then
/// _all_to_all_hp2cp): CP rank j gets the rows of its own positions; the part
/// from rank k is added into columns cols[k] of a [local rows, width] result
/// (adding sums the copies of a repeated B/C group in backward).
template <class T>
Mat<T> HeadsToSeq(Ctx& ctx, const Mat<T>& heads, const std::vector<Ranges>& cols, int64_t width, int64_t batch) {
  const int c = ctx.cp_size;
  const int64_t rows = heads.rows() / c, mine = heads.cols();
  const auto global = GlobalRows(ctx, rows, batch);
  std::vector<T> send;
  std::vector<int64_t> send_counts, recv_counts;
  for (int j = 0; j < c; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      const auto r = heads.row(global[static_cast<size_t>(j)][static_cast<size_t>(i)]);
      send.insert(send.end(), r.data(), r.data() + mine);
    }
    send_counts.push_back(rows * mine);
    recv_counts.push_back(rows * Width(cols[static_cast<size_t>(j)]));
  }
  std::vector<T> recv(static_cast<size_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})));
  ctx.rank->AllToAll(*ctx.cp, send.data(), send_counts, recv.data(), recv_counts, ctx.bytes.activation);
  Mat<T> out = Mat<T>::Zero(rows, width);
  int64_t at = 0;
  for (int k = 0; k < c; ++k) {
    const int64_t w = Width(cols[static_cast<size_t>(k)]);
    AddCols(&out, cols[static_cast<size_t>(k)], Mat<T>(Eigen::Map<const Mat<T>>(recv.data() + at, rows, w)));
    at += rows * w;
  }
  return out;
}

template <class T>
class MambaBlock final : public Block<T> {
 public:
  MambaBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) : d_(d) {
    Validate(ctx, d);
    const int t = ctx.tp_size;
    a2a_ = ctx.cp_size > 1 && ctx.cp_recurrent == CpRecurrent::kAllToAll;
    handoff_ = ctx.cp_size > 1 && ctx.cp_recurrent == CpRecurrent::kHandoff;
    fused_ = d.mamba_fused_norm_out_proj;
    tp_.ssm = SsmShape{d.mamba_heads / t, d.mamba_groups / t, d.mamba_head_dim, d.mamba_d_state, d.batch};
    tp_.d_conv = d.mamba_d_conv;
    group_size_ = d.mamba_inner / d.mamba_groups;
    AddParams(ctx, d, layer, seed, scale);
    PlaceKernel(ctx);
  }

  Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) override {
    ctx.rank->set_what(CommWhat::kMamba);
    const SimCategory act = SimCategory::kActivations, tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation;
    Saved& s = saved_.Open(ctx.microbatch);
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s.x, &s.n, &s.rstd);
    Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
    Tensor<T> proj(ctx.mem(), tmp, ab, MatMul(ctx, n_full.m, in_proj_->value.m));
    n_full.Release();
    // The kernel's input: head-split over the whole sequence under
    // all-to-all CP (Megatron pre_conv_ssm), else this rank's rows.
    s.zxbcdt = Tensor<T>(ctx.mem(), act, ab, a2a_ ? SeqToHeads(ctx, proj.m, seq_to_heads_, d_.batch) : proj.m);
    proj.Release();
    s.out_x = Tensor<T>(ctx.mem(), act, ab, RunForward(ctx, &s));
    // The kernel's gate y * silu(z) (mamba_chunk_scan with z), then back to
    // this rank's rows (Megatron post_conv_ssm).
    Tensor<T> gated(ctx.mem(), tmp, ab, SwiGlu(Mat<T>(s.zxbcdt.m.leftCols(kernel_.inner())), s.out_x.m));
    if (a2a_) gated = Tensor<T>(ctx.mem(), tmp, ab, HeadsToSeq(ctx, gated.m, y_to_seq_, tp_.inner(), d_.batch));
    Mat<T> rstd_groups;
    Tensor<T> normed(ctx.mem(), tmp, ab, GroupNormForward(gated.m, norm_w_->value.m, group_size_, &rstd_groups));
    s.rstd_groups = Tensor<T>(ctx.mem(), act, 4, std::move(rstd_groups));
    if (!fused_) {
      s.gated = Tensor<T>(ctx.mem(), act, ab, gated.m);
      s.normed = Tensor<T>(ctx.mem(), act, ab, normed.m);
    }
    gated.Release();
    Tensor<T> partial(ctx.mem(), tmp, ab, MatMul(ctx, normed.m, out_proj_->value.m));
    normed.Release();
    return ReduceFromTpForward(ctx, partial.m);
  }

  Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) override {
    ctx.rank->set_what(CommWhat::kMamba);
    const SimCategory tmp = SimCategory::kTemporaries;
    const int64_t ab = ctx.bytes.activation;
    Saved s = saved_.Close(ctx.microbatch);
    const Mat<T> z = s.zxbcdt.m.leftCols(kernel_.inner());
    if (fused_) {  // the fused kernel recomputes the gate and the norm (docs/formulas.md §3.2, MS path)
      s.gated = Tensor<T>(ctx.mem(), tmp, ab, SwiGlu(z, s.out_x.m));
      s.normed =
          Tensor<T>(ctx.mem(), tmp, ab, GroupNormApply(s.gated.m, norm_w_->value.m, group_size_, s.rstd_groups.m));
    }
    Tensor<T> dy_full(ctx.mem(), tmp, ab, ReduceFromTpBackward(ctx, dy));
    out_proj_->grad.m += MatMulTransA(ctx, s.normed.m, dy_full.m);
    const Mat<T> dnormed = MatMulTransB(ctx, dy_full.m, out_proj_->value.m);
    dy_full.Release();
    s.normed.Release();
    Mat<T> dgated =
        GroupNormBackward(dnormed, s.gated.m, norm_w_->value.m, group_size_, s.rstd_groups.m, &norm_w_->grad.m);
    s.gated.Release();
    if (a2a_) dgated = SeqToHeads(ctx, dgated, y_to_seq_, d_.batch);
    Mat<T> dz, dout_x;
    SwiGluBackward(dgated, z, s.out_x.m, &dz, &dout_x);
    Tensor<T> dk(ctx.mem(), tmp, ab, RunBackward(ctx, s, dout_x));
    dk.m.leftCols(kernel_.inner()) = dz;
    if (a2a_) dk = Tensor<T>(ctx.mem(), tmp, ab, HeadsToSeq(ctx, dk.m, seq_to_heads_, tp_.proj(), d_.batch));
    const Mat<T> dn = ColumnParallelBackward<T>(ctx, s.n.m, {{in_proj_, &dk.m}});
    dk.Release();
    return NormBackward(dn, s.x.m, s.rstd.m, norm_->value.m, &norm_->grad.m);
  }

 private:
  struct Saved {
    Tensor<T> x, n, rstd;     // pre-norm input, in_proj input (rows of this rank), pre-norm rstd (fp32)
    Tensor<T> zxbcdt;         // kernel input, kernel layout
    Tensor<T> out_x;          // y before the gate, kernel layout
    Tensor<T> gated, normed;  // Megatron path: norm input, out_proj input
    Tensor<T> rstd_groups;    // fp32, [rows, local groups]
    std::vector<Tensor<T>> carry_conv, carry_ssm;  // hand-off: the state each segment received (empty if none)
  };

  static void Require(bool ok, const std::string& why) {
    if (!ok) throw SimUnsupported(why);
  }

  static void Validate(const Ctx& ctx, const Dims& d) {
    const int64_t t = ctx.tp_size, c = ctx.cp_size, h = d.mamba_heads, g = d.mamba_groups;
    const auto str = [](int64_t v) { return std::to_string(v); };
    Require(h > 0 && g > 0 && d.mamba_head_dim > 0 && d.mamba_d_state > 0 && d.mamba_d_conv > 0,
            "Mamba block needs positive heads, groups, head_dim, d_state and d_conv");
    Require(d.mamba_inner == h * d.mamba_head_dim, "Mamba d_inner must equal heads x head_dim");
    // Megatron mamba_mixer.py asserts these three.
    Require(h % g == 0, "Mamba heads (" + str(h) + ") must be a multiple of groups (" + str(g) + ")");
    Require(h % t == 0, "Mamba heads (" + str(h) + ") must be divisible by tp (" + str(t) + ")");
    Require(g % t == 0, "Mamba groups (" + str(g) + ") must be divisible by tp (" + str(t) + ")");
    if (c <= 1 || ctx.cp_recurrent != CpRecurrent::kAllToAll) return;
    // Megatron mamba_context_parallel.py (docs/formulas.md §1.4).
    Require(h % (t * c) == 0, "Mamba all-to-all CP needs heads divisible by tp*cp = " + str(t * c));
    Require((g / t) % c == 0 || c % (g / t) == 0, "Mamba all-to-all CP needs groups/tp (" + str(g / t) +
                                                      ") to divide or be divisible by cp (" + str(c) + ")");
    // The fused kernel would normalise in the head-split layout while its
    // out_proj needs the sequence-split one; Megatron's CP runs the norm and
    // out_proj outside the kernel (mamba_mixer.py _ssm_training).
    Require(!d.mamba_fused_norm_out_proj,
            "Mamba fused_norm_out_proj is not supported with all-to-all CP (Megatron's CP path runs the norm and "
            "out_proj outside the kernel)");
  }

  /// Parameters as the inventory lists them (src/inventory/build.cc AddMamba).
  void AddParams(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const int64_t h = d.hidden, di = d.mamba_inner, gn = d.mamba_groups * d.mamba_d_state, nh = d.mamba_heads;
    const int64_t conv = di + 2 * gn;
    auto add = [&](const std::string& name, int64_t rows, int64_t cols, ShardKind kind, Init init, double s,
                   ParamRole role, std::vector<int64_t> segments = {}) -> Param<T>& {
      return WithRole(
          ctx, this->Add(MakeParam<T>(ctx, p + name, rows, cols, kind, init, seed, s, -1, std::move(segments))), role);
    };
    norm_ = &WithRole(ctx, this->Add(MakeNorm<T>(ctx, d, p + "norm", seed, scale)), ParamRole::kVector);
    in_proj_ = &add("mixer.in_proj.weight", h, 2 * di + 2 * gn + nh, ShardKind::kColumns, Init::kMatrix,
                    scale / std::sqrt(double(h)), ParamRole::kMambaInProj, {di, di, gn, gn, nh});
    conv_w_ = &add("mixer.conv1d.weight", conv, d.mamba_d_conv, ShardKind::kRows, Init::kMatrix,
                   scale / std::sqrt(double(d.mamba_d_conv)), ParamRole::kVector, {di, gn, gn});
    conv_b_ = &add("mixer.conv1d.bias", 1, conv, ShardKind::kColumns, Init::kMatrix, 0.5 * scale, ParamRole::kVector,
                   {di, gn, gn});
    // [OURS] init: dt_bias ~ -1 + U and A_log ~ -1.5 + U give dt ~ 0.3 and
    // A in about [-0.5, -0.1]: a decay near 0.9 a step, so the state carries
    // across the tiny test chunks (Megatron draws dt in [1e-3, 0.1], A in [1, 16]).
    dt_bias_ = &add("mixer.dt_bias", 1, nh, ShardKind::kColumns, Init::kMatrix, scale, ParamRole::kVector);
    dt_bias_->value.m.array() -= T(1);
    a_log_ = &add("mixer.A_log", 1, nh, ShardKind::kColumns, Init::kMatrix, scale, ParamRole::kVector);
    a_log_->value.m.array() -= T(1.5);
    d_skip_ = &add("mixer.D", 1, nh, ShardKind::kColumns, Init::kNormWeight, scale, ParamRole::kVector);
    norm_w_ = &add("mixer.norm.weight", 1, di, ShardKind::kColumns, Init::kNormWeight, scale, ParamRole::kVector);
    out_proj_ = &add("mixer.out_proj.weight", di, h, ShardKind::kRows, Init::kMatrix, scale / std::sqrt(double(di)),
                     ParamRole::kMatrix);
    // Megatron keeps A_log and D in fp32 (the inventory charges 4 B).
    for (Param<T>* fp32 : {a_log_, d_skip_}) {
      Mat<T> v = std::move(fp32->value.m);
      const SimCategory cat = SimCategory::kTpShardedParams;
      fp32->value.Release();
      fp32->value = Tensor<T>(ctx.mem(), cat, 4, std::move(v));
    }
  }

  /// Where this rank's kernel runs: its heads, groups and the slices of the
  /// TP-local tensors it reads. Without all-to-all CP: all TP-local heads.
  /// With it (Megatron MambaContextParallel): heads H/(t c) of CP rank k =
  /// [k H/(tc), ...); groups G/(t c) of them when (G/t) % c == 0, else the
  /// one group k / r_g, whose B and C every one of its r_g = c/(G/t) ranks
  /// receives (Megatron repeats B and C before the all-to-all).
  void PlaceKernel(const Ctx& ctx) {
    kernel_ = tp_;
    const int64_t di = tp_.inner(), gnt = tp_.gn(), ht = tp_.ssm.heads, n = tp_.ssm.d_state;
    channels_ = {{0, tp_.conv_channels()}};
    heads_ = {{0, ht}};
    if (!a2a_) return;
    const int c = ctx.cp_size;
    const int64_t gt = tp_.ssm.groups, repeat = gt % c == 0 ? 1 : c / gt;
    kernel_.ssm.heads = ht / c;
    kernel_.ssm.groups = repeat > 1 ? 1 : gt / c;
    const int64_t dk = kernel_.inner(), gnk = kernel_.gn(), hk = kernel_.ssm.heads;
    auto first_group = [&](int k) { return repeat > 1 ? k / repeat : k * kernel_.ssm.groups; };
    for (int k = 0; k < c; ++k) {
      const int64_t gb = first_group(k) * n;
      seq_to_heads_.push_back({{k * dk, dk},
                               {di + k * dk, dk},
                               {2 * di + gb, gnk},
                               {2 * di + gnt + gb, gnk},
                               {2 * di + 2 * gnt + k * hk, hk}});
      y_to_seq_.push_back({{k * dk, dk}});
    }
    const int k = ctx.cp_rank;
    const int64_t gb = first_group(k) * n;
    channels_ = {{k * dk, dk}, {di + gb, gnk}, {di + gnt + gb, gnk}};
    heads_ = {{k * hk, hk}};
  }

  CoreParams<T> KernelParams() const {
    return {PickRows(conv_w_->value.m, channels_), PickCols(conv_b_->value.m, channels_),
            PickCols(dt_bias_->value.m, heads_), PickCols(a_log_->value.m, heads_), PickCols(d_skip_->value.m, heads_)};
  }

  /// The runs of the recurrence on this rank. One over all rows unless the
  /// CP hand-off is on: then one per run of consecutive chunks (docs/formulas.md §3.4:
  /// chunks r and 2c-1-r are apart except on rank c-1), whose neighbours are
  /// the owners of the chunks just before and after it.
  std::vector<Segment> Segments(const Ctx& ctx, int64_t rows) const {
    if (!handoff_) return {Segment{0, rows, -1, -1}};
    const SeqLayout& q = ctx.seq;
    const int64_t per_chunk = q.chunk_len * d_.batch;
    std::vector<Segment> out;
    for (size_t i = 0; i < q.chunks.size(); ++i) {
      const int64_t id = q.chunks[i];
      if (i == 0 || id != q.chunks[i - 1] + 1) {
        Segment s;
        s.row0 = static_cast<int64_t>(i) * per_chunk;
        s.prev = id > 0 ? ctx.cp->members[static_cast<size_t>(q.OwnerOf(id - 1))] : -1;
        out.push_back(s);
      }
      Segment& s = out.back();
      s.rows += per_chunk;
      s.next = id + 1 < q.num_chunks() ? ctx.cp->members[static_cast<size_t>(q.OwnerOf(id + 1))] : -1;
    }
    return out;
  }

  /// The two messages of a hand-off edge [OURS]: the conv tail in the
  /// activation dtype and the SSM state in fp32 (mamba_ssm keeps
  /// ssm_state fp32; docs/formulas.md §6's state per sequence).
  void SendCarry(Ctx& ctx, int dest, const Carry<T>& c) {
    ctx.rank->set_what(CommWhat::kMambaState);
    if (c.conv.size() > 0) ctx.rank->Send(ctx.cp->axis, dest, c.conv.data(), c.conv.size(), ctx.bytes.activation);
    ctx.rank->Send(ctx.cp->axis, dest, c.ssm.data(), c.ssm.size(), 4);
    ctx.rank->set_what(CommWhat::kMamba);
  }
  void RecvCarry(Ctx& ctx, int src, Carry<T>* c) {
    ctx.rank->set_what(CommWhat::kMambaState);
    if (c->conv.size() > 0) ctx.rank->Recv(ctx.cp->axis, src, c->conv.data(), c->conv.size(), ctx.bytes.activation);
    ctx.rank->Recv(ctx.cp->axis, src, c->ssm.data(), c->ssm.size(), 4);
    ctx.rank->set_what(CommWhat::kMamba);
  }

  /// The kernel over every segment in sequence order, each from the state the
  /// previous one handed on (received from its owner and kept for backward).
  Mat<T> RunForward(Ctx& ctx, Saved* s) {
    const CoreParams<T> p = KernelParams();
    const Mat<T>& in = s->zxbcdt.m;
    const int64_t chunk = d_.mamba_chunk > 0 ? d_.mamba_chunk : in.rows();
    Mat<T> out_x(in.rows(), kernel_.inner());
    for (const Segment& seg : Segments(ctx, in.rows())) {
      Carry<T> from = ZeroCarry<T>(kernel_), to;
      if (seg.prev >= 0) RecvCarry(ctx, seg.prev, &from);
      s->carry_conv.emplace_back(ctx.mem(), SimCategory::kActivations, ctx.bytes.activation,
                                 seg.prev >= 0 ? from.conv : Mat<T>());
      s->carry_ssm.emplace_back(ctx.mem(), SimCategory::kActivations, 4, seg.prev >= 0 ? from.ssm : Mat<T>());
      out_x.middleRows(seg.row0, seg.rows) =
          KernelForward(kernel_, p, Mat<T>(in.middleRows(seg.row0, seg.rows)), from, chunk, &to);
      if (seg.next >= 0) SendCarry(ctx, seg.next, to);
    }
    return out_x;
  }

  /// Backward over the segments in reverse order; the gradient of each
  /// handed-on state comes back along the reverse edge. Returns d(zxBCdt)
  /// with zero z columns and adds the kernel's parameter gradients.
  Mat<T> RunBackward(Ctx& ctx, const Saved& s, const Mat<T>& dout_x) {
    const CoreParams<T> p = KernelParams();
    CoreParams<T> g{Mat<T>::Zero(p.conv_w.rows(), p.conv_w.cols()), Mat<T>::Zero(1, p.conv_b.cols()),
                    Mat<T>::Zero(1, p.dt_bias.cols()), Mat<T>::Zero(1, p.a_log.cols()), Mat<T>::Zero(1, p.d.cols())};
    const Mat<T>& in = s.zxbcdt.m;
    Mat<T> dk(in.rows(), in.cols());
    const std::vector<Segment> segments = Segments(ctx, in.rows());
    for (size_t i = segments.size(); i-- > 0;) {
      const Segment& seg = segments[i];
      Carry<T> dnext = ZeroCarry<T>(kernel_), dprev;
      if (seg.next >= 0) RecvCarry(ctx, seg.next, &dnext);
      const Carry<T> from = seg.prev >= 0 ? Carry<T>{s.carry_conv[i].m, s.carry_ssm[i].m} : ZeroCarry<T>(kernel_);
      // The recomputed states h_0..h_L (fp32) live while the segment runs.
      const Allocation states(ctx.mem(), SimCategory::kTemporaries,
                              (seg.rows / d_.batch + 1) * kernel_.ssm.state_rows() * kernel_.ssm.state_cols() * 4);
      dk.middleRows(seg.row0, seg.rows) =
          KernelBackward(kernel_, p, Mat<T>(in.middleRows(seg.row0, seg.rows)), from,
                         Mat<T>(dout_x.middleRows(seg.row0, seg.rows)), dnext, &g, &dprev);
      if (seg.prev >= 0) SendCarry(ctx, seg.prev, dprev);
    }
    AddRows(&conv_w_->grad.m, channels_, g.conv_w);
    AddCols(&conv_b_->grad.m, channels_, g.conv_b);
    AddCols(&dt_bias_->grad.m, heads_, g.dt_bias);
    AddCols(&a_log_->grad.m, heads_, g.a_log);
    AddCols(&d_skip_->grad.m, heads_, g.d);
    return dk;
  }

  Dims d_;
  bool a2a_ = false, handoff_ = false, fused_ = false;
  CoreDims tp_;                                  // TP-local sizes
  CoreDims kernel_;                              // the kernel's sizes on this rank
  int64_t group_size_ = 1;                       // gated-norm group d_i / G
  Ranges channels_, heads_;                      // kernel slices of the TP-local conv channels and heads
  std::vector<Ranges> seq_to_heads_, y_to_seq_;  // all-to-all CP: columns of zxBCdt / y per CP rank
  Param<T>* norm_ = nullptr;
  Param<T>* in_proj_ = nullptr;
  Param<T>* conv_w_ = nullptr;
  Param<T>* conv_b_ = nullptr;
  Param<T>* dt_bias_ = nullptr;
  Param<T>* a_log_ = nullptr;
  Param<T>* d_skip_ = nullptr;
  Param<T>* norm_w_ = nullptr;
  Param<T>* out_proj_ = nullptr;
  SavedPerMicrobatch<Saved> saved_;
};

}  // namespace

template <class T>
std::unique_ptr<Block<T>> MakeMambaBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale) {
  return std::make_unique<MambaBlock<T>>(ctx, d, layer, seed, scale);
}

#define PREFLIGHT_INSTANTIATE(T)                                                                                   \
  template Mat<T> mamba::SsmScan<T>(const mamba::SsmShape&, const mamba::SsmInputs<T>&, const Mat<T>&, Mat<T>*);   \
  template Mat<T> mamba::SsmChunked<T>(const mamba::SsmShape&, const mamba::SsmInputs<T>&, int64_t, const Mat<T>&, \
                                       Mat<T>*);                                                                   \
  template mamba::SsmGrads<T> mamba::SsmScanBackward<T>(const mamba::SsmShape&, const mamba::SsmInputs<T>&,        \
                                                        const Mat<T>&, const Mat<T>&, const Mat<T>&);              \
  template Mat<T> mamba::CausalConv<T>(const Mat<T>&, const Mat<T>&, const Mat<T>&, int64_t);                      \
  template Mat<T> mamba::CausalConvBackward<T>(const Mat<T>&, const Mat<T>&, const Mat<T>&, int64_t, Mat<T>*,      \
                                               Mat<T>*);                                                           \
  template std::unique_ptr<Block<T>> MakeMambaBlock<T>(Ctx&, const Dims&, int64_t, uint64_t, double);
PREFLIGHT_INSTANTIATE(double)
PREFLIGHT_INSTANTIATE(float)
#undef PREFLIGHT_INSTANTIATE

}  // namespace preflight::sim

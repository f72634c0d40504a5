// The numerics of the Mamba-2 mixer core (docs/formulas.md §8.1-8.2), as free
// functions so that tests can check them against each other: the causal
// depthwise conv1d, the SSM recurrence in its sequential form (the scan) and
// in its chunked SSD form, and the scan's backward. The block that uses them
// (TP/CP sharding, saved tensors, collectives) is in mamba_block.cc.
//
// Layouts. A sequence segment of L positions of `batch` sequences has rows
// row = position * batch + b (the executor's row order). Per row:
//   x [heads * P] (head eta at columns eta*P..), dt [heads] (after softplus),
//   B, C [groups * N] (group gamma at columns gamma*N..).
// Head eta reads group eta / (heads / groups) (docs/formulas.md §8.2).
// An SSM state is [batch * heads, P * N]: row b*heads + eta holds that head's
// P x N state row-major (mamba_ssm's (batch, nheads, headdim, dstate)).
#pragma once

#include <cstdint>

#include "tensor.h"

namespace preflight::sim::mamba {

/// Local sizes of the SSM core on one rank.
struct SsmShape {
  int64_t heads = 1, groups = 1, head_dim = 1, d_state = 1, batch = 1;
  int64_t heads_per_group() const { return heads / groups; }
  int64_t state_rows() const { return batch * heads; }
  int64_t state_cols() const { return head_dim * d_state; }
};

/// Inputs of the recurrence over one segment. a = A = -exp(A_log) and d = D
/// are [1, heads].
template <class T>
struct SsmInputs {
  Mat<T> x, dt, b, c, a, d;
};

/// The recurrence, one position at a time (docs/formulas.md §8.2; mamba_ssm's
/// `selective_state_update` / ssd_minimal's reference):
///   h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t + D x_t.
/// Starts from `h0` and writes the state after the last position to `h_final`.
template <class T>
Mat<T> SsmScan(const SsmShape& s, const SsmInputs<T>& in, const Mat<T>& h0, Mat<T>* h_final);

/// The same map in the chunked SSD form (mamba_ssm ssd_minimal.py /
/// ssd_combined.py): within each chunk of `chunk` positions the quadratic
/// form y_i = sum_{j<=i} exp(cum_i - cum_j) dt_j (C_i . B_j) x_j plus the
/// carried state's contribution exp(cum_i) h C_i, and between chunks the
/// state passing h <- exp(cum_end) h + sum_j exp(cum_end - cum_j) dt_j x_j B_j^T
/// (cum = cumulative sum of dt A within the chunk). A last chunk may be short.
template <class T>
Mat<T> SsmChunked(const SsmShape& s, const SsmInputs<T>& in, int64_t chunk, const Mat<T>& h0, Mat<T>* h_final);

/// Gradients of the recurrence; `h0` the gradient of the initial state.
template <class T>
struct SsmGrads {
  Mat<T> x, dt, b, c, a, d, h0;
};

/// Backward of SsmScan for output gradient `dy` and gradient `dh_final` of the
/// final state (zero when nothing downstream reads it). The states h_t are
/// recomputed from `h0`, as the fused kernel recomputes its chunk states
/// (docs/formulas.md §3.2: they are not saved).
template <class T>
SsmGrads<T> SsmScanBackward(const SsmShape& s, const SsmInputs<T>& in, const Mat<T>& h0, const Mat<T>& dy,
                            const Mat<T>& dh_final);

/// Causal depthwise conv1d without its activation (docs/formulas.md §8.1): `ext` holds
/// K-1 positions of history (zeros at the sequence start, or the state handed
/// over) followed by the L positions of the segment; `w` is [channels, K],
/// `bias` [1, channels]. out[t] = bias + sum_k w[:, k] * ext[t + k] (ext row
/// t + K - 1 is segment position t), L * batch rows.
template <class T>
Mat<T> CausalConv(const Mat<T>& ext, const Mat<T>& w, const Mat<T>& bias, int64_t batch);

/// Backward of CausalConv: returns d(ext); adds into `dw` and `dbias`.
template <class T>
Mat<T> CausalConvBackward(const Mat<T>& dout, const Mat<T>& ext, const Mat<T>& w, int64_t batch, Mat<T>* dw,
                          Mat<T>* dbias);

}  // namespace preflight::sim::mamba

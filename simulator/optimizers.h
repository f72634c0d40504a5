// Optimizer math of the reference executor (docs/formulas.md §9): one AdamW step and
// the pieces of one Muon step, as pure functions the distributed optimizer
// calls on whatever part of the state a rank owns.
//
// What is shardable: AdamWStep, MuonMomentum and MuonApply are element-wise,
// so running them on any split of a flat buffer (a ZeRO shard, a TP slice)
// gives bitwise the values the whole buffer would get. NewtonSchulz5 is not:
// it must see the FULL, DP-averaged matrix in its global shape, so the caller
// gathers the momentum-updated shards first (Moonshot "Distributed Muon",
// Megatron TP "duplicated"; docs/formulas.md §9.3). NS of a block is not the block of
// NS, and NS of a partly reduced matrix is not NS of the average: DeepSpeed
// issue #7807 (ZeRO-1/2 with reduce_scatter ran NS on a matrix whose slices
// outside the rank's partition were its own unreduced gradients).
//
// Orientation. Our Linear stores W as (in x out), Y = X*W (docs/formulas.md §8.1);
// PyTorch stores the same weight as (out, in), so W_torch = W^T. Newton-Schulz
// commutes with transposition (NS(W^T) = NS(W)^T), so NS runs on our matrix
// as it is. The scale rules are defined on the PyTorch (out, in) shape;
// MuonScale takes OUR shape and maps it (out = our cols, in = our rows).
//
// Precision. KJ muon.py runs NS in bf16 on the GPU; here everything runs in T
// (fp64 or fp32), so a sharded run can equal the unsharded one to 1e-10
// (fp64) / 1e-5 (fp32) (docs/formulas.md §8). The modelled bytes are the caller's
// business. NS is ill-conditioned along small singular values: its slope at 0
// is a = 3.4445 per step, so an input perturbation there grows by up to
// a^5 ~ 485. Gradients of the scaled-down models are low-rank (rank <= tokens),
// so an fp32 run whose gradients differ from the reference by 1e-7 (reduction
// order) can differ after NS by ~5e-5: compare Muon updates in fp64, or widen
// the fp32 tolerance by a^steps.
#pragma once

#include <cstdint>

#include "tensor.h"

namespace preflight::sim {

/// AdamW with decoupled weight decay, epsilon added after bias correction
/// (KJ muon.py adam_update + MuonWithAuxAdam.step, PyTorch AdamW; docs/formulas.md §9.1):
///   m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2
///   W <- W (1 - lr wd) - lr * (m / (1-b1^k)) / (sqrt(v / (1-b2^k)) + eps)
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

/// How the orthogonalised update is scaled, on the PyTorch (out, in) shape.
enum class MuonScaleRule {
  /// sqrt(max(1, out/in)). KJ muon.py muon_update
  /// (`max(1, grad.size(-2) / grad.size(-1)) ** 0.5`); Megatron /
  /// emerging-optimizers get_muon_scale_factor mode "shape_scaling".
  kShapeScaling,
  /// 0.2 * sqrt(max(out, in)), matching AdamW's update RMS. Moonlight
  /// examples/toy_train.py adjust_lr_for_muon; emerging-optimizers mode
  /// "align_adamw_rms" (some versions call it "spectral" and drop the 0.2).
  kMatchAdamWRms,
};

/// Muon (KJ muon.py, docs/formulas.md §9.2). Defaults are KJ's except weight_decay
/// (KJ 0, Moonlight toy_train.py 0.1).
struct MuonConfig {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double weight_decay = 0.1;
  MuonScaleRule scale = MuonScaleRule::kShapeScaling;
};

/// KJ zeropower_via_newtonschulz5 coefficients (a, b, c) of the quintic
/// X <- a X + (b A + c A^2) X, A = X X^T, and its normaliser epsilon.
inline constexpr double kNsA = 3.4445, kNsB = -4.7750, kNsC = 2.0315;
inline constexpr double kNsNormEps = 1e-7;

/// One AdamW step on n elements of a flat buffer (any shard of it), in place
/// on param, m and v. `step` is the 1-based step count k of the bias
/// correction; it must be >= 1.
template <class T>
void AdamWStep(const AdamWConfig& c, int64_t step, T* param, const T* grad, T* m, T* v, int64_t n);

/// How far AdamW's first step may move when only its gradient moves, from
/// `grad_a` to `grad_b`, per element. At step 1 bias correction makes m = g and
/// v = g^2, so the update is -lr g / (|g| + eps) - lr wd w, whose slope in g is
/// lr eps / (|g| + eps)^2: up to lr / eps (1e5 at lr 1e-3, eps 1e-8) where |g|
/// is near zero. Two runs whose gradients differ in their last bits (another
/// summation order) can so differ by 1e5 x that in an update with no optimizer
/// error. The bound is the mean-value one over the segment between the two
/// gradients: the slope at the smaller |g|, or at 0 when the segment crosses 0.
Mat<double> AdamWFirstStepSlack(const AdamWConfig& c, const Mat<double>& grad_a, const Mat<double>& grad_b);

/// Muon momentum on n elements, KJ's EMA form: M <- beta M + (1-beta) G, then
/// update_in = nesterov ? (1-beta) G + beta M : M (the NS input). update_in
/// may alias grad (KJ updates the gradient in place). Moonlight's form
/// M <- beta M + G, U = G + beta M is exactly 1/(1-beta) times this U, which
/// the NS normalisation removes (up to its 1e-7 epsilon).
template <class T>
void MuonMomentum(const MuonConfig& c, const T* grad, T* momentum, T* update_in, int64_t n);

/// KJ zeropower_via_newtonschulz5 on the FULL matrix `u` (global shape):
/// X = u, transposed if rows > cols (so the Gram matrix is min x min);
/// X <- X / (||X||_F + 1e-7); `steps` times X <- a X + (b A + c A^2) X with
/// A = X X^T; transposed back. The result is about U S' V^T with S' in
/// roughly [0.5, 1.5] (KJ docstring), not exactly orthogonal. Runs in T, not
/// bf16. If `flops` is not null, adds the FLOPs of the matrix products it ran
/// (2 m k n each).
template <class T>
Mat<T> NewtonSchulz5(const Mat<T>& u, int steps, double* flops = nullptr);

/// Scale of the orthogonalised update of a parameter stored in OUR
/// orientation, rows_in x cols_out (Param::rows, Param::cols: global shape,
/// never a shard's), both >= 1.
/// The rule is applied to the PyTorch shape (out, in) = (cols_out, rows_in).
double MuonScale(const MuonConfig& c, int64_t rows_in, int64_t cols_out);

/// W <- W (1 - lr wd) - lr * scale * O on n elements, decay first and on the
/// unscaled lr (KJ and Moonlight both do p.mul_(1 - lr*wd) before the update).
/// `ortho` is the slice of NewtonSchulz5's output matching `param`'s elements.
template <class T>
void MuonApply(const MuonConfig& c, double scale, T* param, const T* ortho, int64_t n);

}  // namespace preflight::sim

// AdamW and Muon math of the reference executor (docs/formulas.md §9). Sources and
// conventions are in optimizers.h.
#include "optimizers.h"

#include <algorithm>
#include <cmath>

namespace preflight::sim {

template <class T>
void AdamWStep(const AdamWConfig& c, int64_t step, T* param, const T* grad, T* m, T* v, int64_t n) {
  const T b1 = T(c.beta1), b2 = T(c.beta2);
  const T one_b1 = T(1.0 - c.beta1), one_b2 = T(1.0 - c.beta2);
  // Bias corrections in double: 1 - beta^k loses digits in fp32 for small k.
  const double k = static_cast<double>(step);
  const T inv_bc1 = T(1.0 / (1.0 - std::pow(c.beta1, k)));
  const T inv_bc2 = T(1.0 / (1.0 - std::pow(c.beta2, k)));
  const T decay = T(1.0 - c.lr * c.weight_decay), lr = T(c.lr), eps = T(c.eps);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    m[i] = b1 * m[i] + one_b1 * g;
    v[i] = b2 * v[i] + one_b2 * g * g;
    const T m_hat = m[i] * inv_bc1;
    const T v_hat = v[i] * inv_bc2;
    param[i] = param[i] * decay - lr * (m_hat / (std::sqrt(v_hat) + eps));
  }
}

Mat<double> AdamWFirstStepSlack(const AdamWConfig& c, const Mat<double>& grad_a, const Mat<double>& grad_b) {
  const auto slack = [&](double a, double b) {
    const double g = (a < 0) != (b < 0) ? 0.0 : std::min(std::abs(a), std::abs(b));
    return c.lr * c.eps / ((g + c.eps) * (g + c.eps)) * std::abs(a - b);
  };
  return grad_a.binaryExpr(grad_b, slack);
}

template <class T>
void MuonMomentum(const MuonConfig& c, const T* grad, T* momentum, T* update_in, int64_t n) {
  const T beta = T(c.momentum), one_beta = T(1.0 - c.momentum);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];  // read before update_in (which may alias grad) is written
    momentum[i] = beta * momentum[i] + one_beta * g;
    update_in[i] = c.nesterov ? one_beta * g + beta * momentum[i] : momentum[i];
  }
}

template <class T>
Mat<T> NewtonSchulz5(const Mat<T>& u, int steps, double* flops) {
  // Work on the wide orientation (m <= n) so A = X X^T is m x m.
  const bool transposed = u.rows() > u.cols();
  Mat<T> x = transposed ? Mat<T>(u.transpose()) : u;
  const int64_t m = x.rows(), n = x.cols();
  x /= x.norm() + T(kNsNormEps);
  Mat<T> a(m, m), b(m, m), next(m, n);
  const T ca = T(kNsA), cb = T(kNsB), cc = T(kNsC);
  for (int s = 0; s < steps; ++s) {
    a.noalias() = x * x.transpose();
    b.noalias() = cc * (a * a);
    b += cb * a;
    next.noalias() = b * x;
    next += ca * x;
    x.swap(next);
  }
  if (flops != nullptr) {
    const double dm = static_cast<double>(m), dn = static_cast<double>(n);
    *flops += steps * (2.0 * dm * dn * dm + 2.0 * dm * dm * dm + 2.0 * dm * dm * dn);  // X X^T, A A, B X
  }
  if (transposed) return x.transpose();
  return x;
}

double MuonScale(const MuonConfig& c, int64_t rows_in, int64_t cols_out) {
  const double out = static_cast<double>(cols_out), in = static_cast<double>(rows_in);
  switch (c.scale) {
    case MuonScaleRule::kShapeScaling: return std::sqrt(std::max(1.0, out / in));
    case MuonScaleRule::kMatchAdamWRms: return 0.2 * std::sqrt(std::max(out, in));
  }
  return 1.0;
}

template <class T>
void MuonApply(const MuonConfig& c, double scale, T* param, const T* ortho, int64_t n) {
  const T decay = T(1.0 - c.lr * c.weight_decay), step = T(c.lr * scale);
  for (int64_t i = 0; i < n; ++i) param[i] = param[i] * decay - step * ortho[i];
}

#define PREFLIGHT_INSTANTIATE(T)                                                                        \
  template void AdamWStep<T>(const AdamWConfig&, int64_t, T*, const T*, T*, T*, int64_t);              \
  template void MuonMomentum<T>(const MuonConfig&, const T*, T*, T*, int64_t);                         \
  template Mat<T> NewtonSchulz5<T>(const Mat<T>&, int, double*);                                       \
  template void MuonApply<T>(const MuonConfig&, double, T*, const T*, int64_t);
PREFLIGHT_INSTANTIATE(double)
PREFLIGHT_INSTANTIATE(float)
#undef PREFLIGHT_INSTANTIATE

}  // namespace preflight::sim

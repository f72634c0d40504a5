// The executor's own numerics verdict: sharded vs unsharded run.
#include "preflight/simulator/sim.h"

namespace preflight {

NumericsTolerance ToleranceFor(SimPrecision p) {
  // fp32 updates: 1e-5 x a^5 ~ 485 (Newton-Schulz's slope at small singular values), rounded up.
  if (p == SimPrecision::kFp32) return {1e-5, 1e-5, 5e-3};
  return {1e-10, 1e-10, 1e-10};
}

bool NumericsAgree(const SimulationReport& r, const NumericsTolerance& tol) {
  if (!(r.loss.max_rel <= tol.values) || !(r.output.max_rel <= tol.values)) return false;
  for (const ErrorStat& g : r.gradients) {
    if (!(g.max_rel <= tol.gradients)) return false;
  }
  for (const ErrorStat& u : r.updates) {
    if (!(u.max_rel <= tol.updates)) return false;
  }
  return true;
}

}  // namespace preflight

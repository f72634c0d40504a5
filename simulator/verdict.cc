#include "preflight/sim.h"

namespace preflight {

NumericsTolerance ToleranceFor(SimPrecision p) {
  if (p == SimPrecision::kFp32) return {1e-5, 1e-5};
  return {1e-10, 1e-10};
}

bool NumericsAgree(const SimulationReport& r, const NumericsTolerance& tol) {
  if (!(r.loss.max_rel <= tol.values) || !(r.output.max_rel <= tol.values)) return false;
  for (const ErrorStat& g : r.gradients) {
    if (!(g.max_rel <= tol.gradients)) return false;
  }
  return true;
}

bool SimComparison::comm_ok() const {
  for (const CommAgreement& c : comm) {
    if (!c.agrees) return false;
  }
  return true;
}

bool SimComparison::memory_ok() const {
  for (const MemoryAgreement& m : memory) {
    if (!m.agrees) return false;
  }
  return true;
}

}  // namespace preflight

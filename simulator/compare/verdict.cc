// Verdicts of the comparison with the models.
#include "preflight/simulator/sim.h"

namespace preflight {

bool SimComparison::comm_ok() const {
  for (const StageComparison& s : stages) {
    for (const CommAgreement& c : s.comm) {
      if (!c.agrees) return false;
    }
  }
  return true;
}

bool SimComparison::memory_ok() const {
  for (const StageComparison& s : stages) {
    for (const MemoryAgreement& m : s.memory) {
      if (!m.agrees) return false;
    }
  }
  return true;
}

}  // namespace preflight

// Renderers of `preflight simulate` (GUIDE.md 7): results are structs, these
// only format them.
#pragma once

#include <string>

#include "preflight/sim.h"

namespace preflight {

/// Readable table: numerics, communication per bucket, memory per category, verdict.
std::string RenderSimulationTable(const SimulationReport& report, const SimComparison& comparison);
/// JSON with the same content (sorted keys, fixed order of arrays).
std::string RenderSimulationJson(const SimulationReport& report, const SimComparison& comparison);

}  // namespace preflight

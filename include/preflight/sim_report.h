// Renderers of `preflight simulate` (GUIDE.md 7): results are structs, these
// only format them.
#pragma once

#include <string>
#include <vector>

#include "preflight/sim.h"

namespace preflight {

/// Readable table: numerics, communication per bucket of each rank in
/// `shown` (one comparison per shown rank), memory per category, and the
/// verdict `agree` (over every rank, shown or not).
std::string RenderSimulationTable(const SimulationReport& report, const std::vector<SimComparison>& shown,
                                  bool agree);
/// One JSON document with the same content.
std::string RenderSimulationJson(const SimulationReport& report, const std::vector<SimComparison>& shown, bool agree);

}  // namespace preflight

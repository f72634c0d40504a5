// Renderers of `preflight simulate` (docs/architecture.md): results are structs, these
// only format them.
#pragma once

#include <optional>
#include <string>

#include "preflight/simulator/sim.h"

namespace preflight {

/// Readable table: the layout run, numerics (loss, final hidden states,
/// gradients, optimizer updates), then per pipeline stage (all, or only
/// `stage`) its communication buckets and memory categories beside the
/// models, and the verdict over everything.
std::string RenderSimulationTable(const Recipe& scaled, const SimulationReport& report, const SimComparison& comparison,
                                  std::optional<int64_t> stage = std::nullopt);
/// One JSON document with the same content (every stage) and the raw
/// per-rank counters.
std::string RenderSimulationJson(const Recipe& scaled, const SimulationReport& report, const SimComparison& comparison);

}  // namespace preflight

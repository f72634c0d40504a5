// Renderers of `preflight sweep` (docs/sweep.md): a table of the best
// layouts and the Pareto front, and CSV / JSON of every evaluated layout with
// stable column and key names. Deterministic (fixed precision, no paths
// beyond the recipe name as given, no timestamps) so golden files pin them.
#pragma once

#include <string>

#include "preflight/planner/sweep.h"

namespace preflight {

/// The readable summary: counts, the best layouts by tokens/s, the Pareto front.
std::string RenderSweepTable(const SweepResult& result, const std::string& file);
/// Every row, one line each, header first (columns in docs/sweep.md).
std::string SweepCsv(const SweepResult& result);
/// Every row plus the summary, top and pareto (keys in docs/sweep.md). Written
/// by hand, not through a JSON tree: a 1024-GPU sweep has millions of rows.
std::string SweepJson(const SweepResult& result, const std::string& file);

}  // namespace preflight

// Renderers of `preflight sweep` (docs/sweep.md): a table of the best
// layouts and the Pareto front, and CSV / JSON of every evaluated layout with
// stable column and key names. Deterministic (fixed precision, no paths
// beyond the recipe name as given, no timestamps) so golden files pin them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "preflight/planner/sweep.h"

namespace preflight {

/// The readable summary: counts, the best layouts by tokens/s, the Pareto front.
std::string RenderSweepTable(const SweepResult& result, const std::string& file);
/// Every row, one line each, header first (columns in docs/sweep.md).
std::string SweepCsv(const SweepResult& result);
/// Every row plus the summary, top and pareto (keys in docs/sweep.md). Written
/// by hand, not through a JSON tree: a 1024-GPU sweep has millions of rows.
/// With `only` (row indices, ascending), "layouts" holds those rows alone,
/// each with its "index" in the full list (the `--html` page's chart data).
std::string SweepJson(const SweepResult& result, const std::string& file, const std::vector<int64_t>* only = nullptr);
/// `sweep --svg`: step time against peak memory of the fitting layouts (at
/// most kMaxSvgPoints, evenly spaced in the canonical order, plus every
/// Pareto point), the Pareto front joined, the device's capacity, and the
/// recipe's own layout (`own`, a row index) marked whatever its status.
std::string RenderSweepSvg(const SweepResult& result, const std::string& file, std::optional<int64_t> own);
inline constexpr int64_t kMaxSvgPoints = 5000;
/// The fitting rows a chart draws: every Pareto row, then the others evenly
/// spaced in the canonical order up to kMaxSvgPoints in all (ascending);
/// `fitting` gets how many rows fit.
std::vector<int64_t> SweepChartRows(const SweepResult& result, int64_t* fitting);

}  // namespace preflight

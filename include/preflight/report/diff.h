// `preflight diff A B`: which memory categories (worst rank and per stage) and
// which communication axes moved between two recipes, and why: each differing
// recipe key is applied alone to A and its effect measured, the rest is the
// interaction of the changes together. Pure (texts in, report out);
// renderers separate (docs/architecture.md).
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/estimator/estimate.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Every key of a recipe as (key path, value as YAML text) in schema order:
/// "model.moe.experts" -> "64", "parallel.stage_boundaries" -> "[12, 24]",
/// "training.precision.master" -> "none". Optional sections (model.mla,
/// cluster.device, serving) appear as one flow map ("{heads: 128, ...}") when
/// present; model.attention.* is left out when model.mla is set, cluster.gpu
/// when cluster.device is (they exclude each other).
/// Derived fields (model.layers, cluster.spec) are left out. Feeding a value
/// back as `--set key=value` reproduces the field.
std::vector<std::pair<std::string, std::string>> FlattenRecipe(const Recipe& recipe);

struct KeyChange {
  std::string key;
  std::string before;  // "(absent)" when the key is only in B
  std::string after;   // "(absent)" when the key is only in A
};
/// Keys whose values differ, in schema order.
std::vector<KeyChange> DifferingKeys(const Recipe& a, const Recipe& b);

/// What diff keeps of one side.
struct DiffSide {
  std::string label;      // "recipes/x.yaml --set parallel.tp=8"
  std::string name;       // the recipe's name
  MemoryEstimate memory;  // per stage, worst stage, verdict
  /// Bytes sent per step on each axis by the busiest pipeline rank (the
  /// planner's CommItem send totals, maximum over pipeline ranks).
  std::array<Bytes, kNumAxes> comm_send{};
  const RankMemory& worst() const { return memory.stages.at(static_cast<size_t>(memory.worst_stage)); }
};

/// One key applied alone to A: how the worst rank and the comm moved.
struct Attribution {
  KeyChange change;
  bool applied = false;                              // false: A with only this change is not a valid recipe
  std::string note;                                  // why not applied (the first error)
  std::array<Bytes, kNumCategories> memory_delta{};  // worst rank, (A + change) - A
  std::array<Bytes, kNumAxes> comm_delta{};
};

struct DiffReport {
  DiffSide a, b;
  std::vector<KeyChange> changes;
  std::vector<Attribution> attributions;  // one per change
  /// B - A minus the sum of the applied attributions: what only the changes
  /// together (or those not valid alone) explain.
  std::array<Bytes, kNumCategories> interaction_memory{};
  std::array<Bytes, kNumAxes> interaction_comm{};

  Bytes memory_delta(Category c) const { return b.worst().of(c) - a.worst().of(c); }
  Bytes total_delta() const { return b.worst().total() - a.worst().total(); }
  Bytes comm_delta(Axis x) const { return b.comm_send[static_cast<size_t>(x)] - a.comm_send[static_cast<size_t>(x)]; }
};

/// One recipe as text with its overrides, as the user named it.
struct DiffInput {
  std::string file;
  std::string text;
  std::vector<Override> overrides;
  std::string label;  // shown in reports; file plus overrides
};

struct DiffResult {
  std::optional<DiffReport> report;
  std::vector<Diagnostic> diagnostics;  // errors (and warnings) of loading or planning A and B
};

/// Loads A and B, fits and plans both, and attributes B - A to the keys
/// that differ. No report when A or B is invalid or cannot be planned.
DiffResult MakeDiff(const DiffInput& a, const DiffInput& b, const CostModel& cost = {});

std::string RenderDiffTable(const DiffReport& report);
nlohmann::json DiffJson(const DiffReport& report);
std::string RenderDiffMarkdown(const DiffReport& report);

}  // namespace preflight

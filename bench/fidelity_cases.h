// The memory-fidelity harness (issue 15): every stored Megatron-LM
// functional-test run (tests/data/megatron_ci/cases.json, copied from the
// calibration set) through `import megatron` and the memory estimate, next to
// what torch.cuda reported on the run's last global rank. Header-only so the
// bench (bench/fidelity.cc) and the regression test (tests/fidelity_test.cc)
// share one path from arguments to figures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/geometry.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"

namespace preflight::fidelity {

struct Case {
  std::string id;
  std::string family;  // gpt, moe, hybrid, nemotron
  std::string device;  // h100, gb200
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  nlohmann::json args;          // flag -> value (true for store flags)
  int64_t measured_static = 0;  // allocated_bytes_last
  int64_t measured_peak = 0;    // peak_allocated_bytes
};

struct Outcome {
  bool imported = false;
  std::string error;                       // first error diagnostic, formatted
  std::string error_flag;                  // its flag
  std::vector<std::string> unrepresented;  // flags with a not-represented warning
  std::vector<std::string> unknown;
  int64_t modeled_static = 0;  // last global rank
  int64_t modeled_peak = 0;
  double static_error_pct = 0;  // (modeled - measured) / measured * 100
  double peak_error_pct = 0;
  /// MoE runs: the routing scratch in the modeled peak, and the design notes'
  /// count of it (receive and combine buffers of C rows per local expert, C
  /// the capacity or, dropless, the mean T*k/E, and the EP x ETP count surface).
  int64_t modeled_routing = 0;
  int64_t notes_routing = 0;
};

/// The design notes' routing scratch for one MoE layer (docs/formulas.md §5).
inline int64_t NotesRouting(const Recipe& r, const Layout& l) {
  const MoeRouting mr = RouteMoeOn(r, l);
  const MoeConfig& e = r.model.moe;
  const int64_t c = mr.capacity > 0 ? mr.capacity : (mr.tokens * e.top_k + e.experts - 1) / e.experts;
  const int64_t rows = 2 * c * std::max<int64_t>(1, e.experts / l.ep);
  return rows * r.model.hidden * SizeOf(r.training.precision.activations) + 8 * l.expert_tp * l.ep * e.experts;
}

inline std::vector<Case> LoadCases(const std::string& path, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot read";
    return {};
  }
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.contains("cases")) {
    *error = path + ": not a cases file";
    return {};
  }
  std::vector<Case> out;
  for (const auto& c : doc.at("cases")) {
    out.push_back({c.at("id").get<std::string>(), c.at("family").get<std::string>(), c.at("device").get<std::string>(),
                   c.at("nodes").get<int64_t>(), c.at("gpus_per_node").get<int64_t>(), c.at("args"),
                   c.at("measured_static_bytes").get<int64_t>(), c.at("measured_peak_bytes").get<int64_t>()});
  }
  return out;
}

/// The case's arguments in the functional-test form (MODEL_ARGS YAML).
inline std::string ModelArgsYaml(const Case& c) {
  std::string out = "MODEL_ARGS:\n";
  for (const auto& [flag, value] : c.args.items()) {
    out += "  " + flag + ": " + (value.is_boolean() ? (value.get<bool>() ? "true" : "false") : value.dump()) + "\n";
  }
  return out;
}

/// GB200 has no device preset; the allocated figures do not depend on the
/// device's capacity, so it is priced on the H200 preset.
inline std::vector<Override> ClusterOf(const Case& c) {
  return {{"cluster.nodes", std::to_string(c.nodes)},
          {"cluster.gpus_per_node", std::to_string(c.gpus_per_node)},
          {"cluster.gpu", c.device == "h100" ? "h100" : "h200"}};
}

/// The stage plan `fit` prices (pinned boundaries when the recipe has them).
inline StagePlan StagesOf(const Inventory& inventory, const Layout& layout) {
  PlanResult planned = MakePlan(inventory, layout);
  if (planned.plan) return planned.plan->stages;
  return PartitionStages(inventory, layout);
}

inline double ErrorPct(int64_t modeled, int64_t measured) {
  return measured == 0 ? 0.0 : 100.0 * static_cast<double>(modeled - measured) / static_cast<double>(measured);
}

inline Outcome Run(const Case& c) {
  Outcome o;
  const MegatronImport imported = ImportMegatronArgs(ModelArgsYaml(c), c.id);
  o.unrepresented = imported.unrepresented;
  o.unknown = imported.unknown;
  const auto fail = [&o](const std::vector<Diagnostic>& ds) {
    for (const Diagnostic& d : ds) {
      if (d.severity != Severity::kError) continue;
      o.error = Format(d);
      o.error_flag = d.key_path;
      return;
    }
  };
  if (!imported.ok()) {
    fail(imported.diagnostics);
    return o;
  }
  std::vector<Diagnostic> layout_errors;
  const std::string yaml = EmitMegatronRecipe(imported, ClusterOf(c), "case", c.id, &layout_errors);
  if (HasErrors(layout_errors)) {
    fail(layout_errors);
    return o;
  }
  const LoadResult loaded = LoadRecipeFromString(yaml, c.id);
  if (!loaded.ok()) {
    fail(loaded.diagnostics);
    return o;
  }
  const Inventory inventory = BuildInventory(*loaded.recipe);
  const Layout layout = LayoutOf(*loaded.recipe);
  const MemoryEstimate estimate = EstimateMemory(inventory, layout, StagesOf(inventory, layout));
  const RankMemory& last = estimate.stages.back();  // Megatron logs the last global rank
  o.imported = true;
  o.modeled_static = last.last_rank_allocated_static.count();
  o.modeled_peak = last.last_rank_allocated_peak.count();
  o.static_error_pct = ErrorPct(o.modeled_static, c.measured_static);
  o.peak_error_pct = ErrorPct(o.modeled_peak, c.measured_peak);
  o.modeled_routing = last.of(Category::kRoutingScratch).count();
  if (o.modeled_routing > 0) o.notes_routing = NotesRouting(*loaded.recipe, layout);
  return o;
}

}  // namespace preflight::fidelity

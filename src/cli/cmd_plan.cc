// `preflight plan R`: mesh placement, stage partition with per-stage memory,
// communication per axis and the step-time estimate (docs/plan.md).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "preflight/diagnostic.h"
#include "preflight/inventory.h"
#include "preflight/plan.h"
#include "preflight/plan_report.h"
#include "preflight/recipe.h"
#include "verbs.h"

namespace preflight::cli {
namespace {

struct PlanOptions {
  std::string recipe;
  std::vector<std::string> sets;
  std::string format = "table";
  CostModel cost;
  double latency_us = 8.0;
};

void PrintDiagnostics(const std::vector<Diagnostic>& ds) {
  for (const Diagnostic& d : ds) std::fprintf(stderr, "%s\n", Format(d).c_str());
}

int RunPlan(PlanOptions& o) {
  std::vector<Override> overrides;
  for (const std::string& s : o.sets) {
    const auto parsed = ParseOverride(s);
    if (!parsed) {
      std::fprintf(stderr, "preflight plan: --set %s: expected key.path=value\n", s.c_str());
      return static_cast<int>(ExitCode::kBadInput);
    }
    overrides.push_back(*parsed);
  }
  const LoadResult loaded = LoadRecipeFile(o.recipe, overrides);
  PrintDiagnostics(loaded.diagnostics);
  if (!loaded.ok()) return static_cast<int>(ExitCode::kBadInput);
  const Recipe& recipe = *loaded.recipe;
  const Inventory inventory = BuildInventory(recipe);
  o.cost.latency_s = o.latency_us * 1e-6;
  PlanResult result = MakePlan(inventory, LayoutOf(recipe), o.cost);
  if (!result.plan) {
    PrintDiagnostics(result.diagnostics);
    return static_cast<int>(ExitCode::kBadInput);
  }
  const Plan& plan = *result.plan;
  if (o.format == "json") {
    std::fputs(RenderPlanJson(recipe, plan).c_str(), stdout);
  } else {
    PrintDiagnostics(plan.warnings);
    std::fputs(RenderPlanTable(recipe, plan).c_str(), stdout);
  }
  return static_cast<int>(ExitCode::kOk);
}

}  // namespace

void SetupPlan(CLI::App& command, int& exit_code) {
  auto o = std::make_shared<PlanOptions>();
  command.add_option("recipe", o->recipe, "recipe YAML file")->required();
  command.add_option("--set", o->sets, "override a recipe key: key.path=value (repeatable)");
  command.add_option("--format", o->format, "output format")->check(CLI::IsMember({"table", "json"}));
  command.add_option("--compute-efficiency", o->cost.compute_efficiency,
                     "achieved fraction of the bf16 dense peak (default 0.5)")
      ->check(CLI::Range(0.01, 1.0));
  command.add_option("--nvlink-efficiency", o->cost.nvlink_efficiency, "achieved fraction of NVLink bandwidth (0.8)")
      ->check(CLI::Range(0.01, 1.0));
  command.add_option("--ib-efficiency", o->cost.ib_efficiency, "achieved fraction of InfiniBand bandwidth (0.8)")
      ->check(CLI::Range(0.01, 1.0));
  command.add_option("--latency-us", o->latency_us, "latency per ring step in microseconds (8)")
      ->check(CLI::Range(0.0, 1000.0));
  command.callback([o, &exit_code] { exit_code = RunPlan(*o); });
}

}  // namespace preflight::cli

// `preflight plan R`: mesh placement, stage partition with per-stage memory,
// communication per axis and the step-time estimate (docs/plan.md); with
// --emit, the Megatron-LM arguments or torchtitan config module of the planned
// layout: exit 1 when the framework would not run the plan as priced (it does
// not fit, or a part cannot be expressed), unless --force.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/report/emit.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/report/plan_report.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/report.h"
#include "verbs.h"

#include "html_output.h"

namespace preflight::cli {
namespace {

struct PlanOptions {
  RecipeArgs recipe;
  OutputFormat format = OutputFormat::kTable;
  CostModel cost;
  double latency_us = 8.0;
  std::string svg_path;
  std::string out_path;
  std::string emit;  // "" (the plan report), "megatron" or "torchtitan"
  bool force = false;  // --emit a refused configuration with exit 0
  HtmlArgs html;
};

void PrintDiagnostics(const std::vector<Diagnostic>& ds) {
  for (const Diagnostic& d : ds) std::fprintf(stderr, "%s\n", Format(d).c_str());
}

int RunPlan(PlanOptions& o) {
  if (!HtmlStdoutFree(o.html, !o.out_path.empty())) return static_cast<int>(ExitCode::kBadInput);
  const std::optional<Recipe> recipe = LoadRecipeOrReport(o.recipe);
  if (!recipe) return static_cast<int>(ExitCode::kBadInput);
  const Inventory inventory = BuildInventory(*recipe);
  o.cost.latency_s = o.latency_us * 1e-6;
  const PlanResult result = MakePlan(inventory, LayoutOf(*recipe), o.cost);
  if (!result.plan) {
    PrintDiagnostics(result.diagnostics);
    return static_cast<int>(ExitCode::kBadInput);
  }
  const Plan& plan = *result.plan;
  PrintDiagnostics(plan.warnings);
  if (!o.svg_path.empty() && !WriteTextFile(o.svg_path, RenderPlanSvg(*recipe, plan), {o.recipe.path})) {
    return static_cast<int>(ExitCode::kBadInput);
  }
  if (!o.html.path.empty()) {
    HtmlPage page{"plan", "preflight plan: " + plan.name};
    nlohmann::json part = HtmlFitPart(PlannedFitReport(inventory, plan, o.recipe.path, /*explain=*/true));
    part.update(HtmlPlanPart(*recipe, plan));
    page.reports.push_back(part);
    if (!WriteHtml(o.html, page, {o.recipe.path})) return static_cast<int>(ExitCode::kBadInput);
    if (HtmlOnStdout(o.html) && o.out_path.empty()) return static_cast<int>(ExitCode::kOk);
  }
  if (const std::optional<EmitTarget> target = ParseEmitTarget(o.emit)) {
    const Emission emission = Emit(*target, *recipe, plan);
    PrintDiagnostics(emission.warnings);
    if (!EmitOutput(o.out_path, emission.text, {o.recipe.path})) return static_cast<int>(ExitCode::kBadInput);
    if (emission.refusals.empty()) return static_cast<int>(ExitCode::kOk);
    for (const std::string& r : emission.refusals) std::fprintf(stderr, "--emit %s: %s\n", o.emit.c_str(), r.c_str());
    std::fprintf(stderr, "--emit %s: %s\n", o.emit.c_str(),
                 o.force ? "emitted anyway (--force); the text opens with a # WARNING: block"
                         : "the configuration does not run the plan as priced (exit 1; --force emits it with exit 0)");
    return static_cast<int>(o.force ? ExitCode::kOk : ExitCode::kVerdictFail);
  }
  const std::string out = o.format == OutputFormat::kJson ? RenderPlanJson(*recipe, plan) : RenderPlanTable(*recipe, plan);
  return static_cast<int>(EmitOutput(o.out_path, out, {o.recipe.path}) ? ExitCode::kOk : ExitCode::kBadInput);
}

}  // namespace

void SetupPlan(CLI::App& command, int& exit_code) {
  auto o = std::make_shared<PlanOptions>();
  AddRecipeArgs(command, o->recipe);
  AddFormatOption(command, o->format, {OutputFormat::kTable, OutputFormat::kJson});
  // CLI11 rejects any other value with a usage error naming the valid ones (exit 2 in main).
  command
      .add_option("--emit", o->emit,
                  "Print the planned layout as Megatron-LM arguments or a torchtitan config module instead of the "
                  "report; exit 1 when the framework would not run the plan as priced")
      ->check(CLI::IsMember(std::vector<std::string>{Name(EmitTarget::kMegatron), Name(EmitTarget::kTorchtitan)}))
      ->excludes("--format");
  command.add_flag("--force", o->force, "With --emit: exit 0 on a refused configuration (its # WARNING: block stays)")
      ->needs("--emit");
  command
      .add_option("--compute-efficiency", o->cost.compute_efficiency,
                  "achieved fraction of the dense peak for large GEMMs (default 0: the device's measured rate)")
      ->check(FiniteNumber())
      ->check(CLI::Range(0.01, 1.0));
  command.add_option("--nvlink-efficiency", o->cost.nvlink_efficiency, "achieved fraction of NVLink bandwidth (0.8)")
      ->check(FiniteNumber())
      ->check(CLI::Range(0.01, 1.0));
  command.add_option("--ib-efficiency", o->cost.ib_efficiency, "achieved fraction of InfiniBand bandwidth (0.8)")
      ->check(FiniteNumber())
      ->check(CLI::Range(0.01, 1.0));
  command.add_option("--latency-us", o->latency_us, "latency per ring step in microseconds (8)")
      ->check(FiniteNumber())
      ->check(CLI::Range(0.0, 1000.0));
  command.add_option("--svg", o->svg_path,
                     "Write the step (steady state, bubble, tail) and each stage's time per micro-batch as an SVG "
                     "chart (fit --svg draws the memory)");
  AddOutputOption(command, o->out_path);
  AddHtmlOption(command, o->html, {"--format", "--emit"});
  command.callback([o, &exit_code] { exit_code = RunPlan(*o); });
}

}  // namespace preflight::cli

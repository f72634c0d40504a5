// preflight fit R: the memory geometry of every pipeline stage, the worst
// rank and the verdict. Exit 0 fits, 1 does not, 2 bad recipe.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "common.h"
#include "preflight/planner/advice.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/report/report.h"
#include "verbs.h"

#include "html_output.h"

namespace preflight::cli {
namespace {

struct FitArgs {
  RecipeArgs recipe;
  OutputFormat format = OutputFormat::kTable;
  bool explain = false;
  std::string svg_path;
  std::string out_path;
  HtmlArgs html;
};

int RunFit(const FitArgs& args) {
  if (!HtmlStdoutFree(args.html, !args.out_path.empty())) return static_cast<int>(ExitCode::kBadInput);
  auto recipe = LoadRecipeOrReport(args.recipe);
  if (!recipe) return static_cast<int>(ExitCode::kBadInput);
  const Inventory inventory = BuildInventory(*recipe);
  FitReport report;
  report.file = args.recipe.path;
  report.inventory = &inventory;
  report.layout = LayoutOf(*recipe);
  auto plan = PlanOrReport(inventory, report.layout);
  if (!plan) return static_cast<int>(ExitCode::kBadInput);
  report.stages = plan->stages;
  report.balanced_cut = plan->balanced_cut;
  report.estimate = plan->memory ? *plan->memory : EstimateMemory(inventory, report.layout, report.stages);
  if (args.explain) {
    report.explanations = ExplainRank(inventory, report.layout, report.stages, report.estimate.worst_stage);
  }
  report.advice = AdviseFit(inventory, report.layout, report.stages);
  if (!args.svg_path.empty() && !WriteTextFile(args.svg_path, RenderMemorySvg(report), {args.recipe.path})) {
    return static_cast<int>(ExitCode::kBadInput);
  }
  if (!args.html.path.empty() && !WriteHtml(args.html, FitHtmlPage(report), {args.recipe.path})) {
    return static_cast<int>(ExitCode::kBadInput);
  }
  // `--html -` took stdout; the report still goes to -o/--out when given.
  if (!HtmlOnStdout(args.html) || !args.out_path.empty()) {
    const std::string text =
        args.format == OutputFormat::kJson ? FitJson(report).dump(2) + "\n" : RenderFitTable(report);
    if (!EmitOutput(args.out_path, text, {args.recipe.path})) return static_cast<int>(ExitCode::kBadInput);
  }
  if (report.estimate.verdict.fits && !report.estimate.verdict.headroom_ok) {
    std::fprintf(stderr, "warning: headroom %.2f GiB is below the floor cluster.min_headroom_gib = %.2f GiB\n",
                 report.estimate.verdict.headroom.gib(), recipe->cluster.min_headroom_gib);
  }
  return static_cast<int>(report.estimate.verdict.fits ? ExitCode::kOk : ExitCode::kVerdictFail);
}

}  // namespace

void SetupFit(CLI::App& command, int& exit_code) {
  auto args = std::make_shared<FitArgs>();
  AddRecipeArgs(command, args->recipe);
  AddFormatOption(command, args->format, {OutputFormat::kTable, OutputFormat::kJson});
  command.add_flag("--explain", args->explain, "Print every figure of the worst rank with its formula and inputs");
  command.add_option("--svg", args->svg_path, "Write the memory geometry per stage as an SVG chart");
  AddOutputOption(command, args->out_path);
  AddHtmlOption(command, args->html);
  command.callback([args, &exit_code] { exit_code = RunFit(*args); });
}

}  // namespace preflight::cli

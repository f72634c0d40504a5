#include "html_output.h"

#include <cstdio>

#include "common.h"
#include "preflight/estimator/estimate.h"

namespace preflight::cli {

void AddHtmlOption(CLI::App& command, HtmlArgs& args, const std::vector<std::string>& stdout_options) {
  for (const std::string& name : stdout_options) args.stdout_options.push_back(command.get_option(name));
  command.add_option("--html", args.path,
                     "Write a self-contained HTML report (charts with hover details; no network needed to view it); "
                     "- writes it to stdout in place of the report");
}

bool HtmlStdoutFree(const HtmlArgs& args, bool report_to_file) {
  if (!HtmlOnStdout(args) || report_to_file) return true;
  for (const CLI::Option* option : args.stdout_options) {
    if (option->count() == 0) continue;
    std::fprintf(stderr, "--html -: the page takes stdout, so %s cannot go there too; give --html a file name\n",
                 option->get_name().c_str());
    return false;
  }
  return true;
}

bool WriteHtml(const HtmlArgs& args, const HtmlPage& page, const std::vector<std::string>& inputs) {
  return EmitOutput(HtmlOnStdout(args) ? "" : args.path, RenderHtmlPage(page), inputs);
}

FitReport PlannedFitReport(const Inventory& inventory, const Plan& plan, const std::string& file, bool explain) {
  FitReport report;
  report.file = file;
  report.inventory = &inventory;
  report.layout = plan.layout;
  report.stages = plan.stages;
  report.balanced_cut = plan.balanced_cut;
  report.estimate = plan.memory ? *plan.memory : EstimateMemory(inventory, plan.layout, plan.stages);
  if (explain) {
    report.explanations = ExplainRank(inventory, report.layout, report.stages, report.estimate.worst_stage);
  }
  return report;
}

HtmlPage FitHtmlPage(FitReport report) {
  if (report.explanations.empty()) {
    report.explanations = ExplainRank(*report.inventory, report.layout, report.stages, report.estimate.worst_stage);
  }
  HtmlPage page{"fit", "preflight fit: " + report.inventory->recipe.name};
  page.reports.push_back(HtmlFitPart(report));
  return page;
}

nlohmann::json FitPagePart(const Recipe& recipe, const std::string& file) {
  const Inventory inventory = BuildInventory(recipe);
  const PlanResult planned = MakePlan(inventory, LayoutOf(recipe));
  if (!planned.plan) return nullptr;
  return HtmlFitPart(PlannedFitReport(inventory, *planned.plan, file, /*explain=*/true));
}

}  // namespace preflight::cli

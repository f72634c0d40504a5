// `--html FILE` on fit, plan, sweep and check (docs/html.md): the option, the
// stdout rule for `-`, and the page parts the verbs share.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/html_report.h"
#include "preflight/report/report.h"

namespace preflight::cli {

struct HtmlArgs {
  std::string path;  // "-": the page on stdout, in place of the command's report
  /// The command's options whose output would share stdout with `--html -`.
  std::vector<const CLI::Option*> stdout_options;
};

/// Adds --html FILE; `stdout_options` (such as "--format") name the options
/// already added whose output `--html -` leaves no room for.
void AddHtmlOption(CLI::App& command, HtmlArgs& args, const std::vector<std::string>& stdout_options = {"--format"});

/// Whether the page goes to stdout in place of the command's report.
inline bool HtmlOnStdout(const HtmlArgs& args) { return args.path == "-"; }

/// `--html -` next to one of its stdout_options given on the command line
/// (unless `report_to_file`: the report goes to a file, as with sweep --out):
/// false after saying so on stderr (exit 2).
bool HtmlStdoutFree(const HtmlArgs& args, bool report_to_file = false);

/// Writes the page to --html's path (WriteTextFile: never onto one of
/// `inputs`) or, for `-`, to stdout; false after printing why.
bool WriteHtml(const HtmlArgs& args, const HtmlPage& page, const std::vector<std::string>& inputs);

/// The memory geometry of a planned layout as `fit` prices it: the plan's
/// stages and estimate, and the worst rank's --explain lines when `explain`.
FitReport PlannedFitReport(const Inventory& inventory, const Plan& plan, const std::string& file, bool explain);

/// The `fit --html` page of `report`, the worst rank's --explain lines added
/// (its JSON is `fit --explain --format json`'s).
HtmlPage FitHtmlPage(FitReport report);

/// One recipe's page part as `fit` draws it (HtmlFitPart), for `check
/// --html`; null when the layout cannot be planned.
nlohmann::json FitPagePart(const Recipe& recipe, const std::string& file);

}  // namespace preflight::cli

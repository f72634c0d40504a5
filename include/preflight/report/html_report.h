// `--html FILE` (fit, plan, sweep, check): one self-contained page a person
// opens in a browser. The page embeds the data of the command's JSON output
// (<script type="application/json" id="preflight-data">) and draws it with an
// inline script as inline SVG: no external file, no network at view time
// (a Content-Security-Policy forbids any). docs/html.md describes the page.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "preflight/planner/plan.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/report.h"

namespace preflight {

/// The most ranks the rank map lists (128 nodes of 8 GPUs): beyond that a
/// grid no one reads would make the page megabytes; the page says how many
/// nodes it leaves out.
inline constexpr int64_t kMaxHtmlMapRanks = 1024;

/// One recipe's memory geometry: {"fit": FitJson(report), "explain_by_stage":
/// per pipeline rank, every figure with its formula (the `--explain` lines of
/// that rank)}.
nlohmann::json HtmlFitPart(const FitReport& report);

/// One recipe's plan: {"plan": the `plan --format json` document,
/// "rank_groups": the first kMaxHtmlMapRanks ranks' coordinates and, per
/// axis, the index of the group each belongs to (Mesh::groups order)}.
nlohmann::json HtmlPlanPart(const Recipe& recipe, const Plan& plan);

/// The sweep's chart data: the `sweep --format json` document with only the
/// charted rows in "layouts" (SweepChartRows, the top rows and the recipe's
/// own), each with its "index" in the full list, and "own" (that index, or null).
nlohmann::json HtmlSweepPart(const SweepResult& result, const std::string& file, std::optional<int64_t> own);

/// What one page shows; parts left null or empty are not drawn.
struct HtmlPage {
  HtmlPage(std::string command_name, std::string page_title)
      : command(std::move(command_name)), title(std::move(page_title)) {}
  std::string command;  // "fit", "plan", "sweep" or "check"
  std::string title;
  nlohmann::json reports = nlohmann::json::array();  // per recipe: HtmlFitPart, merged with HtmlPlanPart for plan
  nlohmann::json sweep;                              // HtmlSweepPart
  nlohmann::json check;                              // CheckJson
};

/// The page: HTML with the data, the style and the drawing script inline.
/// Deterministic (no timestamps) like every renderer.
std::string RenderHtmlPage(const HtmlPage& page);

}  // namespace preflight

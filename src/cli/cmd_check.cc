// preflight check R...: the CI gate. Validates and fits every recipe, applies
// the headroom floor and, with a baseline (a directory of the same file names,
// or the recipes as committed at a git ref), the regression budget. Exit 0
// pass, 1 fail, 2 bad input (any recipe invalid; the others are still judged).
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "preflight/report/check.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "verbs.h"

#include "html_output.h"

namespace preflight::cli {
namespace {

namespace fs = std::filesystem;

struct CheckArgs {
  std::vector<std::string> recipes;
  std::string baseline_dir;
  std::string baseline_ref;
  double max_regression_gib = 1.0;
  std::vector<std::string> category_budgets;  // "CAT=GIB"
  std::string junit_path;
  std::string summary_path;
  std::string out_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, applied to every recipe and its baseline
  OutputFormat format = OutputFormat::kTable;
  HtmlArgs html;
};

/// Single-quotes `text` for /bin/sh.
std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

/// Runs `command` through the shell (stderr discarded); stdout into `out`.
/// Returns the exit status, or -1 when the command could not be started.
int RunCapture(const std::string& command, std::string* out) {
  std::FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    if (out != nullptr) out->append(buffer, n);
  }
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> Formatted(const std::vector<Diagnostic>& ds) {
  std::vector<std::string> out;
  for (const auto& d : ds) {
    if (d.severity == Severity::kError) out.push_back(Format(d));
  }
  return out;
}

/// The fit of a loaded recipe, as `preflight fit` computes it: the stages
/// MakePlan takes. nullopt with the planner's errors in `errors` when the
/// layout cannot be planned (bad input, as for fit).
std::optional<MemoryEstimate> EstimateOf(const Recipe& recipe, std::vector<Diagnostic>* errors) {
  const Inventory inventory = BuildInventory(recipe);
  const Layout layout = LayoutOf(recipe);
  PlanResult planned = MakePlan(inventory, layout);
  if (!planned.plan) {
    *errors = std::move(planned.diagnostics);
    return std::nullopt;
  }
  if (planned.plan->memory) return std::move(*planned.plan->memory);
  return EstimateMemory(inventory, layout, planned.plan->stages);
}

/// Where a recipe's baseline copy comes from.
struct BaselineSource {
  BaselineState state = BaselineState::kNone;
  std::optional<LoadResult> loaded;  // when the copy exists
};

BaselineSource FromDirectory(const std::string& dir, const std::string& path, const std::vector<Override>& overrides) {
  const fs::path copy = fs::path(dir) / fs::path(path).filename();
  std::error_code ec;
  if (!fs::exists(copy, ec)) return {BaselineState::kNew, std::nullopt};
  return {BaselineState::kCompared, LoadRecipeFile(copy.string(), overrides)};
}

/// The directory git is run in for `path` ("." for a bare file name).
std::string DirOf(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

/// `git show REF:./NAME` in the recipe's directory; absent there is "new".
BaselineSource FromGit(const std::string& ref, const std::string& path, const std::vector<Override>& overrides) {
  const std::string dir = DirOf(path);
  const std::string object = ref + ":./" + fs::path(path).filename().string();
  const std::string git = "git -C " + ShellQuote(dir);
  if (RunCapture(git + " cat-file -e " + ShellQuote(object), nullptr) != 0) return {BaselineState::kNew, std::nullopt};
  std::string text;
  if (RunCapture(git + " show " + ShellQuote(object), &text) != 0) return {BaselineState::kNew, std::nullopt};
  return {BaselineState::kCompared, LoadRecipeFromString(text, ref + ":" + path, overrides)};
}

/// The ref must name a commit in the repository of every recipe's directory.
bool RefResolves(const std::string& ref, const std::string& path) {
  return RunCapture(
             "git -C " + ShellQuote(DirOf(path)) + " rev-parse --verify --quiet " + ShellQuote(ref + "^{commit}"),
             nullptr) == 0;
}

std::optional<CheckThresholds> ParseThresholds(const CheckArgs& args) {
  CheckThresholds t;
  t.max_regression = GiB(args.max_regression_gib);
  for (const std::string& text : args.category_budgets) {
    const auto eq = text.find('=');
    const std::string key = text.substr(0, eq);
    const auto category = CategoryFromKey(key);
    double gib = -1;
    bool number_ok = false;
    if (eq != std::string::npos) {
      try {
        size_t used = 0;
        gib = std::stod(text.substr(eq + 1), &used);
        number_ok = used == text.size() - eq - 1 && gib >= 0 && gib < 1e9;
      } catch (const std::exception&) {
        number_ok = false;
      }
    }
    if (!category || !number_ok) {
      std::string valid;
      for (int i = 0; i < kNumCategories; ++i)
        valid += fmt::format("{}{}", i ? ", " : "", Key(static_cast<Category>(i)));
      std::fprintf(stderr,
                   "--max-regression-gib-category %s: expected CATEGORY=GIB with GIB >= 0 and CATEGORY one of: %s\n",
                   Shown(text).c_str(), Shown(valid).c_str());
      return std::nullopt;
    }
    t.per_category[static_cast<size_t>(static_cast<int>(*category))] = GiB(gib);
  }
  return t;
}

/// One recipe judged, `overrides` (--set) applied to it and its baseline; with
/// `page` (check --html), its memory geometry as fit draws it is added there.
CheckEntry CheckOne(const std::string& path, const CheckArgs& args, const std::vector<Override>& overrides,
                    const CheckThresholds& thresholds, HtmlPage* page) {
  // `-` reads stdin, as every recipe reader does; such a recipe has no baseline copy.
  std::optional<LoadResult> loaded = LoadRecipeFrom(path, overrides);
  if (!loaded) return InvalidEntry(path, {"<stdin>: cannot read the recipe"});
  const LoadResult& current = *loaded;
  for (const auto& d : current.diagnostics) std::fprintf(stderr, "%s\n", Format(d).c_str());
  if (!current.ok()) return InvalidEntry(path, Formatted(current.diagnostics));
  const Recipe& recipe = *current.recipe;
  std::optional<MemoryEstimate> estimate;
  try {
    std::vector<Diagnostic> plan_errors;
    estimate = EstimateOf(recipe, &plan_errors);
    if (!estimate) {
      for (const auto& d : plan_errors) std::fprintf(stderr, "%s\n", Format(d).c_str());
      return InvalidEntry(path, Formatted(plan_errors));
    }
  } catch (const ArithmeticOverflow& e) {
    const std::string message =
        fmt::format("{}: the recipe's sizes exceed 64-bit byte arithmetic ({})", path, e.what());
    std::fprintf(stderr, "%s\n", Shown(message).c_str());
    return InvalidEntry(path, {message});
  }

  BaselineSource baseline;
  if (!args.baseline_dir.empty()) baseline = FromDirectory(args.baseline_dir, path, overrides);
  if (!args.baseline_ref.empty()) baseline = FromGit(args.baseline_ref, path, overrides);
  std::optional<RankMemory> baseline_worst;
  std::string note;
  if (baseline.state == BaselineState::kCompared) {
    if (!baseline.loaded->ok()) {
      baseline.state = BaselineState::kUnreadable;
      const auto errors = Formatted(baseline.loaded->diagnostics);
      note = errors.empty() ? "invalid" : errors.front().substr(0, errors.front().find('\n'));
    } else {
      try {
        std::vector<Diagnostic> plan_errors;
        const auto base = EstimateOf(*baseline.loaded->recipe, &plan_errors);
        if (base) {
          baseline_worst = base->stages.at(static_cast<size_t>(base->worst_stage));
        } else {
          baseline.state = BaselineState::kUnreadable;
          const auto errors = Formatted(plan_errors);
          note = errors.empty() ? "cannot be planned" : errors.front().substr(0, errors.front().find('\n'));
        }
      } catch (const ArithmeticOverflow& e) {
        baseline.state = BaselineState::kUnreadable;
        note = fmt::format("the baseline's sizes exceed 64-bit byte arithmetic ({})", e.what());
      }
    }
  }
  CheckEntry entry = JudgeEntry(path, recipe.name, std::move(*estimate), GiB(recipe.cluster.min_headroom_gib),
                                baseline.state, std::move(baseline_worst), thresholds, note);
  entry.device = DeviceLabel(recipe.cluster);
  if (page != nullptr) {
    nlohmann::json part = FitPagePart(recipe, path);
    if (!part.is_null()) page->reports.push_back(std::move(part));
  }
  return entry;
}

int RunCheck(const CheckArgs& args) {
  if (!HtmlStdoutFree(args.html, !args.out_path.empty())) return static_cast<int>(ExitCode::kBadInput);
  const auto overrides = ParseOverridesOrReport(args.sets);
  if (!overrides) return static_cast<int>(ExitCode::kBadInput);
  const auto thresholds = ParseThresholds(args);
  if (!thresholds) return static_cast<int>(ExitCode::kBadInput);
  if (!args.baseline_dir.empty()) {
    std::error_code ec;
    if (!fs::is_directory(args.baseline_dir, ec)) {
      std::fprintf(stderr, "--baseline %s: not a directory\n", Shown(args.baseline_dir).c_str());
      return static_cast<int>(ExitCode::kBadInput);
    }
  }
  if (!args.baseline_ref.empty()) {
    std::map<std::string, bool> checked;  // per recipe directory
    for (const auto& path : args.recipes) {
      const std::string dir = DirOf(path);
      if (checked.count(dir) != 0) continue;
      checked[dir] = true;
      if (!RefResolves(args.baseline_ref, path)) {
        std::fprintf(stderr,
                     "--baseline-ref %s: not a commit of the git repository holding %s (is git installed, is the ref "
                     "fetched?)\n",
                     Shown(args.baseline_ref).c_str(), Shown(path).c_str());
        return static_cast<int>(ExitCode::kBadInput);
      }
    }
  }

  CheckReport report;
  report.thresholds = *thresholds;
  if (!args.baseline_dir.empty()) report.baseline_label = args.baseline_dir;
  if (!args.baseline_ref.empty()) report.baseline_label = "git " + args.baseline_ref;
  HtmlPage page{"check", "preflight check"};
  HtmlPage* html = args.html.path.empty() ? nullptr : &page;
  for (const auto& path : args.recipes) report.entries.push_back(CheckOne(path, args, *overrides, *thresholds, html));

  if (!args.junit_path.empty() && !WriteTextFile(args.junit_path, RenderCheckJUnit(report), args.recipes)) {
    return static_cast<int>(ExitCode::kBadInput);
  }
  if (!args.summary_path.empty() && !WriteTextFile(args.summary_path, RenderCheckMarkdown(report), args.recipes)) {
    return static_cast<int>(ExitCode::kBadInput);
  }
  if (html != nullptr) {
    page.check = CheckJson(report);
    if (!WriteHtml(args.html, page, args.recipes)) return static_cast<int>(ExitCode::kBadInput);
    if (HtmlOnStdout(args.html) && args.out_path.empty()) return static_cast<int>(report.exit_code());
  }
  std::string text;
  switch (args.format) {
    case OutputFormat::kJson: text = CheckJson(report).dump(2) + "\n"; break;
    case OutputFormat::kMd: text = RenderCheckMarkdown(report); break;
    default: text = RenderCheckTable(report); break;
  }
  if (!EmitOutput(args.out_path, text, args.recipes)) return static_cast<int>(ExitCode::kBadInput);
  return static_cast<int>(report.exit_code());
}

}  // namespace

void SetupCheck(CLI::App& command, int& exit_code) {
  auto args = std::make_shared<CheckArgs>();
  command.add_option("recipes", args->recipes, "Recipe YAML files")->required();
  auto* dir =
      command.add_option("--baseline", args->baseline_dir, "Directory holding the baseline recipes (same file names)");
  auto* ref = command.add_option("--baseline-ref", args->baseline_ref,
                                 "Git ref whose committed recipes are the baseline (git show REF:path)");
  dir->excludes(ref);
  command
      .add_option("--max-regression-gib", args->max_regression_gib,
                  "Largest allowed growth of the worst rank's total vs the baseline (default 1.0)")
      ->check(FiniteNumber())
      ->check(CLI::Range(0.0, 1e9));
  command
      .add_option("--max-regression-gib-category", args->category_budgets,
                  "Largest allowed growth of one category, e.g. activations=0.5 (repeatable)")
      ->type_name("CATEGORY=GIB");
  command.add_option("--junit", args->junit_path, "Write JUnit XML (one testcase per recipe)");
  command.add_option("--summary", args->summary_path, "Write a Markdown summary for a pull-request comment");
  command
      .add_option("--set", args->sets,
                  "Override a key of every recipe and its baseline, e.g. --set parallel.tp=8 (repeatable)")
      ->type_name("KEY=VALUE");
  AddOutputOption(command, args->out_path);
  AddFormatOption(command, args->format, {OutputFormat::kTable, OutputFormat::kJson, OutputFormat::kMd});
  AddHtmlOption(command, args->html);
  command.callback([args, &exit_code] { exit_code = RunCheck(*args); });
}

}  // namespace preflight::cli

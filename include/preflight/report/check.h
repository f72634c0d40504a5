// `preflight check`, the CI gate: judging a set of recipes (fit verdict,
// headroom floor, regression against a baseline) and rendering the result as
// a table, JSON, a Markdown pull-request summary and JUnit XML. Judging is
// pure (the CLI loads files and runs git); renderers are separate (docs/architecture.md)
// and deterministic, so golden files pin them.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/estimator/estimate.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Regression budget against the baseline: the worst rank's total may grow by
/// at most `max_regression`, and each category by at most its own budget when
/// one is given (categories without one are only reported).
struct CheckThresholds {
  Bytes max_regression = GiB(1.0);  // default of --max-regression-gib [OURS]
  std::array<std::optional<Bytes>, kNumCategories> per_category{};
};

/// The category whose Key() is `key` ("activations"), or nullopt.
std::optional<Category> CategoryFromKey(const std::string& key);

enum class BaselineState {
  kNone,        // no baseline requested
  kNew,         // baseline requested, the recipe is absent there: nothing to compare
  kCompared,    // compared against the baseline's worst rank
  kUnreadable,  // the baseline copy exists but is invalid: reported, not compared
};
const char* Key(BaselineState s);  // "none", "new", "compared", "unreadable"

/// One recipe's outcome.
struct CheckEntry {
  std::string file;  // as given on the command line
  std::string name;  // the recipe's name (empty when invalid)
  std::string device;  // DeviceLabel of what was priced (empty when invalid)
  bool valid = false;
  std::vector<std::string> errors;  // formatted diagnostics when !valid
  MemoryEstimate estimate;          // when valid
  Bytes min_headroom;               // cluster.min_headroom_gib
  BaselineState baseline = BaselineState::kNone;
  std::string baseline_note;                 // why the baseline is unreadable
  std::optional<RankMemory> baseline_worst;  // when kCompared
  /// Why the recipe fails, one line each (capacity, headroom floor, regressions).
  std::vector<std::string> failures;

  bool passed() const { return valid && failures.empty(); }
  const RankMemory& worst() const { return estimate.stages.at(static_cast<size_t>(estimate.worst_stage)); }
  /// Current minus baseline worst-rank bytes (zero without a comparison).
  Bytes delta_total() const;
  Bytes delta(Category c) const;
};

/// An entry for a recipe that failed to load or validate.
CheckEntry InvalidEntry(std::string file, std::vector<std::string> errors);

/// Judges a valid recipe: over capacity, below the headroom floor, and
/// (with kCompared) the regression budget. `baseline_worst` is the baseline's
/// worst rank when state == kCompared.
CheckEntry JudgeEntry(std::string file, std::string name, MemoryEstimate estimate, Bytes min_headroom,
                      BaselineState state, std::optional<RankMemory> baseline_worst, const CheckThresholds& thresholds,
                      std::string baseline_note = "");

struct CheckReport {
  std::string baseline_label;  // "DIR" or "git REF"; empty without a baseline
  CheckThresholds thresholds;
  std::vector<CheckEntry> entries;

  int64_t invalid_count() const;
  int64_t failed_count() const;  // valid but failing
  /// 2 when any recipe is invalid, else 1 when any fails, else 0.
  ExitCode exit_code() const;
};

/// Categories of an entry ordered by |delta|, largest first, non-zero only.
std::vector<Category> MovedCategories(const CheckEntry& entry);

std::string RenderCheckTable(const CheckReport& report);
nlohmann::json CheckJson(const CheckReport& report);
/// The pull-request summary: a verdict line and a table (recipe, verdict,
/// worst stage total, headroom, delta vs baseline, top moved categories).
std::string RenderCheckMarkdown(const CheckReport& report);
/// JUnit XML: one <testcase> per recipe in one <testsuite name="preflight check">;
/// failing recipes carry <failure message=...>, invalid ones <error message=...>.
std::string RenderCheckJUnit(const CheckReport& report);

}  // namespace preflight

// Judging recipes for `preflight check` (the CI gate): capacity, headroom
// floor, regression against a baseline. Pure: no files, no git.
#include "preflight/report/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace preflight {

std::optional<Category> CategoryFromKey(const std::string& key) {
  for (int i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    if (key == Key(c)) return c;
  }
  return std::nullopt;
}

const char* Key(BaselineState s) {
  switch (s) {
    case BaselineState::kNone:
      return "none";
    case BaselineState::kNew:
      return "new";
    case BaselineState::kCompared:
      return "compared";
    case BaselineState::kUnreadable:
      return "unreadable";
  }
  return "none";
}

Bytes CheckEntry::delta_total() const {
  if (!valid || !baseline_worst) return Bytes(0);
  return worst().total() - baseline_worst->total();
}

Bytes CheckEntry::delta(Category c) const {
  if (!valid || !baseline_worst) return Bytes(0);
  return worst().of(c) - baseline_worst->of(c);
}

CheckEntry InvalidEntry(std::string file, std::vector<std::string> errors) {
  CheckEntry e;
  e.file = std::move(file);
  e.valid = false;
  e.errors = std::move(errors);
  return e;
}

CheckEntry JudgeEntry(std::string file, std::string name, MemoryEstimate estimate, Bytes min_headroom,
                      BaselineState state, std::optional<RankMemory> baseline_worst, const CheckThresholds& thresholds,
                      std::string baseline_note) {
  CheckEntry e;
  e.file = std::move(file);
  e.name = std::move(name);
  e.valid = true;
  e.estimate = std::move(estimate);
  e.min_headroom = min_headroom;
  e.baseline = state;
  e.baseline_note = std::move(baseline_note);
  if (state == BaselineState::kCompared) e.baseline_worst = std::move(baseline_worst);

  const Verdict& v = e.estimate.verdict;
  if (!v.fits) {
    e.failures.push_back(fmt::format("does not fit: {}", v.reason));
  } else if (!v.headroom_ok) {
    e.failures.push_back(
        fmt::format("headroom {:.2f} GiB on stage {} is below the floor cluster.min_headroom_gib = {:.2f} GiB",
                    v.headroom.gib(), e.estimate.worst_stage, min_headroom.gib()));
  }
  if (e.baseline_worst) {
    const Bytes d = e.delta_total();
    if (d > thresholds.max_regression) {
      e.failures.push_back(fmt::format(
          "peak (worst rank) regressed by {:+.2f} GiB ({:.2f} -> {:.2f} GiB), more than --max-regression-gib {:.2f}",
          d.gib(), e.baseline_worst->total().gib(), e.worst().total().gib(), thresholds.max_regression.gib()));
    }
    for (int i = 0; i < kNumCategories; ++i) {
      const auto c = static_cast<Category>(i);
      const auto& budget = thresholds.per_category[static_cast<size_t>(i)];
      if (!budget) continue;
      const Bytes dc = e.delta(c);
      if (dc > *budget) {
        e.failures.push_back(
            fmt::format("{} regressed by {:+.2f} GiB ({:.2f} -> {:.2f} GiB), more than its budget {:.2f} GiB", Key(c),
                        dc.gib(), e.baseline_worst->of(c).gib(), e.worst().of(c).gib(), budget->gib()));
      }
    }
  }
  return e;
}

int64_t CheckReport::invalid_count() const {
  return std::count_if(entries.begin(), entries.end(), [](const CheckEntry& e) { return !e.valid; });
}

int64_t CheckReport::failed_count() const {
  return std::count_if(entries.begin(), entries.end(), [](const CheckEntry& e) { return e.valid && !e.passed(); });
}

ExitCode CheckReport::exit_code() const {
  if (invalid_count() > 0) return ExitCode::kBadInput;
  if (failed_count() > 0) return ExitCode::kVerdictFail;
  return ExitCode::kOk;
}

std::vector<Category> MovedCategories(const CheckEntry& entry) {
  std::vector<Category> moved;
  for (int i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    if (entry.delta(c).count() != 0) moved.push_back(c);
  }
  // Stable: equal magnitudes keep the fixed category order.
  std::stable_sort(moved.begin(), moved.end(), [&](Category a, Category b) {
    return std::llabs(entry.delta(a).count()) > std::llabs(entry.delta(b).count());
  });
  return moved;
}

}  // namespace preflight

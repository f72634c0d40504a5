// bench/throughput: the step-time calibration table (issue 16). Every
// published run (tests/data/published/runs.json) as a recipe through `plan`,
// beside its measured tokens/s per GPU (torchtitan) or TFLOP/s per GPU
// (Megatron-LM PTD-P, the paper's Eq. 3 count); the signed error per row and
// the distribution.
//
//   build/throughput [RUNS.json]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "published_cases.h"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : PREFLIGHT_SOURCE_DIR "/tests/data/published/runs.json";
  const auto rows = preflight::published::LoadRows(path);
  std::vector<double> errors;
  fmt::print("{:<42} {:>24} {:>10} {:>10} {:>8}\n", "run", "metric", "measured", "modeled", "error");
  for (const auto& r : rows) {
    if (!r.error.empty()) {
      fmt::print("{:<42} not priced: {}\n", r.id, r.error);
      continue;
    }
    fmt::print("{:<42} {:>24} {:>10.1f} {:>10.1f} {:>+7.1f}%\n", r.id, r.metric, r.measured, r.modeled, r.error_pct);
    errors.push_back(std::abs(r.error_pct));
  }
  std::sort(errors.begin(), errors.end());
  if (!errors.empty()) {
    fmt::print("\n{} of {} rows priced; |error| median {:.1f}%, p90 {:.1f}%, worst {:.1f}%; within 10%: {}\n",
               errors.size(), rows.size(), errors[errors.size() / 2],
               errors[static_cast<size_t>(0.9 * static_cast<double>(errors.size() - 1))], errors.back(),
               std::count_if(errors.begin(), errors.end(), [](double e) { return e <= 10.0; }));
  }
  return 0;
}

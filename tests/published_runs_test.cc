// Step time against published throughput of real runs (issue 16): every row
// of tests/data/published/runs.json (torchtitan's Llama 3.1 8B tables on
// H100; the Megatron-LM PTD-P paper's Table 1 on A100) as a recipe through
// `plan`, within 10 % of what was measured. bench/throughput prints the table.
#include <algorithm>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "../bench/published_cases.h"
#include "preflight/planner/sweep.h"

namespace preflight::published_runs_test {
namespace {

// Rows known to miss by more than 10 %, each with its diagnosis and the band it
// must stay in (a change that moves it either way shows here).
struct KnownMiss {
  const char* id;
  double low_pct, high_pct;  // signed error band
};
// The PTD-P paper's 7.5B (tp 4) and 18.4B (tp 8) rows run full activation
// recomputation on A100s without SP: Megatron's CheckpointFunction reruns each
// layer's forward in backward, its TP all-reduces included, which plan now
// prices (was -8.0 % and -8.5 % without that traffic). What remains is the
// A100 compute model (its GEMM rate was calibrated on these rows before the
// rerun's traffic was priced, and Hopper's tile assumption for short-K GEMMs):
// still open, so the rows are held where they are, not tuned in.
constexpr KnownMiss kKnownMisses[] = {
    {"megatron-ptdp-7.5B", -13.0, -10.0},
    {"megatron-ptdp-18.4B", -16.0, -13.0},
};

TEST(PublishedRuns, EveryRowWithinTenPercent) {
  const auto rows = published::LoadRows(std::string(PREFLIGHT_SOURCE_DIR) + "/tests/data/published/runs.json");
  ASSERT_EQ(rows.size(), 16u);
  for (const published::Row& r : rows) {
    ASSERT_TRUE(r.error.empty()) << r.id << ": " << r.error;
    const auto known = std::find_if(std::begin(kKnownMisses), std::end(kKnownMisses),
                                    [&](const KnownMiss& k) { return r.id == k.id; });
    if (known != std::end(kKnownMisses)) {
      EXPECT_GE(r.error_pct, known->low_pct) << r.id << ": measured " << r.measured << ", modeled " << r.modeled;
      EXPECT_LE(r.error_pct, known->high_pct) << r.id << ": now within 10 %? drop it from kKnownMisses";
      continue;
    }
    EXPECT_LE(std::abs(r.error_pct), 10.0) << r.id << ": measured " << r.measured << ", modeled " << r.modeled;
  }
}

// The uncertainty the sweep states when it marks near-ties
// (kStepTimeUncertainty) is this model's median |error| on these rows; it
// must not claim better than it measures.
TEST(PublishedRuns, MedianErrorIsWithinTheStatedUncertainty) {
  const auto rows = published::LoadRows(std::string(PREFLIGHT_SOURCE_DIR) + "/tests/data/published/runs.json");
  std::vector<double> errors;
  for (const published::Row& r : rows) errors.push_back(std::abs(r.error_pct) / 100.0);
  std::sort(errors.begin(), errors.end());
  const double median = (errors[(errors.size() - 1) / 2] + errors[errors.size() / 2]) / 2.0;
  EXPECT_LE(median, kStepTimeUncertainty);
  EXPECT_GE(median, kStepTimeUncertainty / 2) << "the stated uncertainty is far looser than measured; tighten it";
}

// The rows' differences are predicted, not fitted: torch.compile and Float8
// speed the same job up by about what was measured (+15.7 % and +48 % over
// eager; modeled +8.6 % and +43 %: eager torchtitan moved more bytes than the
// per-op count of compute.h says, which this band keeps in view).
TEST(PublishedRuns, CompileAndFloat8GainsArePredicted) {
  const auto rows = published::LoadRows(std::string(PREFLIGHT_SOURCE_DIR) + "/tests/data/published/runs.json");
  const double eager = rows[0].modeled, compile = rows[1].modeled, fp8 = rows[2].modeled;
  EXPECT_NEAR(compile / eager, rows[1].measured / rows[0].measured, 0.08);
  EXPECT_NEAR(fp8 / eager, rows[2].measured / rows[0].measured, 0.10);
}

}  // namespace
}  // namespace preflight::published_runs_test

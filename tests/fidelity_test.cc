// Memory fidelity against measured Megatron-LM runs (issue 15): every stored
// functional-test case (tests/data/megatron_ci/cases.json) is imported with
// `import megatron` and priced; at least 95 % must import, the rest fail with
// a located error naming what was refused. As a regression gate, each case's
// modeled allocator figures (last global rank: allocated between steps and
// max_memory_allocated) must stay within the error band recorded for it in
// tests/data/megatron_ci/baseline.json (bench/fidelity --baseline writes it):
// a model change that makes agreement worse fails; one that improves it
// should rewrite the bands.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../bench/fidelity_cases.h"
#include "support/test_support.h"

namespace preflight::fidelity_test {
namespace {

// Rounding of the stored bands (two decimals) plus arithmetic noise.
constexpr double kSlackPct = 0.05;

TEST(Fidelity, ImportsAndStaysWithinTheBaselineBands) {
  std::string error;
  const std::vector<fidelity::Case> cases =
      fidelity::LoadCases(testing::SourcePath("tests/data/megatron_ci/cases.json"), &error);
  ASSERT_EQ(cases.size(), 188u) << error;
  std::ifstream in(testing::SourcePath("tests/data/megatron_ci/baseline.json"));
  const nlohmann::json bands = nlohmann::json::parse(in, nullptr, false).at("bands");
  size_t imported = 0;
  for (const fidelity::Case& c : cases) {
    const fidelity::Outcome o = fidelity::Run(c);
    if (!o.imported) {
      // Refused with a located error that names the flag or recipe key.
      EXPECT_FALSE(o.error_flag.empty()) << c.id << ": " << o.error;
      EXPECT_NE(o.error.find(c.id + ":"), std::string::npos) << o.error;
      EXPECT_FALSE(bands.contains(c.id)) << c.id << " had a band but no longer imports: " << o.error;
      continue;
    }
    ++imported;
    ASSERT_TRUE(bands.contains(c.id)) << c.id << " imports now: add its band (bench/fidelity --baseline)";
    const double static_band = std::fabs(bands.at(c.id).at("static_error_pct").get<double>()) + kSlackPct;
    const double peak_band = std::fabs(bands.at(c.id).at("peak_error_pct").get<double>()) + kSlackPct;
    EXPECT_LE(std::fabs(o.static_error_pct), static_band)
        << c.id << " static: modeled " << o.modeled_static << " vs measured " << c.measured_static;
    EXPECT_LE(std::fabs(o.peak_error_pct), peak_band)
        << c.id << " peak: modeled " << o.modeled_peak << " vs measured " << c.measured_peak;
  }
  EXPECT_GE(static_cast<double>(imported), 0.95 * static_cast<double>(cases.size()));
}

}  // namespace
}  // namespace preflight::fidelity_test

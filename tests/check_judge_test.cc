// Unit tests of the check library: judging hand-made estimates (no recipe,
// no binary), the category order of MovedCategories and XML escaping.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "preflight/report/check.h"
#include "preflight/report/format.h"

namespace preflight::check_judge_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

/// One stage with `gib` GiB of activations and 2 GiB reserve on a 10 GiB device.
MemoryEstimate OneStage(double activation_gib, bool fits, bool headroom_ok) {
  MemoryEstimate m;
  RankMemory r;
  r.capacity = GiB(10);
  r.bytes[static_cast<int>(Category::kActivations)] = GiB(activation_gib);
  r.bytes[static_cast<int>(Category::kRuntimeReserve)] = GiB(2);
  m.stages.push_back(r);
  m.verdict.fits = fits;
  m.verdict.headroom_ok = headroom_ok;
  m.verdict.headroom = r.headroom();
  m.verdict.reason = fits ? "ok" : "stage 0 over capacity";
  return m;
}

RankMemory Worst(const MemoryEstimate& m) { return m.stages[0]; }

TEST(JudgeEntry, PassWithoutBaseline) {
  const auto e = JudgeEntry("r.yaml", "r", OneStage(4, true, true), GiB(1), BaselineState::kNone, std::nullopt, {});
  EXPECT_TRUE(e.passed());
  EXPECT_EQ(e.delta_total().count(), 0);
}

TEST(JudgeEntry, HeadroomFloorAndCapacityFailures) {
  // 7 GiB of 10 used: 3 GiB headroom below a 4 GiB floor.
  auto e = JudgeEntry("r.yaml", "r", OneStage(5, true, false), GiB(4), BaselineState::kNone, std::nullopt, {});
  ASSERT_EQ(e.failures.size(), 1u);
  EXPECT_THAT(e.failures[0], HasSubstr("headroom 3.00 GiB on stage 0 is below the floor"));
  e = JudgeEntry("r.yaml", "r", OneStage(12, false, false), GiB(4), BaselineState::kNone, std::nullopt, {});
  ASSERT_EQ(e.failures.size(), 1u);  // over capacity implies below the floor: one reason
  EXPECT_THAT(e.failures[0], HasSubstr("does not fit: stage 0 over capacity"));
}

TEST(JudgeEntry, RegressionBudgetIsStrictlyGreaterThan) {
  // Baseline 4 GiB of activations, now 5: +1 GiB exactly equals the budget and passes.
  const RankMemory base = Worst(OneStage(4, true, true));
  CheckThresholds t;
  t.max_regression = GiB(1);
  auto e = JudgeEntry("r.yaml", "r", OneStage(5, true, true), GiB(0), BaselineState::kCompared, base, t);
  EXPECT_EQ(e.delta_total().count(), int64_t{1} << 30);
  EXPECT_TRUE(e.passed());
  t.max_regression = GiB(0.5);
  e = JudgeEntry("r.yaml", "r", OneStage(5, true, true), GiB(0), BaselineState::kCompared, base, t);
  ASSERT_EQ(e.failures.size(), 1u);
  EXPECT_THAT(e.failures[0], HasSubstr("regressed by +1.00 GiB (6.00 -> 7.00 GiB)"));
  // A per-category budget fails on its own category only.
  t.max_regression = GiB(5);
  t.per_category[static_cast<int>(Category::kActivations)] = GiB(0.25);
  t.per_category[static_cast<int>(Category::kRuntimeReserve)] = GiB(0);
  e = JudgeEntry("r.yaml", "r", OneStage(5, true, true), GiB(0), BaselineState::kCompared, base, t);
  ASSERT_EQ(e.failures.size(), 1u);
  EXPECT_THAT(e.failures[0], HasSubstr("activations regressed by +1.00 GiB"));
}

TEST(JudgeEntry, NewRecipeIsNeverARegression) {
  CheckThresholds t;
  t.max_regression = GiB(0);
  const auto e = JudgeEntry("r.yaml", "r", OneStage(5, true, true), GiB(0), BaselineState::kNew, std::nullopt, t);
  EXPECT_TRUE(e.passed());
}

TEST(CheckReport, ExitCodePrefersBadInput) {
  CheckReport r;
  r.entries.push_back(JudgeEntry("a", "a", OneStage(12, false, false), GiB(0), BaselineState::kNone, std::nullopt, {}));
  EXPECT_EQ(r.exit_code(), ExitCode::kVerdictFail);
  r.entries.push_back(InvalidEntry("b", {"b:1:1: bad"}));
  EXPECT_EQ(r.exit_code(), ExitCode::kBadInput);
  EXPECT_EQ(r.failed_count(), 1);
  EXPECT_EQ(r.invalid_count(), 1);
}

TEST(MovedCategories, LargestMagnitudeFirst) {
  MemoryEstimate now = OneStage(3, true, true);                                 // activations -1 GiB
  now.stages[0].bytes[static_cast<int>(Category::kRoutingScratch)] = GiB(0.5);  // +0.5 GiB
  now.stages[0].bytes[static_cast<int>(Category::kRuntimeReserve)] = GiB(4);    // +2 GiB
  const auto e = JudgeEntry("r", "r", now, GiB(0), BaselineState::kCompared, Worst(OneStage(4, true, true)), {});
  EXPECT_THAT(MovedCategories(e),
              ElementsAre(Category::kRuntimeReserve, Category::kActivations, Category::kRoutingScratch));
}

TEST(CategoryFromKey, RoundTripsEveryKey) {
  for (int i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    EXPECT_EQ(CategoryFromKey(Key(c)), c);
  }
  EXPECT_EQ(CategoryFromKey("activation"), std::nullopt);
}

TEST(XmlEscape, EscapesMarkupAndDropsControlCharacters) {
  EXPECT_EQ(XmlEscape("a<b>&\"c'\x01\td"), "a&lt;b&gt;&amp;&quot;c&apos;\td");
}

}  // namespace
}  // namespace preflight::check_judge_test

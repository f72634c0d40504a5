// The sweep chart (`sweep --svg`): every Pareto layout as a point on the
// front, the other fitting layouts as a cloud capped at kMaxSvgPoints, the
// capacity line, and the recipe's own layout marked, or said to be outside
// the space.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/sweep_report.h"
#include "support/test_support.h"

namespace preflight::sweep_svg_test {
namespace {

using ::testing::HasSubstr;

// Llama 3 8B on 8 GPUs over tp 1, 2 and pp 1, 2: a small space whose rows are
// all distinct points.
SweepResult SmallSweep(Recipe* recipe) {
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"));
  EXPECT_TRUE(loaded.ok());
  std::string error;
  *recipe = *SweepRecipe(*loaded.recipe, 8, &error);
  SweepSpace space;
  space.tp = {1, 2};
  space.pp = {1, 2};
  space.cp = {1};
  return RunSweep(BuildInventory(*recipe), DefaultSweepSpace(*recipe, space), SweepOptions{});
}

TEST(SweepSvg, ParetoFrontCloudCapacityAndTheRecipesLayout) {
  Recipe recipe;
  const SweepResult r = SmallSweep(&recipe);
  ASSERT_FALSE(r.pareto.empty());
  const std::optional<int64_t> own = r.RowOf(LayoutOf(recipe));
  ASSERT_TRUE(own.has_value());  // tp 1, pp 1, micro-batch 1, selective, ZeRO 1
  const std::string svg = RenderSweepSvg(r, "a<b>.yaml", own);
  int64_t fitting = 0;
  for (const SweepRow& row : r.rows) {
    fitting += row.status == SweepStatus::kFits || row.status == SweepStatus::kTight;
  }
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"pareto\""), static_cast<int>(r.pareto.size()));
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"layout\""), fitting);  // under the cap: every fitting layout
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"capacity\""), 1);
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"own\""), 1);
  EXPECT_THAT(svg, HasSubstr("a&lt;b&gt;.yaml"));
  EXPECT_THAT(svg, HasSubstr(fmt::format("({} fitting layouts", fitting)));
  EXPECT_THAT(svg, HasSubstr(fmt::format("the recipe&apos;s layout ({})", Key(r.rows[*own].status))));
  const std::string outside = RenderSweepSvg(r, "x.yaml", std::nullopt);
  EXPECT_EQ(testing::CountOccurrences(outside, "class=\"own\""), 0);
  EXPECT_THAT(outside, HasSubstr("not in the swept space"));
}

TEST(SweepSvg, TheCloudIsCappedAndThePointsStayInThePlot) {
  SweepResult r;
  r.gpus = 64;
  r.capacity = GiB(140);
  for (int i = 0; i < 20000; ++i) {
    SweepRow row;
    row.status = SweepStatus::kFits;
    row.peak = GiB(20 + i % 100);
    row.step_s = 10.0 + i % 37;
    r.rows.push_back(row);
  }
  r.pareto = {0, 1};
  const std::string svg = RenderSweepSvg(r, "x.yaml", std::nullopt);
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"layout\""), kMaxSvgPoints);
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"pareto\""), 2);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(SweepSvg, CliWritesTheChart) {
  const std::string path = ::testing::TempDir() + "sweep.svg";
  const auto run = testing::RunPreflight(
      {"sweep", "recipes/llama3-8b-h200.yaml", "--gpus", "8", "--tp", "1,2", "--pp", "1,2", "--svg", path});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(testing::ReadFile(path), HasSubstr("<svg"));
}

}  // namespace
}  // namespace preflight::sweep_svg_test

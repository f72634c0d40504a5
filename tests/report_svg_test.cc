// The memory chart (`fit --svg`, `plan --svg`): rendered from the default
// recipe and checked for its structure: one bar group per pipeline stage, one
// segment per non-zero category with the stage's bytes, the capacity line at
// the device capacity, and a key naming every category.
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/report.h"
#include "support/test_support.h"

namespace preflight {
namespace {

using ::testing::HasSubstr;

struct Rendered {
  std::string svg;
  MemoryEstimate estimate;
};

Rendered RenderDefault() {
  const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"));
  EXPECT_TRUE(loaded.ok());
  const Inventory inventory = BuildInventory(*loaded.recipe);
  FitReport report;
  report.file = "recipes/nam56r-h200.yaml";
  report.inventory = &inventory;
  report.layout = LayoutOf(*loaded.recipe);
  report.stages = PartitionStages(inventory, report.layout);
  report.estimate = EstimateMemory(inventory, report.layout, report.stages);
  return {RenderMemorySvg(report), report.estimate};
}

TEST(MemorySvg, OneBarPerStageOneSegmentPerNonZeroCategory) {
  const Rendered r = RenderDefault();
  EXPECT_EQ(r.svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_THAT(r.svg, HasSubstr("</svg>\n"));
  ASSERT_EQ(r.estimate.stages.size(), 4u);  // the default recipe has pp = 4
  EXPECT_EQ(testing::CountOccurrences(r.svg, "<g class=\"stage\""), 4);
  int nonzero = 0;
  for (const RankMemory& st : r.estimate.stages) {
    for (int c = 0; c < kNumCategories; ++c) nonzero += st.bytes[static_cast<size_t>(c)].count() > 0 ? 1 : 0;
  }
  EXPECT_EQ(testing::CountOccurrences(r.svg, "<rect class=\"segment\""), nonzero);
  EXPECT_EQ(testing::CountOccurrences(r.svg, "<rect class=\"key\""), kNumCategories);  // the key names every category
  // Each segment's tooltip carries its stage and GiB figure: stage 0's reserve is the recipe's 3.0 GiB.
  EXPECT_THAT(r.svg, HasSubstr("<title>stage 0: runtime reserve 3.00 GiB</title>"));
}

TEST(MemorySvg, CapacityLineAtTheDeviceCapacity) {
  const Rendered r = RenderDefault();
  // H200 as nvidia-smi reports it: 143771 MiB = 140.40 GiB (docs/formulas.md §2.4).
  EXPECT_THAT(r.svg, HasSubstr("capacity 140.4 GiB"));
  EXPECT_EQ(testing::CountOccurrences(r.svg, "class=\"capacity\""), 1);
  EXPECT_EQ(testing::CountOccurrences(r.svg, "class=\"headroom-floor\""), 1);
}

TEST(MemorySvg, FitAndPlanWriteTheChart) {
  const std::string fit_path = (std::filesystem::temp_directory_path() / "preflight-fit-test.svg").string();
  const std::string plan_path = (std::filesystem::temp_directory_path() / "preflight-plan-test.svg").string();
  EXPECT_EQ(testing::RunPreflight({"fit", "recipes/nam56r-h200.yaml", "--svg", fit_path}).exit_code, 0);
  EXPECT_EQ(testing::RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--svg", plan_path}).exit_code, 0);
  const std::string fit_svg = testing::ReadFile(fit_path);
  EXPECT_EQ(fit_svg, testing::ReadFile(plan_path));  // both price the same stages
  EXPECT_EQ(testing::CountOccurrences(fit_svg, "<g class=\"stage\""), 4);
  std::filesystem::remove(fit_path);
  std::filesystem::remove(plan_path);
}

TEST(MemorySvg, UnwritablePathIsBadInput) {
  const auto r = testing::RunPreflight({"fit", "recipes/nam56r-h200.yaml", "--svg", "/nonexistent-dir/x.svg"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent-dir/x.svg"));
}

}  // namespace
}  // namespace preflight

// The charts: the memory (`fit --svg`) rendered from the default
// recipe and checked for its structure: one bar group per pipeline stage, one
// segment per non-zero category with the stage's bytes, the capacity line at
// the device capacity, and a key naming every category.
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/report.h"
#include "support/test_support.h"

namespace preflight::report_svg_test {
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

/// The numbers in `attribute="..."` of every element carrying it.
std::vector<double> AttributeValues(const std::string& svg, const std::string& attribute) {
  std::vector<double> out;
  const std::string key = attribute + "=\"";
  for (size_t at = svg.find(key); at != std::string::npos; at = svg.find(key, at + 1)) {
    out.push_back(std::stod(svg.substr(at + key.size())));
  }
  return out;
}

std::string SvgOf(const std::vector<std::string>& args, const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::vector<std::string> with = args;
  with.push_back("--svg");
  with.push_back(path);
  const auto r = testing::RunPreflight(with);
  EXPECT_NE(r.exit_code, 2) << r.err;
  std::string svg = testing::ReadFile(path);
  std::filesystem::remove(path);
  return svg;
}

// fit draws the memory, plan the time: the step on one bar whose parts
// (steady state, bubble, tail) add up to plan's step time, and each stage's
// time per micro-batch adding up to the stage table's four columns.
TEST(MemorySvg, PlanDrawsTheTimeNotTheMemory) {
  const std::vector<std::string> plan = {"plan", "recipes/nam56r-h200.yaml"};
  const std::string svg = SvgOf(plan, "preflight-plan-test.svg");
  EXPECT_EQ(svg.find("class=\"capacity\""), std::string::npos);
  EXPECT_EQ(testing::CountOccurrences(svg, "<g class=\"stage\""), 4);
  const auto json =
      nlohmann::json::parse(testing::RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json"}).out);
  double step = 0;
  for (double x : AttributeValues(svg, "data-seconds")) step += x;
  EXPECT_NEAR(step, json["step"]["step_s"].get<double>(), 1e-5);
  double stages_ms = 0, table_ms = 0;
  for (double x : AttributeValues(svg, "data-ms")) stages_ms += x;
  for (const auto& st : json["stages"]) {
    table_ms += 1e3 * (st["forward_s"].get<double>() + st["backward_s"].get<double>() +
                       st["recompute_s"].get<double>() + st["exposed_comm_s"].get<double>());
  }
  EXPECT_NEAR(stages_ms, table_ms, 1e-3);
  EXPECT_NE(svg, SvgOf({"fit", "recipes/nam56r-h200.yaml"}, "preflight-fit-test.svg"));
}

// 16 and 32 stages stay about as wide as 8 (bars narrow, every stage drawn),
// and a layout over capacity says so in red with every over-capacity stage
// hatched: Llama 3 405B at tp 4 without recompute holds ~174 GiB on its
// first stages against 140.4 GiB.
TEST(MemorySvg, DeepPipelinesStayReadableAndOverCapacityIsUnmistakable) {
  for (const char* pp : {"16", "32"}) {
    const std::string svg = SvgOf({"fit", "recipes/llama3-405b-h200.yaml", "--set", std::string("parallel.pp=") + pp,
                                   "--set", "parallel.vpp=1", "--set", "parallel.schedule=1f1b"},
                                  "preflight-deep.svg");
    EXPECT_EQ(testing::CountOccurrences(svg, "<g class=\"stage"), std::stoi(pp));
    ASSERT_FALSE(AttributeValues(svg, "width").empty());
    EXPECT_LE(AttributeValues(svg, "width").front(), 1500) << "pp " << pp;
  }
  const std::vector<std::string> over = {"fit",   "recipes/llama3-405b-h200.yaml", "--set", "parallel.tp=4",
                                         "--set", "training.global_batch=4096",    "--set", "training.recompute=none"};
  const auto json = nlohmann::json::parse([&] {
    std::vector<std::string> a = over;
    a.push_back("--format");
    a.push_back("json");
    return testing::RunPreflight(a).out;
  }());
  int over_stages = 0;
  for (const auto& st : json["stages"]) over_stages += st["headroom_bytes"].get<int64_t>() < 0 ? 1 : 0;
  ASSERT_GT(over_stages, 0);
  const std::string svg = SvgOf(over, "preflight-over.svg");
  EXPECT_THAT(svg, HasSubstr(">DOES NOT FIT: stage "));
  EXPECT_EQ(testing::CountOccurrences(svg, "class=\"over-capacity\""), over_stages);
  EXPECT_EQ(testing::CountOccurrences(svg, "<g class=\"stage over\""), over_stages);
  // A layout that fits has neither.
  const std::string fits = SvgOf({"fit", "recipes/llama3-405b-h200.yaml"}, "preflight-fits.svg");
  EXPECT_EQ(fits.find("over-capacity"), std::string::npos);
  EXPECT_THAT(fits, HasSubstr("&#9650; worst"));
}

TEST(MemorySvg, UnwritablePathIsBadInput) {
  const auto r = testing::RunPreflight({"fit", "recipes/nam56r-h200.yaml", "--svg", "/nonexistent-dir/x.svg"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent-dir/x.svg"));
}

}  // namespace
}  // namespace preflight::report_svg_test

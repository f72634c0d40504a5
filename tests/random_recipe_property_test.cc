// Property test over random recipes (issue "Hostile input"): patterns of every
// block letter, depths up to a few thousand layers and random layouts. For
// every recipe the parser accepts, `fit` and `plan` (the library calls their
// commands make) finish, and within a generous bound linear in the layer
// count: a guard against hangs and quadratic paths, not a speed measurement
// (bench/ measures speed). Their JSON outputs round-trip and hold no null,
// which is what a NaN or an infinity becomes in JSON.
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/advice.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/plan_report.h"
#include "preflight/report/report.h"
#include "support/test_support.h"

namespace preflight::random_recipe_property_test {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 20.0;  // the sanitizer build runs the suite too
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr double kSlowdown = 20.0;
#else
constexpr double kSlowdown = 1.0;
#endif
#else
constexpr double kSlowdown = 1.0;
#endif

template <class T>
const T& Pick(std::mt19937_64& rng, const std::vector<T>& from) {
  return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
}

std::vector<Override> RandomRecipe(std::mt19937_64& rng) {
  std::string pattern;
  const int letters = std::uniform_int_distribution<int>(1, 12)(rng);
  for (int i = 0; i < letters; ++i) pattern += Pick(rng, std::vector<char>{'A', 'M', 'E', 'D', 'R'});
  const auto n = [](int64_t v) { return std::to_string(v); };
  // Mostly shallow, sometimes thousands of layers.
  const int64_t repeat = std::uniform_int_distribution<int>(0, 9)(rng) == 0
                             ? std::uniform_int_distribution<int64_t>(100, 400)(rng)
                             : std::uniform_int_distribution<int64_t>(1, 16)(rng);
  return {
      {"model.pattern", pattern},
      {"model.repeat", n(repeat)},
      {"parallel.tp", n(Pick<int64_t>(rng, {1, 2, 4, 8}))},
      {"parallel.cp", n(Pick<int64_t>(rng, {1, 1, 2}))},
      {"parallel.pp", n(Pick<int64_t>(rng, {1, 2, 4, 8}))},
      {"parallel.vpp", n(Pick<int64_t>(rng, {1, 1, 2}))},
      {"parallel.ep", n(Pick<int64_t>(rng, {1, 2, 4, 8}))},
      {"parallel.zero", n(Pick<int64_t>(rng, {0, 1, 2, 3}))},
      {"training.recompute", Pick<std::string>(rng, {"none", "selective", "full"})},
      {"training.micro_batch", n(Pick<int64_t>(rng, {1, 2}))},
      {"cluster.nodes", n(Pick<int64_t>(rng, {1, 2, 4, 8, 16}))},
  };
}

// A NaN or infinity is written as null by nlohmann-json.
bool HasNull(const nlohmann::json& j) {
  if (j.is_null()) return true;
  if (j.is_structured()) {
    for (const auto& item : j) {
      if (HasNull(item)) return true;
    }
  }
  return false;
}

void ExpectRoundTrips(const std::string& text, const std::string& what) {
  const nlohmann::json parsed = nlohmann::json::parse(text);
  EXPECT_FALSE(HasNull(parsed)) << what << ": a null (NaN or infinity) in\n" << text.substr(0, 2000);
  EXPECT_EQ(nlohmann::json::parse(parsed.dump()), parsed) << what;
}

TEST(RandomRecipes, FitAndPlanFinishInLinearTimeAndTheirJsonRoundTrips) {
  const std::string base = testing::ReadFile(testing::SourcePath("recipes/nam56r-h200.yaml"));
  std::mt19937_64 rng(20261126);
  int valid = 0, priced = 0;
  constexpr int kRecipes = 120;
  for (int i = 0; i < kRecipes; ++i) {
    const std::vector<Override> overrides = RandomRecipe(rng);
    std::string what = "recipe " + std::to_string(i) + ":";
    for (const Override& o : overrides) what += " --set " + o.key_path + "=" + o.value;
    const LoadResult loaded = LoadRecipeFromString(base, "nam56r-h200.yaml", overrides);
    if (!loaded.ok()) continue;
    ++valid;
    const auto start = std::chrono::steady_clock::now();
    const Inventory inventory = BuildInventory(*loaded.recipe);
    const Layout layout = LayoutOf(*loaded.recipe);
    if (HasErrors(ValidateForPlan(*loaded.recipe, layout))) continue;
    const PlanResult result = MakePlan(inventory, layout);
    ASSERT_TRUE(result.plan || HasErrors(result.diagnostics)) << what;
    if (!result.plan) continue;
    ++priced;
    FitReport fit;
    fit.file = "nam56r-h200.yaml";
    fit.inventory = &inventory;
    fit.layout = layout;
    fit.stages = result.plan->stages;
    fit.balanced_cut = result.plan->balanced_cut;
    fit.estimate = *result.plan->memory;
    fit.advice = AdviseFit(inventory, layout, fit.stages);
    const std::string fit_json = FitJson(fit).dump(2);
    const std::string plan_json = RenderPlanJson(*loaded.recipe, *result.plan);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double layers = static_cast<double>(inventory.layer_count());
    EXPECT_LT(seconds, kSlowdown * (1.0 + 2e-3 * layers)) << what << ": " << layers << " layers";
    ExpectRoundTrips(fit_json, what + " (fit)");
    ExpectRoundTrips(plan_json, what + " (plan)");
  }
  RecordProperty("valid", valid);
  RecordProperty("priced", priced);
  // The generator must reach pricing often enough to test something.
  EXPECT_GE(valid, kRecipes / 4) << valid << " of " << kRecipes << " random recipes were valid";
  EXPECT_GE(priced, kRecipes / 5) << priced << " of " << kRecipes << " random recipes were priced";
}

}  // namespace
}  // namespace preflight::random_recipe_property_test

// The shipped recipes: every recipes/*.yaml validates, and the hand-written
// recipes of imported models describe exactly the model that `import hf`
// reads from the public config (same parameter tensors, layer by layer).
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/recipe/import.h"
#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::import_recipes_test {
namespace {

using testing::ReadFile;
using testing::SourcePath;

std::string Messages(const std::vector<Diagnostic>& ds) {
  std::string out;
  for (const auto& d : ds) out += Format(d) + "\n";
  return out;
}

std::vector<std::string> RecipeFiles() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(SourcePath("recipes"))) {
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Recipes, EveryRecipeValidatesWithoutWarnings) {
  const std::vector<std::string> files = RecipeFiles();
  // nam56r + the inventory's 4 + the importer's 4, at least.
  EXPECT_GE(files.size(), 9u);
  for (const std::string& f : files) {
    const LoadResult r = LoadRecipeFile(f);
    EXPECT_TRUE(r.ok()) << f << ":\n" << Messages(r.diagnostics);
    EXPECT_TRUE(r.diagnostics.empty()) << f << ":\n" << Messages(r.diagnostics);
  }
}

struct Pair {
  const char* recipe;
  const char* fixture;
};

const Pair kPairs[] = {
    {"recipes/qwen3-30b-a3b-h200.yaml", "tests/data/hf/qwen3-30b-a3b.json"},
    {"recipes/jamba-v0.1-h200.yaml", "tests/data/hf/jamba-v0.1.json"},
    {"recipes/nemotron-h-8b-h200.yaml", "tests/data/hf/nemotron-h-8b.json"},
    {"recipes/gpt-oss-120b-h200.yaml", "tests/data/hf/gpt-oss-120b.json"},
};

class RecipeMatchesImport : public ::testing::TestWithParam<Pair> {};

TEST_P(RecipeMatchesImport, SameTensorsLayerByLayer) {
  const Pair& p = GetParam();
  const LoadResult from_file = LoadRecipeFile(SourcePath(p.recipe));
  ASSERT_TRUE(from_file.ok()) << Messages(from_file.diagnostics);
  const HfImport imported = ImportHfConfig(ReadFile(SourcePath(p.fixture)), p.fixture);
  ASSERT_TRUE(imported.ok()) << Messages(imported.diagnostics);
  const LoadResult from_import = LoadRecipeFromString(EmitRecipeYaml(imported, {}, p.fixture, ""), "imported.yaml");
  ASSERT_TRUE(from_import.ok()) << Messages(from_import.diagnostics);
  const Inventory a = BuildInventory(*from_file.recipe);
  const Inventory b = BuildInventory(*from_import.recipe);
  EXPECT_EQ(a.total_params, b.total_params);
  EXPECT_EQ(a.active_params, b.active_params);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].kind, b.layers[i].kind) << "layer " << i;
    EXPECT_EQ(a.layers[i].totals.total(), b.layers[i].totals.total()) << "layer " << i;
  }
}

TEST_P(RecipeMatchesImport, FitsWithTheHeadroomFloor) {
  // The layouts were chosen to fit (see each recipe's comments); `preflight fit` must agree:
  // exit 0 is "fits every stage, with the recipe's headroom floor".
  const auto fit = testing::RunPreflight({"fit", GetParam().recipe});
  EXPECT_EQ(fit.exit_code, 0) << fit.out << fit.err;
}

INSTANTIATE_TEST_SUITE_P(All, RecipeMatchesImport, ::testing::ValuesIn(kPairs),
                         [](const auto& param_info) {
                           std::string n = std::filesystem::path(param_info.param.recipe).stem().string();
                           std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(c); }, '_');
                           return n;
                         });

}  // namespace
}  // namespace preflight::import_recipes_test

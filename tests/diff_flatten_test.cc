// FlattenRecipe/DifferingKeys: every flattened value, fed back as an
// override, reproduces the recipe (so attribution's one-key overrides mean
// what they say), and one changed key is found as exactly that key.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "preflight/report/diff.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::diff_flatten_test {
namespace {

std::vector<std::string> RepoRecipes() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(testing::SourcePath("recipes"))) {
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  }
  return out;
}

TEST(FlattenRecipe, ValuesReadBackAsOverridesForEveryRepoRecipe) {
  for (const std::string& path : RepoRecipes()) {
    const LoadResult base = LoadRecipeFile(path);
    ASSERT_TRUE(base.ok()) << path;
    std::vector<Override> all;
    for (const auto& [key, value] : FlattenRecipe(*base.recipe)) {
      if (key == "name") continue;
      all.push_back({key, value});
    }
    const LoadResult again = LoadRecipeFile(path, all);
    ASSERT_TRUE(again.ok()) << path << ": " << (again.diagnostics.empty() ? "" : Format(again.diagnostics[0]));
    EXPECT_TRUE(DifferingKeys(*base.recipe, *again.recipe).empty()) << path;
  }
}

TEST(DifferingKeys, OneOverrideIsOneChange) {
  const std::string path = testing::SourcePath("recipes/nam56r-h200.yaml");
  const LoadResult a = LoadRecipeFile(path);
  const LoadResult b = LoadRecipeFile(path, {{"training.recompute", "full"}});
  ASSERT_TRUE(a.ok() && b.ok());
  const auto changes = DifferingKeys(*a.recipe, *b.recipe);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "training.recompute");
  EXPECT_EQ(changes[0].before, "selective");
  EXPECT_EQ(changes[0].after, "full");
}

TEST(DifferingKeys, OptionalSectionPresentOnlyInB) {
  const std::string path = testing::SourcePath("recipes/nam56r-h200.yaml");
  const LoadResult a = LoadRecipeFile(path);
  const LoadResult b = LoadRecipeFile(path, {{"serving", "{batch: 8, context: 4096}"}});
  ASSERT_TRUE(a.ok() && b.ok()) << (b.diagnostics.empty() ? "" : Format(b.diagnostics[0]));
  const auto changes = DifferingKeys(*a.recipe, *b.recipe);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "serving");
  EXPECT_EQ(changes[0].before, "(absent)");
  EXPECT_EQ(changes[0].after, "{batch: 8, context: 4096, kv_dtype: bf16, ssm_dtype: fp32}");
}

}  // namespace
}  // namespace preflight::diff_flatten_test

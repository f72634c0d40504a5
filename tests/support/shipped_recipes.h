// The recipes shipped in recipes/, for tests that run each of them.
#pragma once

#include <cctype>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::testing {

/// The shipped recipes' names (recipes/<name>.yaml), for ::testing::ValuesIn.
inline constexpr const char* kShippedRecipes[] = {
    "deepseek-v3-h200", "gpt-oss-120b-h200", "jamba-v0.1-h200", "llama3-405b-h200",   "llama3-8b-h200",
    "mamba2-2.7b-h200", "mixtral-8x7b-h200", "nam56r-h200",     "nemotron-h-8b-h200", "qwen3-30b-a3b-h200"};

/// A test name for a recipe name (letters and digits, the rest '_').
inline std::string RecipeTestName(const ::testing::TestParamInfo<const char*>& param) {
  std::string name = param.param;
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

/// A recipe of the source tree, loaded (the test fails when it does not load).
inline Recipe LoadSourceRecipe(const std::string& relative) {
  LoadResult r = LoadRecipeFile(SourcePath(relative));
  EXPECT_TRUE(r.ok()) << relative;
  return *r.recipe;
}

/// The default sweep space of an inventory built by SweepRecipe on its own
/// cluster (micro-batch 1 and 2, to keep tests short), swept on two threads,
/// and its rows that reach pricing (indices into result.rows).
struct SweptSpace {
  SweepResult result;
  std::vector<size_t> valid;
};
inline SweptSpace SweepDefaultSpace(const Inventory& inv) {
  SweepSpace s;
  s.gpus = inv.recipe.world();
  s.micro_batch = {1, 2};
  s = DefaultSweepSpace(inv.recipe, s);
  SweepOptions options;
  options.threads = 2;
  SweptSpace out;
  out.result = RunSweep(inv, s, options);
  for (size_t i = 0; i < out.result.rows.size(); ++i) {
    if (out.result.rows[i].status != SweepStatus::kInvalid) out.valid.push_back(i);
  }
  return out;
}

}  // namespace preflight::testing

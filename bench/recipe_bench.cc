// Time to load and to re-validate a recipe. Loading is paid once per command;
// ValidateRecipe is what a sweep pays per candidate layout when it reuses the
// parser's checks instead of restating them.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "preflight/recipe.h"

namespace {

std::string ReadOrDie(const std::string& relative) {
  std::ifstream in(std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative);
  if (!in) std::abort();  // a missing checked-in recipe is a bug, not a measurement
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The default recipe from text (no disk in the loop): YAML parse, typed read,
// layer expansion and every semantic check.
void BM_LoadDefaultRecipe(benchmark::State& state) {
  const std::string yaml = ReadOrDie("recipes/nam56r-h200.yaml");
  for (auto _ : state) {
    preflight::LoadResult result = preflight::LoadRecipeFromString(yaml, "nam56r-h200.yaml");
    benchmark::DoNotOptimize(result.recipe);
  }
}
BENCHMARK(BM_LoadDefaultRecipe);

// Re-validating a valid layout (no diagnostics to format).
void BM_ValidateValidLayout(benchmark::State& state) {
  const preflight::LoadResult loaded = preflight::LoadRecipeFromString(ReadOrDie("recipes/nam56r-h200.yaml"), "r.yaml");
  if (!loaded.ok()) std::abort();
  for (auto _ : state) {
    std::vector<preflight::Diagnostic> ds = preflight::ValidateRecipe(*loaded.recipe);
    benchmark::DoNotOptimize(ds);
  }
}
BENCHMARK(BM_ValidateValidLayout);

// Re-validating an invalid layout (tp 3): the diagnostics and their "try"
// suggestions are formatted.
void BM_ValidateInvalidLayout(benchmark::State& state) {
  const preflight::LoadResult loaded = preflight::LoadRecipeFromString(ReadOrDie("recipes/nam56r-h200.yaml"), "r.yaml");
  if (!loaded.ok()) std::abort();
  preflight::Recipe recipe = *loaded.recipe;
  recipe.parallel.tp = 3;
  for (auto _ : state) {
    std::vector<preflight::Diagnostic> ds = preflight::ValidateRecipe(recipe);
    benchmark::DoNotOptimize(ds);
  }
}
BENCHMARK(BM_ValidateInvalidLayout);

}  // namespace

BENCHMARK_MAIN();

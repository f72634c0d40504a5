// Time to load and to re-validate a recipe. Loading is paid once per command;
// ValidateRecipe is what a sweep pays per candidate layout when it reuses the
// parser's checks instead of restating them. `--set` overrides add one small
// YAML parse each; the hostile inputs show the cost of rejecting input at the
// bounds (4 MiB of YAML, 100000 layers, 100k-deep nesting).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace {

std::string ReadOrDie(const std::string& relative) {
  std::ifstream in(std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative);
  if (!in) std::abort();  // a missing checked-in recipe is a bug, not a measurement
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void LoadLoop(benchmark::State& state, const std::string& yaml, const std::vector<preflight::Override>& overrides,
              bool expect_ok) {
  for (auto _ : state) {
    preflight::LoadResult r = preflight::LoadRecipeFromString(yaml, "bench.yaml", overrides);
    if (r.ok() != expect_ok) std::abort();
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(yaml.size()));
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

// The same with three `--set` overrides, as a sweep script would pass them.
void BM_LoadDefaultRecipeWithOverrides(benchmark::State& state) {
  std::vector<preflight::Override> overrides;
  for (const char* text : {"parallel.tp=2", "training.micro_batch=2", "training.recompute=full"}) {
    overrides.push_back(*preflight::ParseOverride(text));
  }
  LoadLoop(state, ReadOrDie("recipes/nam56r-h200.yaml"), overrides, true);
}
BENCHMARK(BM_LoadDefaultRecipeWithOverrides);

// The largest checked-in recipe: DeepSeek-V3 (MLA, 256 experts, 122 sublayers).
void BM_LoadDeepSeekV3(benchmark::State& state) {
  LoadLoop(state, ReadOrDie("recipes/deepseek-v3-h200.yaml"), {}, true);
  state.SetLabel("deepseek-v3-h200");
}
BENCHMARK(BM_LoadDeepSeekV3);

// A pattern at the 100000-layer bound: layer expansion and validation at full size.
void BM_LoadHundredThousandLayers(benchmark::State& state) {
  std::string yaml = "model:\n  repeat: 1\n  pattern: ";
  for (int i = 0; i < 25'000; ++i) yaml += "AMED";
  yaml += "\nparallel: {tp: 1, pp: 1}\n";
  LoadLoop(state, yaml, {}, true);
}
BENCHMARK(BM_LoadHundredThousandLayers);

// Rejection at the file-size bound: almost 4 MiB of unknown keys (capped at
// 100 diagnostics) and of a 100k-deep flow sequence (yaml-cpp's depth guard).
void BM_RejectFourMegabytesOfUnknownKeys(benchmark::State& state) {
  std::string yaml;
  for (int i = 0; yaml.size() < (size_t{4} << 20) - 64; ++i) yaml += "unknown_key_" + std::to_string(i) + ": 1\n";
  LoadLoop(state, yaml, {}, false);
}
BENCHMARK(BM_RejectFourMegabytesOfUnknownKeys)->Unit(benchmark::kMillisecond);

void BM_RejectDeepNesting(benchmark::State& state) {
  const std::string yaml = "model: " + std::string(100'000, '[') + std::string(100'000, ']') + "\n";
  LoadLoop(state, yaml, {}, false);
}
BENCHMARK(BM_RejectDeepNesting)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

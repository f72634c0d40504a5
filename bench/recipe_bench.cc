// Time to parse and validate a recipe (text already in memory, so the disk
// is not measured). `fit`, `plan` and `check` pay this once per recipe;
// `--set` overrides add one small YAML parse each. The hostile inputs show
// the cost of rejecting input at the bounds (4 MiB of YAML, 100000 layers).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "preflight/recipe.h"

namespace {

std::string ReadOrDie(const std::string& relative) {
  std::ifstream in(std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) std::abort();  // a missing checked-in recipe is a bug, not a measurement
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

// The default recipe: 48 layers (AEMEAEMEAEMR x 4), every section present.
void BM_LoadDefaultRecipe(benchmark::State& state) {
  LoadLoop(state, ReadOrDie("recipes/nam56r-h200.yaml"), {}, true);
  state.SetLabel("nam56r-h200");
}
BENCHMARK(BM_LoadDefaultRecipe);

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

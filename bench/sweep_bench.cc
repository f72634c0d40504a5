// Layouts evaluated per second by `preflight sweep` (include/preflight/sweep.h):
// validation (ValidateRecipe + ValidateForPlan), mesh locality, partition,
// memory of every pipeline rank and step time. Counter `layouts/s` is wall
// clock (the sweep is multi-threaded); see bench/README.md for the figures.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "preflight/planner/sweep.h"

namespace {

using namespace preflight;

Recipe SweepRecipeOrDie(const std::string& relative, int64_t gpus) {
  const LoadResult r = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative);
  std::string error;
  auto recipe = r.ok() ? SweepRecipe(*r.recipe, gpus, &error) : std::nullopt;
  if (!recipe) {
    std::fprintf(stderr, "cannot load %s: %s\n", relative.c_str(), error.c_str());
    std::exit(1);
  }
  return *recipe;
}

void RunSpace(benchmark::State& state, const Inventory& inv, const SweepSpace& space, int64_t threads) {
  SweepOptions options;
  options.threads = threads;
  int64_t rows = 0;
  for (auto _ : state) {
    const SweepResult result = RunSweep(inv, space, options);
    rows += static_cast<int64_t>(result.rows.size());
    benchmark::DoNotOptimize(result.top.data());
  }
  state.counters["layouts"] = static_cast<double>(SweepSize(space));
  state.counters["layouts/s"] = benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsRate);
  state.counters["threads"] = static_cast<double>(threads);
}

// The whole default space of the default hybrid recipe (NAM56R: 48 layers,
// MoE with 64 experts, Mamba, attention) on a 1024-GPU (128-node) cluster.
void BM_SweepDefault1024(benchmark::State& state) {
  static const Inventory inv = BuildInventory(SweepRecipeOrDie("recipes/nam56r-h200.yaml", 1024));
  SweepSpace space;
  space.gpus = 1024;
  space = DefaultSweepSpace(inv.recipe, space);
  const int64_t threads = state.range(0) > 0 ? state.range(0) : std::thread::hardware_concurrency();
  RunSpace(state, inv, space, threads);
}
BENCHMARK(BM_SweepDefault1024)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// Llama 3 405B (dense, 126 layers) on 1024 GPUs, default space.
void BM_SweepLlama405bDefault1024(benchmark::State& state) {
  static const Inventory inv = BuildInventory(SweepRecipeOrDie("recipes/llama3-405b-h200.yaml", 1024));
  SweepSpace space;
  space.gpus = 1024;
  space = DefaultSweepSpace(inv.recipe, space);
  RunSpace(state, inv, space, std::thread::hardware_concurrency());
}
BENCHMARK(BM_SweepLlama405bDefault1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();

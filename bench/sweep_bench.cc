// Layouts evaluated per second by `preflight sweep` (include/preflight/sweep.h):
// validation (ValidateRecipe + ValidateForPlan), mesh locality, partition,
// memory of every pipeline rank and step time. Counter `layouts/s` is wall
// clock (the sweep is multi-threaded); `priced/s` (BM_SweepRecipe, one
// thread, CPU time) counts only the layouts that reach pricing (issue #17's
// figure). See bench/README.md for the figures.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/recipe.h"

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

// Rows that reached pricing: every row but the invalid ones.
int64_t PricedRows(const SweepResult& result) {
  return static_cast<int64_t>(result.rows.size()) - result.CountOf(SweepStatus::kInvalid);
}

// One recipe's default space on `gpus` GPUs (0: the recipe's own cluster).
// With one thread the calling thread does all the work, so the rate counters
// (divided by CPU time: no UseRealTime) are per core.
void BM_SweepRecipe(benchmark::State& state, const std::string& relative, int64_t gpus, int64_t threads) {
  const LoadResult loaded = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative);
  if (!loaded.ok()) {
    state.SkipWithError("cannot load the recipe");
    return;
  }
  const int64_t world = gpus > 0 ? gpus : loaded.recipe->world();
  const Inventory inv = BuildInventory(SweepRecipeOrDie(relative, world));
  SweepSpace space;
  space.gpus = world;
  space = DefaultSweepSpace(inv.recipe, space);
  SweepOptions options;
  options.threads = threads;
  int64_t rows = 0, priced = 0;
  for (auto _ : state) {
    const SweepResult result = RunSweep(inv, space, options);
    rows += static_cast<int64_t>(result.rows.size());
    priced += PricedRows(result);
    benchmark::DoNotOptimize(result.top.data());
  }
  state.counters["gpus"] = static_cast<double>(world);
  state.counters["layouts"] = static_cast<double>(SweepSize(space));
  state.counters["priced"] = static_cast<double>(priced) / static_cast<double>(state.iterations());
  state.counters["layouts/s"] = benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsRate);
  state.counters["priced/s"] = benchmark::Counter(static_cast<double>(priced), benchmark::Counter::kIsRate);
}

// Every shipped recipe on its own cluster, one thread; then the two largest
// spaces issue #17 names (a 405B dense and a DeepSeek-V3 MoE on 16,384 GPUs)
// on one thread and on two (wall time).
const bool kRecipeBenchmarks = [] {
  const std::vector<std::string> recipes = {
      "deepseek-v3-h200", "gpt-oss-120b-h200", "jamba-v0.1-h200", "llama3-405b-h200",   "llama3-8b-h200",
      "mamba2-2.7b-h200", "mixtral-8x7b-h200", "nam56r-h200",     "nemotron-h-8b-h200", "qwen3-30b-a3b-h200"};
  for (const std::string& name : recipes) {
    benchmark::RegisterBenchmark(("BM_SweepRecipe/" + name).c_str(), BM_SweepRecipe, "recipes/" + name + ".yaml",
                                 int64_t{0}, int64_t{1})
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  for (const char* name : {"llama3-405b-h200", "deepseek-v3-h200"}) {
    const std::string path = std::string("recipes/") + name + ".yaml";
    benchmark::RegisterBenchmark((std::string("BM_SweepRecipe16384/") + name).c_str(), BM_SweepRecipe, path,
                                 int64_t{16384}, int64_t{1})
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
    benchmark::RegisterBenchmark((std::string("BM_SweepRecipe16384Wall2/") + name).c_str(), BM_SweepRecipe, path,
                                 int64_t{16384}, int64_t{2})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(1);
  }
  return true;
}();

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

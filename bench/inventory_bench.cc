// Time to build the inventory of a recipe. The inventory is built once per
// recipe and priced for every layout of a sweep, so this is paid once per
// `fit`/`plan`/`sweep` run; the pricing loop only reads its prefix sums.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"

namespace {

preflight::Recipe LoadOrDie(const std::string& relative) {
  const std::string path = std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative;
  preflight::LoadResult loaded = preflight::LoadRecipeFile(path);
  if (!loaded.ok()) std::abort();  // a broken checked-in recipe is a bug, not a measurement
  return *loaded.recipe;
}

// The default recipe: 48 layers (AEMEAEMEAEMR x 4), 64 experts.
void BM_BuildInventoryDefault(benchmark::State& state) {
  const preflight::Recipe recipe = LoadOrDie("recipes/nam56r-h200.yaml");
  for (auto _ : state) {
    preflight::Inventory inv = preflight::BuildInventory(recipe);
    benchmark::DoNotOptimize(inv.total_params);
  }
  state.SetLabel("nam56r-h200");
}
BENCHMARK(BM_BuildInventoryDefault);

// The largest checked-in recipe: DeepSeek-V3, 122 sublayers.
void BM_BuildInventoryDeepSeekV3(benchmark::State& state) {
  const preflight::Recipe recipe = LoadOrDie("recipes/deepseek-v3-h200.yaml");
  for (auto _ : state) {
    preflight::Inventory inv = preflight::BuildInventory(recipe);
    benchmark::DoNotOptimize(inv.total_params);
  }
  state.SetLabel("deepseek-v3-h200");
}
BENCHMARK(BM_BuildInventoryDeepSeekV3);

// What pricing one pipeline stage costs once the inventory exists: O(1) range sums.
void BM_RangeTotals(benchmark::State& state) {
  const preflight::Inventory inv = preflight::BuildInventory(LoadOrDie("recipes/nam56r-h200.yaml"));
  const int64_t layers = static_cast<int64_t>(inv.layers.size());
  int64_t first = 0;
  for (auto _ : state) {
    const preflight::ParamTotals t = inv.RangeTotals(first, layers);
    benchmark::DoNotOptimize(t);
    first = (first + 1) % layers;
  }
}
BENCHMARK(BM_RangeTotals);

}  // namespace

BENCHMARK_MAIN();

// Speed of the capacity model on the default recipe (recipes/nam56r-h200.yaml).
// Target: a full EstimateMemory (every pipeline rank + verdict) well under
// 50 us, so sweeps can price millions of layouts.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <benchmark/benchmark.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"

namespace preflight {
namespace {

const Inventory& DefaultInventory() {
  static const Inventory inv = [] {
    const LoadResult loaded = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/nam56r-h200.yaml");
    if (!loaded.ok()) {
      std::fprintf(stderr, "estimate_bench: cannot load the default recipe\n");
      std::exit(2);
    }
    return BuildInventory(*loaded.recipe);
  }();
  return inv;
}

void BM_EstimateMemoryDefault(benchmark::State& state) {
  const Inventory& inv = DefaultInventory();
  const Layout layout = LayoutOf(inv.recipe);
  const StagePlan plan = EqualStagePlan(static_cast<int64_t>(inv.layers.size()), layout.pp, layout.vpp);
  for (auto _ : state) benchmark::DoNotOptimize(EstimateMemory(inv, layout, plan));
}
BENCHMARK(BM_EstimateMemoryDefault);

void BM_EstimateRankDefault(benchmark::State& state) {
  const Inventory& inv = DefaultInventory();
  const Layout layout = LayoutOf(inv.recipe);
  const StagePlan plan = EqualStagePlan(static_cast<int64_t>(inv.layers.size()), layout.pp, layout.vpp);
  for (auto _ : state) benchmark::DoNotOptimize(EstimateRank(inv, layout, plan, 0));
}
BENCHMARK(BM_EstimateRankDefault);

// The longest walk: pp 1 (all 48 layers on one rank) under ZeRO-3, every
// layer offered as a gather unit.
void BM_EstimateRankAllLayersZero3(benchmark::State& state) {
  const Inventory& inv = DefaultInventory();
  Layout layout = LayoutOf(inv.recipe);
  layout.pp = 1;
  layout.dp *= 4;
  layout.zero = 3;
  const StagePlan plan = EqualStagePlan(static_cast<int64_t>(inv.layers.size()), 1, 1);
  for (auto _ : state) benchmark::DoNotOptimize(EstimateRank(inv, layout, plan, 0));
}
BENCHMARK(BM_EstimateRankAllLayersZero3);

void BM_ExplainRankDefault(benchmark::State& state) {
  const Inventory& inv = DefaultInventory();
  const Layout layout = LayoutOf(inv.recipe);
  const StagePlan plan = EqualStagePlan(static_cast<int64_t>(inv.layers.size()), layout.pp, layout.vpp);
  for (auto _ : state) benchmark::DoNotOptimize(ExplainRank(inv, layout, plan, 0));
}
BENCHMARK(BM_ExplainRankDefault);

}  // namespace
}  // namespace preflight

BENCHMARK_MAIN();

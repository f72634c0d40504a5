// Speed of the planner's per-layout pricing (plan.h speed contract): a sweep
// prices millions of layouts from one inventory and cached mesh locality.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"

namespace {

using namespace preflight;

const Inventory& DefaultInventory() {
  static const Inventory inv = [] {
    const LoadResult r = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/nam56r-h200.yaml");
    if (!r.ok()) {
      std::fprintf(stderr, "cannot load the default recipe\n");
      std::exit(1);
    }
    return BuildInventory(*r.recipe);
  }();
  return inv;
}

// Partition + communication + step time of one layout (tables and locality precomputed).
void BM_PriceLayout(benchmark::State& state) {
  const Inventory& inv = DefaultInventory();
  const PlanTables tables = BuildPlanTables(inv);
  const Layout layout = LayoutOf(inv.recipe);
  const MeshLocality locality = PlaceRanks(layout, inv.recipe.cluster.gpus_per_node).locality;
  const CostModel cost;
  for (auto _ : state) {
    const StagePlan stages = PartitionStages(WeighLayers(inv, tables, layout, cost), layout);
    std::vector<StageComm> comm = BuildStageComm(inv, tables, layout, stages, locality, cost);
    const StepTime t = EstimateStepTime(inv, tables, layout, stages, &comm, cost);
    benchmark::DoNotOptimize(t.step_s);
  }
}
BENCHMARK(BM_PriceLayout);

// Building the per-layer tables: once per inventory.
void BM_BuildPlanTables(benchmark::State& state) {
  const Inventory& inv = DefaultInventory();
  for (auto _ : state) benchmark::DoNotOptimize(BuildPlanTables(inv).layers);
}
BENCHMARK(BM_BuildPlanTables);

// Full placement with every group listed, by world size (8 GPUs a node).
void BM_PlaceRanks(benchmark::State& state) {
  Layout l;
  l.tp = 8;
  l.pp = 16;
  l.dp = state.range(0) / 128;
  l.order = AxisOrder::kTpCpPpDp;
  for (auto _ : state) benchmark::DoNotOptimize(PlaceRanks(l, 8).world);
}
BENCHMARK(BM_PlaceRanks)->Arg(128)->Arg(2048)->Arg(16384);

}  // namespace

BENCHMARK_MAIN();

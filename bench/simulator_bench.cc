// Time of one simulated training step of the scaled default recipe on its
// full layout (64 simulated ranks: tp 4 with SP, pp 4 1F1B, dp 4, ep 8,
// ZeRO 1, Muon + AdamW; every block family), plus the unsharded reference
// step, and its GFLOP/s; and the comparison with the planner and estimator.
#include <benchmark/benchmark.h>

#include <string>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"

namespace {

preflight::Recipe BenchRecipe(int64_t hidden, int64_t seq) {
  const preflight::LoadResult loaded =
      preflight::LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/nam56r-h200.yaml");
  if (!loaded.ok()) return preflight::Recipe{};
  preflight::ScaleOptions s;
  s.hidden = hidden;
  s.ffn_hidden = hidden;
  s.moe_ffn_hidden = hidden / 2;
  s.seq_len = seq;
  s.recurrent_width = 2 * hidden;
  return preflight::ScaleRecipe(*loaded.recipe, s);
}

void BM_SimulateDefaultRecipe(benchmark::State& state) {
  const preflight::Recipe r = BenchRecipe(state.range(0), state.range(1));
  double flops = 0;
  for (auto _ : state) {
    const preflight::SimulationReport rep = preflight::Simulate(r);
    flops = rep.flops;
    benchmark::DoNotOptimize(rep.loss.max_rel);
  }
  // FLOPs of the sharded run's matrix products and Newton-Schulz steps (all
  // ranks); the reference run does the same work again, so the step's total
  // is about twice this.
  state.counters["GFLOP_sharded"] = flops / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(2 * flops * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
// Args: hidden, seq_len (the default scale is 32, 16).
BENCHMARK(BM_SimulateDefaultRecipe)->Args({32, 16})->Args({64, 32})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CompareDefaultRecipe(benchmark::State& state) {
  const preflight::Recipe r = BenchRecipe(32, 16);
  const preflight::SimulationReport rep = preflight::Simulate(r);
  for (auto _ : state) {
    const preflight::SimComparison c = preflight::CompareWithModels(r, rep, preflight::SimPrecision::kFp64);
    benchmark::DoNotOptimize(c.numerics_ok);
  }
}
BENCHMARK(BM_CompareDefaultRecipe)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

// Time of one simulated training step (forward + backward on every simulated
// rank, plus the unsharded reference and the comparison) and its GFLOP/s.
//
// Until M and R blocks exist in the executor (part 2), the default recipe
// cannot run; the benchmark uses its A/E part: the default recipe's pattern
// with M and R replaced by D (AEDEAEDEAEDD), scaled by ScaleRecipe, at the
// default layout's TP = 4 with SP, and EP 2 / EP 4 folded inside TP.
#include <benchmark/benchmark.h>

#include <string>

#include "preflight/recipe.h"
#include "preflight/sim.h"

namespace {

preflight::Recipe BenchRecipe(int64_t ep, int64_t hidden, int64_t seq) {
  const preflight::LoadResult loaded = preflight::LoadRecipeFile(
      std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/nam56r-h200.yaml",
      {{"model.pattern", "AEDEAEDEAEDD"}, {"parallel.ep", std::to_string(ep)}, {"parallel.pp", "1"}});
  if (!loaded.ok()) return preflight::Recipe{};
  preflight::ScaleOptions s;
  s.hidden = hidden;
  s.ffn_hidden = 2 * hidden;
  s.moe_ffn_hidden = hidden / 2;
  s.seq_len = seq;
  s.vocab = 256;
  return preflight::ScaleRecipe(*loaded.recipe, s);
}

void BM_SimulateScaledDefault(benchmark::State& state) {
  const preflight::Recipe r = BenchRecipe(state.range(0), state.range(1), state.range(2));
  double flops = 0;
  for (auto _ : state) {
    const preflight::SimulationReport rep = preflight::Simulate(r);
    flops = rep.flops;
    benchmark::DoNotOptimize(rep.loss.max_rel);
  }
  // FLOPs of the sharded run's matrix products (all ranks); the reference
  // run does the same work again, so the step's total is about twice this.
  state.counters["GFLOP_sharded"] = flops / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(2 * flops * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
// Args: ep, hidden, seq_len (tp = 4 from the recipe).
BENCHMARK(BM_SimulateScaledDefault)->Args({2, 32, 16})->Args({4, 32, 16})->Args({4, 64, 32})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

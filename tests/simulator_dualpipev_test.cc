// DualPipeV in the executor: the scaled DeepSeek-V3 recipe on the V-shaped
// schedule (simulator/schedule.cc), numerics against one rank, p2p bytes
// against plan and per-chunk activations against fit's replay of the same
// order (estimator ReplayDualPipeV), with routing padded to capacity so the
// MoE activations compare exactly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_dualpipev_test {
namespace {

Recipe ScaledDualPipeV(int64_t pp, std::vector<Override> more) {
  std::vector<Override> sets = {
      {"parallel.schedule", "dualpipev"},  {"parallel.pp", std::to_string(pp)}, {"parallel.ep", "4"},
      {"model.mtp_layers", "0"},           {"model.moe.dropless", "false"},     {"model.moe.pad_to_capacity", "true"},
      {"model.moe.capacity_factor", "1.0"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml", sets, /*max_world=*/4 * pp);
}

TEST(SimulatorDualPipeV, TwoStagesAgree) {
  const Recipe r = ScaledDualPipeV(2, {});
  const SimComparison c = testing_sim::ExpectStepAgrees(r);
  // 2p + 1 = 5 chunk-micro-batches in flight on every rank (the README's PP + 1, PP = 2p).
  for (const StageComparison& s : c.stages)
    EXPECT_EQ(testing_sim::FindMemory(s, "in-flight micro-batches").measured, 5);
}

TEST(SimulatorDualPipeV, FourStagesWithUnequalChunksAgree) {
  // 2p = 8 chunks of the scaled stack: the ends make rank 0's two chunks
  // unequal, where a fixed (p+1, p) split of the in-flight micro-batches
  // misprices the rank's activations.
  const SimComparison c = testing_sim::ExpectStepAgrees(ScaledDualPipeV(4, {}));
  for (const StageComparison& s : c.stages)
    EXPECT_EQ(testing_sim::FindMemory(s, "in-flight micro-batches").measured, 9);
}

TEST(SimulatorDualPipeV, TensorParallelAgrees) {
  testing_sim::ExpectStepAgrees(ScaledDualPipeV(2, {{"parallel.tp", "2"}, {"parallel.sp", "true"}}));
}

}  // namespace
}  // namespace preflight::simulator_dualpipev_test

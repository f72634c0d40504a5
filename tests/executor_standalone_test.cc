// The executor core links alone: this test is built against preflight_executor
// only (tests/CMakeLists.txt), never the estimator or the planner, and runs a
// pipelined step with a partition it gives itself. If executor code ever
// called estimator or planner code, this test would fail to link.
#include <gtest/gtest.h>

#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"

namespace preflight::executor_standalone_test {
namespace {

TEST(ExecutorStandalone, RunsATensorAndPipelineParallelStepWithoutThePlanner) {
  const LoadResult loaded = LoadRecipeFromString(R"(name: standalone
model: {pattern: "ADAD", repeat: 1, hidden: 16, vocab: 32,
        attention: {heads: 4, kv_heads: 2, head_dim: 4}, mlp: {ffn_hidden: 16}}
training: {seq_len: 8, micro_batch: 1, global_batch: 4, recompute: none,
           optimizer: {matrices: adamw, other: adamw}}
parallel: {tp: 2, sp: true, pp: 2, zero: 0}
cluster: {nodes: 1, gpus_per_node: 4}
)",
                                                 "standalone.yaml");
  ASSERT_TRUE(loaded.recipe.has_value());
  const Recipe& r = *loaded.recipe;
  // Two layers a stage: the cut a user would pin, given here directly.
  const StagePlan stages = EqualStagePlan(4, 2, 1);
  const SimulationReport rep = RunExecutor(r, stages);
  EXPECT_EQ(rep.ranks, 4);
  EXPECT_TRUE(NumericsAgree(rep, ToleranceFor(SimPrecision::kFp64)));
  EXPECT_LT(rep.worst_gradient.max_rel, 1e-10);
}

}  // namespace
}  // namespace preflight::executor_standalone_test

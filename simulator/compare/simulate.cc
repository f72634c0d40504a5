// The simulate driver: asks the planner for the stage partition that `fit`
// and `plan` price, then runs the executor core on it. The core itself never
// reads the planner or the estimator (CMake: preflight_executor links
// neither); only this folder sees both sides.
#include <string>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/simulator/sim.h"

namespace preflight {

StagePlan SimulatedStages(const Recipe& recipe) {
  const Inventory inventory = BuildInventory(recipe);
  const auto layers = static_cast<int64_t>(inventory.layers.size());
  if (recipe.parallel.pp * recipe.parallel.vpp == 1) return EqualStagePlan(layers, 1, 1);
  const PlanResult plan = MakePlan(inventory, LayoutOf(recipe));
  if (!plan.plan) {
    throw SimUnsupported("the planner cannot place this layout: " +
                         (plan.diagnostics.empty() ? std::string("no plan") : plan.diagnostics.front().message));
  }
  return plan.plan->stages;
}

SimulationReport Simulate(const Recipe& recipe, const SimOptions& options) {
  return RunExecutor(recipe, SimulatedStages(recipe), options);
}

}  // namespace preflight

// What every fuzz target does with a recipe that loaded: build its inventory,
// validate the layout for the planner, and price it as `fit` and `plan` do
// (MakePlan: placement, partition, communication, step time, per-stage
// memory), checking the library's promises on the way. Counts how far inputs
// get, printed at exit, so a run shows the share that reached pricing.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight::fuzz {

struct Reach {
  long inputs = 0;    // inputs tried
  long recipes = 0;   // that loaded as a valid recipe
  long priced = 0;    // that MakePlan priced
  long overflow = 0;  // refused with ArithmeticOverflow (a clear error)
};

inline Reach& Counts() {
  static Reach reach;
  return reach;
}

inline void PrintReach() {
  const Reach& r = Counts();
  const double n = r.inputs > 0 ? static_cast<double>(r.inputs) : 1.0;
  std::fprintf(stderr, "fuzz reach: %ld inputs, %ld valid recipes (%.1f %%), %ld priced (%.1f %%), %ld overflow\n",
               r.inputs, r.recipes, 100.0 * static_cast<double>(r.recipes) / n, r.priced,
               100.0 * static_cast<double>(r.priced) / n, r.overflow);
}

/// Registers PrintReach at exit; call once from LLVMFuzzerInitialize.
inline void ReportReachAtExit() { std::atexit(PrintReach); }

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
  std::abort();
}

inline bool NonNegative(const MemoryEstimate& estimate) {
  for (const RankMemory& rank : estimate.stages) {
    for (const Bytes b : rank.bytes) {
      if (b.count() < 0) return false;
    }
  }
  return true;
}

/// Prices a loaded recipe. Promises: no exception but ArithmeticOverflow
/// escapes; a layout the planner refuses has an error diagnostic; a priced
/// plan has a finite, positive step time and no negative memory figure.
inline void Price(const Recipe& recipe) {
  ++Counts().recipes;
  try {
    const Inventory inventory = BuildInventory(recipe);
    if (inventory.total_params < 0) Fail("negative parameter count");
    const Layout layout = LayoutOf(recipe);
    if (HasErrors(ValidateForPlan(recipe, layout))) return;
    const PlanResult result = MakePlan(inventory, layout);
    if (!result.plan) {
      if (!HasErrors(result.diagnostics)) Fail("no plan and no error");
      return;
    }
    const Plan& plan = *result.plan;
    if (!(std::isfinite(plan.time.step_s) && plan.time.step_s > 0)) Fail("step time not finite and positive");
    if (!plan.memory || !NonNegative(*plan.memory)) Fail("a plan without memory or a negative memory figure");
    ++Counts().priced;
  } catch (const ArithmeticOverflow&) {
    ++Counts().overflow;  // the CLI turns it into exit 2
  }
}

}  // namespace preflight::fuzz

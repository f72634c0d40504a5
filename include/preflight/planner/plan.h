// The planner's front door, `preflight plan`: MakePlan places the ranks
// (mesh.h), cuts the stages (stages.h), prices communication (comm.h) and step
// time (step_time.h) on the per-layer tables (tables.h), and asks the estimator
// for each stage's memory. Include the concern's own header where only that
// is needed.
//
// Speed contract: BuildPlanTables walks the inventory once; every pricing
// function after it (PartitionStages on tables, BuildStageComm, EstimateStepTime)
// is arithmetic on those tables, with no I/O and no allocation beyond its
// result vectors, so a sweep can price millions of layouts. PlaceRanks lists
// every rank and group (O(world)); a sweep caches its MeshLocality per
// (degrees, order) instead of re-placing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/collectives.h"
#include "preflight/planner/comm.h"
#include "preflight/planner/mesh.h"
#include "preflight/planner/stages.h"
#include "preflight/planner/step_time.h"
#include "preflight/planner/tables.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Everything the plan prices for one layout. Warnings (groups crossing
/// nodes, forced SP) go in `warnings`.
/// A balanced cut on layer boundaries that beats the framework's (or the
/// pinned) partition: advice, never priced silently in its place.
struct BalancedCut {
  std::string basis;   // "time", "parameters" or "equal_layers"
  StagePlan stages;    // sublayer ranges, as Plan::stages
  Bytes worst_before;  // worst stage's device total under the plan's partition
  Bytes worst_after;   // and under this cut
  double step_before_s = 0;
  double step_after_s = 0;
  bool fits_after = false;
};

struct Plan {
  std::string name;               // the recipe's name
  Layout layout;
  Mesh mesh;
  StagePlan stages;
  bool stages_pinned = false;
  /// Which cut MakePlan took: "pinned", the framework's rule ("megatron",
  /// "torchtitan"), or with parallel.partition: balanced "time" (the
  /// partitioner's) or, when that one does not fit, "parameters" or
  /// "equal_layers".
  std::string partition = "time";
  /// Under a framework or pinned partition: a balanced cut worth telling.
  std::optional<BalancedCut> balanced_cut;
  std::vector<StageComm> comm;    // one per pipeline rank
  StepTime time;
  CostModel cost;
  GpuSpec gpu;
  /// Per-stage memory from the estimator for `stages` (MakePlan fills it;
  /// the pricing functions never need it).
  std::optional<MemoryEstimate> memory;
  std::vector<Diagnostic> warnings;
};

/// Planner validation beyond the recipe parser's (docs/formulas.md §7.2/7.3): CP on
/// Mamba/R layers (all-to-all head split), DualPipe degrees, micro-batch
/// count vs pp, pinned boundaries. Errors carry key path and line from
/// recipe.source.
std::vector<Diagnostic> ValidateForPlan(const Recipe& recipe, const Layout& layout);

/// Places, partitions (or takes the recipe's pinned stages), prices. Memory
/// is the partition's constraint: when the time-balanced cut overflows a
/// device (estimator verdict), the parameter-balanced and equal-layer cuts are
/// priced and the fastest that fits is taken, with a warning. Returns
/// diagnostics (errors) instead when the layout cannot be planned.
struct PlanResult {
  std::optional<Plan> plan;
  std::vector<Diagnostic> diagnostics;
};
/// `advise_balanced_cut` false skips the balanced-cut advice under a
/// framework or pinned partition (its O(L^2) search): for callers that only
/// price the plan, such as fit's suggestions.
PlanResult MakePlan(const Inventory& inventory, const Layout& layout, const CostModel& cost = {},
                    bool advise_balanced_cut = true);

}  // namespace preflight

// Step time: per-stage compute and exposed communication, the schedule's
// bubble, the data-parallel tail and the optimizer, under the overlap rules of
// docs/plan.md.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/inventory/comm_bucket.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/collectives.h"
#include "preflight/planner/comm.h"
#include "preflight/planner/compute.h"
#include "preflight/planner/tables.h"
#include "preflight/recipe/recipe.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Step time (docs/formulas.md §4.2, 7.1)

/// Bubble as a fraction of the whole step (docs/formulas.md §4.2 "fraction of the
/// total step", bubble/(m(t_F+t_B)+bubble)) for equal stages:
/// 1F1B (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1);
/// DualPipe (p/2-1)(F+2B-3W)/(m(F+B)+that) with B=2F, W=B/2 [OURS].
double BubbleFraction(Schedule schedule, int64_t p, int64_t v, int64_t m);

struct StageTime {
  int64_t pipeline_rank = 0;
  double forward_s = 0;  // compute, per micro-batch, all chunks on the rank
  double backward_s = 0;
  double recompute_s = 0;
  double exposed_comm_s = 0;  // TP + CP + EP exposed, per micro-batch
  double per_microbatch_s() const { return forward_s + backward_s + recompute_s + exposed_comm_s; }
};

struct StepTime {
  std::vector<StageTime> stages;
  int64_t slowest_stage = 0;
  double steady_s = 0;      // m * slowest per-micro-batch time (DualPipe: pair time)
  double bubble_s = 0;      // schedule bubble, incl. PP p2p of fill/drain
  double dp_exposed_s = 0;  // gradient reduce + param gather not hidden
  double optimizer_s = 0;   // Muon gathers + Newton-Schulz + small all-reduces
  /// Offloaded optimizer: the slowest rank's host transfers (StageComm::host_transfer
  /// over the host link, not overlapped: Megatron's default). The CPU Adam
  /// step itself is not timed.
  double host_offload_s = 0;
  /// Activation offload on the slowest stage's rank: the host-link time of
  /// its offloaded activations each way, and what of it outlasts the forward
  /// (device to host) and the backward (host to device) it runs beside.
  double activation_offload_s = 0;
  double activation_offload_exposed_s = 0;
  double step_s = 0;
  double bubble_fraction = 0;  // bubble_s / step_s
  double model_flops = 0;      // per step, whole cluster, no recompute (MFU numerator)
  double tokens_per_s = 0;
  double mfu = 0;  // model_flops / (step_s * world * peak)
  /// Exposed seconds per axis over the step (the slowest stage's rank).
  std::array<double, kNumAxes> exposed_by_axis{};
  /// Compute per step on the slowest stage's rank: each family's layers
  /// (forward + backward + recompute over every micro-batch; FamilyIndex
  /// order) and the head's.
  std::array<double, 5> compute_by_family_s{};
  double head_compute_s = 0;
  /// The optimizer's elementwise update of the slowest rank's shard (AdamW's
  /// bytes at the HBM rate), in the tail after the gradient reduce.
  double optimizer_step_s = 0;
  double newton_schulz_s = 0;  // Muon's orthogonalisation GEMMs, the slowest rank's
};

/// The overlap a recipe asks for on this layout, where Megatron-LM runs it:
/// TP overlap needs sequence parallelism, EP overlap no full recompute and an
/// interleaved schedule when pp > 1 (arguments.py, transformer_config.py),
/// the parameter gather the gradient reduce's; the DualPipe schedules
/// overlap EP by construction.
struct Overlap {
  bool grad_reduce = false, param_gather = false, tp = false, ep = false;
};
Overlap OverlapOf(const Recipe& recipe, const Layout& layout);

/// The step in four parts that add up to it (within the tail's max over
/// ranks): the busiest rank's compute, its exposed communication (every axis,
/// the pipeline fill, the optimizer's collectives and exposed activation
/// offload included), the
/// schedule's bubble without the fill, and the optimizer's own work
/// (Newton-Schulz, the update, host transfers).
struct StepBreakdown {
  double compute_s = 0;
  double exposed_comm_s = 0;
  double bubble_s = 0;
  double optimizer_s = 0;
};
StepBreakdown BreakdownOf(const StepTime& time);

/// Fills each item's exposed_seconds (the overlap rules of docs/plan.md) and
/// returns the step time. Every item's exposed_seconds is set, so `comm` may
/// be reused for a layout that differs only in the recompute policy (the
/// communication does not depend on it). `comm` is BuildStageComm's for these
/// stages: a rank priced as an earlier one (StageComm::priced_as) takes that
/// rank's compute and exposure (and its items' exposed_seconds).
StepTime EstimateStepTime(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                          const StagePlan& stages, std::vector<StageComm>* comm, const CostModel& cost);
/// The same with the layout's LayerComputeTimes already worked out (a sweep
/// computes them once and shares them with the partitioner).
StepTime EstimateStepTime(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                          const StagePlan& stages, std::vector<StageComm>* comm, const CostModel& cost,
                          const ComputeTimes& times);
/// The same into `out`, reusing its per-stage vector's storage (a sweep
/// prices millions of layouts with one).
void EstimateStepTime(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                      const StagePlan& stages, std::vector<StageComm>* comm, const CostModel& cost,
                      const ComputeTimes& times, StepTime* out);

}  // namespace preflight

// Helpers shared by the planner's pricing files (not public API).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/planner/compute.h"
#include "preflight/planner/plan.h"

namespace preflight::planner_internal {

/// One chunk a pipeline rank runs and how many micro-batches go through it
/// per step (DualPipe: each rank runs its stage and the mirror stage, m/2
/// micro-batches each).
struct RankChunk {
  int64_t chunk = 0;  // global chunk index in model order
  StageChunk range;
  int64_t microbatches = 0;
};
std::vector<RankChunk> ChunksOn(const StagePlan& plan, const Layout& layout, int64_t pipeline_rank);

/// Layers of each family in [first, end).
std::array<int64_t, 5> FamilyCounts(const PlanTables& t, int64_t first, int64_t end);
/// The layers a chunk runs by family: FamilyCounts, plus the MTP modules'
/// layers when it owns the head.
std::array<int64_t, 5> ChunkCounts(const PlanTables& t, const StageChunk& range);
/// Parameter totals of [first, end).
ParamTotals ParamsOf(const PlanTables& t, int64_t first, int64_t end);

/// Compute seconds of one micro-batch through one chunk on one rank.
struct ChunkCompute {
  double forward_s = 0;
  double backward_s = 0;
  double recompute_s = 0;
  double attention_core_fwd_s = 0;                 // the part of forward_s a CP p2p ring can hide under
  double gemm_forward_s = 0, gemm_backward_s = 0;  // the windows TE's TP overlap hides under
  std::array<double, 5> by_family_s{};             // forward + backward + recompute of its layers
  double head_s = 0;                               // the head's (and MTP extras')
};
ChunkCompute ComputeOf(const ComputeTimes& times, const PlanTables& t, const StageChunk& range);

}  // namespace preflight::planner_internal

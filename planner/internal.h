// Helpers shared by the planner's pricing files (not public API).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "preflight/inventory/inventory.h"
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
/// Every pipeline rank's chunks, in chunk order, found in one pass over the
/// plan (a rank's own search would make pricing quadratic in pp x vpp).
struct RankChunks {
  std::vector<RankChunk> chunks;  // grouped by pipeline rank
  std::vector<size_t> begin;      // rank r holds chunks[begin[r], begin[r + 1])
  std::vector<size_t> next;       // FillRankChunks's cursor per rank
  std::span<const RankChunk> On(int64_t pipeline_rank) const {
    const size_t r = static_cast<size_t>(pipeline_rank);
    return std::span<const RankChunk>(chunks).subspan(begin[r], begin[r + 1] - begin[r]);
  }
};
/// Fills `out` (reusing its buffers) for `layout.pp` pipeline ranks.
void FillRankChunks(const StagePlan& plan, const Layout& layout, RankChunks* out);

/// Ranks that price alike: same_as[r] is the first pipeline rank whose chunks
/// give rank r's communication and compute exactly (r itself when none).
/// Chunks match when, in order, they hold the same layers per family (every
/// family on them uniform), the same first and last family, the same ends,
/// micro-batches and pipeline neighbours, the same Newton-Schulz FLOPs and,
/// under full recompute's block method, the same layers left without a rerun:
/// everything BuildStageComm and EstimateStepTime read of a rank. Pipelines
/// repeat their middle stages, so most ranks are priced once.
void SameRanks(const Inventory& inv, const PlanTables& t, const Layout& layout, const RankChunks& by_rank,
               int64_t n_chunks, std::vector<int64_t>* same_as);

/// What of the recompute policy BuildStageComm reads: 0 when backward reruns
/// no collective (none; selective core_attn alone without CP), else one
/// value per policy. Layouts with equal keys (and stages) share their items.
int CommRerunKey(const Layout& l, const TrainingConfig& t);

/// Layers of each family in [first, end).
std::array<int64_t, 5> FamilyCounts(const PlanTables& t, int64_t first, int64_t end);
/// Full recompute's block method reruns only the first `n` framework layers
/// of a chunk (Megatron transformer_block.py _checkpointed_forward): the
/// first sublayer of `range` after them (range.end_layer when it has no more).
int64_t BlockRecomputeEnd(const Inventory& inv, const StageChunk& range, int64_t n);
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
  std::array<int64_t, 5> counts{};                 // its layers per family (ChunkCounts)
};
ChunkCompute ComputeOf(const ComputeTimes& times, const PlanTables& t, const StageChunk& range);

}  // namespace preflight::planner_internal

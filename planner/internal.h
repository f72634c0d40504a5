// Helpers shared by the planner's pricing files (not public API).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/comm.h"
#include "preflight/planner/compute.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/units.h"

namespace preflight::planner_internal {

/// Whether any layer is a mixture of experts.
inline bool HasMoe(const Recipe& r) {
  return std::find(r.model.layers.begin(), r.model.layers.end(), BlockKind::kMoe) != r.model.layers.end();
}

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
/// Under activation offload every policy has its own key: what the layers
/// offload depends on it (StageComm::activation_offload).
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

// What the data-parallel collectives of one rank move, summed over its units'
// flat buffers. A buffer of n elements is padded to n_pad = RoundUp(n, D) with
// D its group (d*c dense, d_e expert) and the ring collectives move n_pad
// elements (Megatron pads its grad buffers so they split evenly;
// simulator/dist_optimizer.h).
struct DpBuffers {
  std::array<int64_t, 2> padded{};       // [dense, expert]: sum of n_pad (grads, beta_g each)
  std::array<int64_t, 2> param_bytes{};  // sum of n_pad * the buffer's element bytes (param gathers)
  std::array<int64_t, 2> muon{};         // sum of n_pad over Muon buffers (momentum gathers)
  std::array<int64_t, 2> units{};        // units with a dense / expert buffer: ZeRO 2/3 collectives per round
  int64_t replicated = 0;                // REP elements all-reduced over TP: all with SP (norms, router), else qk norms
  int64_t replicated_padded = 0;         // sum over units of RoundUp(REP_u, t): ZeRO 2/3 reduce them unit by unit
  int64_t replicated_units = 0;          // units with REP elements

  DpBuffers& operator+=(const DpBuffers& o) {
    for (size_t g = 0; g < 2; ++g) {
      padded[g] = CheckedAdd(padded[g], o.padded[g]);
      param_bytes[g] = CheckedAdd(param_bytes[g], o.param_bytes[g]);
      muon[g] = CheckedAdd(muon[g], o.muon[g]);
      units[g] = CheckedAdd(units[g], o.units[g]);
    }
    replicated = CheckedAdd(replicated, o.replicated);
    replicated_padded = CheckedAdd(replicated_padded, o.replicated_padded);
    replicated_units = CheckedAdd(replicated_units, o.replicated_units);
    return *this;
  }
  DpBuffers Times(int64_t n) const {
    DpBuffers out;
    for (size_t g = 0; g < 2; ++g) {
      out.padded[g] = CheckedMul(padded[g], n);
      out.param_bytes[g] = CheckedMul(param_bytes[g], n);
      out.muon[g] = CheckedMul(muon[g], n);
      out.units[g] = CheckedMul(units[g], n);
    }
    out.replicated = CheckedMul(replicated, n);
    out.replicated_padded = CheckedMul(replicated_padded, n);
    out.replicated_units = CheckedMul(replicated_units, n);
    return out;
  }
};

// The buffers of a rank's units, and of the units at the ends of its chunks
// (read under ZeRO 2/3 only): the first unit of a chunk (the embedding or its first
// layer) runs first in forward and last in backward, the last unit (the head
// or its last layer) the other way round. Summed over the rank's chunks.
struct RankBuffers {
  DpBuffers all;
  DpBuffers first;
  DpBuffers last;
};

/// What of a pipeline rank's data-parallel and optimizer communication does
/// not depend on the ZeRO stage: its parameters, whether it holds the
/// embedding or the head, and its padded buffers.
struct RankOptimizer {
  ParamTotals params;
  bool embedding = false;
  bool head = false;
  RankBuffers buffers;
};

/// BuildStageComm (comm.h) that also keeps each rank's RankOptimizer in
/// `optimizer` (the entries of ranks priced as an earlier one are not set).
/// `copy_alike` false: a rank priced as an earlier one gets no items (a
/// sweep reads only the step time; EstimateStepTime reads that rank's).
void BuildStageComm(const Inventory& inv, const PlanTables& t, const Layout& layout, const StagePlan& stages,
                    const MeshLocality& locality, const CostModel& cost, std::vector<StageComm>* out,
                    std::vector<RankOptimizer>* optimizer, bool copy_alike = true);
/// The communication of a layout that differs from the one `built` (and
/// `optimizer`) was built for, with these stages, only in its ZeRO stage, as
/// a sweep's rows of one item do: each rank's TP, CP, PP and EP items are
/// taken from `built`, the data-parallel and optimizer items priced for
/// layout.zero from the rank's kept RankOptimizer. `copy_alike` as above.
void BuildStageCommForZero(const Inventory& inv, const PlanTables& t, const Layout& layout, const StagePlan& stages,
                           const MeshLocality& locality, const CostModel& cost, const std::vector<StageComm>& built,
                           const std::vector<RankOptimizer>& optimizer, std::vector<StageComm>* out,
                           bool copy_alike = true);

/// Compute of pipeline rank r per step: every chunk it holds times its
/// micro-batches, and the Newton-Schulz FLOPs of its Muon matrices.
struct RankCompute {
  double forward_s = 0, backward_s = 0, recompute_s = 0;
  double attention_core_forward_s = 0;             // the window the CP p2p ring hides under
  double gemm_forward_s = 0, gemm_backward_s = 0;  // the windows TP overlap hides under
  double muon_flops = 0;
  double max_chunk_forward_s = 0, max_chunk_backward_s = 0;  // one micro-batch, for DualPipe's bubble
  std::array<double, 5> by_family_s{};
  double head_s = 0;
  /// Local elements the rank's optimizer updates on the device, [0] without
  /// ZeRO and [1] with it (sharded over the ZeRO groups).
  std::array<double, 2> optimizer_elements{};
  double total_s() const { return forward_s + backward_s + recompute_s; }
  double OptimizerElements(const Layout& l) const { return optimizer_elements[l.zero >= 1 ? 1 : 0]; }
};

/// Each rank's RankCompute and chunks for one stage plan, kept across the
/// ZeRO stages of one layout (a sweep's rows of one item and recompute
/// policy): nothing in them depends on the ZeRO stage but the optimizer's
/// sharding, which both figures cover. The owner empties it (Reset) when
/// anything else of the layout changes.
struct SharedCompute {
  const StagePlan* stages = nullptr;
  RankChunks by_rank;
  std::vector<RankCompute> ranks;
  std::vector<char> known;
  void Reset() { stages = nullptr; }
};

/// EstimateStepTime into `out` (step_time.h); `copy_alike` false: a rank
/// priced as an earlier one keeps its items as they are (a sweep reads only
/// the step time; the earlier rank's items carry the exposure). `shared`
/// (or null): the ranks' compute kept from an earlier call for these stages
/// and a layout that differs only in its ZeRO stage.
void EstimateStepTime(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                      std::vector<StageComm>* comm, const CostModel& cost, const ComputeTimes& times, StepTime* out,
                      bool copy_alike, SharedCompute* shared = nullptr);

}  // namespace preflight::planner_internal

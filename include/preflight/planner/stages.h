// The pipeline-stage partition: layer weights, the partitioner, and which
// pipeline rank holds which chunk.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/collectives.h"
#include "preflight/planner/compute.h"
#include "preflight/planner/tables.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Pipeline stages (docs/formulas.md §4.3)

/// Forward+backward(+recompute) time of each layer, and of the embedding and
/// head+loss ends, for one micro-batch on one rank under `layout`; the
/// partitioner's weights. Seconds.
struct LayerWeights {
  std::vector<double> layer_s;
  double embedding_s = 0;
  double head_s = 0;
  std::vector<int64_t> layer_params;  // tiebreak: parameter elements per layer
  int64_t embedding_params = 0;
  int64_t head_params = 0;
};
LayerWeights WeighLayers(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                         const CostModel& cost = {});
/// The same from the layout's compute times (LayerComputeTimes): the weights
/// depend on the layout only through them.
LayerWeights WeighLayers(const PlanTables& tables, const ComputeTimes& times);

/// Cuts the weighted list into ChunkCount(layout) contiguous chunks
/// minimising the slowest chunk (DP over prefix sums, O(L^2 * chunks)); ties
/// go to the smaller largest parameter count. Embedding charged to the first
/// chunk, head + loss to the last. Every chunk gets at least one layer.
/// Returns an empty plan when BalancedSearchAffordable says no.
StagePlan PartitionStages(const LayerWeights& weights, const Layout& layout);

/// Whether the balanced cut's search over `layers` layers and `chunks`
/// chunks stays within bounds: chunks x layers^2 / 2 steps (2e9, seconds)
/// and (chunks + 1) x (layers + 1) cells of 24 B (2e7, under 0.5 GB).
/// Beyond them `partition: balanced` is refused and the advice is skipped.
bool BalancedSearchAffordable(int64_t layers, int64_t chunks);
/// The time-balanced cut of the inventory's framework layers (as sublayer ranges).
StagePlan PartitionStages(const Inventory& inventory, const Layout& layout);

/// Chunks the schedule has: pp*vpp for 1F1B/interleaved, pp for DualPipe
/// (rank i also runs stage p-1-i in the reverse direction), 2*pp for
/// DualPipeV (V shape: device i holds chunks i and 2p-1-i).
int64_t ChunkCount(const Layout& layout);
/// Pipeline rank that holds chunk `chunk` of `chunks` (Megatron interleaving
/// c mod pp; DualPipeV's V shape).
int64_t PipelineRankOfChunk(const Layout& layout, int64_t chunk, int64_t chunks);

/// The weights of whole framework layers (Inventory::layer_starts): the
/// partitioner cuts only between layers, as the frameworks do.
LayerWeights WeighFrameworkLayers(const LayerWeights& sublayer_weights, const std::vector<int64_t>& layer_starts);
/// Only the times of WeighFrameworkLayers(WeighLayers(tables, times),
/// layer_starts) into `weights` (the same sums, in the same order), keeping
/// its parameter counts, which no layout changes: a sweep weighs tens of
/// thousands of layouts of one model.
void ReweighFrameworkLayers(const PlanTables& tables, const ComputeTimes& times,
                            const std::vector<int64_t>& layer_starts, LayerWeights* weights);
/// A plan over framework layers as sublayer ranges.
StagePlan ToSublayers(StagePlan plan, const std::vector<int64_t>& layer_starts);

/// The balanced cuts on layer boundaries, in MakePlan's order: the
/// time-balanced cut (PartitionStages), the parameter-balanced cut and
/// (except DualPipeV) the equal-layer cut, with their names ("time",
/// "parameters", "equal_layers"). `weights` are per sublayer (WeighLayers).
struct NamedCut {
  const char* name;
  StagePlan stages;
};
std::vector<NamedCut> BalancedCuts(const LayerWeights& weights, const Layout& layout,
                                   const std::vector<int64_t>& layer_starts);
/// BalancedCuts after the time-balanced one: they read only the layers'
/// parameter counts, so a sweep keeps them per (pp, vpp, schedule).
std::vector<NamedCut> FallbackCuts(const LayerWeights& weights, const Layout& layout,
                                   const std::vector<int64_t>& layer_starts);

}  // namespace preflight

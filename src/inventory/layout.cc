#include "preflight/inventory/layout.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <tuple>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/partition.h"

namespace preflight {

Layout LayoutOf(const Recipe& r) {
  Layout l;
  l.tp = r.parallel.tp;
  l.sp = r.parallel.sp;
  l.cp = r.parallel.cp;
  l.pp = r.parallel.pp;
  l.vpp = r.parallel.vpp;
  l.dp = r.dp();
  l.ep = r.parallel.ep;
  l.expert_tp = r.parallel.expert_tp;
  l.zero = r.parallel.zero;
  l.dp_replicate = r.parallel.dp_replicate;
  l.micro_batch = r.training.micro_batch;
  l.micro_batches = r.micro_batches();
  l.recompute = r.training.recompute;
  l.schedule = r.parallel.schedule;
  l.microbatch_group = r.parallel.microbatch_group;
  l.order = r.parallel.order;
  l.cp_comm = r.parallel.cp_comm;
  l.cp_recurrent = r.parallel.cp_recurrent;
  l.cp_load_balance = r.parallel.cp_load_balance;
  return l;
}

LayerRange LayerRangeOf(const StageChunk& c, const std::vector<int64_t>& starts) {
  auto index = [&](int64_t sublayer) {
    return static_cast<int64_t>(std::lower_bound(starts.begin(), starts.end(), sublayer) - starts.begin());
  };
  return {index(c.first_layer), index(c.end_layer)};
}

std::vector<StageChunk> ChunksOfRank(const StagePlan& plan, int64_t pipeline_rank) {
  std::vector<StageChunk> out;
  for (const auto& c : plan.chunks) {
    if (c.pipeline_rank == pipeline_rank) out.push_back(c);
  }
  return out;
}

StagePlan EqualStagePlan(int64_t layers, int64_t pp, int64_t vpp) {
  const int64_t n = pp * vpp;
  std::vector<int64_t> counts;
  for (int64_t c = 0; c < n; ++c) counts.push_back(layers / n + (c < layers % n ? 1 : 0));
  std::vector<int64_t> units(static_cast<size_t>(layers + 1));
  std::iota(units.begin(), units.end(), int64_t{0});  // each unit its own start
  return PlanFromLayerCounts(counts, units, pp, Schedule::k1F1B);
}

std::pair<int64_t, int64_t> PlaceChunk(int64_t c, int64_t chunks, int64_t pp, Schedule schedule) {
  if (schedule == Schedule::kDualPipeV) return {c < chunks / 2 ? c : chunks - 1 - c, c < chunks / 2 ? 0 : 1};
  return {c % pp, c / pp};
}

StagePlan PlanFromLayerCounts(const std::vector<int64_t>& layers_per_chunk, const std::vector<int64_t>& layer_starts,
                              int64_t pp, Schedule schedule) {
  StagePlan plan;
  const int64_t n = static_cast<int64_t>(layers_per_chunk.size());
  int64_t layer = 0;
  for (int64_t c = 0; c < n; ++c) {
    StageChunk chunk;
    std::tie(chunk.pipeline_rank, chunk.virtual_index) = PlaceChunk(c, n, pp, schedule);
    chunk.first_layer = layer_starts.at(static_cast<size_t>(layer));
    layer += layers_per_chunk[static_cast<size_t>(c)];
    chunk.end_layer = layer_starts.at(static_cast<size_t>(layer));
    chunk.owns_embedding = c == 0;
    chunk.owns_head = c == n - 1;
    plan.chunks.push_back(chunk);
  }
  return plan;
}

std::optional<StagePlan> RecipeStagePlan(const Inventory& inv, const Layout& l) {
  const int64_t layers = inv.layer_count();
  const ParallelConfig p = SplitFor(inv.recipe.parallel, l.pp, l.vpp, l.schedule, layers);
  const LayerSplit split = RecipeSplit(p, inv.recipe.model.layers);
  if (!split.ok() || split.layers.empty()) return std::nullopt;
  int64_t total = 0;
  for (const int64_t n : split.layers) total += n;
  if (total != layers || static_cast<int64_t>(split.layers.size()) != ChunkCountOf(l.schedule, l.pp, l.vpp)) {
    return std::nullopt;  // a split of another stack or schedule: validation reports it
  }
  return PlanFromLayerCounts(split.layers, inv.layer_starts, l.pp, l.schedule);
}

}  // namespace preflight

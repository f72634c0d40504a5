#include "preflight/inventory/layout.h"

#include <optional>

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
  l.order = r.parallel.order;
  l.cp_comm = r.parallel.cp_comm;
  l.cp_recurrent = r.parallel.cp_recurrent;
  l.cp_load_balance = r.parallel.cp_load_balance;
  return l;
}

namespace {
StagePlan PlanFromStarts(const std::vector<int64_t>& starts, int64_t layers, int64_t pp) {
  StagePlan plan;
  const int64_t n = static_cast<int64_t>(starts.size());
  for (int64_t c = 0; c < n; ++c) {
    StageChunk chunk;
    chunk.pipeline_rank = c % pp;
    chunk.virtual_index = c / pp;
    chunk.first_layer = starts[static_cast<size_t>(c)];
    chunk.end_layer = c + 1 < n ? starts[static_cast<size_t>(c + 1)] : layers;
    chunk.owns_embedding = c == 0;
    chunk.owns_head = c == n - 1;
    plan.chunks.push_back(chunk);
  }
  return plan;
}
}  // namespace

std::vector<StageChunk> ChunksOfRank(const StagePlan& plan, int64_t pipeline_rank) {
  std::vector<StageChunk> out;
  for (const auto& c : plan.chunks) {
    if (c.pipeline_rank == pipeline_rank) out.push_back(c);
  }
  return out;
}

StagePlan EqualStagePlan(int64_t layers, int64_t pp, int64_t vpp) {
  const int64_t n = pp * vpp;
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (int64_t c = 0; c < n; ++c) {
    starts.push_back(at);
    at += layers / n + (c < layers % n ? 1 : 0);
  }
  return PlanFromStarts(starts, layers, pp);
}

std::optional<StagePlan> PinnedStagePlan(const Recipe& r) {
  if (r.parallel.stage_boundaries.empty()) return std::nullopt;
  std::vector<int64_t> starts{0};
  starts.insert(starts.end(), r.parallel.stage_boundaries.begin(), r.parallel.stage_boundaries.end());
  return PlanFromStarts(starts, static_cast<int64_t>(r.model.layers.size()), r.parallel.pp);
}

}  // namespace preflight

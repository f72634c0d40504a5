#include "internal.h"

#include "preflight/estimator/geometry.h"

namespace preflight::planner_internal {

std::vector<RankChunk> ChunksOn(const StagePlan& plan, const Layout& layout, int64_t pipeline_rank) {
  std::vector<RankChunk> out;
  const int64_t n = static_cast<int64_t>(plan.chunks.size());
  for (int64_t c = 0; c < n; ++c) {
    const StageChunk& chunk = plan.chunks[static_cast<size_t>(c)];
    if (layout.schedule == Schedule::kDualPipe) {
      // DualPipe [DS3]: rank i holds stage i (forward direction) and stage
      // p-1-i (reverse direction); half the micro-batches enter at each end.
      if (c == pipeline_rank || c == n - 1 - pipeline_rank) out.push_back({c, chunk, layout.micro_batches / 2});
    } else if (PipelineRankOfChunk(layout, c, n) == pipeline_rank) {
      out.push_back({c, chunk, layout.micro_batches});
    }
  }
  return out;
}

std::array<int64_t, 5> FamilyCounts(const PlanTables& t, int64_t first, int64_t end) {
  std::array<int64_t, 5> out{};
  const auto& a = t.family_count_prefix[static_cast<size_t>(first)];
  const auto& b = t.family_count_prefix[static_cast<size_t>(end)];
  for (size_t f = 0; f < 5; ++f) out[f] = b[f] - a[f];
  return out;
}

std::array<int64_t, 5> ChunkCounts(const PlanTables& t, const StageChunk& range) {
  std::array<int64_t, 5> out = FamilyCounts(t, range.first_layer, range.end_layer);
  if (range.owns_head) {
    for (size_t f = 0; f < 5; ++f) out[f] += t.mtp_counts[f];
  }
  return out;
}

ParamTotals ParamsOf(const PlanTables& t, int64_t first, int64_t end) {
  ParamTotals out;
  const ParamTotals& a = t.params_prefix[static_cast<size_t>(first)];
  const ParamTotals& b = t.params_prefix[static_cast<size_t>(end)];
  for (size_t c = 0; c < 3; ++c) {
    for (size_t o = 0; o < 2; ++o) out.elements[c][o] = b.elements[c][o] - a.elements[c][o];
  }
  return out;
}

ChunkCompute ComputeOf(const ComputeTimes& times, const PlanTables& t, const StageChunk& range) {
  ChunkCompute out;
  const auto counts = ChunkCounts(t, range);
  for (size_t f = 0; f < 5; ++f) {
    const LayerSeconds& ls = times.family[f];
    const double n = static_cast<double>(counts[f]);
    out.forward_s += n * ls.forward.total();
    out.backward_s += n * ls.backward.total();
    out.recompute_s += n * ls.recompute.total();
    out.attention_core_fwd_s += n * ls.attention_core_forward;
    out.gemm_forward_s += n * ls.forward.gemm;
    out.gemm_backward_s += n * (ls.backward.gemm + ls.recompute.gemm);
    out.by_family_s[f] = n * ls.total();
  }
  if (range.owns_head) {
    out.forward_s += times.head.forward.total();
    out.backward_s += times.head.backward.total();
    out.head_s = times.head.total();
  }
  return out;
}

}  // namespace preflight::planner_internal

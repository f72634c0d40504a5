#include "internal.h"

#include "preflight/estimator/geometry.h"
#include "preflight/planner/stages.h"

namespace preflight::planner_internal {

void FillRankChunks(const StagePlan& plan, const Layout& layout, RankChunks* out) {
  const int64_t n = static_cast<int64_t>(plan.chunks.size());
  const size_t ranks = static_cast<size_t>(layout.pp);
  const bool dual = layout.schedule == Schedule::kDualPipe;
  // DualPipe [DS3]: rank i holds stage i (forward direction) and stage p-1-i
  // (reverse direction); half the micro-batches enter at each end.
  const int64_t microbatches = dual ? layout.micro_batches / 2 : layout.micro_batches;
  // The ranks chunk c runs on: one, or DualPipe's two (one when c is the middle).
  auto ranks_of = [&](int64_t c) -> std::array<int64_t, 2> {
    if (dual) return {c, n - 1 - c == c ? -1 : n - 1 - c};
    return {PipelineRankOfChunk(layout, c, n), -1};
  };
  // Counting sort by rank, chunk order kept within a rank.
  out->begin.assign(ranks + 1, 0);
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t r : ranks_of(c)) {
      if (r >= 0 && r < layout.pp) ++out->begin[static_cast<size_t>(r) + 1];
    }
  }
  for (size_t r = 0; r < ranks; ++r) out->begin[r + 1] += out->begin[r];
  out->chunks.resize(out->begin[ranks]);
  std::vector<size_t>& next = out->next;
  next.assign(out->begin.begin(), out->begin.end() - 1);
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t r : ranks_of(c)) {
      if (r >= 0 && r < layout.pp)
        out->chunks[next[static_cast<size_t>(r)]++] = {c, plan.chunks[static_cast<size_t>(c)], microbatches};
    }
  }
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
  out.counts = ChunkCounts(t, range);
  for (size_t f = 0; f < 5; ++f) {
    const LayerSeconds& ls = times.family[f];
    const double n = static_cast<double>(out.counts[f]);
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

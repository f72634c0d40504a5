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

double AchievableFlops(const Inventory& inv, const CostModel& cost) {
  return inv.recipe.cluster.spec.bf16_dense_tflops * 1e12 * cost.compute_efficiency;
}

double TokensPerRank(const Inventory& inv, const Layout& layout) {
  // A CP rank's tokens (the shared geometry), their work split over TP.
  return static_cast<double>(TokensOf(inv.recipe, layout).cp_rank) / static_cast<double>(layout.tp);
}

ChunkCompute ComputeOf(const Inventory& inv, const PlanTables& t, const Layout& layout, const StageChunk& range,
                       const CostModel& cost) {
  const double seq = static_cast<double>(inv.recipe.training.seq_len);
  const double tokens = TokensPerRank(inv, layout);
  const double peak = AchievableFlops(inv, cost);
  const auto counts = ChunkCounts(t, range);
  double fwd = 0, core = 0;
  for (size_t f = 0; f < 5; ++f) {
    const FamilyCost& fc = t.family[f];
    const double n = static_cast<double>(counts[f]);
    fwd += n * tokens * (fc.matmul_flops + fc.scan_flops + fc.flops_per_token_per_seq * seq);
    core += n * tokens * fc.flops_per_token_per_seq * seq;
  }
  double recompute = 0;
  if (layout.recompute == Recompute::kSelective) recompute = core;
  if (layout.recompute == Recompute::kFull) recompute = fwd;  // layers only; the head is not recomputed
  if (range.owns_head) fwd += tokens * (t.head_flops + t.mtp_extra_flops);
  ChunkCompute out;
  out.forward_s = fwd / peak;
  out.backward_s = 2.0 * fwd / peak;  // dgrad + wgrad, each the forward's FLOPs
  out.recompute_s = recompute / peak;
  out.attention_core_fwd_s = core / peak;
  return out;
}

}  // namespace preflight::planner_internal

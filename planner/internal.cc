#include "internal.h"

#include <algorithm>

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

namespace {

/// What pricing reads of one chunk of a rank (SameRanks).
struct ChunkKey {
  std::array<int64_t, 5> counts{};   // FamilyCounts of its layers
  std::array<int64_t, 5> unrerun{};  // block recompute: the layers after the first n framework layers
  int first_kind = -1, last_kind = -1;
  bool embedding = false, head = false, sends = false, receives = false;
  int64_t microbatches = 0;
  double muon_dense = 0, muon_expert = 0;  // Newton-Schulz FLOPs, as ComputeOnRank takes them
  bool operator==(const ChunkKey&) const = default;
};

/// Fills the key of chunk `c` in place (a sweep keys every chunk of every
/// layout); false when a family on it is not uniform.
bool FillKey(const Inventory& inv, const PlanTables& t, const Layout& l, const RankChunk& c, int64_t n_chunks,
             ChunkKey& k) {
  const StageChunk& r = c.range;
  k.counts = FamilyCounts(t, r.first_layer, r.end_layer);
  for (size_t f = 0; f < 5; ++f) {
    if (k.counts[f] > 0 && !inv.family_uniform[f]) return false;
  }
  if (r.first_layer < r.end_layer) {
    k.first_kind = static_cast<int>(t.kinds[static_cast<size_t>(r.first_layer)]);
    k.last_kind = static_cast<int>(t.kinds[static_cast<size_t>(r.end_layer - 1)]);
  }
  if (l.recompute == Recompute::kFull && inv.recipe.training.recompute_method == RecomputeMethod::kBlock) {
    // As KeepBlockRecompute (step_time.cc): the layers from the (n+1)-th framework layer on.
    k.unrerun = FamilyCounts(t, BlockRecomputeEnd(inv, r, inv.recipe.training.recompute_layers), r.end_layer);
  }
  k.embedding = r.owns_embedding;
  k.head = r.owns_head;
  // As AddPp: a boundary to the next (previous) chunk on another device.
  const bool v_shape = l.schedule == Schedule::kDualPipeV;
  const auto same_device = [&](int64_t a, int64_t b) {
    return v_shape && PipelineRankOfChunk(l, a, n_chunks) == PipelineRankOfChunk(l, b, n_chunks);
  };
  k.sends = c.chunk + 1 < n_chunks && !same_device(c.chunk, c.chunk + 1);
  k.receives = c.chunk > 0 && !same_device(c.chunk, c.chunk - 1);
  k.microbatches = c.microbatches;
  const size_t a = static_cast<size_t>(r.first_layer), b = static_cast<size_t>(r.end_layer);
  k.muon_dense = t.muon_ns_dense_flops_prefix[b] - t.muon_ns_dense_flops_prefix[a];
  k.muon_expert = t.muon_ns_expert_flops_prefix[b] - t.muon_ns_expert_flops_prefix[a];
  return true;
}

}  // namespace

void SameRanks(const Inventory& inv, const PlanTables& t, const Layout& layout, const RankChunks& by_rank,
               int64_t n_chunks, std::vector<int64_t>* same_as) {
  // Every chunk's key once (a rank that matches none is compared with every
  // distinct rank before it), built in place in per-thread buffers.
  thread_local std::vector<ChunkKey> keys;
  thread_local std::vector<char> keyed;  // the chunk's families are uniform
  keys.resize(by_rank.chunks.size());
  keyed.resize(by_rank.chunks.size());
  for (size_t i = 0; i < by_rank.chunks.size(); ++i) {
    keys[i] = ChunkKey{};
    keyed[i] = FillKey(inv, t, layout, by_rank.chunks[i], n_chunks, keys[i]) ? 1 : 0;
  }
  const auto same = [&](int64_t a, int64_t b) {
    const size_t a0 = by_rank.begin[static_cast<size_t>(a)], b0 = by_rank.begin[static_cast<size_t>(b)];
    const size_t n = by_rank.begin[static_cast<size_t>(a) + 1] - a0;
    if (n != by_rank.begin[static_cast<size_t>(b) + 1] - b0) return false;
    for (size_t i = 0; i < n; ++i) {
      if (!keyed[a0 + i] || !keyed[b0 + i] || !(keys[a0 + i] == keys[b0 + i])) return false;
    }
    return true;
  };
  same_as->resize(static_cast<size_t>(layout.pp));
  for (int64_t r = 0; r < layout.pp; ++r) {
    int64_t match = r;
    // Against the distinct ranks so far (a pipeline has few).
    for (int64_t q = 0; q < r && match == r; ++q) {
      if ((*same_as)[static_cast<size_t>(q)] == q && same(r, q)) match = q;
    }
    (*same_as)[static_cast<size_t>(r)] = match;
  }
}

int CommRerunKey(const Layout& l, const TrainingConfig& t) {
  if (!t.activation_offload.empty()) return 3 + static_cast<int>(l.recompute);
  if (l.recompute == Recompute::kFull) return 1;
  if (l.recompute != Recompute::kSelective) return 0;
  const bool modules =
      t.recompute_modules.has(RecomputeModule::kMlp) || t.recompute_modules.has(RecomputeModule::kMoe) ||
      t.recompute_modules.has(RecomputeModule::kSharedExperts) || t.recompute_modules.has(RecomputeModule::kMlaUpProj);
  return modules || (l.cp > 1 && t.recompute_modules.has(RecomputeModule::kCoreAttn)) ? 2 : 0;
}

int64_t BlockRecomputeEnd(const Inventory& inv, const StageChunk& range, int64_t n) {
  const std::vector<int64_t>& starts = inv.layer_starts;
  const auto first = std::lower_bound(starts.begin(), starts.end(), range.first_layer);
  const int64_t after = std::distance(first, starts.end()) > n ? *(first + n) : range.end_layer;
  return std::min(after, range.end_layer);
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

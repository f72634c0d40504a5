// Pipeline-stage partition (docs/formulas.md §4.3, [OURS] partitioner): contiguous
// chunks minimising the slowest one, by dynamic programming over prefix sums.
#include <algorithm>
#include <array>
#include <limits>
#include <tuple>

#include "preflight/planner/stages.h"

#include "preflight/planner/compute.h"

#include "preflight/recipe/partition.h"

namespace preflight {

int64_t ChunkCount(const Layout& l) { return ChunkCountOf(l.schedule, l.pp, l.vpp); }

int64_t PipelineRankOfChunk(const Layout& l, int64_t chunk, int64_t chunks) {
  // DualPipeV [DS3 DualPipe README]: the V shape puts chunk c and chunk
  // 2p-1-c on device c.
  return PlaceChunk(chunk, chunks, l.pp, l.schedule).first;
}

namespace {

struct Best {
  double time = std::numeric_limits<double>::infinity();
  int64_t params = std::numeric_limits<int64_t>::max();
  int64_t cut = -1;
};

// Lexicographic (time, params) with a relative tolerance on time, so float
// noise does not hide a parameter tiebreak.
bool Better(double t1, int64_t p1, const Best& b) {
  const double tol = 1e-12 * std::max(t1, b.time == std::numeric_limits<double>::infinity() ? t1 : b.time);
  if (t1 < b.time - tol) return true;
  if (t1 > b.time + tol) return false;
  return p1 < b.params;
}

// The partitioner scans the candidate cuts i of a cell (k, j) in order, each
// accepted when Better than the cell so far; two exact shortcuts skip the
// candidates that cannot change the outcome, so a cell costs about log n
// steps instead of n. kMargin, ten times Better's tolerance, keeps rounding
// far inside both proofs.
constexpr double kMargin = 1e-11;

// Stop: a candidate weighs at least its prefix best[k-1][i] and has at least
// its parameters. Once the lightest valid prefix from i on outweighs the cell
// by more than the tolerance, or is no lighter than the cell beyond the
// tolerance while the fewest parameters from i on are no fewer than the
// cell's, no later candidate is accepted and the cell stays as it is.
struct Lightest {
  std::vector<double> time;     // [i]: least time of a valid best[k-1][i'], i' >= i
  std::vector<int64_t> params;  // [i]: fewest parameters of one
  bool Stops(size_t i, const Best& cell) const {
    return time[i] > cell.time * (1.0 + kMargin) ||
           (time[i] >= cell.time * (1.0 - kMargin / 100.0) && params[i] >= cell.params);
  }
};

// Over one row's band (cells [base, base + n)): the cells outside it are
// never set, so they add nothing to a suffix minimum.
void SuffixMinimum(const Best* band, int64_t n, Lightest* out) {
  out->time.resize(static_cast<size_t>(n));
  out->params.resize(static_cast<size_t>(n));
  double time = std::numeric_limits<double>::infinity();
  int64_t params = std::numeric_limits<int64_t>::max();
  for (int64_t i = n - 1; i >= 0; --i) {
    if (band[i].cut >= 0) {
      time = std::min(time, band[i].time);
      params = std::min(params, band[i].params);
    }
    out->time[static_cast<size_t>(i)] = time;
    out->params[static_cast<size_t>(i)] = params;
  }
}

// Start: candidate s, whose own chunk [s, j) outweighs its prefix, weighs
// chunk_time(s, j); every earlier candidate weighs at least chunk_time(s-1, j)
// (chunk times fall as the chunk starts later). When that is heavier by more
// than the tolerance, s is accepted whatever the earlier candidates left in
// the cell, and the scan may start at s. The s before where the chunk stops
// outweighing the prefix (then checked exactly), or the first candidate.
// That place only moves right as j grows (a chunk ending later weighs more),
// so it is walked to from the row's previous cell (`boundary`) instead of
// bisected: any s that passes the checks gives the cell the full scan gives.
// `prev` is the previous row's band, whose first cell is candidate `lo`;
// time_to(i) is chunk_time(i, j). A candidate the walk passed is known to
// outweigh its prefix, so only a walk that did not move checks s again.
template <class TimeTo>
int64_t FirstCandidate(const Best* prev, int64_t lo, int64_t j, int64_t* boundary, const TimeTo& time_to) {
  int64_t a = std::max(lo, *boundary);
  double s_time = 0.0;  // time_to(a - 1) once the walk has passed a - 1
  bool walked = false;
  for (; a < j; ++a) {
    const Best& before = prev[a - lo];
    if (before.cut < 0) break;
    const double t = time_to(a);
    if (!(t >= before.time)) break;
    s_time = t;
    walked = true;
  }
  *boundary = a;
  const int64_t s = a - 1;
  if (s <= lo) return lo;
  if (!walked) {
    const Best& before = prev[s - lo];
    if (before.cut < 0) return lo;
    s_time = time_to(s);
    if (!(s_time >= before.time)) return lo;
  }
  return s_time * (1.0 + kMargin) < time_to(s - 1) ? s : lo;
}

}  // namespace

LayerWeights WeighLayers(const Inventory& inv, const PlanTables& tables, const Layout& layout,
                         const CostModel& cost) {
  return WeighLayers(tables, LayerComputeTimes(inv, tables, layout, cost));
}

namespace {

// The head's work: its projection and loss, and the MTP modules' layers.
double HeadWeightSeconds(const PlanTables& tables, const ComputeTimes& ct) {
  double head_s = ct.head.total();
  for (size_t f = 0; f < 5; ++f) {
    head_s += static_cast<double>(tables.mtp_counts[f]) * ct.family[f].total();
  }
  return head_s;
}

}  // namespace

LayerWeights WeighLayers(const PlanTables& tables, const ComputeTimes& ct) {
  LayerWeights w;
  // One micro-batch's forward + backward + recompute of each layer on one
  // rank: the step time's own per-layer compute (compute.h).
  w.layer_s.reserve(static_cast<size_t>(tables.layers));
  w.layer_params.reserve(static_cast<size_t>(tables.layers));
  for (int64_t l = 0; l < tables.layers; ++l) {
    w.layer_s.push_back(ct.family[static_cast<size_t>(FamilyIndex(tables.kinds[static_cast<size_t>(l)]))].total());
    w.layer_params.push_back(tables.params_prefix[static_cast<size_t>(l + 1)].total() -
                             tables.params_prefix[static_cast<size_t>(l)].total());
  }
  w.head_s = HeadWeightSeconds(tables, ct);
  w.embedding_s = 0.0;  // a lookup; its cost is memory (the parameter tiebreak)
  w.embedding_params = tables.embedding_params;
  w.head_params = tables.head_params + tables.final_norm_params + tables.mtp_params;
  return w;
}

void ReweighFrameworkLayers(const PlanTables& tables, const ComputeTimes& ct, const std::vector<int64_t>& starts,
                            LayerWeights* w) {
  std::array<double, 5> family{};
  for (size_t f = 0; f < family.size(); ++f) family[f] = ct.family[f].total();
  const size_t n = starts.size() - 1;
  w->layer_s.resize(n);
  for (size_t l = 0; l < n; ++l) {
    double s = 0.0;  // summed in WeighFrameworkLayers' order
    for (int64_t i = starts[l]; i < starts[l + 1]; ++i) {
      s += family[static_cast<size_t>(FamilyIndex(tables.kinds[static_cast<size_t>(i)]))];
    }
    w->layer_s[l] = s;
  }
  w->head_s = HeadWeightSeconds(tables, ct);
  w->embedding_s = 0.0;
}

bool BalancedSearchAffordable(int64_t layers, int64_t chunks) {
  const double l = static_cast<double>(layers), k = static_cast<double>(chunks);
  return k * l * l / 2.0 <= 2e9 && (k + 1.0) * (l + 1.0) <= 2e7;
}

StagePlan PartitionStages(const LayerWeights& w, const Layout& layout) {
  const int64_t n = static_cast<int64_t>(w.layer_s.size());
  const int64_t k_chunks = ChunkCount(layout);
  StagePlan plan;
  // ValidateForPlan reports both.
  if (k_chunks <= 0 || k_chunks > n || !BalancedSearchAffordable(n, k_chunks)) return plan;
  // Per-thread buffers: a sweep partitions tens of thousands of layouts.
  thread_local std::vector<double> t_prefix;
  thread_local std::vector<int64_t> p_prefix;
  thread_local std::vector<Best> best;
  thread_local Lightest lightest;
  t_prefix.assign(static_cast<size_t>(n + 1), 0.0);
  p_prefix.assign(static_cast<size_t>(n + 1), 0);
  for (int64_t l = 0; l < n; ++l) {
    t_prefix[static_cast<size_t>(l + 1)] = t_prefix[static_cast<size_t>(l)] + w.layer_s[static_cast<size_t>(l)];
    p_prefix[static_cast<size_t>(l + 1)] = p_prefix[static_cast<size_t>(l)] + w.layer_params[static_cast<size_t>(l)];
  }
  const double* t_at = t_prefix.data();
  const int64_t* p_at = p_prefix.data();
  // best[k][j]: first k chunks cover layers [0, j). Each chunk keeps at least
  // one layer, so row k holds only j in [k, n - (k_chunks - k)] (its band,
  // `width` cells): the search never reads a cell outside it.
  const int64_t width = n - k_chunks + 1;
  best.resize(static_cast<size_t>((k_chunks + 1) * width));
  auto band = [&](int64_t k) { return &best[static_cast<size_t>(k * width)]; };  // cell (k, k) first
  std::fill_n(band(0), width, Best{});
  band(0)[0] = Best{0.0, 0, 0};
  // The shortcuts below lean on chunk times falling as a chunk starts later.
  const bool shortcuts =
      w.embedding_s >= 0 && std::all_of(w.layer_s.begin(), w.layer_s.end(), [](double x) { return x >= 0; });
  for (int64_t k = 1; k <= k_chunks; ++k) {
    const Best* prev = band(k - 1);  // candidate i at prev[i - (k - 1)]
    Best* row = band(k);
    SuffixMinimum(prev, width, &lightest);
    int64_t boundary = k - 1;
    for (int64_t j = k; j <= n - (k_chunks - k); ++j) {
      // The chunk [i, j)'s time and parameters, summed as
      // prefix[j] - prefix[i] + embedding + head in that order.
      const double t_j = t_at[j], head_s = j == n ? w.head_s : 0.0;
      const int64_t p_j = p_at[j], head_params = j == n ? w.head_params : 0;
      auto time_to = [&](int64_t i) { return t_j - t_at[i] + (i == 0 ? w.embedding_s : 0.0) + head_s; };
      auto params_to = [&](int64_t i) { return p_j - p_at[i] + (i == 0 ? w.embedding_params : 0) + head_params; };
      Best cell;  // kept out of the table while scanned: no store may alias a read
      const int64_t first = shortcuts ? FirstCandidate(prev, k - 1, j, &boundary, time_to) : k - 1;
      for (int64_t i = first; i < j; ++i) {
        const size_t at = static_cast<size_t>(i - (k - 1));
        if (shortcuts && lightest.Stops(at, cell)) break;
        const Best& before = prev[at];
        if (before.cut < 0) continue;
        const double t = std::max(before.time, time_to(i));
        const int64_t p = std::max(before.params, params_to(i));
        if (Better(t, p, cell)) cell = Best{t, p, i};
      }
      row[j - k] = cell;
    }
  }
  thread_local std::vector<int64_t> starts;
  starts.assign(static_cast<size_t>(k_chunks), 0);
  for (int64_t k = k_chunks, j = n; k >= 1; --k) {
    j = band(k)[j - k].cut;
    starts[static_cast<size_t>(k - 1)] = j;
  }
  plan.chunks.reserve(static_cast<size_t>(k_chunks));
  for (int64_t c = 0; c < k_chunks; ++c) {
    StageChunk chunk;
    std::tie(chunk.pipeline_rank, chunk.virtual_index) = PlaceChunk(c, k_chunks, layout.pp, layout.schedule);
    chunk.first_layer = starts[static_cast<size_t>(c)];
    chunk.end_layer = c + 1 < k_chunks ? starts[static_cast<size_t>(c + 1)] : n;
    chunk.owns_embedding = c == 0;
    chunk.owns_head = c == k_chunks - 1;
    plan.chunks.push_back(chunk);
  }
  return plan;
}

LayerWeights WeighFrameworkLayers(const LayerWeights& w, const std::vector<int64_t>& starts) {
  LayerWeights out;
  out.embedding_s = w.embedding_s;
  out.head_s = w.head_s;
  out.embedding_params = w.embedding_params;
  out.head_params = w.head_params;
  const size_t n = starts.size() - 1;
  out.layer_s.assign(n, 0.0);
  out.layer_params.assign(n, 0);
  for (size_t l = 0; l < n; ++l) {
    for (int64_t i = starts[l]; i < starts[l + 1]; ++i) {
      out.layer_s[l] += w.layer_s[static_cast<size_t>(i)];
      out.layer_params[l] += w.layer_params[static_cast<size_t>(i)];
    }
  }
  return out;
}

StagePlan ToSublayers(StagePlan plan, const std::vector<int64_t>& starts) {
  for (StageChunk& c : plan.chunks) {
    c.first_layer = starts.at(static_cast<size_t>(c.first_layer));
    c.end_layer = starts.at(static_cast<size_t>(c.end_layer));
  }
  return plan;
}

StagePlan PartitionStages(const Inventory& inv, const Layout& layout) {
  const PlanTables tables = BuildPlanTables(inv);
  return ToSublayers(PartitionStages(WeighFrameworkLayers(WeighLayers(inv, tables, layout), inv.layer_starts), layout),
                     inv.layer_starts);
}

}  // namespace preflight

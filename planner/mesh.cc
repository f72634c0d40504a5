// Mesh placement: rank <-> (node, GPU, axis coordinates) and the groups of
// every axis (docs/formulas.md §7.3).
#include <algorithm>
#include <limits>
#include <optional>

#include "preflight/planner/mesh.h"

namespace preflight {

int64_t RankOf(const Layout& l, int64_t tp, int64_t cp, int64_t dp, int64_t pp) {
  if (l.order == AxisOrder::kTpCpPpDp) return tp + l.tp * (cp + l.cp * (pp + l.pp * dp));
  return tp + l.tp * (cp + l.cp * (dp + l.dp * pp));
}

RankCoord CoordOf(const Layout& l, int64_t rank, int64_t gpus_per_node) {
  RankCoord c;
  c.rank = rank;
  c.node = rank / gpus_per_node;
  c.local_gpu = rank % gpus_per_node;
  c.tp = rank % l.tp;
  c.cp = (rank / l.tp) % l.cp;
  const int64_t outer = rank / (l.tp * l.cp);
  if (l.order == AxisOrder::kTpCpPpDp) {
    c.pp = outer % l.pp;
    c.dp = outer / l.pp;
  } else {
    c.dp = outer % l.dp;
    c.pp = outer / l.dp;
  }
  // MoE folding over the t*c*d ranks of one stage (docs/formulas.md §7.3).
  const int64_t i = c.tp + l.tp * (c.cp + l.cp * c.dp);
  c.expert_tp = i % l.expert_tp;
  c.ep = (i / l.expert_tp) % l.ep;
  c.expert_dp = i / (l.expert_tp * l.ep);
  return c;
}

namespace {

struct GroupSlot {
  int64_t group = 0;  // which group of the axis
  int64_t index = 0;  // position inside it
};

// Group id and position of a rank on axis `a` (ids are dense, 0..groups-1).
GroupSlot SlotOf(const Layout& l, const RankCoord& c, Axis a) {
  const int64_t stage_ranks = l.tp * l.cp * l.dp;
  const int64_t i = c.tp + l.tp * (c.cp + l.cp * c.dp);
  switch (a) {
    case Axis::kTp: return {c.cp + l.cp * (c.dp + l.dp * c.pp), c.tp};
    case Axis::kCp: return {c.tp + l.tp * (c.dp + l.dp * c.pp), c.cp};
    case Axis::kDp: return {c.tp + l.tp * (c.cp + l.cp * c.pp), c.dp};
    case Axis::kPp: return {i, c.pp};
    case Axis::kExpertTp: return {c.pp * (stage_ranks / l.expert_tp) + i / l.expert_tp, c.expert_tp};
    case Axis::kEp: return {c.pp * (stage_ranks / l.ep) + c.expert_tp + l.expert_tp * c.expert_dp, c.ep};
    // HSDP: a replica is a block of consecutive positions of the d*c (d_e)
    // group; the shard axes group inside a replica, the replica axes across
    // (Megatron parallel_state.py: intra/inter partial data-parallel groups).
    case Axis::kExpertDp: {
      const int64_t shard = l.expert_dp() / l.dp_replicate;
      const int64_t group = c.pp * (l.expert_tp * l.ep) + c.expert_tp + l.expert_tp * c.ep;
      return {group * l.dp_replicate + c.expert_dp / shard, c.expert_dp % shard};
    }
    case Axis::kExpertDpReplica: {
      const int64_t shard = l.expert_dp() / l.dp_replicate;
      const int64_t group = c.pp * (l.expert_tp * l.ep) + c.expert_tp + l.expert_tp * c.ep;
      return {group * shard + c.expert_dp % shard, c.expert_dp / shard};
    }
    case Axis::kDpCp: {
      const int64_t j = c.cp + l.cp * c.dp, shard = l.zero_group();
      return {(c.tp + l.tp * c.pp) * l.dp_replicate + j / shard, j % shard};
    }
    case Axis::kDpReplica: {
      const int64_t j = c.cp + l.cp * c.dp, shard = l.zero_group();
      return {(c.tp + l.tp * c.pp) * shard + j % shard, j / shard};
    }
    case Axis::kEmbedding: return {i, c.pp == 0 ? 0 : 1};
    case Axis::kPpMirror: return {i + stage_ranks * std::min(c.pp, l.pp - 1 - c.pp), 2 * c.pp < l.pp ? 0 : 1};
  }
  return {};
}

int64_t AxisSize(const Layout& l, Axis a) {
  switch (a) {
    case Axis::kTp: return l.tp;
    case Axis::kCp: return l.cp;
    case Axis::kDp: return l.dp;
    case Axis::kPp: return l.pp;
    case Axis::kEp: return l.ep;
    case Axis::kExpertTp: return l.expert_tp;
    case Axis::kExpertDp: return l.expert_zero_group();
    case Axis::kDpCp: return l.zero_group();
    case Axis::kEmbedding: return 2;
    case Axis::kDpReplica: return l.dp_replicate;
    case Axis::kExpertDpReplica: return l.dp_replicate;
    case Axis::kPpMirror: return 2;
  }
  return 1;
}

// Locality of one axis per NVLink domain of `domain` consecutive ranks (a
// node on HGX), gathered rank by rank in ascending order: a group's members
// then arrive in node order, so the members one node holds form a run that
// ends when a member on another node arrives.
class LocalityCounter {
 public:
  LocalityCounter(Axis a, int64_t size, int64_t groups) : axis_(a), size_(size), runs_(static_cast<size_t>(groups)) {}
  void Add(int64_t group, int64_t node) {
    Run& g = runs_[static_cast<size_t>(group)];
    if (node == g.node) {
      ++g.length;
      return;
    }
    if (g.node >= 0) g.fewest = std::min(g.fewest, g.length);
    g.node = node;
    g.length = 1;
    ++g.nodes;
  }
  AxisLocality Finish() const {
    AxisLocality loc;
    loc.axis = axis_;
    loc.size = size_;
    loc.groups = static_cast<int64_t>(runs_.size());
    loc.min_members_per_node = size_;
    for (const Run& g : runs_) {
      if (g.nodes == 0) continue;  // a group the pass did not visit (CountLocality's first block)
      loc.min_members_per_node = std::min({loc.min_members_per_node, g.fewest, g.length});
      loc.max_nodes_spanned = std::max(loc.max_nodes_spanned, g.nodes);
    }
    loc.intra_node = loc.max_nodes_spanned <= 1;
    return loc;
  }

 private:
  struct Run {
    int64_t node = -1;                                     // of the last member seen
    int64_t length = 0;                                    // members on it so far
    int64_t nodes = 0;                                     // nodes the group spans so far
    int64_t fewest = std::numeric_limits<int64_t>::max();  // shortest finished run
  };
  Axis axis_;
  int64_t size_;
  std::vector<Run> runs_;
};

// Every rank's coordinates in rank order (CoordOf's, without node and local
// GPU, and without the expert view unless `expert`), counted like an odometer
// instead of divided out of each rank: LocalityOf visits every rank.
// `only` restricts the visit to the first value of the outer or the inner
// of pp and dp.
enum class RankSet { kAll, kFirstOuter, kFirstInner };
template <class Visit>
void ForEachCoord(const Layout& l, bool expert, RankSet only, const Visit& visit) {
  // tp->cp->dp->pp: dp inside pp; tp->cp->pp->dp: pp inside dp (RankOf).
  const bool pp_inner = l.order == AxisOrder::kTpCpPpDp;
  const int64_t outer_all = pp_inner ? l.dp : l.pp, inner_all = pp_inner ? l.pp : l.dp;
  const int64_t outer_n = only == RankSet::kFirstOuter ? 1 : outer_all;
  const int64_t inner_n = only == RankSet::kFirstInner ? 1 : inner_all;
  RankCoord c;
  for (int64_t outer = 0; outer < outer_n; ++outer) {
    for (int64_t inner = 0; inner < inner_n; ++inner) {
      c.pp = pp_inner ? inner : outer;
      c.dp = pp_inner ? outer : inner;
      c.rank = (outer * inner_all + inner) * l.tp * l.cp;
      for (c.cp = 0; c.cp < l.cp; ++c.cp) {
        for (c.tp = 0; c.tp < l.tp; ++c.tp) {
          if (expert) {  // MoE folding over the t*c*d ranks of one stage, as CoordOf
            const int64_t i = c.tp + l.tp * (c.cp + l.cp * c.dp);
            c.expert_tp = i % l.expert_tp;
            c.ep = (i / l.expert_tp) % l.ep;
            c.expert_dp = i / (l.expert_tp * l.ep);
          }
          visit(c);
          ++c.rank;
        }
      }
    }
  }
}

// DualPipe's mirror pairs (pipeline ranks i and p-1-i) exist with an even pp only.
bool Mirrored(const Layout& l) { return l.schedule == Schedule::kDualPipe && l.pp > 1 && l.pp % 2 == 0; }

// The groups of axis `a`: world / size, except the tied embedding's, which
// exist only with pp > 1 (one per position of a stage), and DualPipe's
// mirror pairs, only under DualPipe.
int64_t GroupCount(const Layout& l, Axis a, bool tied_embedding) {
  if (a == Axis::kPpMirror) return Mirrored(l) ? l.world() / 2 : 0;
  if (a != Axis::kEmbedding) return l.world() / AxisSize(l, a);
  return tied_embedding && l.pp > 1 ? l.tp * l.cp * l.dp : 0;
}

// Whether rank `c` is a member of an axis's groups (the embedding's hold the
// first and last stage only).
bool InGroups(const Layout& l, const RankCoord& c, Axis a) {
  if (a == Axis::kPpMirror) return Mirrored(l);
  return a != Axis::kEmbedding || c.pp == 0 || c.pp == l.pp - 1;
}

}  // namespace

int64_t NvlinkDomain(const ClusterConfig& c) {
  return c.spec.nvlink_domain > 0 ? c.spec.nvlink_domain : c.gpus_per_node;
}

bool DenseAxis(Axis a) {
  return a != Axis::kEp && a != Axis::kExpertTp && a != Axis::kExpertDp && a != Axis::kExpertDpReplica;
}

MeshLocality LocalityOf(const Layout& l, int64_t gpus_per_node, bool tied_embedding, int64_t nvlink_domain) {
  return LocalityOf(l, gpus_per_node, tied_embedding, nvlink_domain, [](Axis) { return true; });
}

namespace {

// One pass over the ranks counting the groups of `axes` (each of more than
// one rank), into `out`.
void CountLocality(const Layout& l, int64_t domain, bool tied_embedding, const std::vector<Axis>& axes, RankSet only,
                   MeshLocality& out) {
  if (axes.empty()) return;
  std::vector<LocalityCounter> counters;
  for (Axis axis : axes) counters.emplace_back(axis, AxisSize(l, axis), GroupCount(l, axis, tied_embedding));
  const bool expert = std::any_of(axes.begin(), axes.end(), [](Axis a) { return !DenseAxis(a); });
  ForEachCoord(l, expert, only, [&](const RankCoord& c) {
    const int64_t node = c.rank / domain;
    for (size_t k = 0; k < axes.size(); ++k) {
      if (InGroups(l, c, axes[k])) counters[k].Add(SlotOf(l, c, axes[k]).group, node);
    }
  });
  for (size_t k = 0; k < axes.size(); ++k) out[static_cast<size_t>(axes[k])] = counters[k].Finish();
}

// Rank as a mixed-radix number whose digits each move the rank by a fixed
// stride: the pipeline stage and the stage-local index i = tp + t*(cp + c*dp)
// cut at every boundary an axis's groups have in it (t, t*c, the dense and
// expert ZeRO shards, e_t, e_t*e). An axis's groups then vary some digits and
// keep the others: each is a translate of the group at rank 0, by a base whose
// residue modulo the NVLink domain fixes how it spans nodes. Empty when the
// boundaries do not nest (tp 3 beside expert_tp 2, say).
struct Digit {
  int64_t low = 1;     // first index of i the digit moves (1 for its lowest), 0 for the stage
  int64_t count = 1;   // values
  int64_t stride = 1;  // rank step of one value
};
std::vector<Digit> RankDigits(const Layout& l) {
  const int64_t tc = l.tp * l.cp, stage = tc * l.dp;
  const int64_t dense_shard = l.zero_group(), expert_shard = l.expert_zero_group();
  std::vector<int64_t> bounds = {
      1, l.tp, tc, stage, l.expert_tp, l.expert_tp * l.ep, l.tp * dense_shard, l.expert_tp * l.ep * expert_shard};
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<Digit> out;
  if (bounds.front() < 1 || bounds.back() != stage) return out;
  const bool pp_outer = l.order == AxisOrder::kTpCpDpPp;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    if (bounds[k + 1] % bounds[k] != 0) return {};
    // tp->cp->dp->pp: rank = i + stage * pp; tp->cp->pp->dp: the dp part of
    // i (from t*c up) moves the rank by t*c*p per step of t*c.
    const int64_t stride = pp_outer || bounds[k] < tc ? bounds[k] : bounds[k] * l.pp;
    out.push_back({bounds[k], bounds[k + 1] / bounds[k], stride});
  }
  out.push_back({0, l.pp, pp_outer ? stage : tc});
  return out;
}

// The part of i (first, end) an axis's groups vary; the stage when `stage`.
struct Varies {
  int64_t first = 1, end = 1;
  bool stage = false;
};
std::optional<Varies> VariesOf(const Layout& l, Axis a) {
  const int64_t tc = l.tp * l.cp, stage = tc * l.dp;
  const int64_t et = l.expert_tp, ete = l.expert_tp * l.ep;
  switch (a) {
    case Axis::kTp: return Varies{1, l.tp, false};
    case Axis::kCp: return Varies{l.tp, tc, false};
    case Axis::kDp: return Varies{tc, stage, false};
    case Axis::kPp: return Varies{1, 1, true};
    case Axis::kExpertTp: return Varies{1, et, false};
    case Axis::kEp: return Varies{et, ete, false};
    case Axis::kExpertDp: return Varies{ete, ete * l.expert_zero_group(), false};
    case Axis::kExpertDpReplica: return Varies{ete * l.expert_zero_group(), stage, false};
    case Axis::kDpCp: return Varies{l.tp, l.tp * l.zero_group(), false};
    case Axis::kDpReplica: return Varies{l.tp * l.zero_group(), stage, false};
    case Axis::kEmbedding: return std::nullopt;  // two stages, not a digit
    case Axis::kPpMirror: return std::nullopt;   // DualPipe's mirrored stage pairs, not a digit
  }
  return std::nullopt;
}

// Locality of an axis from one group per residue of the bases (see
// RankDigits), as LocalityCounter::Finish gives it; nullopt when the axis's
// groups are not digit translates.
std::optional<AxisLocality> TranslatesLocality(const Layout& l, Axis a, int64_t size, int64_t groups, int64_t domain,
                                               const std::vector<Digit>& digits) {
  if (digits.empty()) return std::nullopt;
  std::vector<int64_t> offsets = {0};
  std::vector<int64_t> residues = {0};  // of the bases, modulo the domain
  std::vector<bool> seen(static_cast<size_t>(domain));
  const auto fix = [&](int64_t count, int64_t stride) {  // the bases take count values of this digit
    std::fill(seen.begin(), seen.end(), false);
    std::vector<int64_t> next;
    for (int64_t r : residues) {
      for (int64_t x = 0; x < std::min(count, domain); ++x) {
        const int64_t v = (r + x % domain * (stride % domain)) % domain;
        if (!seen[static_cast<size_t>(v)]) {
          seen[static_cast<size_t>(v)] = true;
          next.push_back(v);
        }
      }
    }
    residues = std::move(next);
  };
  const auto vary = [&](int64_t count, int64_t stride) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(count));
    for (int64_t x = 0; x < count; ++x) {
      for (int64_t o : offsets) next.push_back(o + x * stride);
    }
    offsets = std::move(next);
  };
  if (a == Axis::kEmbedding) {  // the first and the last stage
    for (const Digit& d : digits) {
      if (d.low == 0) {
        offsets = {0, (l.pp - 1) * d.stride};
      } else {
        fix(d.count, d.stride);
      }
    }
  } else {
    const std::optional<Varies> v = VariesOf(l, a);
    if (!v) return std::nullopt;
    for (const Digit& d : digits) {
      const bool varied = d.low == 0 ? v->stage : d.low >= v->first && d.low < v->end;
      if (varied) {
        vary(d.count, d.stride);
      } else {
        fix(d.count, d.stride);
      }
    }
  }
  if (static_cast<int64_t>(offsets.size()) != size) return std::nullopt;
  std::sort(offsets.begin(), offsets.end());
  // One group per residue, its members in rank order.
  LocalityCounter counter(a, size, static_cast<int64_t>(residues.size()));
  for (size_t g = 0; g < residues.size(); ++g) {
    for (int64_t o : offsets) counter.Add(static_cast<int64_t>(g), (residues[g] + o) / domain);
  }
  AxisLocality loc = counter.Finish();
  loc.groups = groups;
  return loc;
}

// Whether every group of `a` keeps pp (keeps_pp) or dp (otherwise) fixed.
bool KeepsFixed(Axis a, bool keeps_pp) {
  if (keeps_pp) return a != Axis::kPp && a != Axis::kEmbedding && a != Axis::kPpMirror;
  return a == Axis::kTp || a == Axis::kCp || a == Axis::kPp || a == Axis::kEmbedding || a == Axis::kPpMirror;
}

}  // namespace

MeshLocality LocalityOf(const Layout& l, int64_t gpus_per_node, bool tied_embedding, int64_t nvlink_domain,
                        bool (*axes)(Axis)) {
  const int64_t domain = nvlink_domain > 0 ? nvlink_domain : gpus_per_node;
  // Rank = tp + t*(cp + c*(inner + n_inner*outer)), (inner, outer) = (dp, pp)
  // under order tp->cp->dp->pp and (pp, dp) under tp->cp->pp->dp. The groups
  // of an axis that keeps pp (dp) fixed at one value are those at another
  // value shifted by a whole number of t*c*n_inner (outer) or t*c (inner)
  // ranks; when that shift is a whole number of NVLink domains they span
  // their nodes alike, so the groups at the first value give every figure:
  // O(world / pp) or O(world / dp) for such an axis, not O(world).
  const bool pp_outer = l.order == AxisOrder::kTpCpDpPp;
  const int64_t outer_n = pp_outer ? l.pp : l.dp, inner_n = pp_outer ? l.dp : l.pp;
  const int64_t tc = l.tp * l.cp;
  const bool by_outer = outer_n > 1 && (tc * inner_n) % domain == 0;
  const bool by_inner = inner_n > 1 && tc % domain == 0;
  std::vector<Axis> whole, first_outer, first_inner;  // axes with groups of more than one rank
  MeshLocality out;
  const std::vector<Digit> digits = RankDigits(l);
  for (int a = 0; a < kNumAxes; ++a) {
    const Axis axis = static_cast<Axis>(a);
    if (!axes(axis)) continue;
    const int64_t size = AxisSize(l, axis), groups = GroupCount(l, axis, tied_embedding);
    if (size <= 1 || groups == 0) {
      // A rank alone (or no group at all) spans one node.
      out[static_cast<size_t>(a)] = LocalityCounter(axis, size, 0).Finish();
      out[static_cast<size_t>(a)].groups = groups;
      continue;
    }
    // O(size x domain) when the groups are digit translates, else a pass over ranks.
    if (const auto loc = TranslatesLocality(l, axis, size, groups, domain, digits)) {
      out[static_cast<size_t>(a)] = *loc;
      continue;
    }
    // The outer axis is fixed in an axis's groups when it keeps pp (dp) fixed.
    const bool outer = by_outer && KeepsFixed(axis, pp_outer);
    const bool inner = by_inner && KeepsFixed(axis, !pp_outer);
    if (outer && (!inner || outer_n >= inner_n)) {
      first_outer.push_back(axis);
    } else if (inner) {
      first_inner.push_back(axis);
    } else {
      whole.push_back(axis);
    }
  }
  CountLocality(l, domain, tied_embedding, whole, RankSet::kAll, out);
  CountLocality(l, domain, tied_embedding, first_outer, RankSet::kFirstOuter, out);
  CountLocality(l, domain, tied_embedding, first_inner, RankSet::kFirstInner, out);
  return out;
}

Mesh PlaceRanks(const Layout& l, int64_t gpus_per_node, bool tied_embedding, int64_t nvlink_domain) {
  Mesh mesh;
  mesh.world = l.world();
  mesh.gpus_per_node = gpus_per_node;
  mesh.nodes = CeilDiv(mesh.world, gpus_per_node);
  mesh.ranks.reserve(static_cast<size_t>(mesh.world));
  for (int64_t r = 0; r < mesh.world; ++r) mesh.ranks.push_back(CoordOf(l, r, gpus_per_node));
  for (int a = 0; a < kNumAxes; ++a) {
    const Axis axis = static_cast<Axis>(a);
    auto& groups = mesh.groups[static_cast<size_t>(a)];
    groups.assign(static_cast<size_t>(GroupCount(l, axis, tied_embedding)),
                  std::vector<int64_t>(static_cast<size_t>(AxisSize(l, axis))));
    if (groups.empty()) continue;
    for (const auto& c : mesh.ranks) {
      if (!InGroups(l, c, axis)) continue;
      const GroupSlot s = SlotOf(l, c, axis);
      groups[static_cast<size_t>(s.group)][static_cast<size_t>(s.index)] = c.rank;
    }
  }
  mesh.locality = LocalityOf(l, gpus_per_node, tied_embedding, nvlink_domain);
  return mesh;
}

}  // namespace preflight

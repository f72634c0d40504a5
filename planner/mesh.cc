// Mesh placement: rank <-> (node, GPU, axis coordinates) and the groups of
// every axis (docs/formulas.md §7.3).
#include <algorithm>

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
  }
  return 1;
}

// Locality per NVLink domain of `domain` consecutive ranks (a node on HGX).
AxisLocality Summarize(Axis a, int64_t size, const std::vector<std::vector<int64_t>>& groups, int64_t domain) {
  AxisLocality loc;
  loc.axis = a;
  loc.size = size;
  loc.groups = static_cast<int64_t>(groups.size());
  loc.min_members_per_node = size;
  for (const auto& g : groups) {
    // Count members per node; members are in coordinate order, which is
    // rank order for every axis, so equal nodes are adjacent.
    std::vector<int64_t> nodes(g.size());
    for (size_t k = 0; k < g.size(); ++k) nodes[k] = g[k] / domain;
    std::sort(nodes.begin(), nodes.end());
    int64_t spanned = 0;
    for (size_t k = 0; k < nodes.size();) {
      size_t run = k;
      while (run < nodes.size() && nodes[run] == nodes[k]) ++run;
      ++spanned;
      loc.min_members_per_node = std::min(loc.min_members_per_node, static_cast<int64_t>(run - k));
      k = run;
    }
    loc.max_nodes_spanned = std::max(loc.max_nodes_spanned, spanned);
  }
  loc.intra_node = loc.max_nodes_spanned <= 1;
  return loc;
}

}  // namespace

int64_t NvlinkDomain(const ClusterConfig& c) {
  return c.spec.nvlink_domain > 0 ? c.spec.nvlink_domain : c.gpus_per_node;
}

Mesh PlaceRanks(const Layout& l, int64_t gpus_per_node, bool tied_embedding, int64_t nvlink_domain) {
  const int64_t domain = nvlink_domain > 0 ? nvlink_domain : gpus_per_node;
  Mesh mesh;
  mesh.world = l.world();
  mesh.gpus_per_node = gpus_per_node;
  mesh.nodes = CeilDiv(mesh.world, gpus_per_node);
  mesh.ranks.reserve(static_cast<size_t>(mesh.world));
  for (int64_t r = 0; r < mesh.world; ++r) mesh.ranks.push_back(CoordOf(l, r, gpus_per_node));

  for (int a = 0; a < kNumAxes; ++a) {
    const Axis axis = static_cast<Axis>(a);
    auto& groups = mesh.groups[static_cast<size_t>(a)];
    const int64_t size = AxisSize(l, axis);
    if (axis == Axis::kEmbedding) {
      if (tied_embedding && l.pp > 1) {
        groups.assign(static_cast<size_t>(l.tp * l.cp * l.dp), std::vector<int64_t>(2));
        for (const auto& c : mesh.ranks) {
          if (c.pp != 0 && c.pp != l.pp - 1) continue;
          const GroupSlot s = SlotOf(l, c, axis);
          groups[static_cast<size_t>(s.group)][static_cast<size_t>(s.index)] = c.rank;
        }
      }
    } else {
      groups.assign(static_cast<size_t>(mesh.world / size), std::vector<int64_t>(static_cast<size_t>(size)));
      for (const auto& c : mesh.ranks) {
        const GroupSlot s = SlotOf(l, c, axis);
        groups[static_cast<size_t>(s.group)][static_cast<size_t>(s.index)] = c.rank;
      }
    }
    mesh.locality[static_cast<size_t>(a)] = Summarize(axis, size, groups, domain);
  }
  return mesh;
}

}  // namespace preflight

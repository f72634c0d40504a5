// Mesh placement: rank -> node/GPU and the groups of every axis, with their
// locality (NVLink inside a node, InfiniBand across). PlaceRanks lists every
// rank and group (O(world)); sweeps cache a MeshLocality per (degrees, order).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/inventory/comm_bucket.h"
#include "preflight/inventory/layout.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Mesh placement (docs/formulas.md §7.3)

/// Where one global rank sits and its coordinate on every axis.
struct RankCoord {
  int64_t rank = 0;
  int64_t node = 0;       // rank / gpus_per_node
  int64_t local_gpu = 0;  // rank % gpus_per_node
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
  int64_t expert_tp = 0, ep = 0, expert_dp = 0;
};

/// Summary of the groups of one axis.
struct AxisLocality {
  Axis axis = Axis::kTp;
  int64_t size = 1;               // ranks per group
  int64_t groups = 0;             // number of groups
  bool intra_node = true;         // every group inside one node (NVLink only)
  int64_t max_nodes_spanned = 1;  // over all groups
  /// Fewest members a spanning group has on one of its nodes (g_loc of docs/formulas.md
  /// 7.1 B_eff; NCCL spreads a ring's channels over that many NICs). Equals
  /// `size` for intra-node axes.
  int64_t min_members_per_node = 1;
};
using MeshLocality = std::array<AxisLocality, kNumAxes>;

struct Mesh {
  int64_t world = 0;
  int64_t gpus_per_node = 8;
  int64_t nodes = 0;
  std::vector<RankCoord> ranks;  // indexed by global rank
  /// groups[axis] = every group of that axis, each a list of global ranks in
  /// axis-coordinate order. kEmbedding is empty unless the head is tied and pp > 1.
  std::array<std::vector<std::vector<int64_t>>, kNumAxes> groups;
  MeshLocality locality;
};

/// Global rank of (tp, cp, dp, pp) coordinates under layout.order:
/// tp->cp->dp->pp: i_tp + t*(i_cp + c*(i_dp + d*i_pp)) (Megatron default);
/// tp->cp->pp->dp: i_tp + t*(i_cp + c*(i_pp + p*i_dp)) (Llama 3).
int64_t RankOf(const Layout& layout, int64_t tp, int64_t cp, int64_t dp, int64_t pp);
/// Coordinates of `rank`, expert view included (MoE folding, docs/formulas.md §7.3).
RankCoord CoordOf(const Layout& layout, int64_t rank, int64_t gpus_per_node);
/// Every rank and group of the layout, with locality per axis.
/// `tied_embedding` adds the kEmbedding groups when pp > 1.
/// `nvlink_domain` (0 = a node) is how many consecutive ranks one NVLink
/// domain joins: a group inside one domain is `intra_node` (NVLink), else it
/// crosses the network (GB200 NVL72: 72 GPUs over 18 nodes of 4).
Mesh PlaceRanks(const Layout& layout, int64_t gpus_per_node, bool tied_embedding = false, int64_t nvlink_domain = 0);
/// PlaceRanks's locality alone, without listing ranks and groups: what a
/// sweep needs of a layout's placement (one pass over the ranks).
MeshLocality LocalityOf(const Layout& layout, int64_t gpus_per_node, bool tied_embedding = false,
                        int64_t nvlink_domain = 0);
/// The axes whose groups do not depend on the expert degrees (ep, expert_tp):
/// TP, CP, DP, PP, DP x CP, the replicas and the tied embedding.
bool DenseAxis(Axis axis);
/// LocalityOf for the axes `axes` selects only (the others left default).
MeshLocality LocalityOf(const Layout& layout, int64_t gpus_per_node, bool tied_embedding, int64_t nvlink_domain,
                        bool (*axes)(Axis));
/// The recipe's NVLink domain in ranks: the device's, or a node.
int64_t NvlinkDomain(const ClusterConfig& cluster);

}  // namespace preflight

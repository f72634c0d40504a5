// Mesh placement against hand-written rank tables (docs/formulas.md §7.3 formulas,
// worked out by hand in the comments).
#include <algorithm>
#include <limits>
#include <map>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "preflight/planner/plan.h"

namespace preflight::planner_mesh_test {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

Layout Degrees(int64_t tp, int64_t cp, int64_t dp, int64_t pp, AxisOrder order = AxisOrder::kTpCpDpPp) {
  Layout l;
  l.tp = tp;
  l.cp = cp;
  l.dp = dp;
  l.pp = pp;
  l.order = order;
  return l;
}

const AxisLocality& Loc(const Mesh& m, Axis a) { return m.locality[static_cast<size_t>(a)]; }
const Groups& GroupsOf(const Mesh& m, Axis a) { return m.groups[static_cast<size_t>(a)]; }

// 2 nodes x 8 GPUs, tp 4, dp 2, pp 2, Megatron order tp->cp->dp->pp:
// rank = i_tp + 4*(i_dp + 2*i_pp), so
//   node 0: ranks 0-3 (dp0, pp0), 4-7 (dp1, pp0)
//   node 1: ranks 8-11 (dp0, pp1), 12-15 (dp1, pp1)
TEST(PlannerMesh, TwoNodeMegatronOrderHandTable) {
  const Mesh m = PlaceRanks(Degrees(4, 1, 2, 2), 8);
  ASSERT_EQ(m.world, 16);
  EXPECT_EQ(m.nodes, 2);
  struct Row {
    int64_t rank, node, gpu, tp, dp, pp;
  };
  const Row rows[] = {{0, 0, 0, 0, 0, 0}, {3, 0, 3, 3, 0, 0},  {4, 0, 4, 0, 1, 0},  {7, 0, 7, 3, 1, 0},
                      {8, 1, 0, 0, 0, 1}, {11, 1, 3, 3, 0, 1}, {12, 1, 4, 0, 1, 1}, {15, 1, 7, 3, 1, 1}};
  for (const Row& r : rows) {
    const RankCoord& c = m.ranks[static_cast<size_t>(r.rank)];
    EXPECT_EQ(c.node, r.node) << r.rank;
    EXPECT_EQ(c.local_gpu, r.gpu) << r.rank;
    EXPECT_EQ(c.tp, r.tp) << r.rank;
    EXPECT_EQ(c.dp, r.dp) << r.rank;
    EXPECT_EQ(c.pp, r.pp) << r.rank;
    EXPECT_EQ(c.cp, 0) << r.rank;
  }
  EXPECT_EQ(GroupsOf(m, Axis::kTp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(GroupsOf(m, Axis::kDp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(GroupsOf(m, Axis::kPp), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_TRUE(Loc(m, Axis::kTp).intra_node);
  EXPECT_TRUE(Loc(m, Axis::kDp).intra_node);
  EXPECT_FALSE(Loc(m, Axis::kPp).intra_node);
  EXPECT_EQ(Loc(m, Axis::kPp).max_nodes_spanned, 2);
  EXPECT_EQ(Loc(m, Axis::kPp).min_members_per_node, 1);
  EXPECT_EQ(Loc(m, Axis::kTp).groups, 4);
  EXPECT_EQ(Loc(m, Axis::kPp).groups, 8);
}

// Same degrees, Llama 3 order tp->cp->pp->dp: rank = i_tp + 4*(i_pp + 2*i_dp):
// node 0 holds dp replica 0 (both stages), node 1 replica 1; PP stays on
// NVLink and DP crosses nodes.
TEST(PlannerMesh, TwoNodeLlamaOrderHandTable) {
  const Mesh m = PlaceRanks(Degrees(4, 1, 2, 2, AxisOrder::kTpCpPpDp), 8);
  EXPECT_EQ(m.ranks[4].pp, 1);
  EXPECT_EQ(m.ranks[4].dp, 0);
  EXPECT_EQ(m.ranks[8].pp, 0);
  EXPECT_EQ(m.ranks[8].dp, 1);
  EXPECT_EQ(GroupsOf(m, Axis::kPp)[0], (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(GroupsOf(m, Axis::kDp)[0], (std::vector<int64_t>{0, 8}));
  EXPECT_TRUE(Loc(m, Axis::kPp).intra_node);
  EXPECT_FALSE(Loc(m, Axis::kDp).intra_node);
  EXPECT_TRUE(Loc(m, Axis::kTp).intra_node);
  const Layout l = Degrees(4, 1, 2, 2, AxisOrder::kTpCpPpDp);
  for (int64_t r = 0; r < 16; ++r) {
    const RankCoord& c = m.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(RankOf(l, c.tp, c.cp, c.dp, c.pp), r);
  }
}

// tp 2, cp 2, dp 2, pp 2 on 2 nodes: rank = i_tp + 2*(i_cp + 2*(i_dp + 2*i_pp)).
// CP group of rank 0: {0, 2}; the dense-gradient group (dp x cp) of tp 0, pp 0:
// i_cp + 2*i_dp = 0..3 -> ranks {0, 2, 4, 6}.
TEST(PlannerMesh, ContextParallelAndDpCpGroups) {
  const Mesh m = PlaceRanks(Degrees(2, 2, 2, 2), 8);
  EXPECT_EQ(GroupsOf(m, Axis::kCp)[0], (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(GroupsOf(m, Axis::kDpCp)[0], (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(Loc(m, Axis::kDpCp).size, 4);
  EXPECT_TRUE(Loc(m, Axis::kCp).intra_node);
  EXPECT_EQ(GroupsOf(m, Axis::kPp)[0], (std::vector<int64_t>{0, 8}));
}

// Expert folding (docs/formulas.md §7.3): tp 4, dp 2, pp 2, ep 8 on 16 GPUs. Within a
// stage i = i_tp + 4*i_dp covers 8 ranks; ep = i mod 8 -> one EP group per
// stage. Megatron order: stage 0 is ranks 0-7 (node 0), inside a node.
// Llama order: stage 0 is ranks {0-3, 8-11}, 4 on each node.
TEST(PlannerMesh, ExpertFoldingLocality) {
  Layout l = Degrees(4, 1, 2, 2);
  l.ep = 8;
  const Mesh mg = PlaceRanks(l, 8);
  EXPECT_EQ(GroupsOf(mg, Axis::kEp), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_TRUE(Loc(mg, Axis::kEp).intra_node);
  EXPECT_EQ(Loc(mg, Axis::kExpertDp).size, 1);

  l.order = AxisOrder::kTpCpPpDp;
  const Mesh ll = PlaceRanks(l, 8);
  EXPECT_EQ(GroupsOf(ll, Axis::kEp)[0], (std::vector<int64_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_FALSE(Loc(ll, Axis::kEp).intra_node);
  EXPECT_EQ(Loc(ll, Axis::kEp).min_members_per_node, 4);
}

// ep 2, expert_tp 2 over tp 4 x dp 2 (8 ranks a stage): i_etp = i mod 2,
// i_ep = (i/2) mod 2, i_edp = i/4. Rank 5 (i = 1 + 4*1 = 5): etp 1, ep 0, edp 1.
// Its expert-TP group is {4, 5}, EP group {5, 7}, expert-DP group {1, 5}.
TEST(PlannerMesh, ExpertCoordinatesByHand) {
  Layout l = Degrees(4, 1, 2, 2);
  l.ep = 2;
  l.expert_tp = 2;
  const Mesh m = PlaceRanks(l, 8);
  const RankCoord& c = m.ranks[5];
  EXPECT_EQ(c.expert_tp, 1);
  EXPECT_EQ(c.ep, 0);
  EXPECT_EQ(c.expert_dp, 1);
  auto group_with = [&](Axis a, int64_t rank) {
    for (const auto& g : GroupsOf(m, a)) {
      for (int64_t x : g) {
        if (x == rank) return g;
      }
    }
    return std::vector<int64_t>{};
  };
  EXPECT_EQ(group_with(Axis::kExpertTp, 5), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(group_with(Axis::kEp, 5), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(group_with(Axis::kExpertDp, 5), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(Loc(m, Axis::kExpertDp).size, 2);  // d_e = t*c*d/(e*t_e) = 8/4
}

// Tied embedding group: first and last stage ranks with equal (tp, cp, dp).
TEST(PlannerMesh, TiedEmbeddingGroups) {
  const Mesh tied = PlaceRanks(Degrees(4, 1, 2, 2), 8, true);
  ASSERT_EQ(GroupsOf(tied, Axis::kEmbedding).size(), 8u);
  EXPECT_EQ(GroupsOf(tied, Axis::kEmbedding)[5], (std::vector<int64_t>{5, 13}));
  const Mesh untied = PlaceRanks(Degrees(4, 1, 2, 2), 8, false);
  EXPECT_TRUE(GroupsOf(untied, Axis::kEmbedding).empty());
}

// Counted by hand from PlaceRanks's groups: the most nodes a group's members
// sit on, and the fewest members a group has on one of its nodes.
struct NodeCounts {
  int64_t most_nodes = 1;
  int64_t fewest_members = std::numeric_limits<int64_t>::max();
};
NodeCounts CountNodes(const Groups& groups, int64_t domain) {
  NodeCounts out;
  for (const auto& g : groups) {
    std::map<int64_t, int64_t> per_node;
    for (int64_t rank : g) ++per_node[rank / domain];
    out.most_nodes = std::max(out.most_nodes, static_cast<int64_t>(per_node.size()));
    for (const auto& [node, members] : per_node) out.fewest_members = std::min(out.fewest_members, members);
  }
  return out;
}

// LocalityOf (what sweeps use, without the groups) equals the summary of the
// groups PlaceRanks lists, on layouts whose groups straddle nodes unevenly:
// tp 3 and 6 against 8-GPU nodes, an NVLink domain of 4 and 12, dp 4 and 6,
// both rank orders, MoE folding, HSDP replicas, the tied embedding. Most
// axes' groups are translates of the one at rank 0 (TranslatesLocality: one
// group per residue of their bases modulo the domain); tp 6 with expert_tp 2
// and cp 2 do not nest and take the passes over ranks. LocalityOf counts
// an axis whose groups keep pp (or dp) fixed over the ranks at its first
// value when the shift to the next is a whole number of domains (e.g. tp 2,
// cp 2, domain 4: t*c = 4; tp 6, cp 2, domain 12).
// Every axis of LocalityOf(l) against the groups PlaceRanks lists, tied
// embedding, 8-GPU nodes; the axes checked.
int ExpectListedLocality(const Layout& l, int64_t domain, const MeshLocality& fast) {
  const Mesh m = PlaceRanks(l, 8, true, domain);
  int checked = 0;
  for (int a = 0; a < kNumAxes; ++a) {
    const Axis axis = static_cast<Axis>(a);
    const Groups& groups = GroupsOf(m, axis);
    const NodeCounts want = CountNodes(groups, domain > 0 ? domain : 8);
    const AxisLocality& got = fast[static_cast<size_t>(a)];
    const std::string where =
        fmt::format("{} tp {} cp {} dp {} pp {} order {} ep {} etp {} replicas {} domain {}", Key(axis), l.tp, l.cp,
                    l.dp, l.pp, static_cast<int>(l.order), l.ep, l.expert_tp, l.dp_replicate, domain);
    EXPECT_EQ(got.axis, axis) << where;
    EXPECT_EQ(got.size, Loc(m, axis).size) << where;
    EXPECT_EQ(got.groups, static_cast<int64_t>(groups.size())) << where;
    EXPECT_EQ(got.intra_node, want.most_nodes == 1) << where;
    EXPECT_EQ(got.max_nodes_spanned, want.most_nodes) << where;
    // No groups (the untied embedding): the whole group size.
    EXPECT_EQ(got.min_members_per_node, groups.empty() ? got.size : want.fewest_members) << where;
    ++checked;
  }
  return checked;
}

TEST(PlannerMesh, LocalityOfMatchesTheListedGroups) {
  int checked = 0;
  for (int64_t tp : {1, 2, 3, 6}) {
    for (int64_t cp : {1, 2}) {
      for (int64_t pp : {1, 2, 3}) {
        for (AxisOrder order : {AxisOrder::kTpCpDpPp, AxisOrder::kTpCpPpDp}) {
          for (int64_t domain : {0, 4, 12}) {
            for (int64_t dp : {4, 6}) {
              Layout l = Degrees(tp, cp, dp, pp, order);
              l.ep = 2;
              l.expert_tp = tp % 2 == 0 ? 2 : 1;
              l.zero = 1;
              l.dp_replicate = cp == 2 ? 2 : 1;
              const MeshLocality fast = LocalityOf(l, 8, true, domain);
              checked += ExpectListedLocality(l, domain, fast);
              // The sweep's passes over some axes (the dense ones, the expert
              // ones) give the same figures for them.
              for (bool (*pick)(Axis) : {&DenseAxis, +[](Axis a) { return !DenseAxis(a); }}) {
                const MeshLocality part = LocalityOf(l, 8, true, domain, pick);
                for (int a = 0; a < kNumAxes; ++a) {
                  if (!pick(static_cast<Axis>(a))) continue;
                  const AxisLocality& x = part[static_cast<size_t>(a)];
                  const AxisLocality& y = fast[static_cast<size_t>(a)];
                  EXPECT_TRUE(x.size == y.size && x.groups == y.groups && x.max_nodes_spanned == y.max_nodes_spanned &&
                              x.min_members_per_node == y.min_members_per_node && x.intra_node == y.intra_node)
                      << Key(static_cast<Axis>(a)) << " tp " << tp << " cp " << cp << " pp " << pp;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 2 * 3 * 2 * 3 * 2 * kNumAxes);
}

// The residue counting (TranslatesLocality) on MoE foldings and HSDP
// replicas: ep up to 8 and expert_tp up to 4 beside tp 1-4 and cp 1-2,
// replicas 1-4 (shards that cut a cp row and take the passes over ranks
// among them), domains of 6, 8 and 72 (an NVL72 rack over the 8-GPU nodes).
TEST(PlannerMesh, LocalityOfMatchesTheListedGroupsOnFoldings) {
  int layouts = 0;
  for (int64_t tp : {1, 2, 4}) {
    for (int64_t cp : {1, 2}) {
      for (int64_t dp : {2, 3, 4, 8}) {
        for (int64_t pp : {1, 3}) {
          for (AxisOrder order : {AxisOrder::kTpCpDpPp, AxisOrder::kTpCpPpDp}) {
            for (int64_t ep : {1, 2, 4, 8}) {
              for (int64_t etp : {1, 2, 4}) {
                for (int64_t replicas : {1, 2, 4}) {
                  Layout l = Degrees(tp, cp, dp, pp, order);
                  l.ep = ep;
                  l.expert_tp = etp;
                  l.zero = 1;
                  l.dp_replicate = replicas;
                  const int64_t stage = tp * cp * dp;
                  if (stage % (ep * etp) != 0 || (dp * cp) % replicas != 0 || (stage / (ep * etp)) % replicas != 0) {
                    continue;  // not a layout the validator passes
                  }
                  for (int64_t domain : {6, 8, 72}) {
                    ExpectListedLocality(l, domain, LocalityOf(l, 8, true, domain));
                  }
                  ++layouts;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(layouts, 300);
}

}  // namespace
}  // namespace preflight::planner_mesh_test

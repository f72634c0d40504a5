#include "topology.h"

#include <functional>
#include <string>

#include "preflight/simulator/sim.h"

namespace preflight::sim {

int Topology::RankOf(int tp_i, int cp_i, int dp_i, int pp_i) const {
  if (order == AxisOrder::kTpCpPpDp) return tp_i + tp * (cp_i + cp * (pp_i + pp * dp_i));
  return tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i));
}

Topology::Coord Topology::CoordOf(int rank) const {
  Coord c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  const int rest = rank / (tp * cp);
  if (order == AxisOrder::kTpCpPpDp) {
    c.pp = rest % pp;
    c.dp = rest / pp;
  } else {
    c.dp = rest % dp;
    c.pp = rest / dp;
  }
  const int i = c.tp + tp * (c.cp + cp * c.dp);
  c.etp = i % etp;
  c.ep = (i / etp) % ep;
  c.edp = i / (etp * ep);
  return c;
}

int Topology::RankOfExpert(int etp_i, int ep_i, int edp_i, int pp_i) const {
  const int i = etp_i + etp * (ep_i + ep * edp_i);
  return RankOf(i % tp, (i / tp) % cp, i / (tp * cp), pp_i);
}

Topology TopologyOf(const Recipe& r) {
  const ParallelConfig& p = r.parallel;
  Topology t;
  t.tp = static_cast<int>(p.tp);
  t.cp = static_cast<int>(p.cp);
  t.pp = static_cast<int>(p.pp);
  t.dp = static_cast<int>(r.dp());
  t.ep = static_cast<int>(p.ep);
  t.etp = static_cast<int>(p.expert_tp);
  t.order = p.order;
  const int stage = t.tp * t.cp * t.dp;
  if (stage % (t.ep * t.etp) != 0) {
    throw SimUnsupported("parallel.ep x expert_tp (" + std::to_string(t.ep * t.etp) +
                         ") must divide tp x cp x dp (" + std::to_string(stage) + ")");
  }
  t.edp = stage / (t.ep * t.etp);
  t.replicas = static_cast<int>(p.dp_replicate);
  if ((t.cp * t.dp) % t.replicas != 0 || t.edp % t.replicas != 0) {
    throw SimUnsupported("parallel.dp_replicate (" + std::to_string(t.replicas) +
                         ") must divide the dense (dp x cp) and expert data-parallel groups");
  }
  return t;
}

namespace {

/// One group per value of the coordinates `key` leaves fixed; members ordered
/// by `index`. `key` and `index` map a rank to (group key, position).
void AddGroups(World& world, const Topology& topo, Axis axis, int size, const std::function<long(int)>& key,
               const std::function<int(int)>& index, const Group* RankGroups::*field, std::vector<RankGroups>* out) {
  std::vector<long> keys;
  std::vector<std::vector<int>> members;
  for (int r = 0; r < topo.world(); ++r) {
    size_t g = 0;
    while (g < keys.size() && keys[g] != key(r)) ++g;
    if (g == keys.size()) {
      keys.push_back(key(r));
      members.emplace_back(static_cast<size_t>(size), -1);
    }
    members[g][static_cast<size_t>(index(r))] = r;
  }
  for (const std::vector<int>& m : members) {
    const Group& group = world.NewGroup(axis, m);
    for (int r : m) (*out)[static_cast<size_t>(r)].*field = &group;
  }
}

}  // namespace

std::vector<RankGroups> MakeGroups(World& world, const Topology& topo, bool dualpipe) {
  std::vector<RankGroups> out(static_cast<size_t>(topo.world()));
  const auto c = [&](int r) { return topo.CoordOf(r); };
  // A group key packs the coordinates that stay fixed inside the group.
  const auto pack = [](std::initializer_list<int> xs) {
    long k = 0;
    for (int x : xs) k = k * 4096 + x;
    return k;
  };
  AddGroups(
      world, topo, Axis::kTp, topo.tp,
      [&](int r) {
        auto x = c(r);
        return pack({x.cp, x.dp, x.pp});
      },
      [&](int r) { return c(r).tp; }, &RankGroups::tp, &out);
  AddGroups(
      world, topo, Axis::kCp, topo.cp,
      [&](int r) {
        auto x = c(r);
        return pack({x.tp, x.dp, x.pp});
      },
      [&](int r) { return c(r).cp; }, &RankGroups::cp, &out);
  // HSDP: position j of the d*c group is in replica j / shard at j % shard.
  const int shard = topo.dp * topo.cp / topo.replicas, expert_shard = topo.edp / topo.replicas;
  const auto j = [&](int r) {
    auto x = c(r);
    return x.cp + topo.cp * x.dp;
  };
  AddGroups(
      world, topo, Axis::kDpCp, shard,
      [&](int r) {
        auto x = c(r);
        return pack({x.tp, x.pp, j(r) / shard});
      },
      [&](int r) { return j(r) % shard; }, &RankGroups::dp_cp, &out);
  if (topo.replicas > 1) {
    AddGroups(
        world, topo, Axis::kDpReplica, topo.replicas,
        [&](int r) {
          auto x = c(r);
          return pack({x.tp, x.pp, j(r) % shard});
        },
        [&](int r) { return j(r) / shard; }, &RankGroups::dp_replica, &out);
    AddGroups(
        world, topo, Axis::kExpertDpReplica, topo.replicas,
        [&](int r) {
          auto x = c(r);
          return pack({x.etp, x.ep, x.pp, x.edp % expert_shard});
        },
        [&](int r) { return c(r).edp / expert_shard; }, &RankGroups::edp_replica, &out);
  }
  AddGroups(
      world, topo, Axis::kEp, topo.ep,
      [&](int r) {
        auto x = c(r);
        return pack({x.etp, x.edp, x.pp});
      },
      [&](int r) { return c(r).ep; }, &RankGroups::ep, &out);
  AddGroups(
      world, topo, Axis::kExpertTp, topo.etp,
      [&](int r) {
        auto x = c(r);
        return pack({x.ep, x.edp, x.pp});
      },
      [&](int r) { return c(r).etp; }, &RankGroups::etp, &out);
  AddGroups(
      world, topo, Axis::kExpertDp, expert_shard,
      [&](int r) {
        auto x = c(r);
        return pack({x.etp, x.ep, x.pp, x.edp / expert_shard});
      },
      [&](int r) { return c(r).edp % expert_shard; }, &RankGroups::edp, &out);
  for (int r = 0; r < topo.world(); ++r) {
    const Topology::Coord x = c(r);
    RankGroups& g = out[static_cast<size_t>(r)];
    if (x.pp > 0) g.prev_pp = topo.RankOf(x.tp, x.cp, x.dp, x.pp - 1);
    if (x.pp + 1 < topo.pp) g.next_pp = topo.RankOf(x.tp, x.cp, x.dp, x.pp + 1);
    if (topo.pp > 1 && x.pp == 0) {
      const int last = topo.RankOf(x.tp, x.cp, x.dp, topo.pp - 1);
      g.embedding = out[static_cast<size_t>(last)].embedding = &world.NewGroup(Axis::kEmbedding, {r, last});
    }
    if (dualpipe && 2 * x.pp < topo.pp) {
      const int mirror = topo.RankOf(x.tp, x.cp, x.dp, topo.pp - 1 - x.pp);
      g.mirror = out[static_cast<size_t>(mirror)].mirror = &world.NewGroup(Axis::kPpMirror, {r, mirror});
    }
  }
  return out;
}

}  // namespace preflight::sim

// Where each simulated rank sits in the layout and which process groups it
// belongs to (docs/formulas.md §7.3). The executor derives this itself from the recipe's
// degrees and rank order; it does not call the planner's placer, so a
// disagreement between the two shows up as a byte or numerics mismatch.
#pragma once

#include <cstdint>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "world.h"

namespace preflight::sim {

struct Topology {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int ep = 1, etp = 1, edp = 1;  // expert folding over the tp*cp*dp ranks of a stage
  int replicas = 1;              // HSDP replicas of the ZeRO groups (parallel.dp_replicate)
  AxisOrder order = AxisOrder::kTpCpDpPp;
  int world() const { return tp * cp * dp * pp; }

  struct Coord {
    int tp = 0, cp = 0, dp = 0, pp = 0;
    int etp = 0, ep = 0, edp = 0;
  };
  /// tp->cp->dp->pp: i_tp + t(i_cp + c(i_dp + d i_pp)); tp->cp->pp->dp: i_tp + t(i_cp + c(i_pp + p i_dp)).
  int RankOf(int tp_i, int cp_i, int dp_i, int pp_i) const;
  /// Coordinates of `rank`, the expert view by Megatron's folding of
  /// i = i_tp + t(i_cp + c i_dp): i_etp = i mod t_e, i_ep = (i / t_e) mod e,
  /// i_edp = i / (t_e e).
  Coord CoordOf(int rank) const;
  /// The rank of a stage with folded expert coordinates (inverse of the folding).
  int RankOfExpert(int etp_i, int ep_i, int edp_i, int pp_i) const;
};

/// Topology of a recipe's layout; throws SimUnsupported when the expert
/// folding does not divide (the parser rejects such recipes).
Topology TopologyOf(const Recipe& recipe);

/// The groups one rank belongs to. `dp_cp` is the d*c group dense gradients
/// are reduced over (Megatron's intra_dp_cp_group, docs/formulas.md §2.2), ordered
/// i_cp + c i_dp; the pipeline neighbours are global ranks or -1.
struct RankGroups {
  const Group* tp = nullptr;
  const Group* cp = nullptr;
  const Group* dp_cp = nullptr;
  const Group* ep = nullptr;
  const Group* etp = nullptr;
  const Group* edp = nullptr;
  /// HSDP (Topology::replicas > 1): dp_cp and edp are one replica's ZeRO
  /// groups, a block of consecutive positions of the d*c (d_e) ranks; these
  /// join the ranks at the same position across the replicas (Megatron
  /// parallel_state.py: the intra and inter partial data-parallel groups).
  const Group* dp_replica = nullptr;
  const Group* edp_replica = nullptr;
  /// The first and last pipeline rank of this rank's (tp, cp, dp), which
  /// hold a tied embedding's two copies (Megatron's embedding group); set on
  /// those two ranks when pp > 1.
  const Group* embedding = nullptr;
  /// DualPipe: this rank and pipeline rank p-1-pp of its (tp, cp, dp), which
  /// hold copies of the same two stages (whose gradients they sum).
  const Group* mirror = nullptr;
  int prev_pp = -1, next_pp = -1;
};

/// Creates every group of `topo` in `world` (with `dualpipe` the mirror
/// pairs too); entry r is rank r's view.
std::vector<RankGroups> MakeGroups(World& world, const Topology& topo, bool dualpipe = false);

}  // namespace preflight::sim

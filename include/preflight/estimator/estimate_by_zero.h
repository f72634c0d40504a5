// The capacity model of one layout at several ZeRO stages at once, as a
// sweep prices an item's rows (planner/sweep.cc).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "preflight/estimator/estimate.h"

namespace preflight {

/// EstimateRanks of `layout` at each ZeRO stage zeros[i] into (*out)[i]
/// (layout.zero is not read): each rank's walk and the categories ZeRO does
/// not change (activations, routing scratch, serving state, workspaces) are
/// worked out once (in a transformer stack: the ZeRO 3 walk, less what only
/// ZeRO 3 reads, serves the stages below 3), else once for the stages below
/// 3 and once for ZeRO 3.
/// `until_all_over` (a caller that only uses a stage's ranks when they all
/// fit, as a sweep's fallback cuts): the ranks after the first one at which
/// every stage of a group (below 3, or 3) has a rank over capacity or over
/// the node's host memory (HostMemoryFits) are left as RankMemory{}; the
/// stages that fit are complete. `first_rank` (until_all_over only, or
/// null): the rank to price first, the others following it round the
/// pipeline; on return, the rank that put the last stage over (kept when a
/// stage fits). Only the order changes, so only the work: a caller that
/// prices many layouts of one cut passes the rank that stopped the last one.
void EstimateRanksByZero(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                         std::span<const int64_t> zeros, std::vector<std::vector<RankMemory>>* out,
                         bool until_all_over = false, int64_t* first_rank = nullptr);

}  // namespace preflight

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
/// worked out once for the stages below 3 and once for ZeRO 3.
void EstimateRanksByZero(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                         std::span<const int64_t> zeros, std::vector<std::vector<RankMemory>>* out);

}  // namespace preflight

// Renderers of `preflight plan`: a readable table and JSON with stable
// snake_case keys (documented in docs/plan.md).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"

namespace preflight {

/// The human table: layout, rank map per node, group locality per axis,
/// stages with memory and time, communication of the slowest stage, step time.
std::string RenderPlanTable(const Recipe& recipe, const Plan& plan);
/// The same content as JSON (2-space indent, keys in a fixed order).
std::string RenderPlanJson(const Recipe& recipe, const Plan& plan);

/// `plan --svg`: the step as steady state, bubble and tail on one bar, and
/// each stage's time per micro-batch (forward, backward, recompute, exposed
/// communication), the slowest marked.
std::string RenderPlanSvg(const Recipe& recipe, const Plan& plan);

/// The balanced-cut advice as one paragraph: where it cuts (in layers), what
/// it saves, and how to pin it.
std::string DescribeBalancedCut(const Recipe& recipe, const BalancedCut& cut);
/// The same as JSON: basis, boundaries (layers), the worst stage's bytes and
/// the step before and after.
nlohmann::ordered_json BalancedCutJson(const Recipe& recipe, const BalancedCut& cut);

}  // namespace preflight

// Renderers of `preflight plan`: a readable table and JSON with stable
// snake_case keys (documented in docs/plan.md).
#pragma once

#include <string>

#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"

namespace preflight {

/// The human table: layout, rank map per node, group locality per axis,
/// stages with memory and time, communication of the slowest stage, step time.
std::string RenderPlanTable(const Recipe& recipe, const Plan& plan);
/// The same content as JSON (2-space indent, keys in a fixed order).
std::string RenderPlanJson(const Recipe& recipe, const Plan& plan);

}  // namespace preflight

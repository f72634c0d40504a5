// Semantic checks of a typed recipe (divisibility, mesh, schedule), each
// with "what would be valid" in its message. Private to preflight_recipe.
#pragma once

#include "preflight/recipe.h"
#include "reader.h"

namespace preflight::recipe_internal {

/// Adds errors and warnings about `recipe` to `ctx`. Checks that need a key
/// the parser could not read are skipped (that key already has an error).
/// `layers_ok` is false when the layer list could not be built.
void Validate(const Recipe& recipe, bool layers_ok, Context& ctx);

}  // namespace preflight::recipe_internal

// The first error of a typed recipe alone, for callers that show one reason
// per recipe (a sweep validates every layout it enumerates).
#pragma once

#include <optional>

#include "preflight/recipe/recipe.h"

namespace preflight {

/// The first error ValidateRecipe would list (its file order), or nullopt
/// when it lists none; the other errors' messages are not built.
std::optional<Diagnostic> FirstRecipeError(const Recipe& recipe);

}  // namespace preflight

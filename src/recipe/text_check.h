// Byte-level checks of recipe text before yaml-cpp sees it: a recipe is
// UTF-8 text of YAML printable characters (YAML 1.2.2, 5.1 "c-printable").
// Private to preflight_recipe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "preflight/recipe/diagnostic.h"

namespace preflight::recipe_internal {

struct TextProblem {
  SourceMark mark;      // 1-based line and byte column of the first bad byte
  std::string message;  // what is wrong and what would be valid
};

/// The first byte of `text` that is not valid UTF-8, or that starts a
/// character YAML does not allow (control characters other than tab, line
/// feed and carriage return; U+FFFE, U+FFFF); nullopt when all is well.
std::optional<TextProblem> CheckRecipeText(std::string_view text);

/// `text` cut to at most `max_bytes` bytes at a character boundary, with
/// "..." appended when cut, for echoing user input in messages.
std::string Abbreviate(std::string_view text, size_t max_bytes);

/// `text` with every byte outside printable ASCII (and tab) replaced by '?',
/// so text that failed CheckRecipeText can be echoed safely, one byte a column.
std::string Sanitize(std::string_view text);

}  // namespace preflight::recipe_internal

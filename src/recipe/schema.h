// The recipe schema as the parser asks for it: the exact key set of every map
// and the range of every integer key, both read off the field table
// (include/preflight/recipe/fields.h). Every map is read against its set, so
// typos fail loudly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace preflight::recipe_internal {

/// Keys of the map at `path` ("" = top level, "model.moe", ...); empty for a
/// path that is not a map of the schema.
const std::vector<std::string>& KeysOf(const std::string& path);

/// The other map of the schema that has a key named exactly `key`, if any
/// ("hidden" -> "model"), for "belongs in" hints on unknown keys.
std::optional<std::string> MapHoldingKey(const std::string& key, const std::string& except_path);

/// Valid range of an integer key, both ends inclusive.
struct IntRange {
  int64_t min = 0;
  int64_t max = 0;
};
/// The range of the integer key at `path` ("parallel.tp"); the one table both
/// the parser and ValidateRecipe use. {0, -1} (empty) for unknown paths.
IntRange IntRangeOf(std::string_view path);

}  // namespace preflight::recipe_internal

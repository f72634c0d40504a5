#include "schema.h"

#include "preflight/recipe/fields.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace preflight::recipe_internal {

IntRange IntRangeOf(std::string_view path) {
  // Indexed once: ValidateRecipe looks up every integer key, and a sweep
  // validates every layout it enumerates.
  static const std::unordered_map<std::string_view, IntRange> kRanges = [] {
    std::unordered_map<std::string_view, IntRange> out;  // paths live as long as RecipeFields()
    for (const RecipeField& f : RecipeFields()) {        // the first field of a path, as FindRecipeField
      out.try_emplace(f.path, f.kind == FieldKind::kInt ? IntRange{f.min, f.max} : IntRange{0, -1});
    }
    return out;
  }();
  const auto it = kRanges.find(path);
  return it != kRanges.end() ? it->second : IntRange{0, -1};
}

const std::vector<std::string>& KeysOf(const std::string& path) {
  // Each map's exact key set, in the table's order, built once.
  static const std::map<std::string, std::vector<std::string>, std::less<>> kKeys = [] {
    std::map<std::string, std::vector<std::string>, std::less<>> out;
    for (const RecipeField& f : RecipeFields()) out[std::string(f.parent())].emplace_back(f.key());
    return out;
  }();
  static const std::vector<std::string> kNone;
  const auto it = kKeys.find(path);
  if (it == kKeys.end()) return kNone;
  const RecipeField* section = path.empty() ? nullptr : FindRecipeField(path);
  return path.empty() || (section != nullptr && section->kind == FieldKind::kSection) ? it->second : kNone;
}

std::optional<std::string> MapHoldingKey(const std::string& key, const std::string& except_path) {
  for (const RecipeField& f : RecipeFields()) {
    if (f.kind != FieldKind::kSection) continue;
    const std::string map_path(f.path);
    if (map_path == except_path) continue;
    const std::vector<std::string>& keys = KeysOf(map_path);
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) return map_path;
  }
  return std::nullopt;
}

}  // namespace preflight::recipe_internal

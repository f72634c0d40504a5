// The recipe field table: every recipe key declared once, with its kind,
// unit, valid range or names, and the Recipe member it lives in. The parser
// reads every plain key through it; its exact key sets and ranges, `--set`
// path checking, `diff`'s flattening and the docs/recipe.md check all read
// this table, so a new key is one entry here plus the model code that uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight {
namespace recipe_internal {
class MapReader;
}

enum class FieldKind {
  kSection,  // a map of further keys ("model.moe")
  kString,
  kInt,   // integer in [min, max]
  kReal,  // number in [real_min, real_max] (or [real_min, real_max))
  kBool,
  kEnum,     // one word of a fixed list (RecipeField::names)
  kLetters,  // layer letters: a pattern string or a list of letters
  kIntList,  // a list of integers
  kWords,    // a list of distinct words of a fixed list (RecipeField::names)
};

/// A framework spelling (RecipeField::megatron, ::torchtitan) is the flag or
/// key that sets the value, or one of these two.
/// The framework has no setting: a value other than the default cannot be
/// expressed (the emitters say so for every such key).
inline constexpr std::string_view kNoCounterpart = "-";
/// preflight's own pricing and cluster keys: nothing to emit.
inline constexpr std::string_view kPreflightOnly = "(preflight)";

/// Which of preflight's figures a key moves: the memory of some rank (any
/// category), the step time, both, or neither (a verdict threshold, a name).
/// recipe_fields_test holds every declaration against the estimator and the
/// planner.
enum Affects : unsigned { kAffectsNothing = 0, kAffectsMemory = 1, kAffectsTime = 2, kAffectsBoth = 3 };

struct RecipeField {
  std::string_view path;  // "parallel.tp"; a section's path names the map
  FieldKind kind = FieldKind::kString;
  std::string_view unit;  // as docs/recipe.md writes it ("ranks", "GiB", "bool", "enum")
  int64_t min = 0, max = 0;
  double real_min = 0, real_max = 0;
  bool max_exclusive = false;
  /// The lower bound is open: a figure that must be positive reads "(0, max]".
  bool min_exclusive = false;
  /// How Megatron-LM and torchtitan spell the setting (see kNoCounterpart);
  /// "(model flavor)" for architecture keys torchtitan builds in code.
  std::string_view megatron{};
  std::string_view torchtitan{};
  /// Which figures the key moves (sections: kAffectsNothing).
  Affects affects = kAffectsBoth;
  /// An enum's words, in the order the parser lists them.
  std::vector<std::string> names{};
  /// The value as a recipe would write it ("4", "true", "1f1b", "1.25");
  /// empty for sections and for keys with no value of their own (model.layers).
  std::function<std::string(const Recipe&)> text{};
  /// Reads the key from the reader of its map into the recipe (type and
  /// range checked, reported there); empty for the keys the parser reads by
  /// hand (name, model.pattern / repeat / layers, parallel.stage_boundaries,
  /// cluster.gpu). False when the value was present but bad.
  std::function<bool(recipe_internal::MapReader&, Recipe&)> read{};
  /// Sections only: what a present section switches on (model.mla,
  /// cluster.device and serving exist only when written).
  std::function<void(Recipe&)> open{};

  std::string_view key() const;     // last component ("tp")
  std::string_view parent() const;  // the map holding it ("parallel"; "" at the top)
};

/// Every key and section, in the order a recipe lists them (and `diff` prints them).
const std::vector<RecipeField>& RecipeFields();
/// The key's value in a recipe that does not set it ("true", "1f1b"); empty
/// for keys without a value of their own (sections, model.layers).
std::string DefaultText(const RecipeField& field);
/// The field at `path`, or nullptr.
const RecipeField* FindRecipeField(std::string_view path);

}  // namespace preflight

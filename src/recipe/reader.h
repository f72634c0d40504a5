// Reading a yaml-cpp tree against the recipe schema: every map is read
// against its exact key set, every scalar is type- and range-checked, and
// every problem becomes a Diagnostic (docs/recipe.md "Diagnostics"). Private to preflight_recipe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/recipe.h"

namespace preflight::recipe_internal {

/// Upper bound on YAML nodes visited, so alias-heavy input cannot stall us.
inline constexpr int64_t kMaxVisitedNodes = 1'000'000;
/// Diagnostics kept per load; more are counted, not stored (like a
/// compiler's error limit), so hostile input cannot fill memory with them.
inline constexpr size_t kMaxDiagnostics = 100;
/// Longest key path and value echoed in a diagnostic; longer ones are cut.
inline constexpr size_t kMaxShownKeyPath = 200;
inline constexpr size_t kMaxShownValue = 120;

/// Where diagnostics go and how they are located.
class Context {
 public:
  Context(std::string file, const std::string& text);

  /// Records that `key_path` (and everything under it) was set by `--set <text>`.
  void AddOverride(const std::string& key_path, const std::string& text);

  /// 1-based mark of a yaml-cpp node (yaml-cpp marks are 0-based).
  static SourceMark ToMark(const YAML::Mark& mark) { return {mark.line + 1, mark.column + 1}; }

  /// Adds a diagnostic about `key_path` at `mark` in the file, or, when the
  /// key came from an override, naming the override instead.
  void Report(Severity severity, const std::string& key_path, SourceMark mark, std::string value, std::string message);
  void Error(const std::string& key_path, SourceMark mark, std::string value, std::string message) {
    Report(Severity::kError, key_path, mark, std::move(value), std::move(message));
  }
  void Warning(const std::string& key_path, SourceMark mark, std::string value, std::string message) {
    Report(Severity::kWarning, key_path, mark, std::move(value), std::move(message));
  }
  /// A diagnostic about a key, located through the source map.
  void ErrorAt(const std::string& key_path, std::string value, std::string message);
  void WarningAt(const std::string& key_path, std::string value, std::string message);

  /// Counts one visited node; false (after one diagnostic) once over budget.
  bool Visit();

  /// Marks `key_path` as unreadable, so checks that need it are skipped.
  void MarkBad(const std::string& key_path) { bad_keys_.insert(key_path); }
  /// True when `key_path`, one of its parents or anything under it could
  /// not be read ("model.moe" is bad when "model.moe.top_k" is).
  bool IsBad(const std::string& key_path) const;

  /// The line `line` (1-based) of the file, or "".
  std::string SourceLine(int line) const;

  const std::string& file() const { return source_.file; }
  SourceMap& source() { return source_; }
  const SourceMap& source() const { return source_; }
  std::vector<Diagnostic>& diagnostics() { return diagnostics_; }
  /// Diagnostics not stored because kMaxDiagnostics were already kept.
  int64_t dropped() const { return dropped_; }
  bool dropped_errors() const { return dropped_errors_; }
  bool has_errors() const { return HasErrors(diagnostics_); }

 private:
  SourceMap source_;
  std::vector<Diagnostic> diagnostics_;
  std::set<std::string> bad_keys_;
  int64_t visited_ = 0;
  int64_t dropped_ = 0;
  bool dropped_errors_ = false;
};

/// Human name of a node's kind for "got a map" messages.
const char* KindName(const YAML::Node& node);

/// Reads one map of the recipe against its exact key set. Unknown keys,
/// duplicate keys and non-map values are reported on construction; typed
/// getters report type and range errors and leave the default in place.
class MapReader {
 public:
  /// `node` is the value at `path` ("" for the top level), read against the
  /// schema's keys of `path`; a null node reads as an empty map (`serving:`
  /// alone means "all defaults").
  MapReader(Context& ctx, const YAML::Node& node, std::string path);

  /// False when the node was not a map (already reported).
  bool ok() const { return ok_; }
  bool Has(const std::string& key) const { return entries_.count(key) > 0; }
  const std::string& path() const { return path_; }
  /// "model.attention" + "heads".
  std::string PathOf(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  /// The value node of `key` (Has(key) must hold).
  const YAML::Node& Value(const std::string& key) const { return entries_.at(key).second; }
  /// Mark of the key node of `key` (Has(key) must hold).
  SourceMark KeyMark(const std::string& key) const { return Context::ToMark(entries_.at(key).first.Mark()); }
  /// Mark of the value of `key`, or of its key when the value is null.
  SourceMark ValueMark(const std::string& key) const;

  /// Integer in the schema's range for this key (IntRangeOf). Returns false
  /// (and reports) when present but bad.
  bool Int(const std::string& key, int64_t* out);
  /// Number in the field table's range for this key.
  bool Double(const std::string& key, double* out);
  /// Finite number in [min, max]; `max_exclusive` (`min_exclusive`) makes the
  /// upper (lower) bound open.
  bool Double(const std::string& key, double* out, double min, double max, bool max_exclusive = false,
              bool min_exclusive = false);
  bool Bool(const std::string& key, bool* out);
  /// Non-empty string of at most `max_length` characters.
  bool String(const std::string& key, std::string* out, size_t max_length);
  /// One of `names` (exact, lower-case); `*out` gets its index.
  bool Choice(const std::string& key, int* out, const std::vector<std::string>& names);
  /// A list of distinct words of `names` ("[a, b]"; "[]" is empty); bit i of
  /// `*bits` set for names[i]. Each bad item is reported at its own position.
  bool Choices(const std::string& key, uint32_t* bits, const std::vector<std::string>& names);
  /// Enum read through a name table.
  template <class E>
  bool Enum(const std::string& key, E* out, const std::vector<std::pair<std::string, E>>& table) {
    std::vector<std::string> names;
    for (const auto& entry : table) names.push_back(entry.first);
    int index = -1;
    if (!Choice(key, &index, names)) return false;
    if (index >= 0) *out = table[static_cast<size_t>(index)].second;
    return true;
  }
  /// A sub-map; nullopt when absent. The reader's ok() says whether it is a map.
  std::optional<MapReader> Section(const std::string& key);

 private:
  /// Reports a type/range problem with the value of `key`, marks it bad.
  void ValueError(const std::string& key, const std::string& value, const std::string& message);
  /// The scalar text of `key`'s value; nullopt (reported) when not a plain scalar.
  std::optional<std::string> PlainScalar(const std::string& key, const std::string& expected);

  Context& ctx_;
  std::string path_;
  bool ok_ = true;
  std::map<std::string, std::pair<YAML::Node, YAML::Node>> entries_;  // key -> (key node, value node), first occurrence
};

/// Parses a decimal integer ("+12", "-3"); nullopt when `text` is not one or overflows.
std::optional<int64_t> ParseInteger(const std::string& text, bool* overflow);

}  // namespace preflight::recipe_internal

// Semantic checks of a typed recipe (divisibility, mesh, schedule), each
// with "what would be valid" in its message. Private to preflight_recipe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "reader.h"

namespace preflight::recipe_internal {

/// Where semantic checks report: diagnostics are located through `source`;
/// with a parse context, checks that need a key the parser could not read
/// are skipped (that key already has an error).
class Reporter {
 public:
  Reporter(const SourceMap& source, std::vector<Diagnostic>* out, const Context* parse)
      : source_(source), out_(out), parse_(parse) {}
  void ErrorAt(const std::string& key_path, std::string value, std::string message) {
    out_->push_back(source_.At(key_path, std::move(value), std::move(message), Severity::kError));
  }
  void WarningAt(const std::string& key_path, std::string value, std::string message) {
    out_->push_back(source_.At(key_path, std::move(value), std::move(message), Severity::kWarning));
  }
  /// A key the parse could not read (never, for a recipe built in code: no
  /// key string is made then, as a sweep validates every layout it enumerates).
  bool IsBad(std::string_view key_path) const { return parse_ != nullptr && parse_->IsBad(std::string(key_path)); }
  /// True when the recipe text (or an override) set `key_path` explicitly.
  bool IsWritten(const std::string& key_path) const {
    return source_.marks.count(key_path) > 0 || source_.OverrideFor(key_path) != nullptr;
  }

 private:
  const SourceMap& source_;
  std::vector<Diagnostic>* out_;
  const Context* parse_;
};

/// Adds errors and warnings about `recipe`. `layers_ok` is false when the
/// layer list could not be built (family checks are then skipped).
void Validate(const Recipe& recipe, bool layers_ok, Reporter& out);

/// File order: whole-file problems first, then by line and column; problems
/// from `--set` overrides after the file's, in command-line order.
void SortDiagnostics(const SourceMap& source, std::vector<Diagnostic>* ds);

}  // namespace preflight::recipe_internal

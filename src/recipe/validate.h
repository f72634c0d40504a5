// Semantic checks of a typed recipe (divisibility, mesh, schedule), each
// with "what would be valid" in its message. Private to preflight_recipe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "preflight/recipe/recipe.h"
#include "reader.h"

namespace preflight::recipe_internal {

/// Where SortDiagnostics puts a diagnostic: the file's before the overrides'
/// (in command-line order), then by line and column.
struct DiagnosticOrder {
  int64_t override_index = -1;
  int64_t line = 0;
  int64_t column = 0;
  friend bool operator<(const DiagnosticOrder& a, const DiagnosticOrder& b) {
    return std::tie(a.override_index, a.line, a.column) < std::tie(b.override_index, b.line, b.column);
  }
};
/// The order of a diagnostic located in `file` at `mark`.
DiagnosticOrder OrderOf(const SourceMap& source, const std::string& file, SourceMark mark);
/// The order of the diagnostic SourceMap::At(key_path, ...) would make.
DiagnosticOrder OrderOf(const SourceMap& source, const std::string& key_path);

/// Where semantic checks report: diagnostics are located through `source`;
/// with a parse context, checks that need a key the parser could not read
/// are skipped (that key already has an error).
class Reporter {
 public:
  /// With `first_error_only`, `out` keeps only the error that SortDiagnostics
  /// would put first: warnings are dropped, and an error that cannot come
  /// before the one kept is neither located nor formatted (a sweep shows one
  /// reason per invalid layout).
  Reporter(const SourceMap& source, std::vector<Diagnostic>* out, const Context* parse, bool first_error_only = false)
      : source_(source), out_(out), parse_(parse), first_error_only_(first_error_only) {}
  /// The message is formatted only when the error is kept.
  template <typename... Args>
  void ErrorAt(const std::string& key_path, std::string value, fmt::format_string<Args...> message, Args&&... args) {
    if (first_error_only_) {
      const DiagnosticOrder order = OrderOf(source_, key_path);
      if (!out_->empty() && !(order < first_)) return;
      first_ = order;
      out_->clear();
    }
    out_->push_back(
        source_.At(key_path, std::move(value), fmt::format(message, std::forward<Args>(args)...), Severity::kError));
  }
  void WarningAt(const std::string& key_path, std::string value, std::string message) {
    if (first_error_only_) return;
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
  bool first_error_only_;
  DiagnosticOrder first_;
};

/// Adds errors and warnings about `recipe`. `layers_ok` is false when the
/// layer list could not be built (family checks are then skipped).
void Validate(const Recipe& recipe, bool layers_ok, Reporter& out);

/// File order: whole-file problems first, then by line and column; problems
/// from `--set` overrides after the file's, in command-line order.
void SortDiagnostics(const SourceMap& source, std::vector<Diagnostic>* ds);

}  // namespace preflight::recipe_internal

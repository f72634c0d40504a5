// Diagnostics: every bad-input message names file, line, column, key path,
// the bad value and what would be valid (docs/recipe.md "Diagnostics").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace preflight {

enum class ExitCode : int { kOk = 0, kVerdictFail = 1, kBadInput = 2 };

struct SourceMark {
  int line = 0;    // 1-based; 0 = unknown
  int column = 0;  // 1-based; 0 = unknown
};

enum class Severity { kError, kWarning };

struct Diagnostic {
  Severity severity = Severity::kError;
  std::string file;
  SourceMark mark;
  std::string key_path;  // "parallel.tp"; empty for whole-file errors
  std::string value;     // the bad value as written ("6"); empty when not about one value
  std::string message;   // "must divide model.attention.heads (32); try 4 or 8"
  std::string source_line;  // the offending line of the file, for the caret; may be empty
  /// 1-based column of the caret within source_line when source_line is a
  /// window ("...abc...") of a very long line; 0 = mark.column (whole line).
  int caret_column = 0;
};

/// "file:line:col: key.path = value: message" (or "file:line:col: warning: ...")
/// plus the source line and a caret under the column when the line is known.
/// Control characters that came from input are escaped (EscapeControl).
std::string Format(const Diagnostic& d);

/// `text` with control characters and DEL written as \xNN, so input cannot
/// move the cursor or recolour a terminal; newlines and tabs are kept when
/// `keep_newlines` (a message's own line breaks).
std::string EscapeControl(std::string_view text, bool keep_newlines = false);
bool HasErrors(const std::vector<Diagnostic>& ds);

}  // namespace preflight

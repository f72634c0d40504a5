#include "preflight/recipe/diagnostic.h"

#include <algorithm>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace preflight {

std::string EscapeControl(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    const bool control = u < 0x20 || u == 0x7f;
    if (control && !(keep_newlines && (c == '\n' || c == '\t'))) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::string Format(const Diagnostic& d) {
  std::string out = d.file.empty() ? std::string("<recipe>") : EscapeControl(d.file);
  if (d.mark.line > 0) out += fmt::format(":{}:{}", d.mark.line, std::max(d.mark.column, 1));
  out += ": ";
  if (d.severity == Severity::kWarning) out += "warning: ";
  if (!d.key_path.empty()) {
    out += EscapeControl(d.key_path);
    if (!d.value.empty()) out += fmt::format(" = {}", EscapeControl(d.value));
    out += ": ";
  }
  out += EscapeControl(d.message, /*keep_newlines=*/true);
  if (!d.source_line.empty() && d.mark.line > 0) {
    // A tab stays a tab so the caret below stays under its column.
    std::string line = EscapeControl(d.source_line, /*keep_newlines=*/true);
    std::replace(line.begin(), line.end(), '\n', ' ');
    const int caret = d.caret_column > 0 ? d.caret_column : d.mark.column;
    out += fmt::format("\n    {}\n    {}^", line, std::string(static_cast<size_t>(std::max(caret - 1, 0)), ' '));
  }
  return out;
}

bool HasErrors(const std::vector<Diagnostic>& ds) {
  return std::any_of(ds.begin(), ds.end(), [](const Diagnostic& d) { return d.severity == Severity::kError; });
}

}  // namespace preflight

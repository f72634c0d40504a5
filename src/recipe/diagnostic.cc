#include "preflight/recipe/diagnostic.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace preflight {

std::string Format(const Diagnostic& d) {
  std::string out = d.file.empty() ? std::string("<recipe>") : d.file;
  if (d.mark.line > 0) out += fmt::format(":{}:{}", d.mark.line, std::max(d.mark.column, 1));
  out += ": ";
  if (d.severity == Severity::kWarning) out += "warning: ";
  if (!d.key_path.empty()) {
    out += d.key_path;
    if (!d.value.empty()) out += fmt::format(" = {}", d.value);
    out += ": ";
  }
  out += d.message;
  if (!d.source_line.empty() && d.mark.line > 0) {
    const int caret = d.caret_column > 0 ? d.caret_column : d.mark.column;
    out += fmt::format("\n    {}\n    {}^", d.source_line, std::string(static_cast<size_t>(std::max(caret - 1, 0)), ' '));
  }
  return out;
}

bool HasErrors(const std::vector<Diagnostic>& ds) {
  return std::any_of(ds.begin(), ds.end(), [](const Diagnostic& d) { return d.severity == Severity::kError; });
}

}  // namespace preflight

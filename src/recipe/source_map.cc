// Locating diagnostics: key path -> file position, or the `--set` that set it.
#include <algorithm>
#include <string>

#include "preflight/recipe/recipe.h"

namespace preflight {
namespace {

bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

/// Puts `line` into d->source_line, or, when it is long, a window of it
/// around `column` with "..." on the cut sides, so a diagnostic never
/// carries (or prints) a megabyte line; cuts fall between UTF-8 characters.
void ShowLine(const std::string& line, int column, Diagnostic* d) {
  constexpr size_t kMaxWholeLine = 160;
  constexpr size_t kContext = 60;  // bytes shown on each side of the caret
  if (line.size() <= kMaxWholeLine) {
    d->source_line = line;
    return;
  }
  const size_t caret = std::min(static_cast<size_t>(std::max(column, 1) - 1), line.size());
  size_t begin = caret > kContext ? caret - kContext : 0;
  size_t end = std::min(line.size(), caret + kContext);
  while (begin < caret && IsContinuationByte(line[begin])) ++begin;
  while (end > caret && end < line.size() && IsContinuationByte(line[end])) --end;
  const std::string prefix = begin > 0 ? "..." : "";
  d->source_line = prefix + line.substr(begin, end - begin) + (end < line.size() ? "..." : "");
  d->caret_column = static_cast<int>(caret - begin + prefix.size()) + 1;
}

}  // namespace

SourceMark SourceMap::Find(const std::string& key_path) const {
  std::string path = key_path;
  while (!path.empty()) {
    if (auto it = marks.find(path); it != marks.end()) return it->second;
    const size_t cut = path.find_last_of(".[");
    if (cut == std::string::npos) break;
    path.resize(cut);
  }
  return {};
}

const std::string* SourceMap::OverrideFor(const std::string& key_path) const {
  // Later overrides win, like later `--set` flags do.
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
    const std::string& o = it->first;
    if (key_path == o) return &it->second;
    if (key_path.size() > o.size() && key_path.compare(0, o.size(), o) == 0 &&
        (key_path[o.size()] == '.' || key_path[o.size()] == '[')) {
      return &it->second;
    }
  }
  return nullptr;
}

Diagnostic SourceMap::At(const std::string& key_path, std::string value, std::string message,
                         Severity severity) const {
  return AtMark(Find(key_path), key_path, std::move(value), std::move(message), severity);
}

Diagnostic SourceMap::AtMark(SourceMark mark, const std::string& key_path, std::string value, std::string message,
                             Severity severity) const {
  Diagnostic d;
  d.severity = severity;
  d.key_path = key_path;
  d.value = std::move(value);
  d.message = std::move(message);
  if (const std::string* text = OverrideFor(key_path)) {
    d.file = *text;  // the key came from the command line: name the override, not a file line
    return d;
  }
  d.file = file;
  if (mark.line > 0) {
    d.mark = mark;
    if (lines && static_cast<size_t>(mark.line) <= lines->size()) {
      ShowLine((*lines)[static_cast<size_t>(mark.line - 1)], mark.column, &d);
      // yaml-cpp counts a tab as one column; print it as one space so the caret lines up.
      std::replace(d.source_line.begin(), d.source_line.end(), '\t', ' ');
    }
  }
  return d;
}

}  // namespace preflight

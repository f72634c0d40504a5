#include "yaml_load.h"

#include <sstream>

#include <yaml-cpp/eventhandler.h>

namespace preflight::recipe_internal {
namespace {

/// Records where a document's first non-null node starts.
class FirstNodeProbe : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> first;

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Note(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override { Note(mark); }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Note(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Note(mark);
  }
  void OnMapEnd() override {}

 private:
  void Note(const YAML::Mark& mark) {
    if (!first) first = mark;
  }
};

}  // namespace

std::optional<YAML::Mark> SecondDocument(const std::string& yaml) {
  std::istringstream stream(yaml);
  YAML::Parser parser(stream);
  FirstNodeProbe first_document;
  if (!parser.HandleNextDocument(first_document)) return std::nullopt;
  FirstNodeProbe second_document;
  if (!parser.HandleNextDocument(second_document)) return std::nullopt;
  return second_document.first;  // an empty trailing document ("---" alone) does not count
}

std::optional<YAML::Mark> AfterDocumentEnd(const std::string& yaml) {
  bool ended = false;
  int line = 0;
  for (size_t start = 0; start < yaml.size(); ++line) {
    size_t end = yaml.find('\n', start);
    if (end == std::string::npos) end = yaml.size();
    const std::string text = yaml.substr(start, end - start);
    start = end + 1;
    const size_t column = text.find_first_not_of(" \t\r");
    if (column == std::string::npos || text[column] == '#') continue;
    if (!ended) {
      // The end marker sits at column 0, alone but for a comment.
      const size_t after = text.find_first_not_of(" \t\r", 3);
      ended = text.compare(0, 3, "...") == 0 && (after == std::string::npos || text[after] == '#');
      continue;
    }
    YAML::Mark mark = YAML::Mark::null_mark();
    mark.line = line;
    mark.column = static_cast<int>(column);
    return mark;
  }
  return std::nullopt;
}

std::optional<YAML::Mark> FirstContent(const std::string& yaml) {
  int line = 0;
  size_t start = 0;
  while (start < yaml.size()) {
    size_t end = yaml.find('\n', start);
    if (end == std::string::npos) end = yaml.size();
    const std::string text = yaml.substr(start, end - start);
    const size_t column = text.find_first_not_of(" \t\r");
    if (column != std::string::npos && text[column] != '#' && text.compare(column, 3, "---") != 0 &&
        text.compare(column, 3, "...") != 0) {
      YAML::Mark mark = YAML::Mark::null_mark();
      mark.line = line;
      mark.column = static_cast<int>(column);
      return mark;
    }
    ++line;
    start = end + 1;
  }
  return std::nullopt;
}

}  // namespace preflight::recipe_internal

// Loading YAML text into a yaml-cpp tree without yaml-cpp's known traps.
#pragma once

#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

namespace preflight::recipe_internal {

/// Mark of the first node of a second YAML document in `yaml`, if there is
/// one with content. Never calls YAML::LoadAll: in yaml-cpp 0.7 it loops
/// forever, allocating, on input such as ",\nname: x" (jbeder/yaml-cpp#1040,
/// fixed upstream by #1319); we ask the parser for at most two documents.
/// May throw YAML::ParserException.
/// Where content follows a document end marker ("..." at column 0): yaml-cpp
/// ignores it, so it would pass unread.
std::optional<YAML::Mark> AfterDocumentEnd(const std::string& yaml);
std::optional<YAML::Mark> SecondDocument(const std::string& yaml);

/// 0-based (line, column) of the first character of `yaml` that is not
/// blank, a comment or a document marker ("---", "..."); nullopt when none.
std::optional<YAML::Mark> FirstContent(const std::string& yaml);

}  // namespace preflight::recipe_internal

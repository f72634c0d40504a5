#include "reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "preflight/recipe/fields.h"
#include "schema.h"
#include "suggest.h"
#include "text_check.h"

namespace preflight::recipe_internal {

Context::Context(std::string file, const std::string& text) {
  source_.file = std::move(file);
  auto lines = std::make_shared<std::vector<std::string>>();
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines->push_back(std::move(line));
    start = end + 1;
  }
  source_.lines = std::move(lines);
}

void Context::AddOverride(const std::string& key_path, const std::string& text) {
  source_.overrides.emplace_back(key_path, text);
}

void Context::Report(Severity severity, const std::string& key_path, SourceMark mark, std::string value,
                     std::string message) {
  if (diagnostics_.size() >= kMaxDiagnostics) {
    ++dropped_;
    dropped_errors_ = dropped_errors_ || severity == Severity::kError;
    return;
  }
  Diagnostic d = source_.AtMark(mark, key_path, Abbreviate(value, kMaxShownValue), std::move(message), severity);
  d.key_path = Abbreviate(d.key_path, kMaxShownKeyPath);
  diagnostics_.push_back(std::move(d));
}

void Context::ErrorAt(const std::string& key_path, std::string value, std::string message) {
  Error(key_path, source_.Find(key_path), std::move(value), std::move(message));
}

void Context::WarningAt(const std::string& key_path, std::string value, std::string message) {
  Warning(key_path, source_.Find(key_path), std::move(value), std::move(message));
}

bool Context::Visit() {
  ++visited_;
  if (visited_ == kMaxVisitedNodes + 1) {
    Error("", {}, "",
          fmt::format("more than {} YAML nodes to read (aliases expanding?); a recipe is far smaller", kMaxVisitedNodes));
  }
  return visited_ <= kMaxVisitedNodes;
}

namespace {

/// True when `path` lies strictly under `prefix` ("a.b.c" under "a.b").
bool IsUnder(const std::string& path, const std::string& prefix) {
  return path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
         (path[prefix.size()] == '.' || path[prefix.size()] == '[');
}

}  // namespace

bool Context::IsBad(const std::string& key_path) const {
  return std::any_of(bad_keys_.begin(), bad_keys_.end(), [&key_path](const std::string& bad) {
    return key_path == bad || IsUnder(key_path, bad) || IsUnder(bad, key_path);
  });
}

std::string Context::SourceLine(int line) const {
  if (line < 1 || static_cast<size_t>(line) > source_.lines->size()) return "";
  return (*source_.lines)[static_cast<size_t>(line - 1)];
}

const char* KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "map";
    case YAML::NodeType::Sequence: return "list";
    case YAML::NodeType::Scalar: return "scalar";
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Undefined: return "nothing";
  }
  return "?";
}

std::optional<int64_t> ParseInteger(const std::string& text, bool* overflow) {
  *overflow = false;
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  if (digits.empty() || digits.front() == '+') return std::nullopt;
  int64_t value = 0;
  const char* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    *overflow = ptr == end;
    return std::nullopt;
  }
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

namespace {

std::optional<double> ParseNumber(const std::string& text) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  if (digits.empty()) return std::nullopt;
  double value = 0;
  const char* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string RangeText(int64_t min, int64_t max) { return fmt::format("[{}, {}]", min, max); }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

MapReader::MapReader(Context& ctx, const YAML::Node& node, std::string path) : ctx_(ctx), path_(std::move(path)) {
  const std::vector<std::string>& keys = KeysOf(path_);
  if (!ctx_.Visit()) {
    ok_ = false;
    return;
  }
  if (node.IsNull()) return;
  const std::string where = path_.empty() ? "the top level" : path_;
  if (!node.IsMap()) {
    ok_ = false;
    ctx_.MarkBad(path_);
    ctx_.Error(path_, Context::ToMark(node.Mark()), node.IsScalar() ? node.Scalar() : "",
               fmt::format("must be a map with keys {}, got a {}", JoinNames(keys), KindName(node)));
    return;
  }
  for (const auto& entry : node) {
    if (!ctx_.Visit()) {
      ok_ = false;
      return;
    }
    const YAML::Node key_node = entry.first;  // copies: yaml-cpp iterators hand out temporaries
    const YAML::Node value_node = entry.second;
    if (!key_node.IsScalar()) {
      ctx_.Error(path_, Context::ToMark(key_node.Mark()), "",
                 fmt::format("keys of {} must be plain names ({}), got a {}", where, JoinNames(keys), KindName(key_node)));
      continue;
    }
    const std::string& name = key_node.Scalar();
    const std::string full = PathOf(name);
    const SourceMark key_mark = Context::ToMark(key_node.Mark());
    if (auto first = entries_.find(name); first != entries_.end()) {
      const SourceMark first_mark = Context::ToMark(first->second.first.Mark());
      ctx_.MarkBad(full);
      ctx_.Error(full, key_mark, "",
                 fmt::format("duplicate key; first set on line {}, again on line {}: keep one", first_mark.line,
                             key_mark.line));
      continue;
    }
    if (std::find(keys.begin(), keys.end(), name) == keys.end()) {
      if (name == "<<") {
        ctx_.Error(full, key_mark, "",
                   "YAML merge keys ('<<') are not supported by the recipe reader; write the keys out");
      } else if (const auto close = ClosestName(name, keys)) {
        ctx_.Error(full, key_mark, "", fmt::format("unknown key; did you mean '{}'?", *close));
      } else if (const auto home = MapHoldingKey(name, path_)) {
        ctx_.Error(full, key_mark, "",
                   fmt::format("unknown key in {}; '{}' belongs in {} (valid keys here: {})", where, name, *home,
                               JoinNames(keys)));
      } else {
        ctx_.Error(full, key_mark, "", fmt::format("unknown key; valid keys in {}: {}", where, JoinNames(keys)));
      }
      continue;
    }
    entries_.emplace(name, std::make_pair(key_node, value_node));
    ctx_.source().marks[full] = ValueMark(name);
  }
}

SourceMark MapReader::ValueMark(const std::string& key) const {
  const auto& [key_node, value_node] = entries_.at(key);
  // yaml-cpp gives a null value the mark of the next token; point at the key.
  return Context::ToMark(value_node.IsNull() ? key_node.Mark() : value_node.Mark());
}

void MapReader::ValueError(const std::string& key, const std::string& value, const std::string& message) {
  ctx_.MarkBad(PathOf(key));
  ctx_.Error(PathOf(key), ValueMark(key), value, message);
}

std::optional<std::string> MapReader::PlainScalar(const std::string& key, const std::string& expected) {
  const YAML::Node& node = Value(key);
  if (!ctx_.Visit()) return std::nullopt;
  if (node.IsNull()) {
    ValueError(key, "", fmt::format("has no value; expected {}", expected));
    return std::nullopt;
  }
  if (!node.IsScalar()) {
    ValueError(key, "", fmt::format("must be {}, got a {}", expected, KindName(node)));
    return std::nullopt;
  }
  if (node.Tag() == "!") {  // quoted: a string, even when it looks like a number
    ValueError(key, "\"" + node.Scalar() + "\"", fmt::format("must be {}, got a quoted string", expected));
    return std::nullopt;
  }
  return node.Scalar();
}

bool MapReader::Int(const std::string& key, int64_t* out) {
  if (!Has(key)) return true;
  const auto [min, max] = IntRangeOf(PathOf(key));
  const std::string expected = "an integer in " + RangeText(min, max);
  const auto text = PlainScalar(key, expected);
  if (!text) return false;
  bool overflow = false;
  const auto value = ParseInteger(*text, &overflow);
  if (!value) {
    if (overflow) {
      ValueError(key, *text, "out of range; valid range is " + RangeText(min, max));
    } else if (const auto number = ParseNumber(*text);
               number && (*number < static_cast<double>(min) || *number > static_cast<double>(max))) {
      ValueError(key, *text, "out of range; valid range is " + RangeText(min, max));  // e.g. 1e30
    } else if (number) {
      ValueError(key, *text,
                 std::string(*number == std::floor(*number) ? "must be written as a plain decimal integer"
                                                              : "must be a whole number") +
                     " in " + RangeText(min, max));
    } else {
      ValueError(key, *text, "must be " + expected);
    }
    return false;
  }
  if (*value < min || *value > max) {
    std::string message;
    if (*value < min && min == 1) {
      message = "must be positive; valid range is " + RangeText(min, max);
    } else if (*value < min && min == 0) {
      message = "must not be negative; valid range is " + RangeText(min, max);
    } else {
      message = "out of range; valid range is " + RangeText(min, max);
    }
    ValueError(key, *text, message);
    return false;
  }
  *out = *value;
  return true;
}

bool MapReader::Double(const std::string& key, double* out) {
  const RecipeField* f = FindRecipeField(PathOf(key));
  if (f == nullptr || f->kind != FieldKind::kReal) throw std::logic_error("no number field " + PathOf(key));
  return Double(key, out, f->real_min, f->real_max, f->max_exclusive, f->min_exclusive);
}

bool MapReader::Double(const std::string& key, double* out, double min, double max, bool max_exclusive,
                       bool min_exclusive) {
  if (!Has(key)) return true;
  const std::string range = fmt::format("{}{}, {}{}", min_exclusive ? "(" : "[", min, max, max_exclusive ? ")" : "]");
  const std::string expected = "a number in " + range;
  const auto text = PlainScalar(key, expected);
  if (!text) return false;
  const auto value = ParseNumber(*text);
  if (!value) {
    ValueError(key, *text, "must be " + expected);
    return false;
  }
  if (min_exclusive && min == 0 && *value <= 0) {
    ValueError(key, *text, "must be positive; valid range is " + range);
    return false;
  }
  if (*value < min || *value > max || (max_exclusive && *value == max) || (min_exclusive && *value == min)) {
    ValueError(key, *text, "out of range; valid range is " + range);
    return false;
  }
  *out = *value;
  return true;
}

bool MapReader::Bool(const std::string& key, bool* out) {
  if (!Has(key)) return true;
  const auto text = PlainScalar(key, "true or false");
  if (!text) return false;
  static const std::vector<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::vector<std::string> kFalse = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (std::find(kTrue.begin(), kTrue.end(), *text) != kTrue.end()) {
    *out = true;
    return true;
  }
  if (std::find(kFalse.begin(), kFalse.end(), *text) != kFalse.end()) {
    *out = false;
    return true;
  }
  ValueError(key, *text, "must be true or false");
  return false;
}

bool MapReader::String(const std::string& key, std::string* out, size_t max_length) {
  if (!Has(key)) return true;
  const YAML::Node& node = Value(key);
  const std::string expected = fmt::format("a non-empty string of at most {} characters", max_length);
  if (!ctx_.Visit()) return false;
  if (!node.IsScalar()) {
    ValueError(key, "", fmt::format("must be {}, got a {}", expected, KindName(node)));
    return false;
  }
  if (node.Scalar().empty() || node.Scalar().size() > max_length) {
    ValueError(key, node.Scalar().substr(0, 40), "must be " + expected);
    return false;
  }
  // Names reach terminals, SVG and Markdown: no control characters.
  const std::string& text = node.Scalar();
  if (std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    ValueError(key, "", "must be " + expected + " without control characters (tabs, escapes, line breaks)");
    return false;
  }
  *out = text;
  return true;
}

bool MapReader::Choice(const std::string& key, int* out, const std::vector<std::string>& names) {
  if (!Has(key)) return true;
  const YAML::Node& node = Value(key);
  const std::string expected = "one of: " + JoinNames(names);
  if (!ctx_.Visit()) return false;
  if (!node.IsScalar()) {
    ValueError(key, "", fmt::format("must be {}, got a {}", expected, KindName(node)));
    return false;
  }
  const std::string& text = node.Scalar();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) {
      *out = static_cast<int>(i);
      return true;
    }
  }
  std::string message = "must be " + expected;
  if (const auto close = ClosestName(Lower(text), names)) message += fmt::format("; did you mean '{}'?", *close);
  ValueError(key, text, message);
  return false;
}

bool MapReader::Choices(const std::string& key, uint32_t* bits, const std::vector<std::string>& names) {
  if (!Has(key)) return true;
  const YAML::Node& node = Value(key);
  const std::string expected = "a list of: " + JoinNames(names);
  if (!ctx_.Visit()) return false;
  if (!node.IsSequence()) {
    ValueError(key, node.IsScalar() ? node.Scalar() : "",
               fmt::format("must be {}, got a {}", expected, node.IsScalar() ? "word" : KindName(node)));
    return false;
  }
  uint32_t read = 0;
  bool ok = true;
  for (size_t i = 0; i < node.size() && i < names.size() + 1; ++i) {
    if (!ctx_.Visit()) return false;
    const YAML::Node item = node[i];
    const std::string item_path = fmt::format("{}[{}]", PathOf(key), i);
    const std::string text = item.IsScalar() ? item.Scalar() : "";
    const auto at = std::find(names.begin(), names.end(), text);
    std::string message;
    if (at == names.end()) {
      message = "must be one of: " + JoinNames(names);
      if (const auto close = ClosestName(Lower(text), names)) message += fmt::format("; did you mean '{}'?", *close);
    } else if ((read >> (at - names.begin()) & 1u) != 0) {
      message = "is listed twice";
    }
    if (!message.empty()) {
      ctx_.MarkBad(PathOf(key));
      ctx_.Error(item_path, Context::ToMark(item.Mark()), text, message);
      ok = false;
      continue;
    }
    read |= 1u << (at - names.begin());
  }
  if (node.size() > names.size()) {
    ValueError(key, "", fmt::format("has {} entries; there are {} words", node.size(), names.size()));
    return false;
  }
  if (ok) *bits = read;
  return ok;
}

std::optional<MapReader> MapReader::Section(const std::string& key) {
  if (!Has(key)) return std::nullopt;
  return MapReader(ctx_, Value(key), PathOf(key));
}

}  // namespace preflight::recipe_internal

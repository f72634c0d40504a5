#include "text_check.h"

#include <cstdint>

#include <fmt/format.h>

namespace preflight::recipe_internal {
namespace {

/// Length of the UTF-8 sequence starting at `text[i]` and its code point, or
/// 0 when the bytes there are not a well-formed sequence (RFC 3629, 4:
/// overlong forms, surrogates and code points past U+10FFFF are ill-formed).
size_t DecodeUtf8(std::string_view text, size_t i, char32_t* code_point) {
  const auto byte = [&text](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  size_t length = 0;
  char32_t value = 0;
  char32_t min_value = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, value = lead & 0x1F, min_value = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, value = lead & 0x0F, min_value = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, value = lead & 0x07, min_value = 0x10000;
  } else {
    return 0;
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  if (value < min_value || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  *code_point = value;
  return length;
}

/// YAML 1.2.2 c-printable: x9 | xA | xD | [x20-x7E] | x85 | [xA0-xD7FF] |
/// [xE000-xFFFD] | [x10000-x10FFFF] (surrogates are already rejected).
bool IsYamlPrintable(char32_t c) {
  if (c == 0x9 || c == 0xA || c == 0xD || c == 0x85) return true;
  if (c >= 0x20 && c <= 0x7E) return true;
  if (c >= 0xA0 && c <= 0xFFFD) return true;
  return c >= 0x10000;
}

}  // namespace

std::optional<TextProblem> CheckRecipeText(std::string_view text) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < text.size();) {
    char32_t c = 0;
    const size_t length = DecodeUtf8(text, i, &c);
    const SourceMark mark{line, static_cast<int>(i - line_start + 1)};
    if (length == 0) {
      return TextProblem{mark, fmt::format("byte 0x{:02X} is not valid UTF-8; a recipe is UTF-8 text",
                                           static_cast<unsigned char>(text[i]))};
    }
    if (!IsYamlPrintable(c)) {
      return TextProblem{mark, fmt::format("control character U+{:04X} is not allowed in YAML; only tab, line feed "
                                           "and carriage return are (YAML 1.2 printable characters)",
                                           static_cast<uint32_t>(c))};
    }
    i += length;
    if (c == '\n') {
      ++line;
      line_start = i;
    }
  }
  return std::nullopt;
}

std::string Abbreviate(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Back up over UTF-8 continuation bytes so a character is never split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "...";
}

std::string Sanitize(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte != '\t' && (byte < 0x20 || byte > 0x7E)) c = '?';
  }
  return out;
}

}  // namespace preflight::recipe_internal

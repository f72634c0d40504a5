#include "preflight/report/format.h"

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace preflight {

const char* PreflightVersion() { return PREFLIGHT_VERSION; }

std::string FormatGiB(Bytes b) { return fmt::format("{:.2f} GiB", b.gib()); }
std::string FormatGiBNumber(Bytes b) { return fmt::format("{:.2f}", b.gib()); }
std::string FormatSignedGiBNumber(Bytes b) { return fmt::format("{:+.2f}", b.gib()); }

std::string FormatBytesHuman(Bytes b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(b.count());
  int unit = 0;
  while (std::fabs(v) >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", b.count());
  return fmt::format("{:.2f} {}", v, kUnits[unit]);
}

std::string FormatCount(int64_t n) {
  const double v = static_cast<double>(n);
  if (std::llabs(n) >= 1'000'000'000'000LL) return fmt::format("{:.2f} T", v / 1e12);
  if (std::llabs(n) >= 1'000'000'000LL) return fmt::format("{:.2f} B", v / 1e9);
  if (std::llabs(n) >= 1'000'000LL) return fmt::format("{:.2f} M", v / 1e6);
  if (std::llabs(n) >= 1'000LL) return fmt::format("{:.2f} K", v / 1e3);
  return fmt::format("{}", n);
}

std::string FormatLayerRange(const LayerRange& range) {
  if (range.end <= range.first) return "none";
  if (range.end == range.first + 1) return fmt::format("{}", range.first);
  return fmt::format("{}-{}", range.first, range.end - 1);
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (u < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') break;  // not allowed in XML 1.0
        out += ch;
    }
  }
  return out;
}

}  // namespace preflight

// Human formatting of quantities; only renderers call these (docs/architecture.md:
// binary units for capacity, decimal for link rates).
#pragma once

#include <string>

#include "preflight/recipe/units.h"

namespace preflight {

/// "3.00 GiB" with two decimals; negative values keep their sign.
std::string FormatGiB(Bytes b);
/// Picks B, KiB, MiB, GiB or TiB so the number is below 1024; two decimals.
std::string FormatBytesHuman(Bytes b);
/// "12.35 B" / "850.12 M" parameter counts (decimal).
std::string FormatCount(int64_t n);
/// Text for XML (JUnit, SVG): markup characters as entities; control
/// characters XML 1.0 cannot carry (all but tab and line breaks) dropped.
std::string XmlEscape(const std::string& s);

}  // namespace preflight

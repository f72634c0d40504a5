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

}  // namespace preflight

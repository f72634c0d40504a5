// Human formatting of quantities; only renderers call these (docs/architecture.md:
// binary units for capacity, decimal for link rates).
#pragma once

#include <string>

#include "preflight/inventory/layout.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// "3.00 GiB" with two decimals; negative values keep their sign.
std::string FormatGiB(Bytes b);
/// "3.00" and "+3.00": GiB with two decimals and no unit, for table cells
/// whose header names the unit.
std::string FormatGiBNumber(Bytes b);
std::string FormatSignedGiBNumber(Bytes b);
/// Picks B, KiB, MiB, GiB or TiB so the number is below 1024; two decimals.
std::string FormatBytesHuman(Bytes b);
/// "12.35 B" / "850.12 M" parameter counts (decimal).
std::string FormatCount(int64_t n);
/// A layer range as every text output writes it (docs/glossary.md): first and
/// last layer, inclusive, "0-13"; one layer "7"; an empty range "none".
/// JSON keeps the half-open pair first_layer, end_layer.
std::string FormatLayerRange(const LayerRange& range);
/// preflight's version ("0.1.0"), which every JSON output carries as
/// `preflight_version` beside `schema_version`.
const char* PreflightVersion();
/// The layout of the JSON outputs: raised when a key is removed or changes
/// meaning (added keys keep it); README "JSON outputs" lists the changes.
inline constexpr int kJsonSchemaVersion = 1;
/// Text for XML (JUnit, SVG): markup characters as entities; control
/// characters XML 1.0 cannot carry (all but tab and line breaks) dropped.
std::string XmlEscape(const std::string& s);

}  // namespace preflight

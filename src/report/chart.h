// What the per-stage SVG charts (fit's memory, plan's time) share: bar
// widths that keep any pipeline depth to about 1,100 px, and the stage
// numbers under the bars.
#pragma once

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace preflight::chart {

// 90 px bars at 8 stages or fewer, narrower beyond, never under 14 px.
inline int BarWidth(int stages) { return std::clamp(1100 / std::max(1, stages) * 2 / 3, 14, 90); }
inline int GapWidth(int bar) { return std::max(6, bar * 5 / 9); }

/// The number of stage `s` of `n` under its bar centred at `x` (every one
/// while they fit, else every k-th and the last), "stage N" on wide bars.
inline std::string StageLabel(int s, int n, int bar, int gap, int x, int y) {
  const int every = std::max(1, 22 / (bar + gap) + 1);
  if (s % every != 0 && s != n - 1) return "";
  return fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}{}</text>\n", x, y, bar >= 60 ? "stage " : "",
                     s);
}

/// Narrow bars carry bare numbers: the axis named once, left of them.
inline std::string StageAxisName(int bar, int left, int y) {
  return bar < 60 ? fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">stage</text>\n", left - 6, y) : "";
}

}  // namespace preflight::chart

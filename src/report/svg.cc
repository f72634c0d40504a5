// SVG chart of the per-stage memory geometry (`fit --svg`, `plan --svg`).
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "preflight/report/format.h"
#include "preflight/report/report.h"

namespace preflight {
namespace {

struct Style {
  Category category;
  const char* color;
};
// In stacking order, bottom first; colours as CategoryColor documents.
constexpr Style kStyles[] = {
    {Category::kReplicatedParams, "#9ecae1"}, {Category::kTpShardedParams, "#4292c6"},
    {Category::kEpShardedParams, "#08519c"},  {Category::kGradients, "#74c476"},
    {Category::kOptimizerMuon, "#31a354"},    {Category::kOptimizerAdamW, "#006d2c"},
    {Category::kActivations, "#fd8d3c"},      {Category::kRoutingScratch, "#9e9ac8"},
    {Category::kServingState, "#6a51a3"},     {Category::kLibraryWorkspaces, "#737373"},
    {Category::kRuntimeReserve, "#969696"},   {Category::kAllocatorOverhead, "#cccccc"},
};

constexpr int kTop = 50, kPlotHeight = 420, kLeft = 70, kBarWidth = 90, kGap = 50, kKeyWidth = 260;

}  // namespace

const char* CategoryColor(Category c) {
  for (const Style& style : kStyles) {
    if (style.category == c) return style.color;
  }
  return "#000000";
}

std::string RenderMemorySvg(const FitReport& r) {
  const auto& stages = r.estimate.stages;
  double max_gib = 1.0;
  for (const auto& st : stages) max_gib = std::max({max_gib, st.total().gib(), st.capacity.gib()});
  max_gib *= 1.05;
  const auto y_of = [&](double gib) { return kTop + kPlotHeight - gib / max_gib * kPlotHeight; };
  const int n = static_cast<int>(stages.size());
  const int plot_width = n * (kBarWidth + kGap) + kGap;
  const int width = kLeft + plot_width + kKeyWidth;
  const int height = kTop + kPlotHeight + 60;

  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  out += fmt::format("<title>{} memory per rank by pipeline stage</title>\n", XmlEscape(r.inventory->recipe.name));
  out += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}: memory per rank (GiB)</text>\n",
                     kLeft, XmlEscape(r.inventory->recipe.name));
  // Axis with gridlines every "nice" step.
  const double step = max_gib > 100 ? 20.0 : (max_gib > 40 ? 10.0 : 5.0);
  for (double g = 0; g <= max_gib; g += step) {
    out += fmt::format(
        "<line class=\"grid\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n",
        kLeft, y_of(g), kLeft + plot_width, y_of(g), kLeft - 6, y_of(g) + 4, g);
  }
  for (int s = 0; s < n; ++s) {
    const auto& st = stages[static_cast<size_t>(s)];
    const int x = kLeft + kGap + s * (kBarWidth + kGap);
    double base = 0;
    out += fmt::format("<g class=\"stage\" data-stage=\"{}\">\n", s);
    for (const Style& style : kStyles) {
      const double gib = st.of(style.category).gib();
      if (gib <= 0) continue;
      const double y_top = y_of(base + gib);
      const double h = y_of(base) - y_top;
      out += fmt::format(
          "<rect class=\"segment\" data-category=\"{}\" x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" "
          "fill=\"{}\"><title>stage {}: {} {:.2f} GiB</title></rect>\n",
          Key(style.category), x, y_top, kBarWidth, h, style.color, s, Label(style.category), gib);
      if (h >= 13) {  // label the segment in place when it is tall enough to read
        out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\">{} {:.1f}</text>\n",
                           x + kBarWidth / 2, y_top + h / 2 + 3, Label(style.category), gib);
      }
      base += gib;
    }
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\" font-weight=\"bold\">{:.1f}</text>\n",
                       x + kBarWidth / 2, y_of(base) - 5, base);
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">stage {}</text>\n</g>\n", x + kBarWidth / 2,
                       kTop + kPlotHeight + 18, s);
  }
  if (!stages.empty()) {
    const double cap = stages.front().capacity.gib();
    const double floor_gib = cap - r.inventory->recipe.cluster.min_headroom_gib;
    out += fmt::format(
        "<line class=\"capacity\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#cb181d\" "
        "stroke-width=\"2\"/><text x=\"{}\" y=\"{:.1f}\" fill=\"#cb181d\">capacity {:.1f} GiB</text>\n",
        kLeft, y_of(cap), kLeft + plot_width, y_of(cap), kLeft + 4, y_of(cap) - 4, cap);
    out += fmt::format(
        "<line class=\"headroom-floor\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#cb181d\" "
        "stroke-dasharray=\"6,4\"/><text x=\"{}\" y=\"{:.1f}\" fill=\"#cb181d\">headroom floor</text>\n",
        kLeft, y_of(floor_gib), kLeft + plot_width, y_of(floor_gib), kLeft + plot_width - 90, y_of(floor_gib) + 12);
  }
  // The key repeats every category in stacking order, top of the bar first.
  const int key_x = kLeft + plot_width + 20;
  int key_y = kTop;
  for (auto it = std::rbegin(kStyles); it != std::rend(kStyles); ++it) {
    out += fmt::format(
        "<rect class=\"key\" x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        key_x, key_y, it->color, key_x + 18, key_y + 10, Label(it->category));
    key_y += 18;
  }
  out += "</svg>\n";
  return out;
}

}  // namespace preflight

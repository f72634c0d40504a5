// SVG chart of the per-stage memory geometry (`fit --svg`, `plan --svg`).
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "chart.h"
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

constexpr int kTop = 64, kPlotHeight = 420, kLeft = 70, kKeyWidth = 260;
constexpr const char* kOver = "#cb181d";

/// Whether a 9 px label of `chars` characters fits inside a bar `width` wide.
bool LabelFits(size_t chars, int width) { return static_cast<double>(chars) * 5.2 <= width - 4; }

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
  const int bar = chart::BarWidth(n), gap = chart::GapWidth(bar);
  const int plot_width = n * (bar + gap) + gap;
  const int width = kLeft + plot_width + kKeyWidth;
  const int height = kTop + kPlotHeight + 60;
  const double cap = stages.empty() ? 0.0 : stages.front().capacity.gib();
  const Verdict& v = r.estimate.verdict;
  const size_t worst = static_cast<size_t>(std::max<int64_t>(0, r.estimate.worst_stage));

  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  // The hatch that marks memory above capacity.
  out += fmt::format(
      "<defs><pattern id=\"over\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.35\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"{}\" stroke-width=\"3\"/></pattern></defs>\n",
      kOver);
  out += fmt::format("<title>{} memory per rank by pipeline stage</title>\n", XmlEscape(r.inventory->recipe.name));
  out += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}: memory per rank (GiB)</text>\n",
                     kLeft, XmlEscape(r.inventory->recipe.name));
  // The verdict under the title; over capacity in red, bold, with the overshoot.
  if (!stages.empty() && !v.fits) {
    const double over = stages[worst].total().gib() - cap;
    out += fmt::format(
        "<text class=\"verdict over\" x=\"{}\" y=\"46\" font-size=\"14\" font-weight=\"bold\" fill=\"{}\">"
        "DOES NOT FIT: stage {} is {:.2f} GiB over capacity</text>\n",
        kLeft, kOver, worst, over);
  } else if (!stages.empty()) {
    out +=
        fmt::format("<text class=\"verdict\" x=\"{}\" y=\"46\">fits: stage {} (the worst) leaves {:.2f} GiB{}</text>\n",
                    kLeft, worst, v.headroom.gib(), v.headroom_ok ? "" : ", below the headroom floor");
  }
  // Axis with gridlines every "nice" step.
  const double step = max_gib > 200 ? 40.0 : (max_gib > 100 ? 20.0 : (max_gib > 40 ? 10.0 : 5.0));
  for (double g = 0; g <= max_gib; g += step) {
    out += fmt::format(
        "<line class=\"grid\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n",
        kLeft, y_of(g), kLeft + plot_width, y_of(g), kLeft - 6, y_of(g) + 4, g);
  }
  for (int s = 0; s < n; ++s) {
    const auto& st = stages[static_cast<size_t>(s)];
    const int x = kLeft + gap + s * (bar + gap);
    const bool over = st.total().gib() > cap && cap > 0;
    double base = 0;
    out += fmt::format("<g class=\"stage{}\" data-stage=\"{}\">\n", over ? " over" : "", s);
    for (const Style& style : kStyles) {
      const double gib = st.of(style.category).gib();
      if (gib <= 0) continue;
      const double y_top = y_of(base + gib);
      const double h = y_of(base) - y_top;
      out += fmt::format(
          "<rect class=\"segment\" data-category=\"{}\" x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" "
          "fill=\"{}\"><title>stage {}: {} {:.2f} GiB</title></rect>\n",
          Key(style.category), x, y_top, bar, h, style.color, s, Label(style.category), gib);
      // The segment's label in place when the bar is tall and wide enough to hold it.
      const std::string label = fmt::format("{} {:.1f}", Label(style.category), gib);
      if (h >= 13 && LabelFits(label.size(), bar)) {
        out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n",
                           x + bar / 2, y_top + h / 2 + 3, label);
      }
      base += gib;
    }
    if (over) {
      // Everything above the capacity line hatched red, the bar outlined.
      out += fmt::format(
          "<rect class=\"over-capacity\" x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"url(#over)\" "
          "stroke=\"{}\" stroke-width=\"2\"><title>stage {}: {:.2f} GiB over capacity</title></rect>\n",
          x, y_of(base), bar, y_of(cap) - y_of(base), kOver, s, base - cap);
    }
    const std::string total = fmt::format("{:.1f}", base);
    if (LabelFits(total.size(), bar + gap)) {
      out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\" font-weight=\"bold\"{}>{}</text>\n",
                         x + bar / 2, y_of(base) - 5, over ? fmt::format(" fill=\"{}\"", kOver) : "", total);
    }
    if (static_cast<size_t>(s) == worst) {
      out += fmt::format("<text class=\"worst\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">&#9650; worst</text>\n",
                         x + bar / 2, kTop + kPlotHeight + 34);
    }
    out += chart::StageLabel(s, n, bar, gap, x + bar / 2, kTop + kPlotHeight + 18);
    out += "</g>\n";
  }
  if (!stages.empty()) {
    const double floor_gib = cap - r.inventory->recipe.cluster.min_headroom_gib;
    out += fmt::format(
        "<line class=\"capacity\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"/><text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"{}\">capacity {:.1f} GiB</text>\n",
        kLeft, y_of(cap), kLeft + plot_width, y_of(cap), kOver, kLeft + plot_width, y_of(cap) - 4, kOver, cap);
    out += fmt::format(
        "<line class=\"headroom-floor\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-dasharray=\"6,4\"/><text x=\"{}\" y=\"{:.1f}\" fill=\"{}\">headroom floor</text>\n",
        kLeft, y_of(floor_gib), kLeft + plot_width, y_of(floor_gib), kOver, kLeft + plot_width - 90,
        y_of(floor_gib) + 12, kOver);
    out += chart::StageAxisName(bar, kLeft, kTop + kPlotHeight + 18);
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

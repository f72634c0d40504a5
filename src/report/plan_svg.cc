// SVG chart of a plan's time (`plan --svg`): where the step goes, and each
// stage's time per micro-batch. `fit --svg` draws the memory.
#include <algorithm>
#include <span>
#include <string>

#include <fmt/format.h>

#include "chart.h"
#include "preflight/report/format.h"
#include "preflight/report/plan_report.h"

namespace preflight {
namespace {

struct Part {
  const char* name;
  const char* color;
};
constexpr Part kStepParts[] = {
    {"steady state", "#4292c6"}, {"pipeline bubble", "#fdae6b"}, {"tail: gradient sync + optimizer", "#74c476"}};
constexpr Part kStageParts[] = {
    {"forward", "#6baed6"}, {"backward", "#2171b5"}, {"recompute", "#9e9ac8"}, {"exposed communication", "#fd8d3c"}};

constexpr int kPlanLeft = 70, kPlanTop = 60, kPlanStepBar = 28, kPlanPlotTop = kPlanTop + kPlanStepBar + 70,
              kPlanPlotHeight = 320;
constexpr int kPlanKeyWidth = 240;

}  // namespace

std::string RenderPlanSvg(const Recipe& r, const Plan& p) {
  const StepTime& t = p.time;
  const int n = static_cast<int>(t.stages.size());
  const int bar = chart::BarWidth(n), gap = chart::GapWidth(bar);
  const int plot_width = std::max(600, n * (bar + gap) + gap);
  const int width = kPlanLeft + plot_width + kPlanKeyWidth;
  const int height = kPlanPlotTop + kPlanPlotHeight + 60;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  out += fmt::format("<title>{} step time by stage</title>\n", XmlEscape(r.name));
  out += fmt::format(
      "<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}: step {:.3f} s on {} GPUs, {:.0f} tokens/s, "
      "MFU {:.1f} %</text>\n",
      kPlanLeft, XmlEscape(r.name), t.step_s, p.mesh.world, t.tokens_per_s, 100.0 * t.mfu);

  // The step on one bar: steady + bubble + tail = step.
  const double tail = std::max(0.0, t.step_s - t.steady_s - t.bubble_s);
  const double step_parts[] = {t.steady_s, t.bubble_s, tail};
  const double scale = t.step_s > 0 ? plot_width / t.step_s : 0.0;
  double x = kPlanLeft;
  out += fmt::format("<text x=\"{}\" y=\"{}\">the step (s)</text>\n", kPlanLeft, kPlanTop - 6);
  for (size_t i = 0; i < std::size(kStepParts); ++i) {
    const double w = step_parts[i] * scale;
    out += fmt::format(
        "<rect class=\"step-part\" data-part=\"{}\" data-seconds=\"{:.6f}\" x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" "
        "height=\"{}\" fill=\"{}\"><title>{}: {:.3f} s ({:.1f} %)</title></rect>\n",
        kStepParts[i].name, step_parts[i], x, kPlanTop, w, kPlanStepBar, kStepParts[i].color, kStepParts[i].name,
        step_parts[i], t.step_s > 0 ? 100.0 * step_parts[i] / t.step_s : 0.0);
    const std::string label = fmt::format("{} {:.2f}", kStepParts[i].name, step_parts[i]);
    if (static_cast<double>(label.size()) * 6.0 < w) {
      out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#ffffff\">{}</text>\n", x + w / 2,
                         kPlanTop + kPlanStepBar / 2 + 4, label);
    }
    x += w;
  }

  // Each stage's time per micro-batch.
  double max_ms = 1e-3;
  for (const StageTime& s : t.stages) max_ms = std::max(max_ms, 1e3 * s.per_microbatch_s());
  max_ms *= 1.1;
  const auto y_of = [&](double ms) { return kPlanPlotTop + kPlanPlotHeight - ms / max_ms * kPlanPlotHeight; };
  out +=
      fmt::format("<text x=\"{}\" y=\"{}\">time per micro-batch by stage (ms)</text>\n", kPlanLeft, kPlanPlotTop - 16);
  for (int k = 0; k <= 4; ++k) {
    const double ms = max_ms * k / 4;
    out += fmt::format(
        "<line class=\"grid\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n",
        kPlanLeft, y_of(ms), kPlanLeft + plot_width, y_of(ms), kPlanLeft - 6, y_of(ms) + 4, ms);
  }
  for (int s = 0; s < n; ++s) {
    const StageTime& st = t.stages[static_cast<size_t>(s)];
    const int bx = kPlanLeft + gap + s * (bar + gap);
    const double parts[] = {st.forward_s, st.backward_s, st.recompute_s, st.exposed_comm_s};
    double base = 0;
    out += fmt::format("<g class=\"stage\" data-stage=\"{}\">\n", s);
    for (size_t i = 0; i < std::size(kStageParts); ++i) {
      const double ms = 1e3 * parts[i];
      if (ms <= 0) continue;
      out += fmt::format(
          "<rect class=\"segment\" data-part=\"{}\" data-ms=\"{:.6f}\" x=\"{}\" y=\"{:.1f}\" width=\"{}\" "
          "height=\"{:.1f}\" fill=\"{}\"><title>stage {}: {} {:.2f} ms</title></rect>\n",
          kStageParts[i].name, ms, bx, y_of(base + ms), bar, y_of(base) - y_of(base + ms), kStageParts[i].color, s,
          kStageParts[i].name, ms);
      base += ms;
    }
    if (s == t.slowest_stage) {
      out += fmt::format("<text class=\"slowest\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">&#9650; slowest</text>\n",
                         bx + bar / 2, kPlanPlotTop + kPlanPlotHeight + 34);
    }
    out += chart::StageLabel(s, n, bar, gap, bx + bar / 2, kPlanPlotTop + kPlanPlotHeight + 18);
    out += "</g>\n";
  }
  out += chart::StageAxisName(bar, kPlanLeft, kPlanPlotTop + kPlanPlotHeight + 18);
  // The key: the step's parts, then the stages'.
  int key_y = kPlanTop;
  const int key_x = kPlanLeft + plot_width + 20;
  const auto key = [&](std::span<const Part> parts) {
    for (const Part& part : parts) {
      out += fmt::format(
          "<rect class=\"key\" x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" "
          "y=\"{}\">{}</text>\n",
          key_x, key_y, part.color, key_x + 18, key_y + 10, part.name);
      key_y += 18;
    }
    key_y += 10;
  };
  key(kStepParts);
  key(kStageParts);
  out += "</svg>\n";
  return out;
}

}  // namespace preflight

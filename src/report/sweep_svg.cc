// `sweep --svg`: the fitting layouts as a cloud of (peak memory, step time),
// the Pareto front joined, the device's capacity as a line, and the recipe's
// own layout marked (docs/sweep.md).
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "preflight/report/format.h"
#include "preflight/report/sweep_report.h"

namespace preflight {
namespace {

constexpr int kFrontWidth = 900, kFrontHeight = 560, kFrontLeft = 80, kFrontRight = 220, kFrontTop = 50,
              kFrontBottom = 60;
constexpr int kFrontPlotWidth = kFrontWidth - kFrontLeft - kFrontRight,
              kFrontPlotHeight = kFrontHeight - kFrontTop - kFrontBottom;

struct Axes {
  double x_max = 1, y_min = 0, y_max = 1;  // GiB, seconds
  double X(double gib) const { return kFrontLeft + gib / x_max * kFrontPlotWidth; }
  double Y(double s) const { return kFrontTop + kFrontPlotHeight - (s - y_min) / (y_max - y_min) * kFrontPlotHeight; }
};

}  // namespace

std::vector<int64_t> SweepChartRows(const SweepResult& r, int64_t* fitting) {
  std::vector<int64_t> fit;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    if (r.rows[i].status == SweepStatus::kFits || r.rows[i].status == SweepStatus::kTight) {
      fit.push_back(static_cast<int64_t>(i));
    }
  }
  *fitting = static_cast<int64_t>(fit.size());
  std::set<int64_t> drawn(r.pareto.begin(), r.pareto.end());
  const int64_t room = std::max<int64_t>(0, kMaxSvgPoints - static_cast<int64_t>(drawn.size()));
  const double stride = room > 0 ? std::max(1.0, static_cast<double>(fit.size()) / static_cast<double>(room)) : 0;
  for (double k = 0; room > 0 && k < static_cast<double>(fit.size()); k += stride) {
    drawn.insert(fit[static_cast<size_t>(k)]);
  }
  return {drawn.begin(), drawn.end()};
}

namespace {

Axes AxesOf(const SweepResult& r, const std::vector<int64_t>& drawn, std::optional<int64_t> own) {
  Axes a;
  a.x_max = r.capacity.gib();
  double lo = INFINITY, hi = 0;
  std::vector<int64_t> all = drawn;
  if (own && r.rows[static_cast<size_t>(*own)].status != SweepStatus::kInvalid) all.push_back(*own);
  for (int64_t i : all) {
    const SweepRow& row = r.rows[static_cast<size_t>(i)];
    a.x_max = std::max(a.x_max, row.peak.gib());
    lo = std::min(lo, row.step_s);
    hi = std::max(hi, row.step_s);
  }
  a.x_max *= 1.05;
  if (!(lo < hi)) {  // nothing, or one step time: a band around it
    lo = std::isfinite(lo) ? lo * 0.9 : 0;
    hi = lo > 0 ? lo / 0.9 * 1.1 : 1;
  }
  const double pad = 0.05 * (hi - lo);
  a.y_min = std::max(0.0, lo - pad);
  a.y_max = hi + pad;
  return a;
}

std::string Ticks(const Axes& a) {
  std::string out;
  for (int k = 0; k <= 5; ++k) {
    const double gib = a.x_max / 1.05 * k / 5, s = a.y_min + (a.y_max - a.y_min) * k / 5;
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" font-size=\"11\" text-anchor=\"middle\">{4:.0f}</text>\n",
        a.X(gib), kFrontTop, kFrontTop + kFrontPlotHeight, kFrontTop + kFrontPlotHeight + 16, gib);
    out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" font-size=\"11\" text-anchor=\"end\">{5:.3g}</text>\n",
        kFrontLeft, a.Y(s), kFrontLeft + kFrontPlotWidth, kFrontLeft - 6, a.Y(s) + 4, s);
  }
  return out;
}

}  // namespace

std::string RenderSweepSvg(const SweepResult& r, const std::string& file, std::optional<int64_t> own) {
  int64_t fitting = 0;
  const std::vector<int64_t> drawn = SweepChartRows(r, &fitting);
  const Axes a = AxesOf(r, drawn, own);
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<title>{2}: step time against peak memory on {3} GPUs</title>\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{4}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{2}: step time vs peak memory, {3} GPUs "
      "({5} fitting layouts, {6} drawn)</text>\n",
      kFrontWidth, kFrontHeight, XmlEscape(file), r.gpus, kFrontLeft, fitting, drawn.size());
  out += Ticks(a);
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">peak memory of the worst rank (GiB)</text>\n"
      "<text x=\"18\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">step time "
      "(s)</text>\n",
      kFrontLeft + kFrontPlotWidth / 2, kFrontHeight - 18, kFrontTop + kFrontPlotHeight / 2,
      kFrontTop + kFrontPlotHeight / 2);
  // The device's capacity: layouts right of it do not fit.
  out += fmt::format(
      "<line class=\"capacity\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#c00\" "
      "stroke-dasharray=\"6 4\"/>\n<text x=\"{3:.1f}\" y=\"{4}\" font-size=\"11\" fill=\"#c00\">capacity "
      "{5:.1f} GiB</text>\n",
      a.X(r.capacity.gib()), kFrontTop, kFrontTop + kFrontPlotHeight, a.X(r.capacity.gib()) - 4, kFrontTop - 6,
      r.capacity.gib());
  for (int64_t i : drawn) {
    const SweepRow& row = r.rows[static_cast<size_t>(i)];
    out += fmt::format("<circle class=\"layout\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2\" fill=\"#bbb\"/>\n",
                       a.X(row.peak.gib()), a.Y(row.step_s));
  }
  std::string front;
  for (int64_t i : r.pareto) {
    const SweepRow& row = r.rows[static_cast<size_t>(i)];
    front += fmt::format("{}{:.1f},{:.1f}", front.empty() ? "" : " ", a.X(row.peak.gib()), a.Y(row.step_s));
  }
  if (!front.empty()) out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#2166ac\"/>\n", front);
  for (int64_t i : r.pareto) {
    const SweepRow& row = r.rows[static_cast<size_t>(i)];
    out += fmt::format("<circle class=\"pareto\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#2166ac\"/>\n",
                       a.X(row.peak.gib()), a.Y(row.step_s));
  }
  // The key, and the recipe's own layout.
  const int kx = kFrontLeft + kFrontPlotWidth + 20;
  out += fmt::format(
      "<circle cx=\"{0}\" cy=\"{1}\" r=\"2\" fill=\"#bbb\"/><text x=\"{2}\" y=\"{3}\" font-size=\"12\">a fitting "
      "layout</text>\n<circle cx=\"{0}\" cy=\"{4}\" r=\"4\" fill=\"#2166ac\"/><text x=\"{2}\" y=\"{5}\" "
      "font-size=\"12\">Pareto front ({6})</text>\n",
      kx, kFrontTop + 10, kx + 12, kFrontTop + 14, kFrontTop + 30, kFrontTop + 34, r.pareto.size());
  const SweepRow* mine = own ? &r.rows[static_cast<size_t>(*own)] : nullptr;
  if (mine != nullptr && mine->status != SweepStatus::kInvalid) {
    const double x = a.X(mine->peak.gib()), y = a.Y(mine->step_s);
    out += fmt::format(
        "<path class=\"own\" d=\"M {0:.1f} {1:.1f} l 7 7 l -7 7 l -7 -7 z\" fill=\"#d6604d\" stroke=\"black\" "
        "transform=\"translate(0 -7)\"/>\n",
        x, y);
  }
  const std::string own_text = mine == nullptr ? "the recipe's layout: not in the swept space"
                               : mine->status == SweepStatus::kInvalid
                                   ? "the recipe's layout: invalid here"
                                   : fmt::format("the recipe's layout ({})", Key(mine->status));
  out += fmt::format(
      "<path d=\"M {0} {1} l 7 7 l -7 7 l -7 -7 z\" fill=\"#d6604d\" stroke=\"black\"/><text x=\"{2}\" y=\"{3}\" "
      "font-size=\"12\">{4}</text>\n</svg>\n",
      kx, kFrontTop + 43, kx + 12, kFrontTop + 54, XmlEscape(own_text));
  return out;
}

}  // namespace preflight

// Renderers of `preflight check`: table, JSON, Markdown summary, JUnit XML.
// Deterministic: fixed precision, no timestamps, paths as the user gave them.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "preflight/report/check.h"
#include "preflight/report/format.h"

namespace preflight {
namespace {

const char* StatusWord(const CheckEntry& e) {
  if (!e.valid) return "INVALID";
  return e.passed() ? "pass" : "FAIL";
}

/// The delta column: a signed GiB figure when compared, else the state.
std::string DeltaCell(const CheckEntry& e) {
  if (!e.valid) return "-";
  switch (e.baseline) {
    case BaselineState::kNone:
      return "-";
    case BaselineState::kNew:
      return "new";
    case BaselineState::kUnreadable:
      return "unreadable";
    case BaselineState::kCompared: return FormatSignedGiBNumber(e.delta_total());
  }
  return "-";
}

/// Up to three moved categories: "activations +1.20, routing_scratch -0.10".
std::string MovedCell(const CheckEntry& e) {
  std::string out;
  int shown = 0;
  for (Category c : MovedCategories(e)) {
    if (shown++ == 3) break;
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", Key(c), FormatSignedGiBNumber(e.delta(c)));
  }
  return out.empty() ? "-" : out;
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string Headline(const CheckReport& r) {
  const auto n = r.entries.size();
  if (r.invalid_count() > 0) {
    return fmt::format("{} of {} recipes invalid, {} failing", r.invalid_count(), n, r.failed_count());
  }
  if (r.failed_count() > 0) return fmt::format("{} of {} recipes failing", r.failed_count(), n);
  return fmt::format("all {} recipes pass", n);
}

std::string BaselineLine(const CheckReport& r) {
  if (r.baseline_label.empty()) return "no baseline";
  std::string out =
      fmt::format("baseline {}, max regression {:.2f} GiB", r.baseline_label, r.thresholds.max_regression.gib());
  for (int i = 0; i < kNumCategories; ++i) {
    const auto& b = r.thresholds.per_category[static_cast<size_t>(i)];
    if (b) out += fmt::format(", {} {:.2f} GiB", Key(static_cast<Category>(i)), b->gib());
  }
  return out;
}

/// Markdown table cells must not contain '|' or newlines.
std::string MdCell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '\n' || ch == '\r') {
      out += ' ';
    } else if (u < 0x20 || u == 0x7f) {
      out += '?';  // control characters stay out of the comment
    } else {
      out += ch;
    }
  }
  return out;
}

// A Markdown code span that holds any text: fenced by one backtick more than
// the longest run inside it (CommonMark), padded when the text starts or
// ends with one.
std::string MdCode(const std::string& text) {
  size_t longest = 0, run = 0;
  for (char ch : text) {
    run = ch == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(longest + 1, '`');
  const bool pad = !text.empty() && (text.front() == '`' || text.back() == '`');
  return fence + (pad ? " " : "") + text + (pad ? " " : "") + fence;
}

}  // namespace

std::string RenderCheckTable(const CheckReport& r) {
  std::string out = fmt::format("preflight check: {} ({})\n\n", Headline(r), BaselineLine(r));
  out += fmt::format("  {:<36} {:<8} {:>6} {:>12} {:>12} {:>10}  {}\n", "recipe", "verdict", "stage", "peak GiB",
                     "headroom GiB", "delta GiB", "moved categories (GiB)");
  for (const CheckEntry& e : r.entries) {
    if (!e.valid) {
      out += fmt::format("  {:<36} {:<8} {:>6} {:>12} {:>12} {:>10}  {}\n", e.file, StatusWord(e), "-", "-", "-", "-",
                         "-");
      continue;
    }
    out += fmt::format("  {:<36} {:<8} {:>6} {:>12.2f} {:>12.2f} {:>10}  {}\n", e.file, StatusWord(e),
                       e.estimate.worst_stage, e.worst().total().gib(), e.worst().headroom().gib(), DeltaCell(e),
                       MovedCell(e));
  }
  bool header = false;
  for (const CheckEntry& e : r.entries) {
    if (e.passed()) continue;
    if (!header) out += "\n";
    header = true;
    const std::string on = e.device.empty() ? "" : " on " + e.device;
    for (const auto& f : e.failures) out += fmt::format("{} {}{}: {}\n", StatusWord(e), e.file, on, f);
    for (const auto& err : e.errors) out += fmt::format("{} {}: {}\n", StatusWord(e), e.file, FirstLine(err));
  }
  for (const CheckEntry& e : r.entries) {
    if (e.baseline == BaselineState::kUnreadable) {
      out += fmt::format("note {}: baseline not compared: {}\n", e.file, e.baseline_note);
    }
  }
  return out;
}

nlohmann::json CheckJson(const CheckReport& r) {
  nlohmann::json per_category = nlohmann::json::object();
  for (int i = 0; i < kNumCategories; ++i) {
    const auto& b = r.thresholds.per_category[static_cast<size_t>(i)];
    if (b) per_category[Key(static_cast<Category>(i))] = b->count();
  }
  nlohmann::json recipes = nlohmann::json::array();
  for (const CheckEntry& e : r.entries) {
    nlohmann::json j = {{"file", e.file},
                        {"status", !e.valid ? "invalid" : (e.passed() ? "pass" : "fail")},
                        {"failures", e.failures},
                        {"errors", e.errors}};
    if (e.valid) {
      const RankMemory& w = e.worst();
      j["name"] = e.name;
      j["device"] = e.device;
      j["worst_stage"] = e.estimate.worst_stage;
      j["peak_bytes"] = w.total().count();
      j["worst_total_bytes"] = w.total().count();  // the old name of peak_bytes, kept one release
      j["capacity_bytes"] = w.capacity.count();
      j["headroom_bytes"] = w.headroom().count();
      j["min_headroom_bytes"] = e.min_headroom.count();
      j["fits"] = e.estimate.verdict.fits;
      j["headroom_ok"] = e.estimate.verdict.headroom_ok;
      nlohmann::json baseline = {{"state", Key(e.baseline)}};
      if (e.baseline_worst) {
        nlohmann::json deltas = nlohmann::json::object();
        for (int i = 0; i < kNumCategories; ++i) {
          const auto c = static_cast<Category>(i);
          deltas[Key(c)] = e.delta(c).count();
        }
        baseline["peak_bytes"] = e.baseline_worst->total().count();
        baseline["delta_peak_bytes"] = e.delta_total().count();
        // The old names of peak_bytes and delta_peak_bytes, kept one release.
        baseline["worst_total_bytes"] = e.baseline_worst->total().count();
        baseline["delta_total_bytes"] = e.delta_total().count();
        baseline["delta_bytes"] = deltas;
      }
      if (!e.baseline_note.empty()) baseline["note"] = e.baseline_note;
      j["baseline"] = baseline;
    }
    recipes.push_back(j);
  }
  return {
      {"preflight_version", PreflightVersion()},
      {"schema_version", kJsonSchemaVersion},
      {"baseline", r.baseline_label.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.baseline_label)},
      {"thresholds",
       {{"max_regression_bytes", r.thresholds.max_regression.count()}, {"per_category_bytes", per_category}}},
      {"recipes", recipes},
      {"summary",
       {{"recipes", r.entries.size()},
        {"failed", r.failed_count()},
        {"invalid", r.invalid_count()},
        {"exit_code", static_cast<int>(r.exit_code())}}},
  };
}

std::string RenderCheckMarkdown(const CheckReport& r) {
  std::string out = fmt::format("## preflight check: {}\n\n", Headline(r));
  out += fmt::format("{}.\n\n", r.baseline_label.empty() ? std::string("No baseline") : "Against " + BaselineLine(r));
  out += "| recipe | verdict | peak (worst stage) | headroom | delta vs baseline | top moved categories |\n";
  out += "| --- | --- | ---: | ---: | ---: | --- |\n";
  for (const CheckEntry& e : r.entries) {
    const std::string verdict = e.passed() ? "pass" : fmt::format("**{}**", StatusWord(e));
    if (!e.valid) {
      out += fmt::format("| {} | {} | - | - | - | - |\n", MdCode(MdCell(e.file)), verdict);
      continue;
    }
    const std::string delta = e.baseline == BaselineState::kCompared ? DeltaCell(e) + " GiB" : DeltaCell(e);
    out += fmt::format("| {} | {} | {:.2f} GiB (stage {}) | {:.2f} GiB | {} | {} |\n", MdCode(MdCell(e.file)), verdict,
                       e.worst().total().gib(), e.estimate.worst_stage, e.worst().headroom().gib(), delta,
                       MdCell(MovedCell(e)));
  }
  std::string details;
  for (const CheckEntry& e : r.entries) {
    for (const auto& f : e.failures) details += fmt::format("- {}: {}\n", MdCode(MdCell(e.file)), MdCell(f));
    for (const auto& err : e.errors) {
      details += fmt::format("- {}: {}\n", MdCode(MdCell(e.file)), MdCell(FirstLine(err)));
    }
    if (e.baseline == BaselineState::kUnreadable) {
      details += fmt::format("- {}: baseline not compared: {}\n", MdCode(MdCell(e.file)), MdCell(e.baseline_note));
    }
  }
  if (!details.empty()) out += "\n### Details\n\n" + details;
  return out;
}

std::string RenderCheckJUnit(const CheckReport& r) {
  const auto n = r.entries.size();
  const auto failures = r.failed_count();
  const auto errors = r.invalid_count();
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out +=
      fmt::format("<testsuites name=\"preflight\" tests=\"{}\" failures=\"{}\" errors=\"{}\">\n", n, failures, errors);
  out +=
      fmt::format("  <testsuite name=\"preflight check\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"0\">\n",
                  n, failures, errors);
  for (const CheckEntry& e : r.entries) {
    out += fmt::format("    <testcase classname=\"preflight.check\" name=\"{}\"", XmlEscape(e.file));
    if (e.passed()) {
      out += "/>\n";
      continue;
    }
    out += ">\n";
    if (!e.valid) {
      std::string all;
      for (const auto& err : e.errors) all += err + "\n";
      out += fmt::format("      <error type=\"invalid recipe\" message=\"{}\">{}</error>\n",
                         XmlEscape(e.errors.empty() ? "invalid" : FirstLine(e.errors.front())), XmlEscape(all));
    } else {
      std::string all;
      for (const auto& f : e.failures) all += f + "\n";
      out += fmt::format("      <failure type=\"preflight\" message=\"{}\">{}</failure>\n",
                         XmlEscape(e.failures.front()), XmlEscape(all));
    }
    out += "    </testcase>\n";
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace preflight

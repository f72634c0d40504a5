// bench/fidelity: the memory-fidelity table (issue 15). Every stored
// Megatron-LM functional-test run goes through `import megatron` and the
// memory estimate; prints per case the measured and modeled allocator figures
// of the last global rank (static: allocated between steps; peak:
// max_memory_allocated), the signed error, the flags not represented, and the
// distribution (coverage, median / p90 / worst absolute error per family).
//
//   build/fidelity [CASES.json] [--baseline OUT.json] [--bytes OUT.tsv]
//
// --baseline writes each case's current errors (the regression bands of
// tests/fidelity_test.cc); --bytes writes measured and modeled bytes per case
// (tab-separated; with the routing scratch as modeled and as the design notes
// count it) for diagnosis. Needs nothing outside the repository.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fidelity_cases.h"

namespace {

using preflight::fidelity::Case;
using preflight::fidelity::Outcome;

struct Dist {
  std::vector<double> s, p;
  int total = 0;
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(PREFLIGHT_SOURCE_DIR) + "/tests/data/megatron_ci/cases.json";
  std::string baseline, bytes_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--baseline" && i + 1 < argc)
      baseline = argv[++i];
    else if (a == "--bytes" && i + 1 < argc)
      bytes_path = argv[++i];
    else
      path = a;
  }
  std::string error;
  const std::vector<Case> cases = preflight::fidelity::LoadCases(path, &error);
  if (cases.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 2;
  }
  std::map<std::string, Dist> dist;
  // MoE runs: peak error as modeled, and with the design notes' routing scratch.
  std::vector<double> moe_peak, notes_peak;
  std::FILE* bytes = bytes_path.empty() ? nullptr : std::fopen(bytes_path.c_str(), "wb");
  if (!bytes_path.empty() && bytes == nullptr) return 2;
  if (bytes) std::fprintf(bytes, "case\tfamily\tstatic\tmodel_static\tpeak\tmodel_peak\trouting\tnotes_routing\n");
  nlohmann::json bands = nlohmann::json::object();
  std::printf("%-95s %-8s %9s %9s %8s %9s %9s %8s  %s\n", "case", "family", "static", "model", "err%", "peak", "model",
              "err%", "not represented / unknown");
  for (const Case& c : cases) {
    const Outcome o = preflight::fidelity::Run(c);
    const std::string family = c.family == "nemotron" ? "hybrid" : c.family;
    for (const std::string& key : {family, std::string("all")}) {
      Dist& d = dist[key];
      ++d.total;
      if (o.imported) {
        d.s.push_back(std::fabs(o.static_error_pct));
        d.p.push_back(std::fabs(o.peak_error_pct));
      }
    }
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (!o.imported) {
      std::printf("%-95s %-8s %9.2f %9s %8s %9.2f %9s %8s  NOT IMPORTED: %s\n", c.id.c_str(), c.family.c_str(),
                  static_cast<double>(c.measured_static) / gib, "-", "-", static_cast<double>(c.measured_peak) / gib,
                  "-", "-", o.error.substr(0, o.error.find('\n')).c_str());
      continue;
    }
    if (bytes) {
      std::fprintf(bytes, "%s\t%s\t%lld\t%lld\t%lld\t%lld\t%lld\t%lld\n", c.id.c_str(), c.family.c_str(),
                   static_cast<long long>(c.measured_static), static_cast<long long>(o.modeled_static),
                   static_cast<long long>(c.measured_peak), static_cast<long long>(o.modeled_peak),
                   static_cast<long long>(o.modeled_routing), static_cast<long long>(o.notes_routing));
    }
    std::string notes = Join(o.unrepresented);
    if (!o.unknown.empty()) notes += " | unknown: " + Join(o.unknown);
    std::printf("%-95s %-8s %9.2f %9.2f %+8.1f %9.2f %9.2f %+8.1f  %s\n", c.id.c_str(), c.family.c_str(),
                static_cast<double>(c.measured_static) / gib, static_cast<double>(o.modeled_static) / gib,
                o.static_error_pct, static_cast<double>(c.measured_peak) / gib,
                static_cast<double>(o.modeled_peak) / gib, o.peak_error_pct, notes.c_str());
    if (o.modeled_routing > 0) {
      const int64_t peak = o.modeled_peak - o.modeled_routing + o.notes_routing;
      notes_peak.push_back(
          std::fabs(100.0 * static_cast<double>(peak - c.measured_peak) / static_cast<double>(c.measured_peak)));
      moe_peak.push_back(std::fabs(o.peak_error_pct));
    }
    bands[c.id] = {{"static_error_pct", std::round(o.static_error_pct * 100) / 100},
                   {"peak_error_pct", std::round(o.peak_error_pct * 100) / 100}};
  }
  std::printf("\n%-8s %9s %12s %10s %10s %12s %10s %10s\n", "family", "imported", "static med", "p90", "worst",
              "peak med", "p90", "worst");
  for (const auto& [name, d] : dist) {
    std::printf("%-8s %4zu/%-4d %11.1f%% %9.1f%% %9.1f%% %11.1f%% %9.1f%% %9.1f%%\n", name.c_str(), d.s.size(), d.total,
                Quantile(d.s, 0.5), Quantile(d.s, 0.9), Quantile(d.s, 1.0), Quantile(d.p, 0.5), Quantile(d.p, 0.9),
                Quantile(d.p, 1.0));
  }
  std::printf(
      "\nrouting scratch, %zu MoE runs, peak median / p90 / worst: as modeled %.1f%% / %.1f%% / %.1f%%; with "
      "the design notes' figure (C rows per local expert) %.1f%% / %.1f%% / %.1f%%\n",
      notes_peak.size(), Quantile(moe_peak, 0.5), Quantile(moe_peak, 0.9), Quantile(moe_peak, 1.0),
      Quantile(notes_peak, 0.5), Quantile(notes_peak, 0.9), Quantile(notes_peak, 1.0));
  if (bytes) std::fclose(bytes);
  if (!baseline.empty()) {
    std::FILE* f = std::fopen(baseline.c_str(), "wb");
    if (f == nullptr) return 2;
    const std::string text =
        nlohmann::json({{"about",
                         "signed error % of the modeled allocator figures per case at the baseline "
                         "(bench/fidelity --baseline); tests/fidelity_test.cc fails a case whose error "
                         "grows past its band"},
                        {"bands", bands}})
            .dump(1) +
        "\n";
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  return 0;
}

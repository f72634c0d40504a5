#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "preflight/format.h"
#include "preflight/sim_report.h"

namespace preflight {

namespace {
const char* Mark(bool ok) { return ok ? "ok" : "DISAGREE"; }

int64_t WorstPeak(const SimulationReport& r, int c) {
  int64_t m = 0;
  for (const RankMeasurement& rm : r.per_rank) m = std::max(m, rm.peak_bytes[static_cast<size_t>(c)]);
  return m;
}
std::string RenderComm(const SimulationReport& r, const SimComparison& c) {
  std::string out = fmt::format("communication, rank {} (bytes sent)\n", c.compared_rank);
  out += fmt::format("  {:<10} {:<15} {:<10} {:<18} {:>6} {:>12} {:>12}  {}\n", "axis", "kind", "pass", "what", "calls",
                     "measured", "modeled", "");
  if (!c.comm.empty()) {
    for (const CommAgreement& a : c.comm) {
      const std::string modeled = a.in_model ? fmt::format("{}", a.modeled_sent) : "-";
      const char* mark = !a.exact ? (a.agrees ? "info" : "DISAGREE") : Mark(a.agrees);
      out += fmt::format("  {:<10} {:<15} {:<10} {:<18} {:>6} {:>12} {:>12}  {}\n", a.axis, a.kind, a.pass, a.what,
                         a.calls, a.measured_sent, modeled, mark);
    }
  } else if (static_cast<size_t>(c.compared_rank) < r.per_rank.size()) {
    for (const CommCount& k : r.per_rank[static_cast<size_t>(c.compared_rank)].comm) {
      out += fmt::format("  {:<10} {:<15} {:<10} {:<18} {:>6} {:>12} {:>12}\n", k.axis, Name(k.kind), Name(k.pass),
                         k.what, k.calls, k.bytes_sent, "-");
    }
  }
  out += "\n";
  return out;
}

}  // namespace

std::string RenderSimulationTable(const SimulationReport& r, const std::vector<SimComparison>& shown, bool agree) {
  const SimComparison none;
  const SimComparison& c = shown.empty() ? none : shown.front();
  std::string out = fmt::format("simulate {}: {} simulated rank(s) vs 1 unsharded rank\n\n", r.recipe_name, r.ranks);
  out += fmt::format("numerics (max relative error; tolerance {:.0e} values, {:.0e} gradients)\n", c.tolerance.values,
                     c.tolerance.gradients);
  out += fmt::format("  {:<40} {:>12} {:>12}  {}\n", "quantity", "max abs", "max rel", "");
  const auto line = [&](const ErrorStat& e, double tol) {
    out += fmt::format("  {:<40} {:>12.3e} {:>12.3e}  {}\n", e.name, e.max_abs, e.max_rel, Mark(e.max_rel <= tol));
  };
  line(r.loss, c.tolerance.values);
  line(r.output, c.tolerance.values);
  // Every gradient is in the JSON; the table shows the worst and any that fail.
  int failing = 0;
  for (const ErrorStat& g : r.gradients) {
    if (g.max_rel > c.tolerance.gradients) {
      line(g, c.tolerance.gradients);
      ++failing;
    }
  }
  if (failing == 0 && !r.gradients.empty()) {
    ErrorStat worst = r.worst_gradient;
    worst.name = "worst gradient: " + worst.name;
    line(worst, c.tolerance.gradients);
  }
  out += fmt::format("  ({} parameter gradients compared after gathering the shards, {} over tolerance)\n",
                     r.gradients.size(), failing);
  out += fmt::format("  loss {:.12f} (sharded) vs {:.12f} (reference); dropped token-expert pairs {} vs {}\n\n",
                     r.loss_sharded, r.loss_reference, r.dropped_pairs, r.dropped_pairs_reference);

  for (const SimComparison& sc : shown) out += RenderComm(r, sc);
  out += "memory (peak bytes per category, worst rank, modeled dtypes)\n";
  out += fmt::format("  {:<20} {:>14} {:>14} {:>10}  {}\n", "category", "measured", "modeled", "tolerance", "");
  if (!c.memory.empty()) {
    for (const MemoryAgreement& m : c.memory) {
      const std::string tol = m.note.empty() ? fmt::format("{:.0f}%", 100 * m.tolerance) : "-";
      out += fmt::format("  {:<20} {:>14} {:>14} {:>10}  {}{}\n", m.category, m.measured, m.modeled, tol,
                         m.note.empty() ? Mark(m.agrees) : "info ", m.note);
    }
  } else {
    for (int k = 0; k < kNumSimCategories; ++k) {
      out += fmt::format("  {:<20} {:>14} {:>14}\n", Key(static_cast<SimCategory>(k)), WorstPeak(r, k), "-");
    }
  }
  for (const std::string& n : c.notes) out += "note: " + n + "\n";
  bool comm_ok = true;
  for (const SimComparison& sc : shown) comm_ok = comm_ok && sc.comm_ok();
  out += fmt::format("\nverdict: {} over all {} ranks (shown: numerics {}, communication {}, memory {})\n",
                     agree ? "agree" : "DISAGREE", r.ranks, Mark(c.numerics_ok), Mark(comm_ok), Mark(c.memory_ok()));
  return out;
}

std::string RenderSimulationJson(const SimulationReport& r, const std::vector<SimComparison>& shown, bool agree) {
  const SimComparison none;
  const SimComparison& c = shown.empty() ? none : shown.front();
  using nlohmann::ordered_json;
  const auto err = [](const ErrorStat& e) {
    return ordered_json{{"name", e.name}, {"elements", e.elements}, {"max_abs", e.max_abs}, {"max_rel", e.max_rel}};
  };
  ordered_json j;
  j["recipe"] = r.recipe_name;
  j["ranks"] = r.ranks;
  j["verdict"] = agree ? "agree" : "disagree";
  j["numerics"] = {{"ok", c.numerics_ok},
                   {"tolerance_values", c.tolerance.values},
                   {"tolerance_gradients", c.tolerance.gradients},
                   {"loss_sharded", r.loss_sharded},
                   {"loss_reference", r.loss_reference},
                   {"loss", err(r.loss)},
                   {"output", err(r.output)},
                   {"dropped_pairs", r.dropped_pairs},
                   {"dropped_pairs_reference", r.dropped_pairs_reference}};
  ordered_json grads = ordered_json::array();
  for (const ErrorStat& g : r.gradients) grads.push_back(err(g));
  j["numerics"]["gradients"] = grads;
  ordered_json ranks = ordered_json::array();
  for (const RankMeasurement& m : r.per_rank) {
    ordered_json comm = ordered_json::array();
    for (const CommCount& k : m.comm) {
      comm.push_back({{"axis", k.axis}, {"kind", Name(k.kind)}, {"pass", Name(k.pass)}, {"what", k.what},
                      {"calls", k.calls}, {"bytes_sent", k.bytes_sent}, {"bytes_received", k.bytes_received}});
    }
    ordered_json peaks;
    for (int k = 0; k < kNumSimCategories; ++k) peaks[Key(static_cast<SimCategory>(k))] = m.peak_bytes[static_cast<size_t>(k)];
    ranks.push_back({{"rank", m.rank}, {"comm", comm}, {"peak_bytes", peaks}, {"peak_total_bytes", m.peak_total_bytes}});
  }
  j["per_rank"] = ranks;
  ordered_json comm = ordered_json::array();
  for (const SimComparison& sc : shown) {
    ordered_json rows = ordered_json::array();
    for (const CommAgreement& a : sc.comm) {
      rows.push_back({{"axis", a.axis}, {"kind", a.kind}, {"pass", a.pass}, {"what", a.what}, {"calls", a.calls},
                      {"measured_sent", a.measured_sent}, {"modeled_sent", a.modeled_sent}, {"in_model", a.in_model},
                      {"in_run", a.in_run}, {"exact", a.exact}, {"agrees", a.agrees}});
    }
    comm.push_back({{"rank", sc.compared_rank}, {"ok", sc.comm_ok()}, {"buckets", rows}});
  }
  ordered_json mem = ordered_json::array();
  for (const MemoryAgreement& m : c.memory) {
    mem.push_back({{"category", m.category}, {"measured", m.measured}, {"modeled", m.modeled},
                   {"tolerance", m.tolerance}, {"agrees", m.agrees}, {"note", m.note}});
  }
  j["comparison"] = {{"communication", comm}, {"memory", mem}, {"notes", c.notes}};
  j["flops_sharded"] = r.flops;
  return j.dump(2) + "\n";
}

}  // namespace preflight

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "preflight/report/format.h"
#include "preflight/report/sim_report.h"

namespace preflight {

namespace {
const char* Mark(bool ok) { return ok ? "ok" : "DISAGREE"; }

std::string LayoutLine(const Recipe& r, const SimulationReport& rep) {
  const ParallelConfig& p = r.parallel;
  return fmt::format("tp {}{} cp {} pp {} vpp {} dp {} ep {} expert_tp {} zero {} schedule {}, {} micro-batches",
                     p.tp, p.sp && p.tp > 1 ? " (sp)" : "", p.cp, p.pp, p.vpp, r.dp(), p.ep, p.expert_tp, p.zero,
                     Name(p.schedule), rep.microbatches);
}

std::string RenderNumerics(const SimulationReport& r, const SimComparison& c) {
  const NumericsTolerance& tol = c.tolerance;
  std::string out = fmt::format("numerics (max relative error; tolerance {:.0e} values, {:.0e} gradients, {:.0e} updates)\n",
                                tol.values, tol.gradients, tol.updates);
  out += fmt::format("  {:<46} {:>12} {:>12}  {}\n", "quantity", "max abs", "max rel", "");
  const auto line = [&](const ErrorStat& e, double t, const std::string& prefix = "") {
    out += fmt::format("  {:<46} {:>12.3e} {:>12.3e}  {}\n", prefix + e.name, e.max_abs, e.max_rel, Mark(e.max_rel <= t));
  };
  line(r.loss, tol.values, "per micro-batch ");
  line(r.output, tol.values, "final hidden state: ");
  // Every gradient and update is in the JSON; the table shows the worst and any that fail.
  const auto block = [&](const std::vector<ErrorStat>& all, const ErrorStat& worst, double t, const char* what) {
    int failing = 0;
    for (const ErrorStat& e : all) {
      if (e.max_rel > t) {
        line(e, t, std::string(what) + " ");
        ++failing;
      }
    }
    if (failing == 0 && !all.empty()) line(worst, t, std::string("worst ") + what + ": ");
    return failing;
  };
  const int bad_grads = block(r.gradients, r.worst_gradient, tol.gradients, "gradient");
  const int bad_updates = block(r.updates, r.worst_update, tol.updates, "update");
  out += fmt::format("  ({} gradients assembled from the shards, {} updates from every data-parallel replica; {} and {} over "
                     "tolerance)\n",
                     r.gradients.size(), r.updates.size(), bad_grads, bad_updates);
  out += fmt::format("  loss {:.12f} (sharded) vs {:.12f} (reference); dropped token-expert pairs {} vs {}\n\n",
                     r.loss_sharded, r.loss_reference, r.dropped_pairs, r.dropped_pairs_reference);
  return out;
}

std::string RenderStage(const StageComparison& s) {
  std::string out = fmt::format("stage {}: communication (bytes sent per step, busiest rank of the stage)\n", s.pipeline_rank);
  out += fmt::format("  {:<9} {:<15} {:<5} {:<22} {:>6} {:>12} {:>12}  {}\n", "axis", "kind", "pass", "what", "calls",
                     "measured", "modeled", "");
  for (const CommAgreement& a : s.comm) {
    const std::string modeled = a.in_model ? fmt::format("{}", a.modeled_sent) : "-";
    const char* mark = !a.exact ? (a.agrees ? "info" : "DISAGREE") : Mark(a.agrees);
    out += fmt::format("  {:<9} {:<15} {:<5} {:<22} {:>6} {:>12} {:>12}  {}\n", a.axis, a.kind, a.pass, a.what, a.calls,
                       a.measured_sent, modeled, mark);
  }
  out += fmt::format("stage {}: memory (peak bytes, worst rank of the stage, modeled dtypes)\n", s.pipeline_rank);
  out += fmt::format("  {:<24} {:>12} {:>12} {:>10}  {}\n", "category", "measured", "modeled", "tolerance", "");
  for (const MemoryAgreement& m : s.memory) {
    const std::string tol = !m.note.empty() ? "-" : m.bound ? "<= model" : fmt::format("{:.0f}%", 100 * m.tolerance);
    out += fmt::format("  {:<24} {:>12} {:>12} {:>10}  {}{}\n", m.category, m.measured, m.modeled, tol,
                       m.note.empty() ? Mark(m.agrees) : "info ", m.note);
  }
  return out + "\n";
}

}  // namespace

std::string RenderSimulationTable(const Recipe& scaled, const SimulationReport& r, const SimComparison& c,
                                  std::optional<int64_t> stage) {
  std::string out = fmt::format("simulate {}: {} simulated rank(s) vs 1 unsharded rank\n  layout: {}\n\n", r.recipe_name,
                                r.ranks, LayoutLine(scaled, r));
  out += RenderNumerics(r, c);
  for (const StageComparison& s : c.stages) {
    if (!stage || *stage == s.pipeline_rank) out += RenderStage(s);
  }
  for (const std::string& n : c.notes) out += "note: " + n + "\n";
  out += fmt::format("\nverdict: {} (numerics {}, communication {}, memory {}; every stage, every rank)\n",
                     c.agrees() ? "agree" : "DISAGREE", Mark(c.numerics_ok), Mark(c.comm_ok()), Mark(c.memory_ok()));
  return out;
}

std::string RenderSimulationJson(const Recipe& scaled, const SimulationReport& r, const SimComparison& c) {
  using nlohmann::ordered_json;
  const auto err = [](const ErrorStat& e) {
    return ordered_json{{"name", e.name}, {"elements", e.elements}, {"max_abs", e.max_abs}, {"max_rel", e.max_rel}};
  };
  const auto errs = [&](const std::vector<ErrorStat>& v) {
    ordered_json a = ordered_json::array();
    for (const ErrorStat& e : v) a.push_back(err(e));
    return a;
  };
  const ParallelConfig& p = scaled.parallel;
  ordered_json j;
  j["preflight_version"] = PreflightVersion();
  j["schema_version"] = kJsonSchemaVersion;
  j["recipe"] = r.recipe_name;
  j["ranks"] = r.ranks;
  j["layout"] = {{"tp", p.tp}, {"sp", p.sp && p.tp > 1}, {"cp", p.cp}, {"pp", p.pp}, {"vpp", p.vpp}, {"dp", scaled.dp()},
                 {"ep", p.ep}, {"expert_tp", p.expert_tp}, {"zero", p.zero}, {"schedule", Name(p.schedule)},
                 {"micro_batches", r.microbatches}};
  j["verdict"] = c.agrees() ? "agree" : "disagree";
  j["numerics"] = {{"ok", c.numerics_ok},
                   {"tolerance_values", c.tolerance.values},
                   {"tolerance_gradients", c.tolerance.gradients},
                   {"tolerance_updates", c.tolerance.updates},
                   {"loss_sharded", r.loss_sharded},
                   {"loss_reference", r.loss_reference},
                   {"loss", err(r.loss)},
                   {"output", err(r.output)},
                   {"dropped_pairs", r.dropped_pairs},
                   {"dropped_pairs_reference", r.dropped_pairs_reference},
                   {"gradients", errs(r.gradients)},
                   {"updates", errs(r.updates)}};
  ordered_json stages = ordered_json::array();
  for (const StageComparison& s : c.stages) {
    ordered_json comm = ordered_json::array();
    for (const CommAgreement& a : s.comm) {
      comm.push_back({{"axis", a.axis}, {"kind", a.kind}, {"pass", a.pass}, {"what", a.what}, {"calls", a.calls},
                      {"measured_sent", a.measured_sent}, {"modeled_sent", a.modeled_sent}, {"in_model", a.in_model},
                      {"in_run", a.in_run}, {"exact", a.exact}, {"agrees", a.agrees}});
    }
    ordered_json mem = ordered_json::array();
    for (const MemoryAgreement& m : s.memory) {
      mem.push_back({{"category", m.category}, {"measured", m.measured}, {"modeled", m.modeled},
                     {"tolerance", m.tolerance}, {"bound", m.bound}, {"agrees", m.agrees}, {"note", m.note}});
    }
    stages.push_back({{"pipeline_rank", s.pipeline_rank}, {"communication", comm}, {"memory", mem}});
  }
  j["comparison"] = {{"communication_ok", c.comm_ok()}, {"memory_ok", c.memory_ok()}, {"stages", stages},
                     {"notes", c.notes}};
  ordered_json ranks = ordered_json::array();
  for (const RankMeasurement& m : r.per_rank) {
    ordered_json comm = ordered_json::array();
    for (const CommCount& k : m.comm) {
      comm.push_back({{"axis", Key(k.axis)},
                      {"kind", Name(k.kind)},
                      {"pass", Key(k.pass)},
                      {"what", Key(k.what)},
                      {"calls", k.calls},
                      {"bytes_sent", k.bytes_sent},
                      {"bytes_received", k.bytes_received}});
    }
    ordered_json peaks;
    for (int k = 0; k < kNumSimCategories; ++k) peaks[Key(static_cast<SimCategory>(k))] = m.peak_bytes[static_cast<size_t>(k)];
    ranks.push_back({{"rank", m.rank},
                     {"pipeline_rank", m.pipeline_rank},
                     {"peak_in_flight", m.peak_in_flight},
                     {"comm", comm},
                     {"peak_bytes", peaks},
                     {"peak_total_bytes", m.peak_total_bytes},
                     {"allocated_static_bytes", m.allocated_static_bytes},
                     {"allocated_peak_bytes", m.allocated_peak_bytes}});
    // Only with an offload: every other report keeps its fields.
    if (m.host_peak_bytes > 0 || m.bytes_to_host > 0 || m.bytes_to_device > 0) {
      ranks.back()["host_peak_bytes"] = m.host_peak_bytes;
      ranks.back()["bytes_to_host"] = m.bytes_to_host;
      ranks.back()["bytes_to_device"] = m.bytes_to_device;
    }
  }
  j["per_rank"] = ranks;
  j["flops_sharded"] = r.flops;
  return j.dump(2) + "\n";
}

}  // namespace preflight

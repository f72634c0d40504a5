// Sweep renderers (include/preflight/sweep_report.h).
#include "preflight/report/sweep_report.h"

#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "preflight/report/format.h"

namespace preflight {
namespace {

std::string CsvQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }

/// The table of `indices`; with `ties` (TieGroups of the same indices), a row
/// that ties an earlier one shows "=N", N the rank of its group's first row.
void AppendTableRows(const SweepResult& r, const std::vector<int64_t>& indices, std::string* out,
                     const std::vector<int64_t>& ties = {}) {
  fmt::format_to(std::back_inserter(*out),
                 "{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>5} {:>3} {:>3} {:>9} {:>3} {:>10} {:>5} "
                 "{:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>9} {:>12} {:>6}\n",
                 "#", "tp", "sp", "cp", "pp", "vpp", "dp", "rep", "ep", "expert_tp", "mb", "recompute", "zero",
                 "peak GiB", "headroom", "step s", "compute", "comm", "bubble", "optimizer", "tokens/s", "MFU");
  int64_t rank = 0;
  for (int64_t i : indices) {
    const SweepRow& row = r.rows[static_cast<size_t>(i)];
    ++rank;
    const int64_t group = ties.empty() ? rank : ties[static_cast<size_t>(rank - 1)];
    const std::string shown = group == rank ? fmt::format("{}", rank) : fmt::format("={}", group);
    const Layout l = r.LayoutOf(row);
    fmt::format_to(std::back_inserter(*out),
                   "{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>5} {:>3} {:>3} {:>9} {:>3} {:>10} {:>5} {:>10.2f} {:>10.2f} "
                   "{:>9.3f} {:>9.3f} {:>7.3f} {:>7.3f} {:>9.3f} {:>12.0f} {:>5.1f}%\n",
                   shown, l.tp, l.sequence_parallel() ? "on" : "-", l.cp, l.pp, l.vpp, l.dp, l.dp_replicate, l.ep,
                   l.expert_tp, l.micro_batch, Name(l.recompute), l.zero, row.peak.gib(), r.HeadroomOf(row).gib(),
                   row.step_s, row.compute_s, row.exposed_comm_s, row.bubble_s, row.optimizer_s, row.tokens_per_s,
                   100.0 * row.mfu);
  }
}

std::string RowJson(const SweepResult& r, const SweepRow& row) {
  const Layout l = r.LayoutOf(row);
  std::string out = fmt::format(
      "{{\"tp\": {}, \"sp\": {}, \"cp\": {}, \"pp\": {}, \"vpp\": {}, \"dp\": {}, \"dp_replicate\": {}, \"ep\": {}, "
      "\"expert_tp\": {}, "
      "\"micro_batch\": {}, \"micro_batches\": {}, \"recompute\": \"{}\", \"zero\": {}, \"schedule\": \"{}\", "
      "\"status\": \"{}\"",
      l.tp, l.sequence_parallel() ? "true" : "false", l.cp, l.pp, l.vpp, l.dp, l.dp_replicate, l.ep, l.expert_tp,
      l.micro_batch, l.micro_batches, Name(l.recompute), l.zero, Name(l.schedule), Key(row.status));
  if (row.status == SweepStatus::kInvalid) {
    out +=
        ", \"peak_bytes\": null, \"headroom_bytes\": null, \"worst_stage\": null, \"step_s\": null, "
        "\"compute_s\": null, \"exposed_comm_s\": null, \"bubble_s\": null, \"optimizer_s\": null, "
        "\"tokens_per_s\": null, \"mfu\": null";
  } else {
    out += fmt::format(
        ", \"peak_bytes\": {}, \"headroom_bytes\": {}, \"worst_stage\": {}, \"step_s\": {:.6f}, "
        "\"compute_s\": {:.6f}, \"exposed_comm_s\": {:.6f}, \"bubble_s\": {:.6f}, "
        "\"optimizer_s\": {:.6f}, \"tokens_per_s\": {:.1f}, \"mfu\": {:.4f}",
        row.peak.count(), r.HeadroomOf(row).count(), row.worst_stage, row.step_s, row.compute_s, row.exposed_comm_s,
        row.bubble_s, row.optimizer_s, row.tokens_per_s, row.mfu);
  }
  return out + ", \"reason\": " + JsonString(r.ReasonOf(row)) + "}";
}

std::string IndexList(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", v[i]);
  return out + "]";
}

}  // namespace

std::string RenderSweepTable(const SweepResult& r, const std::string& file) {
  std::string out = fmt::format(
      "sweep of {} on {} GPUs ({} nodes x {} {}), capacity {}, headroom floor {}\n"
      "step time priced at {}\n"
      "{} layouts: {} fit, {} tight (under the floor), {} over capacity, {} invalid\n",
      file, r.gpus, r.nodes, r.gpus_per_node, r.device, FormatGiB(r.capacity), FormatGiB(r.min_headroom),
      r.priced_rates, r.rows.size(), r.CountOf(SweepStatus::kFits), r.CountOf(SweepStatus::kTight),
      r.CountOf(SweepStatus::kOverCapacity), r.CountOf(SweepStatus::kInvalid));
  out += r.sequence_parallel ? "sequence parallelism on wherever tp > 1 (--sp off to hold it off)\n"
                             : "sequence parallelism held off (--sp off)\n";
  if (!r.held_fixed.empty()) {
    out += fmt::format("held at the recipe's values (not varied): {}\n", fmt::join(r.held_fixed, ", "));
  }
  if (r.top.empty()) {
    out += "\nno layout fits. Why:\n";
    const NoFitReasons why = WhyNothingFits(r);
    if (why.invalid_rows > 0) {
      out += fmt::format("  {} invalid; the keys most often to blame:\n", why.invalid_rows);
      for (const NoFitReasons::Group& g : why.invalid) {
        out += fmt::format("    {:>8}  {}, e.g. {}\n", g.rows, g.key, g.example);
      }
    }
    if (why.closest) {
      const SweepRow& row = r.rows[static_cast<size_t>(*why.closest)];
      out += fmt::format("  {} over capacity or under the headroom floor; the closest ({}):\n", why.over_rows,
                         r.ReasonOf(row));
      AppendTableRows(r, {*why.closest}, &out);
    }
    out += "widen the ranges (--tp, --pp, --zero, --recompute) or add GPUs\n";
    return out;
  }
  out += fmt::format("\nbest {} by estimated tokens/s:\n", r.top.size());
  const std::vector<int64_t> ties = TieGroups(r.rows, r.top);
  AppendTableRows(r, r.top, &out, ties);
  for (size_t i = 0; i < ties.size(); ++i) {
    if (ties[i] != static_cast<int64_t>(i) + 1) {
      out += fmt::format(
          "=N: within {:.0f}% of row N's step time, the step-time model's median error against published runs: "
          "a tie, not a ranking\n",
          100.0 * kStepTimeUncertainty);
      break;
    }
  }
  out += fmt::format("\nPareto front of peak memory vs step time ({} layouts, by peak):\n", r.pareto.size());
  AppendTableRows(r, r.pareto, &out);
  return out;
}

std::string SweepCsv(const SweepResult& r) {
  std::string out =
      "tp,sp,cp,pp,vpp,dp,dp_replicate,ep,expert_tp,micro_batch,micro_batches,recompute,zero,schedule,status,peak_"
      "bytes,"
      "headroom_bytes,worst_stage,step_s,compute_s,exposed_comm_s,bubble_s,optimizer_s,tokens_per_s,mfu,reason\n";
  for (const SweepRow& row : r.rows) {
    const Layout l = r.LayoutOf(row);
    auto it = std::back_inserter(out);
    fmt::format_to(it, "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},", l.tp, l.sequence_parallel() ? 1 : 0, l.cp, l.pp,
                   l.vpp, l.dp, l.dp_replicate, l.ep, l.expert_tp, l.micro_batch, l.micro_batches, Name(l.recompute),
                   l.zero, Name(l.schedule), Key(row.status));
    if (row.status == SweepStatus::kInvalid) {
      out += ",,,,,,,,,,";
    } else {
      fmt::format_to(it, "{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.1f},{:.4f},", row.peak.count(),
                     r.HeadroomOf(row).count(), row.worst_stage, row.step_s, row.compute_s, row.exposed_comm_s,
                     row.bubble_s, row.optimizer_s, row.tokens_per_s, row.mfu);
    }
    out += CsvQuote(r.ReasonOf(row));
    out += '\n';
  }
  return out;
}

std::string SweepJson(const SweepResult& r, const std::string& file, const std::vector<int64_t>* only) {
  std::string out = fmt::format(
      "{{\n  \"preflight_version\": \"{}\",\n  \"schema_version\": {},\n  \"recipe\": {},\n  \"gpus\": {},\n  "
      "\"nodes\": {},\n  \"gpus_per_node\": {},\n  \"device\": {},\n"
      "  \"priced_rates\": {},\n  \"capacity_bytes\": {},\n"
      "  \"min_headroom_bytes\": {},\n  \"evaluated\": {},\n  \"counts\": {{\"fits\": {}, \"tight\": {}, "
      "\"over_capacity\": {}, \"invalid\": {}}},\n  \"sequence_parallel\": {},\n  \"held_fixed\": {},\n  \"top\": "
      "{},\n  \"top_tie_groups\": {},\n  \"pareto\": {},\n  "
      "\"layouts\": [",
      PreflightVersion(), kJsonSchemaVersion, JsonString(file), r.gpus, r.nodes, r.gpus_per_node, JsonString(r.device),
      JsonString(r.priced_rates), r.capacity.count(), r.min_headroom.count(), r.rows.size(),
      r.CountOf(SweepStatus::kFits), r.CountOf(SweepStatus::kTight), r.CountOf(SweepStatus::kOverCapacity),
      r.CountOf(SweepStatus::kInvalid), r.sequence_parallel ? "true" : "false", nlohmann::json(r.held_fixed).dump(),
      IndexList(r.top), nlohmann::json(TieGroups(r.rows, r.top)).dump(), IndexList(r.pareto));
  if (r.top.empty()) {
    // Inserted before "layouts": why nothing fits, as the table says it.
    const NoFitReasons why = WhyNothingFits(r);
    nlohmann::json j = {{"invalid_rows", why.invalid_rows}, {"over_rows", why.over_rows}};
    j["invalid"] = nlohmann::json::array();
    for (const NoFitReasons::Group& g : why.invalid) {
      j["invalid"].push_back({{"key", g.key}, {"rows", g.rows}, {"example", g.example}});
    }
    j["closest"] = why.closest ? nlohmann::json(*why.closest) : nlohmann::json(nullptr);
    const std::string layouts = "  \"layouts\": [";
    out.insert(out.size() - layouts.size(), fmt::format("  \"nothing_fits\": {},\n", j.dump()));
  }
  const size_t count = only != nullptr ? only->size() : r.rows.size();
  for (size_t k = 0; k < count; ++k) {
    out += k ? ",\n    " : "\n    ";
    if (only == nullptr) {
      out += RowJson(r, r.rows[k]);
    } else {
      const auto i = static_cast<size_t>((*only)[k]);
      out += fmt::format("{{\"index\": {}, {}", i, RowJson(r, r.rows[i]).substr(1));
    }
  }
  out += count == 0 ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace preflight

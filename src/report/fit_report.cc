// Renderers of `preflight fit`: the table and the JSON document.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "preflight/report/format.h"
#include "preflight/report/plan_report.h"
#include "preflight/report/report.h"

namespace preflight {
namespace {

constexpr Category kAllCategories[] = {
    Category::kReplicatedParams, Category::kTpShardedParams,   Category::kEpShardedParams, Category::kGradients,
    Category::kOptimizerMuon,    Category::kOptimizerAdamW,    Category::kActivations,     Category::kRoutingScratch,
    Category::kServingState,     Category::kLibraryWorkspaces, Category::kRuntimeReserve,  Category::kAllocatorOverhead,
};

std::string FamilyCounts(const Inventory& inv) {
  std::string out;
  for (BlockKind k : kAllBlockKinds) {
    const int64_t n = inv.family_layers[static_cast<size_t>(FamilyIndex(k))];
    if (n > 0) out += fmt::format("{}{}×{}", out.empty() ? "" : " ", Letter(k), n);
  }
  return out;
}

/// The rank's chunks in layers (the framework's unit): "0-3", "0-3,16-19".
std::string ChunkRanges(const StagePlan& plan, int64_t pipeline_rank, const std::vector<int64_t>& layer_starts) {
  std::string out;
  for (const StageChunk& c : ChunksOfRank(plan, pipeline_rank)) {
    if (!out.empty()) out += ",";
    const LayerRange range = LayerRangeOf(c, layer_starts);
    out += range.end > range.first ? fmt::format("{}-{}", range.first, range.end - 1) : std::string("none");
  }
  return out;
}

/// A row of the memory table: label, then one GiB cell per stage.
std::string Row(const std::string& label, const std::vector<std::string>& cells) {
  std::string out = fmt::format("  {:<30}", label);
  for (const auto& c : cells) out += fmt::format("{:>12}", c);
  return out + "\n";
}

std::string Gib(Bytes b) { return fmt::format("{:.2f}", b.gib()); }

std::string SignedPercent(double fraction) { return fmt::format("{:+.1f}%", 100.0 * fraction); }

std::string RenderAdvice(const FitAdvice& a) {
  if (a.fits) {
    return fmt::format("dominant  {} is {:.0f}% of the worst rank (stage {}): {} GiB\n", Label(a.dominant),
                       100.0 * a.dominant_share, a.worst_stage, Gib(a.dominant_bytes));
  }
  if (a.suggestions.empty()) {
    return "advice    no single change or pair of changes (more TP, SP, more EP, more PP, more CP, ZeRO up, more "
           "recompute, smaller micro-batch, fewer HSDP replicas) makes it fit, nor 2, 4 or 8 times the nodes\n";
  }
  std::string out = "advice    changes that make it fit, cheapest first:\n";
  for (size_t i = 0; i < a.suggestions.size(); ++i) {
    const Suggestion& s = a.suggestions[i];
    out += fmt::format("  {}. {}\n     headroom {} GiB ({:+.2f} GiB){}, step time {} ({})\n", i + 1, s.Summary(),
                       Gib(s.headroom), s.headroom_gain.gib(), s.headroom_ok ? "" : ", below the floor",
                       a.step_s > 0 ? fmt::format("{:.3f} s", s.step_s) : std::string("n/a"),
                       a.step_s > 0 ? SignedPercent(s.step_change) : std::string("not priced"));
  }
  return out;
}

nlohmann::json AdviceJson(const FitAdvice& a) {
  nlohmann::json out = {{"fits", a.fits}, {"step_s", a.step_s}};
  if (a.fits) {
    out["dominant"] = {{"category", Key(a.dominant)},
                       {"bytes", a.dominant_bytes.count()},
                       {"share", a.dominant_share},
                       {"stage", a.worst_stage}};
    return out;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const Suggestion& s : a.suggestions) {
    nlohmann::json changes = nlohmann::json::array();
    for (const AdviceChange& c : s.changes) {
      changes.push_back({{"move", Key(c.move)}, {"key", c.key}, {"from", c.from}, {"to", c.to}});
    }
    list.push_back({{"changes", changes},
                    {"summary", s.Summary()},
                    {"layout", LayoutJson(s.layout)},
                    {"peak_bytes", s.peak.count()},
                    {"headroom_bytes", s.headroom.count()},
                    {"headroom_gain_bytes", s.headroom_gain.count()},
                    {"headroom_ok", s.headroom_ok},
                    {"step_s", s.step_s},
                    {"step_change", s.step_change}});
  }
  out["suggestions"] = list;
  return out;
}

/// The rank Megatron logs memory for (the last global rank: last pipeline
/// stage, last TP/CP/DP coordinate). Megatron pads the vocabulary to a multiple
/// of TP and the distributed optimizer's buffers to a multiple of DP, so that
/// coordinate holds what the stage's worst rank holds (docs/allocated.md).
nlohmann::json LastRankJson(const MemoryEstimate& est) {
  if (est.stages.empty()) return nlohmann::json::object();
  const RankMemory& m = est.stages.back();
  return {{"pipeline_rank", est.stages.size() - 1},
          {"allocated_static_bytes", m.allocated_static.count()},
          {"allocated_peak_bytes", m.allocated_peak.count()}};
}

}  // namespace

nlohmann::json ExplanationsJson(const std::vector<Explanation>& explanations) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : explanations) {
    out.push_back({{"category", Key(e.category)},
                   {"item", e.item},
                   {"formula", e.formula},
                   {"inputs", e.inputs},
                   {"bytes", e.bytes.count()}});
  }
  return out;
}

nlohmann::json DeviceJson(const ClusterConfig& cluster) {
  const GpuSpec& g = cluster.spec;
  const KernelRates& k = g.rates;
  nlohmann::json out = {{"gpu", g.name},
                        {"label", DeviceLabel(cluster)},
                        {"capacity_mib", g.capacity_mib},
                        {"bf16_dense_tflops", g.bf16_dense_tflops},
                        {"fp8_dense_tflops", g.fp8_dense_tflops},
                        {"fp4_dense_tflops", g.fp4_dense_tflops},
                        {"hbm_gbps", g.hbm_gbps},
                        {"nvlink_gbps_per_dir", g.nvlink_gbps_per_dir},
                        {"ib_gbps_per_dir", g.ib_gbps_per_dir},
                        {"nvlink_domain", g.nvlink_domain},
                        {"host_link_gbps_per_dir", g.host_link_gbps_per_dir},
                        {"host_memory_gib", g.host_memory_gib},
                        {"rates",
                         {{"gemm", k.gemm},
                          {"gemm_fp8", k.gemm_fp8},
                          {"gemm_memory", k.gemm_memory},
                          {"hbm", k.hbm},
                          {"attention_fused", k.attention_fused},
                          {"attention_flash2", k.attention_flash2},
                          {"attention_half_seq", k.attention_half_seq},
                          {"gemm_tile_k", k.gemm_tile_k}}}};
  if (cluster.device && !cluster.device->based_on.empty()) out["based_on"] = cluster.device->based_on;
  return out;
}

std::string RenderFitTable(const FitReport& r) {
  const Inventory& inv = *r.inventory;
  const Recipe& recipe = inv.recipe;
  const MemoryEstimate& est = r.estimate;
  std::string out;
  out += fmt::format("preflight fit: {} ({})\n", recipe.name, r.file);
  const size_t depth = inv.layer_starts.empty() ? inv.layers.size() : inv.layer_starts.size() - 1;
  const std::string sublayers = depth == inv.layers.size()
                                    ? FamilyCounts(inv)
                                    : fmt::format("{} sublayers: {}", inv.layers.size(), FamilyCounts(inv));
  out += fmt::format("model     {} layers ({}), {} params total, {} active per token\n", depth, sublayers,
                     FormatCount(inv.total_params), FormatCount(inv.active_params));
  out += fmt::format("layout    {} | zero {} | {} m={} | recompute {}\n", LayoutSummary(r.layout), r.layout.zero,
                     Name(r.layout.schedule), r.layout.micro_batches, Name(r.layout.recompute));
  out += fmt::format("device    {} {} MiB ({:.2f} GiB), {} GPUs = {} nodes × {}\n", DeviceLabel(recipe.cluster),
                     recipe.cluster.spec.capacity_mib, est.stages.empty() ? 0.0 : est.stages.front().capacity.gib(),
                     recipe.world(), recipe.cluster.nodes, recipe.cluster.gpus_per_node);
  out += "\n";

  const size_t n = est.stages.size();
  std::vector<std::string> header, layers, inflight;
  for (size_t s = 0; s < n; ++s) {
    header.push_back(fmt::format("stage {}", s));
    layers.push_back(ChunkRanges(r.stages, static_cast<int64_t>(s), r.inventory->layer_starts));
    inflight.push_back(fmt::format("{}", est.stages[s].in_flight_microbatches));
  }
  out += Row("memory per rank (GiB)", header);
  out += Row("layers", layers);
  out += Row("micro-batches in flight", inflight);
  for (Category c : kAllCategories) {
    std::vector<std::string> cells;
    for (const auto& st : est.stages) cells.push_back(Gib(st.of(c)));
    out += Row(Label(c), cells);
    if (c == Category::kActivations) {
      for (BlockKind k : kAllBlockKinds) {
        const auto f = static_cast<size_t>(FamilyIndex(k));
        if (inv.family_layers[f] == 0) continue;
        std::vector<std::string> fam;
        for (const auto& st : est.stages) fam.push_back(Gib(st.activations_by_family[f]));
        out += Row(fmt::format("  of which {}", Letter(k)), fam);
      }
      std::vector<std::string> ends, kept;
      bool offload = false;
      for (const auto& st : est.stages) {
        ends.push_back(Gib(st.activations_ends));
        kept.push_back(Gib(st.activations_offload_kept));
        offload = offload || st.activations_offload_kept.count() > 0;
      }
      out += Row("  of which embedding/head", ends);
      // Activation offloading: what the device still holds of the offloaded tensors.
      if (offload) out += Row("  of which offloaded, on device", kept);
    }
  }
  std::vector<std::string> total, cap, head, allocated_static, allocated_peak;
  for (const auto& st : est.stages) {
    total.push_back(Gib(st.total()));
    cap.push_back(Gib(st.capacity));
    head.push_back(Gib(st.headroom()));
    allocated_static.push_back(Gib(st.allocated_static));
    allocated_peak.push_back(Gib(st.allocated_peak));
  }
  out += Row("total", total);
  // What PyTorch's allocator will report (docs/allocated.md): no reserve, no fragmentation.
  out += Row("  allocated between steps", allocated_static);
  out += Row("  allocated at the peak", allocated_peak);
  out += Row("capacity", cap);
  out += Row("headroom", head);
  if (est.verdict.host_per_node.count() > 0) {
    std::vector<std::string> host;
    for (const auto& st : est.stages) host.push_back(Gib(st.host));
    out += Row("host (offloaded state)", host);
    out += fmt::format("  host per node: {} GPUs x the heaviest stage = {} of {} GiB\n", recipe.cluster.gpus_per_node,
                       FormatGiB(est.verdict.host_per_node), Gib(GiB(recipe.cluster.spec.host_memory_gib)));
  }
  out += "\n";
  if (!r.explanations.empty()) {
    out += fmt::format("explain (stage {}, the worst rank)\n", est.worst_stage);
    for (const auto& e : r.explanations) {
      out += fmt::format("  {:<20} {:<40} {:>12}\n", Key(e.category), e.item, FormatBytesHuman(e.bytes));
      out += fmt::format("      = {}\n", e.formula);
      if (!e.inputs.empty()) out += fmt::format("        with {}\n", e.inputs);
    }
    out += "\n";
  }
  const auto& v = est.verdict;
  const char* word = !v.fits ? "DOES NOT FIT" : (v.headroom_ok ? "fits" : "fits, below the headroom floor");
  out += fmt::format("verdict   {}: {}\n", word, v.reason);
  if (r.advice) out += RenderAdvice(*r.advice);
  if (r.balanced_cut) out += "stages    " + DescribeBalancedCut(r.inventory->recipe, *r.balanced_cut) + "\n";
  return out;
}

nlohmann::json FitJson(const FitReport& r) {
  const Inventory& inv = *r.inventory;
  const Recipe& recipe = inv.recipe;
  nlohmann::json families = nlohmann::json::object();
  for (BlockKind k : kAllBlockKinds) {
    const auto f = static_cast<size_t>(FamilyIndex(k));
    families[std::string(1, Letter(k))] = {{"layers", inv.family_layers[f]}, {"params", inv.family_params[f]}};
  }
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < r.estimate.stages.size(); ++s) {
    const RankMemory& m = r.estimate.stages[s];
    nlohmann::json memory = nlohmann::json::object();
    for (Category c : kAllCategories) memory[Key(c)] = m.of(c).count();
    nlohmann::json acts = nlohmann::json::object();
    for (BlockKind k : kAllBlockKinds) {
      acts[std::string(1, Letter(k))] = m.activations_by_family[static_cast<size_t>(FamilyIndex(k))].count();
    }
    acts["embedding_head"] = m.activations_ends.count();
    nlohmann::json chunks = nlohmann::json::array();
    for (const StageChunk& c : ChunksOfRank(r.stages, static_cast<int64_t>(s))) {
      const LayerRange range = LayerRangeOf(c, r.inventory->layer_starts);
      chunks.push_back({{"first_layer", range.first}, {"end_layer", range.end}});
    }
    stages.push_back({{"pipeline_rank", s},
                      {"chunks", chunks},
                      {"in_flight_microbatches", m.in_flight_microbatches},
                      {"memory_bytes", memory},
                      {"activations_by_family_bytes", acts},
                      {"total_bytes", m.total().count()},
                      {"capacity_bytes", m.capacity.count()},
                      {"headroom_bytes", m.headroom().count()},
                      {"allocated_static_bytes", m.allocated_static.count()},
                      {"allocated_peak_bytes", m.allocated_peak.count()}});
    if (m.host.count() > 0) stages.back()["host_bytes"] = m.host.count();
  }
  const nlohmann::json explain = ExplanationsJson(r.explanations);
  const auto& v = r.estimate.verdict;
  nlohmann::json out = {
      {"recipe", {{"name", recipe.name}, {"file", r.file}}},
      {"params", {{"total", inv.total_params}, {"active", inv.active_params}, {"by_family", families}}},
      {"layout", LayoutJson(r.layout)},
      {"device", DeviceJson(recipe.cluster)},
      {"stages", stages},
      {"worst_stage", r.estimate.worst_stage},
      {"last_global_rank", LastRankJson(r.estimate)},
      {"verdict",
       {{"fits", v.fits},
        {"headroom_ok", v.headroom_ok},
        {"headroom_bytes", v.headroom.count()},
        {"min_headroom_bytes", GiB(recipe.cluster.min_headroom_gib).count()},
        {"reason", v.reason}}},
  };
  out["device"]["capacity_bytes"] = r.estimate.stages.empty() ? 0 : r.estimate.stages.front().capacity.count();
  out["device"]["nodes"] = recipe.cluster.nodes;
  out["device"]["gpus_per_node"] = recipe.cluster.gpus_per_node;
  if (v.host_per_node.count() > 0) {
    out["verdict"]["host_per_node_bytes"] = v.host_per_node.count();
    out["verdict"]["host_capacity_bytes"] = GiB(recipe.cluster.spec.host_memory_gib).count();
    out["verdict"]["host_fits"] = v.host_fits;
  }
  if (!explain.empty()) out["explain"] = explain;
  if (r.advice) out["advice"] = AdviceJson(*r.advice);
  if (r.balanced_cut) out["balanced_cut"] = BalancedCutJson(r.inventory->recipe, *r.balanced_cut);
  return out;
}

}  // namespace preflight

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
    out += FormatLayerRange(LayerRangeOf(c, layer_starts));
  }
  return out;
}

/// Framework layers on one pipeline rank, over all its chunks.
int64_t LayersOfRank(const StagePlan& plan, int64_t pipeline_rank, const std::vector<int64_t>& layer_starts) {
  int64_t n = 0;
  for (const StageChunk& c : ChunksOfRank(plan, pipeline_rank)) {
    const LayerRange range = LayerRangeOf(c, layer_starts);
    n += range.end - range.first;
  }
  return n;
}

// The memory table fits 100 columns at any pipeline depth: a label column,
// then at most five 12-wide stage columns per block of rows; more columns
// continue in another block below.
constexpr size_t kLabelWidth = 32;
constexpr size_t kCellWidth = 12;
constexpr size_t kTableWidth = 100;
constexpr size_t kColumnsPerBlock = (kTableWidth - kLabelWidth) / kCellWidth;

/// A row of the memory table: its label and one cell per stage.
struct TableRow {
  std::string label;
  std::vector<std::string> cells;
};

/// A column of the memory table: consecutive stages [first, last] whose every
/// shown figure and layer count agree (a deep pipeline's middle stages).
struct Column {
  size_t first = 0;
  size_t last = 0;
};

std::vector<Column> GroupStages(const std::vector<TableRow>& rows, const std::vector<int64_t>& layer_counts) {
  auto same = [&](size_t a, size_t b) {
    if (layer_counts[a] != layer_counts[b]) return false;
    return std::all_of(rows.begin(), rows.end(), [&](const TableRow& row) { return row.cells[a] == row.cells[b]; });
  };
  std::vector<Column> out;
  for (size_t s = 0; s < layer_counts.size(); ++s) {
    if (!out.empty() && same(out.back().last, s)) {
      out.back().last = s;
    } else {
      out.push_back({s, s});
    }
  }
  return out;
}

std::string Row(const std::string& label, const std::vector<std::string>& cells) {
  std::string out = fmt::format("  {:<{}}", label, kLabelWidth - 2);
  for (const auto& c : cells) out += fmt::format("{:>{}}", c, kCellWidth);
  return out + "\n";
}

/// The table in blocks of kColumnsPerBlock columns: a header row naming the
/// stages of each column (the worst marked *), then every row.
std::string RenderColumns(const std::vector<Column>& columns, size_t worst, const std::vector<TableRow>& rows) {
  std::string out;
  for (size_t begin = 0; begin < columns.size(); begin += kColumnsPerBlock) {
    const size_t end = std::min(columns.size(), begin + kColumnsPerBlock);
    if (begin > 0) out += "\n";
    std::vector<std::string> header;
    for (size_t c = begin; c < end; ++c) {
      const Column& col = columns[c];
      header.push_back(fmt::format(
          "{}{}",
          col.first == col.last ? fmt::format("stage {}", col.first) : fmt::format("stages {}-{}", col.first, col.last),
          worst >= col.first && worst <= col.last ? "*" : ""));
    }
    out += Row("memory per rank (GiB)", header);
    for (const TableRow& row : rows) {
      std::vector<std::string> cells;
      for (size_t c = begin; c < end; ++c) cells.push_back(row.cells[columns[c].first]);
      out += Row(row.label, cells);
    }
  }
  return out;
}

/// "layers    stage 0: 0-2,63-66; stage 1: 3-6,67-70; ..." wrapped at the table width.
std::string LayerList(const std::vector<std::string>& ranges) {
  std::string out = "layers   ";
  size_t line = out.size();
  for (size_t s = 0; s < ranges.size(); ++s) {
    const std::string item = fmt::format(" stage {}: {}{}", s, ranges[s], s + 1 < ranges.size() ? ";" : "");
    if (line + item.size() > kTableWidth) {
      out += "\n         ";
      line = 9;
    }
    out += item;
    line += item.size();
  }
  return out + "\n";
}

std::string SignedPercent(double fraction) { return fmt::format("{:+.1f}%", 100.0 * fraction); }

std::string SuggestionList(const std::vector<Suggestion>& list, double step_s) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    const Suggestion& s = list[i];
    out += fmt::format("  {}. {}\n     headroom {} GiB ({:+.2f} GiB){}, step time {} ({})\n", i + 1, s.Summary(),
                       FormatGiBNumber(s.headroom), s.headroom_gain.gib(), s.headroom_ok ? "" : ", below the floor",
                       step_s > 0 ? fmt::format("{:.3f} s", s.step_s) : std::string("n/a"),
                       step_s > 0 ? SignedPercent(s.step_change) : std::string("not priced"));
  }
  return out;
}

// Stages whose peaks differ by less than this share of the lightest are not
// called unbalanced: a tenth is what one layer more or less moves on a
// typical 8-16-layer stage.
constexpr double kImbalanceWorthSaying = 0.10;

std::string RenderAdvice(const FitReport& r, const FitAdvice& a) {
  std::string out;
  if (a.fits) {
    out += fmt::format("dominant  {} is {:.0f}% of the worst rank (stage {}): {} GiB\n", Label(a.dominant),
                       100.0 * a.dominant_share, a.worst_stage, FormatGiBNumber(a.dominant_bytes));
  }
  const double spread = a.lightest > Bytes(0) ? a.heaviest.gib() / a.lightest.gib() - 1.0 : 0.0;
  if (spread >= kImbalanceWorthSaying) {
    out += fmt::format("balance   stage {} peaks {:.1f} % above stage {} ({} vs {} GiB)\n", a.heaviest_stage,
                       100.0 * spread, a.lightest_stage, FormatGiBNumber(a.heaviest), FormatGiBNumber(a.lightest));
  }
  if (r.balanced_cut) out += "stages    " + DescribeBalancedCut(r.inventory->recipe, *r.balanced_cut) + "\n";
  if (a.fits && !a.below_floor) {
    if (!a.faster.empty()) {
      out += fmt::format(
          "faster    changes that still fit above the floor and shorten the step, fastest first (`preflight sweep {} "
          "--gpus {}` searches every layout):\n",
          r.file, r.inventory->recipe.world());
      out += SuggestionList(a.faster, a.step_s);
    }
    return out;
  }
  const std::string goal = a.below_floor ? "meet the headroom floor (cluster.min_headroom_gib)" : "make it fit";
  if (a.suggestions.empty()) {
    return out + fmt::format(
                     "advice    no single change or pair of changes (more TP, SP, more EP, more PP, more CP, ZeRO up, "
                     "more recompute, smaller micro-batch, fewer HSDP replicas) would {}, nor 2, 4 or 8 times the "
                     "nodes\n",
                     goal);
  }
  out += fmt::format("advice    changes that {}, cheapest first:\n", goal);
  return out + SuggestionList(a.suggestions, a.step_s);
}

nlohmann::json SuggestionsJson(const std::vector<Suggestion>& suggestions) {
  nlohmann::json list = nlohmann::json::array();
  for (const Suggestion& s : suggestions) {
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
  return list;
}

nlohmann::json AdviceJson(const FitAdvice& a) {
  nlohmann::json out = {{"fits", a.fits},
                        {"below_floor", a.below_floor},
                        {"step_s", a.step_s},
                        {"heaviest_stage", {{"stage", a.heaviest_stage}, {"peak_bytes", a.heaviest.count()}}},
                        {"lightest_stage", {{"stage", a.lightest_stage}, {"peak_bytes", a.lightest.count()}}}};
  if (a.fits) {
    out["dominant"] = {{"category", Key(a.dominant)},
                       {"bytes", a.dominant_bytes.count()},
                       {"share", a.dominant_share},
                       {"stage", a.worst_stage}};
  }
  if (!a.fits || a.below_floor) out["suggestions"] = SuggestionsJson(a.suggestions);
  if (a.fits && !a.below_floor) out["faster"] = SuggestionsJson(a.faster);
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
          {"allocated_static_bytes", m.last_rank_allocated_static.count()},
          {"allocated_peak_bytes", m.last_rank_allocated_peak.count()}};
}

/// The table's line for the rank Megatron logs memory for (LastRankJson):
/// what its allocator will show.
std::string LastRankLine(const MemoryEstimate& est) {
  if (est.stages.empty()) return {};
  const RankMemory& m = est.stages.back();
  return fmt::format("  last global rank (stage {}, logged by Megatron): allocated {} between steps, {} at peak\n",
                     est.stages.size() - 1, FormatGiBNumber(m.last_rank_allocated_static),
                     FormatGiBNumber(m.last_rank_allocated_peak));
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
  // Two lines: the degrees, then ZeRO, schedule and recompute (one line is wider than 100 columns).
  out += fmt::format("layout    {}\n          zero {} | {} m={} | recompute {}\n", LayoutSummary(r.layout),
                     r.layout.zero, Name(r.layout.schedule), r.layout.micro_batches, Name(r.layout.recompute));
  out += fmt::format("device    {} {} MiB ({:.2f} GiB), {} GPUs = {} nodes × {}\n", DeviceLabel(recipe.cluster),
                     recipe.cluster.spec.capacity_mib, est.stages.empty() ? 0.0 : est.stages.front().capacity.gib(),
                     recipe.world(), recipe.cluster.nodes, recipe.cluster.gpus_per_node);
  out += "\n";

  const size_t n = est.stages.size();
  std::vector<std::string> ranges;
  std::vector<int64_t> layer_counts;
  std::vector<TableRow> rows;
  auto add = [&](std::string label, auto cell) {
    TableRow row{std::move(label), {}};
    for (const RankMemory& st : est.stages) row.cells.push_back(cell(st));
    rows.push_back(std::move(row));
  };
  for (size_t s = 0; s < n; ++s) {
    ranges.push_back(ChunkRanges(r.stages, static_cast<int64_t>(s), inv.layer_starts));
    layer_counts.push_back(LayersOfRank(r.stages, static_cast<int64_t>(s), inv.layer_starts));
  }
  add("micro-batches in flight", [](const RankMemory& st) { return fmt::format("{}", st.in_flight_microbatches); });
  for (Category c : kAllCategories) {
    add(Label(c), [c](const RankMemory& st) { return FormatGiBNumber(st.of(c)); });
    if (c != Category::kActivations) continue;
    // The activation line's parts, adding up to it.
    for (BlockKind k : kAllBlockKinds) {
      const auto f = static_cast<size_t>(FamilyIndex(k));
      if (inv.family_layers[f] == 0) continue;
      add(fmt::format("  of which {}", Letter(k)),
          [f](const RankMemory& st) { return FormatGiBNumber(st.activations_by_family[f]); });
    }
    add("  of which embedding/head", [](const RankMemory& st) { return FormatGiBNumber(st.activations_ends); });
    auto any = [&](auto member) {
      return std::any_of(est.stages.begin(), est.stages.end(),
                         [&](const RankMemory& st) { return (st.*member).count() > 0; });
    };
    if (any(&RankMemory::activations_transient)) {
      add("  of which one-layer transient",
          [](const RankMemory& st) { return FormatGiBNumber(st.activations_transient); });
    }
    // Activation offloading: what the device still holds of the offloaded tensors.
    if (any(&RankMemory::activations_offload_kept)) {
      add("  of which offloaded, on device",
          [](const RankMemory& st) { return FormatGiBNumber(st.activations_offload_kept); });
    }
  }
  add("peak", [](const RankMemory& st) { return FormatGiBNumber(st.total()); });
  // What PyTorch's allocator will report (docs/allocated.md): no reserve, no fragmentation.
  add("  allocated between steps", [](const RankMemory& st) { return FormatGiBNumber(st.allocated_static); });
  add("  allocated at the peak", [](const RankMemory& st) { return FormatGiBNumber(st.allocated_peak); });
  add("capacity", [](const RankMemory& st) { return FormatGiBNumber(st.capacity); });
  add("headroom", [](const RankMemory& st) { return FormatGiBNumber(st.headroom()); });
  if (est.verdict.host_per_node.count() > 0) {
    add("host (offloaded state)", [](const RankMemory& st) { return FormatGiBNumber(st.host); });
  }
  const std::vector<Column> columns = GroupStages(rows, layer_counts);
  // Layer ranges go in the table when each column is one stage and its ranges fit the cell.
  const bool ranges_in_table =
      columns.size() == n &&
      std::all_of(ranges.begin(), ranges.end(), [](const std::string& x) { return x.size() < kCellWidth; });
  TableRow layers{ranges_in_table ? "layers" : "layers per stage", {}};
  for (size_t s = 0; s < n; ++s)
    layers.cells.push_back(ranges_in_table ? ranges[s] : fmt::format("{}", layer_counts[s]));
  rows.insert(rows.begin(), std::move(layers));
  out += RenderColumns(columns, static_cast<size_t>(est.worst_stage), rows);
  if (est.verdict.host_per_node.count() > 0) {
    out += fmt::format("  host per node: {} GPUs x the heaviest stage = {} of {} GiB\n", recipe.cluster.gpus_per_node,
                       FormatGiB(est.verdict.host_per_node), FormatGiBNumber(GiB(recipe.cluster.spec.host_memory_gib)));
  }
  out += "  * the worst stage (the most memory)\n";
  out += LastRankLine(est);
  if (!ranges_in_table) out += "\n" + LayerList(ranges);
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
  if (r.advice) out += RenderAdvice(r, *r.advice);
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
    // With these two the parts add up to memory_bytes.activations.
    acts["transient"] = m.activations_transient.count();
    acts["offloaded_on_device"] = m.activations_offload_kept.count();
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
                      {"peak_bytes", m.total().count()},
                      {"total_bytes", m.total().count()},  // the old name of peak_bytes, kept one release
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
  out["preflight_version"] = PreflightVersion();
  out["schema_version"] = kJsonSchemaVersion;
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

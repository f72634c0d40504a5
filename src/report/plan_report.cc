#include "preflight/report/plan_report.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "emit_common.h"
#include "preflight/recipe/partition.h"
#include "preflight/report/format.h"
#include "preflight/report/report.h"

namespace preflight {
namespace {

using nlohmann::ordered_json;

std::string Pattern(const Recipe& r, const StageChunk& c) {
  std::string out;
  for (int64_t l = c.first_layer; l < c.end_layer && l < static_cast<int64_t>(r.model.layers.size()); ++l) {
    out += Letter(r.model.layers[static_cast<size_t>(l)]);
  }
  return out;
}

// "0-3" for a contiguous set, "0,2,5" otherwise.
std::string RangeText(const std::set<int64_t>& values) {
  if (values.empty()) return "-";
  const int64_t lo = *values.begin(), hi = *values.rbegin();
  if (static_cast<int64_t>(values.size()) == hi - lo + 1) return lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi);
  std::string out;
  for (int64_t v : values) {
    if (!out.empty()) out += ',';
    out += std::to_string(v);
  }
  return out;
}

struct NodeRow {
  int64_t node = 0, first_rank = 0, last_rank = 0;
  std::set<int64_t> tp, cp, dp, pp;
};

std::vector<NodeRow> NodeRows(const Mesh& m) {
  std::vector<NodeRow> rows(static_cast<size_t>(m.nodes));
  for (size_t n = 0; n < rows.size(); ++n) {
    rows[n].node = static_cast<int64_t>(n);
    rows[n].first_rank = static_cast<int64_t>(n) * m.gpus_per_node;
    rows[n].last_rank = std::min(m.world, static_cast<int64_t>(n + 1) * m.gpus_per_node) - 1;
  }
  for (const RankCoord& c : m.ranks) {
    NodeRow& row = rows[static_cast<size_t>(c.node)];
    row.tp.insert(c.tp);
    row.cp.insert(c.cp);
    row.dp.insert(c.dp);
    row.pp.insert(c.pp);
  }
  return rows;
}

std::string Ms(double s) { return fmt::format("{:.2f}", s * 1e3); }

bool HasMoe(const Recipe& r) {
  for (BlockKind k : r.model.layers) {
    if (k == BlockKind::kMoe) return true;
  }
  return false;
}

// The expert axes only mean something when the model has MoE layers.
bool Shown(const Recipe& r, Axis a) {
  return HasMoe(r) || (a != Axis::kEp && a != Axis::kExpertTp && a != Axis::kExpertDp && a != Axis::kExpertDpReplica);
}

std::string LayoutLine(const Recipe& r, const Plan& p) {
  const Layout& l = p.layout;
  const std::string experts =
      HasMoe(r) ? fmt::format(" · ep {} · expert_tp {} · expert_dp {}", l.ep, l.expert_tp, l.expert_dp()) : "";
  return fmt::format(
      "tp {}{} · cp {} ({}, {}, {}) · pp {} · vpp {} · dp {}{} · zero {} · {} · order {} · {} "
      "micro-batches of {} · recompute {}",
      l.tp, l.sequence_parallel() ? " (sp)" : "", l.cp, Name(l.cp_comm), Name(l.cp_recurrent),
      l.cp_load_balance ? "balanced" : "unbalanced", l.pp, l.vpp, l.dp, ReplicaText(l) + experts, l.zero,
      Name(l.schedule), Name(l.order), l.micro_batches, l.micro_batch, Name(l.recompute));
}

/// The stage rows, the memory line, each chunk's pattern and the
/// balanced-cut advice.
std::string StagesTable(const Recipe& r, const Plan& p) {
  const std::vector<int64_t> starts = LayerStarts(r.model.layers);
  std::string out = fmt::format("\nstages ({}; times per micro-batch)\n",
                                p.stages_pinned ? "pinned in the recipe" : "partitioned by " + p.partition);
  out +=
      fmt::format("  {:<6} {:<28} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10}\n", "stage",
                  "chunks (layers first-last)", "layers", "peak", "headroom", "fwd ms", "bwd ms", "recomp", "comm ms");
  for (const StageTime& s : p.time.stages) {
    std::string chunks;
    int64_t layers = 0;
    for (const StageChunk& c : p.stages.chunks) {
      if (c.pipeline_rank != s.pipeline_rank) continue;
      const LayerRange range = LayerRangeOf(c, starts);
      chunks += fmt::format("{}{}{}{}", chunks.empty() ? "" : ", ", FormatLayerRange(range),
                            c.owns_embedding ? "+emb" : "", c.owns_head ? "+head" : "");
      layers += range.end - range.first;
    }
    // DualPipe: the rank also runs stage p-1-r in the reverse direction.
    if (p.layout.schedule == Schedule::kDualPipe) chunks += fmt::format(" +stage {}", p.layout.pp - 1 - s.pipeline_rank);
    std::string mem = "-", head = "-";
    if (p.memory && s.pipeline_rank < static_cast<int64_t>(p.memory->stages.size())) {
      const RankMemory& rm = p.memory->stages[static_cast<size_t>(s.pipeline_rank)];
      mem = FormatGiB(rm.total());
      head = FormatGiB(rm.headroom());
    }
    out += fmt::format("  {:<6} {:<28} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10}{}\n", s.pipeline_rank, chunks,
                       layers, mem, head, Ms(s.forward_s), Ms(s.backward_s), Ms(s.recompute_s),
                       Ms(s.exposed_comm_s), s.pipeline_rank == p.time.slowest_stage ? "  <- slowest" : "");
  }
  if (p.memory) {
    const Verdict& v = p.memory->verdict;
    out += v.reason.empty() ? fmt::format("  memory: {} (worst stage {}, headroom {})\n", v.fits ? "fits" : "does not fit",
                                          p.memory->worst_stage, FormatGiB(v.headroom))
                            : fmt::format("  memory: {}\n", v.reason);
  }
  for (const StageChunk& c : p.stages.chunks) {
    out += fmt::format("  chunk {} (stage {}, virtual {}): {}\n", &c - p.stages.chunks.data(), c.pipeline_rank,
                       c.virtual_index, Pattern(r, c));
  }
  if (p.balanced_cut) out += "  " + DescribeBalancedCut(r, *p.balanced_cut) + "\n";
  return out;
}

/// The slowest stage's communication and the step-time breakdown.
std::string CommAndStepTables(const Recipe& r, const Plan& p) {
  std::string out;
  const StageComm& sc = p.comm[static_cast<size_t>(p.time.slowest_stage)];
  out += fmt::format("\ncommunication per step, stage {} (one rank)\n", sc.pipeline_rank);
  out += fmt::format("  {:<10} {:<15} {:<9} {:<22} {:>6} {:>10} {:>11} {:>12} {:>10} {:>11}\n", "axis", "collective",
                     "pass", "what", "group", "calls", "payload", "sent", "time ms", "exposed ms");
  for (const CommItem& i : sc.items) {
    out += fmt::format("  {:<10} {:<15} {:<9} {:<22} {:>6} {:>10} {:>11} {:>12} {:>10} {:>11}\n", Key(i.axis),
                       Key(i.kind), Key(i.pass), Key(i.what), i.group_size, i.calls, FormatBytesHuman(i.payload),
                       FormatBytesHuman(i.send), Ms(i.seconds), Ms(i.exposed_seconds));
  }
  out += "  sent per axis:";
  for (int a = 0; a < kNumAxes; ++a) {
    const Bytes b = sc.send_on(static_cast<Axis>(a));
    if (b.count() > 0) out += fmt::format(" {} {}", Key(static_cast<Axis>(a)), FormatBytesHuman(b));
  }
  out += "\n";

  const StepTime& t = p.time;
  out += "\nstep time\n";
  out += fmt::format("  steady (m x slowest stage)   {:>10} ms\n", Ms(t.steady_s));
  out += fmt::format("  pipeline bubble              {:>10} ms  ({:.1f}% of the step)\n", Ms(t.bubble_s),
                     100.0 * t.bubble_fraction);
  out += fmt::format("  data-parallel exposed        {:>10} ms\n", Ms(t.dp_exposed_s));
  out += fmt::format("  optimizer                    {:>10} ms  (of which the update {} ms)\n",
                     Ms(t.optimizer_s + t.optimizer_step_s), Ms(t.optimizer_step_s));
  if (t.host_offload_s > 0) {
    out += fmt::format("  offloaded optimizer, host   {:>10} ms  (grads down, params up; the CPU step not timed)\n",
                       Ms(t.host_offload_s));
  }
  if (t.activation_offload_s > 0) {
    out += fmt::format("  activation offload, host     {:>10} ms  each way beside the compute, {} ms of it exposed\n",
                       Ms(t.activation_offload_s), Ms(t.activation_offload_exposed_s));
  }
  out += fmt::format("  step                         {:>10} ms\n", Ms(t.step_s));
  out += fmt::format("  compute on pipeline rank {} (forward + backward + recompute, all micro-batches):",
                     t.slowest_stage);
  for (const BlockKind k :
       {BlockKind::kAttention, BlockKind::kMamba, BlockKind::kMoe, BlockKind::kRecurrent, BlockKind::kDenseMlp}) {
    const double s = t.compute_by_family_s[static_cast<size_t>(FamilyIndex(k))];
    if (s > 0) out += fmt::format(" {} {} ms", Letter(k), Ms(s));
  }
  if (t.head_compute_s > 0) out += fmt::format(" head {} ms", Ms(t.head_compute_s));
  out += "\n  exposed communication by axis:";
  for (int a = 0; a < kNumAxes; ++a) {
    const double s = t.exposed_by_axis[static_cast<size_t>(a)];
    if (s > 0) out += fmt::format(" {} {} ms", Key(static_cast<Axis>(a)), Ms(s));
  }
  out += "\n";
  out += fmt::format("  tokens/s {:.0f} · MFU {:.1f}% of {:.0f} TFLOPS bf16 dense\n", t.tokens_per_s, 100.0 * t.mfu,
                     p.gpu.bf16_dense_tflops);
  out += "  priced at " + PricedRates(r, p.cost) + "\n";
  return out;
}
}  // namespace

std::string RenderPlanTable(const Recipe& r, const Plan& p) {
  std::string out;
  const Mesh& m = p.mesh;
  out += fmt::format("plan: {} on {} GPUs ({} nodes x {} {})\n", p.name, m.world, m.nodes, m.gpus_per_node,
                     DeviceLabel(r.cluster));
  out += "layout: " + LayoutLine(r, p) + "\n";

  out += "\nrank map (per node: the coordinates its GPUs hold)\n";
  out += fmt::format("  {:<8} {:<13} {:<9} {:<9} {:<11} {:<9}\n", "node", "ranks", "tp", "cp", "dp", "pp");
  const std::vector<NodeRow> rows = NodeRows(m);
  const size_t shown = rows.size() <= 16 ? rows.size() : 8;
  for (size_t n = 0; n < rows.size(); ++n) {
    if (n == shown && n + 1 < rows.size()) {
      out += fmt::format("  ... {} more nodes ...\n", rows.size() - shown - 1);
      n = rows.size() - 1;
    }
    const NodeRow& row = rows[n];
    out += fmt::format("  {:<8} {:<13} {:<9} {:<9} {:<11} {:<9}\n", row.node,
                       fmt::format("{}-{}", row.first_rank, row.last_rank), RangeText(row.tp), RangeText(row.cp),
                       RangeText(row.dp), RangeText(row.pp));
  }

  out += "\ngroups per axis\n";
  out += fmt::format("  {:<10} {:>6} {:>8}  {:<11} {:>11} {:>14}\n", "axis", "size", "groups", "link", "max nodes",
                     "min per node");
  for (const AxisLocality& a : m.locality) {
    if (a.groups == 0 || a.size <= 1 || !Shown(r, a.axis)) continue;
    out += fmt::format("  {:<10} {:>6} {:>8}  {:<11} {:>11} {:>14}\n", Key(a.axis), a.size, a.groups,
                       a.intra_node ? "NVLink" : "InfiniBand", a.max_nodes_spanned, a.min_members_per_node);
  }
  out += StagesTable(r, p);
  return out + CommAndStepTables(r, p);
}

namespace {

ordered_json PlanLayoutJson(const Layout& l) {
  return {{"tp", l.tp},
          {"sp", l.sequence_parallel()},
          {"cp", l.cp},
          {"cp_comm", Name(l.cp_comm)},
          {"cp_recurrent", Name(l.cp_recurrent)},
          {"cp_load_balance", l.cp_load_balance},
          {"pp", l.pp},
          {"vpp", l.vpp},
          {"dp", l.dp},
          {"ep", l.ep},
          {"expert_tp", l.expert_tp},
          {"expert_dp", l.expert_dp()},
          {"zero", l.zero},
          {"dp_replicate", l.dp_replicate},
          {"schedule", Name(l.schedule)},
          {"order", Name(l.order)},
          {"micro_batch", l.micro_batch},
          {"micro_batches", l.micro_batches},
          {"recompute", Name(l.recompute)}};
}

ordered_json RankMapJson(const Mesh& m) {
  ordered_json nodes = ordered_json::array();
  for (const NodeRow& row : NodeRows(m)) {
    nodes.push_back({{"node", row.node},
                     {"first_rank", row.first_rank},
                     {"last_rank", row.last_rank},
                     {"tp", row.tp},
                     {"cp", row.cp},
                     {"dp", row.dp},
                     {"pp", row.pp}});
  }
  return nodes;
}

ordered_json GroupsJson(const Mesh& m) {
  ordered_json groups = ordered_json::array();
  for (const AxisLocality& a : m.locality) {
    if (a.groups == 0) continue;
    groups.push_back({{"axis", Key(a.axis)},
                      {"size", a.size},
                      {"groups", a.groups},
                      {"intra_node", a.intra_node},
                      {"max_nodes_spanned", a.max_nodes_spanned},
                      {"min_members_per_node", a.min_members_per_node},
                      {"first_group", m.groups[static_cast<size_t>(a.axis)].front()}});
  }
  return groups;
}

ordered_json StagesJson(const Recipe& r, const Plan& p) {
  const std::vector<int64_t> starts = LayerStarts(r.model.layers);
  ordered_json stages = ordered_json::array();
  for (const StageTime& s : p.time.stages) {
    ordered_json chunks = ordered_json::array();
    for (const StageChunk& c : p.stages.chunks) {
      if (c.pipeline_rank != s.pipeline_rank) continue;
      const LayerRange range = LayerRangeOf(c, starts);
      chunks.push_back({{"virtual_index", c.virtual_index},
                        {"first_layer", range.first},
                        {"end_layer", range.end},
                        {"pattern", Pattern(r, c)},
                        {"owns_embedding", c.owns_embedding},
                        {"owns_head", c.owns_head}});
    }
    ordered_json stage = {{"pipeline_rank", s.pipeline_rank},
                          {"chunks", chunks},
                          {"forward_s", s.forward_s},
                          {"backward_s", s.backward_s},
                          {"recompute_s", s.recompute_s},
                          {"exposed_comm_s", s.exposed_comm_s}};
    if (p.memory && s.pipeline_rank < static_cast<int64_t>(p.memory->stages.size())) {
      const RankMemory& rm = p.memory->stages[static_cast<size_t>(s.pipeline_rank)];
      stage["memory"] = {{"total_bytes", rm.total().count()},
                         {"in_flight_microbatches", rm.in_flight_microbatches},
                         {"capacity_bytes", rm.capacity.count()},
                         {"headroom_bytes", rm.headroom().count()}};
    }
    stages.push_back(stage);
  }
  return stages;
}

ordered_json CommunicationJson(const Plan& p) {
  ordered_json comm = ordered_json::array();
  for (const StageComm& sc : p.comm) {
    ordered_json items = ordered_json::array();
    for (const CommItem& i : sc.items) {
      items.push_back({{"axis", Key(i.axis)},
                       {"collective", Key(i.kind)},
                       {"pass", Key(i.pass)},
                       {"what", Key(i.what)},
                       {"group_size", i.group_size},
                       {"payload_bytes", i.payload.count()},
                       {"calls", i.calls},
                       {"send_bytes", i.send.count()},
                       {"recv_bytes", i.recv.count()},
                       {"seconds", i.seconds},
                       {"exposed_seconds", i.exposed_seconds}});
    }
    ordered_json by_axis = ordered_json::object();
    for (int a = 0; a < kNumAxes; ++a) by_axis[Key(static_cast<Axis>(a))] = sc.send_on(static_cast<Axis>(a)).count();
    comm.push_back({{"pipeline_rank", sc.pipeline_rank}, {"send_bytes_by_axis", by_axis}, {"items", items}});
  }
  return comm;
}

ordered_json StepJson(const StepTime& t) {
  ordered_json family = ordered_json::object();
  for (const BlockKind k :
       {BlockKind::kAttention, BlockKind::kMamba, BlockKind::kMoe, BlockKind::kRecurrent, BlockKind::kDenseMlp}) {
    family[std::string(1, Letter(k))] = t.compute_by_family_s[static_cast<size_t>(FamilyIndex(k))];
  }
  ordered_json exposed = ordered_json::object();
  for (int a = 0; a < kNumAxes; ++a) exposed[Key(static_cast<Axis>(a))] = t.exposed_by_axis[static_cast<size_t>(a)];
  return {{"step_s", t.step_s},
          {"steady_s", t.steady_s},
          {"bubble_s", t.bubble_s},
          {"bubble_fraction", t.bubble_fraction},
          {"dp_exposed_s", t.dp_exposed_s},
          {"optimizer_s", t.optimizer_s},
          {"host_offload_s", t.host_offload_s},
          {"activation_offload_s", t.activation_offload_s},
          {"activation_offload_exposed_s", t.activation_offload_exposed_s},
          {"slowest_stage", t.slowest_stage},
          {"exposed_by_axis_s", exposed},
          {"model_flops", t.model_flops},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"compute_by_family_s", family},
          {"head_compute_s", t.head_compute_s},
          {"optimizer_step_s", t.optimizer_step_s}};
}

ordered_json CostModelJson(const Recipe& r, const Plan& p) {
  const KernelRates& k = p.gpu.rates;
  return {{"compute_efficiency", p.cost.compute_efficiency},
          {"gemm_efficiency", GemmEfficiency(p.gpu, p.cost)},
          {"gemm_fp8_efficiency", k.gemm_fp8},
          {"gemm_memory_efficiency", k.gemm_memory},
          {"hbm_efficiency", k.hbm},
          {"attention_kernel", AttentionKernel(r.training)},
          {"attention_efficiency", AttentionKernelRate(r.training, p.gpu, p.cost)},
          {"attention_half_seq", k.attention_half_seq},
          {"gemm_tile_k", k.gemm_tile_k},
          {"fused_elementwise", r.training.fused_elementwise},
          {"hbm_gbps", p.gpu.hbm_gbps},
          {"fp8_dense_tflops", p.gpu.fp8_dense_tflops},
          {"nvlink_efficiency", p.cost.nvlink_efficiency},
          {"ib_efficiency", p.cost.ib_efficiency},
          {"latency_s", p.cost.latency_s},
          {"dp_bucket_elements", p.cost.dp_bucket_elements},
          {"bf16_dense_tflops", p.gpu.bf16_dense_tflops},
          {"nvlink_gbps_per_dir", p.gpu.nvlink_gbps_per_dir},
          {"ib_gbps_per_dir", p.gpu.ib_gbps_per_dir}};
}

}  // namespace

std::string RenderPlanJson(const Recipe& r, const Plan& p) {
  const Mesh& m = p.mesh;
  ordered_json j;
  j["preflight_version"] = PreflightVersion();
  j["schema_version"] = kJsonSchemaVersion;
  j["name"] = p.name;
  j["world"] = m.world;
  j["nodes"] = m.nodes;
  j["gpus_per_node"] = m.gpus_per_node;
  j["gpu"] = p.gpu.name;
  j["device"] = DeviceLabel(r.cluster);
  j["layout"] = PlanLayoutJson(p.layout);
  j["rank_map"] = RankMapJson(m);
  j["groups"] = GroupsJson(m);
  j["stages_pinned"] = p.stages_pinned;
  j["partition"] = p.partition;
  j["stages"] = StagesJson(r, p);
  if (p.balanced_cut) j["balanced_cut"] = BalancedCutJson(r, *p.balanced_cut);
  j["communication"] = CommunicationJson(p);
  if (p.memory) {
    j["memory_verdict"] = {{"fits", p.memory->verdict.fits},
                           {"headroom_ok", p.memory->verdict.headroom_ok},
                           {"worst_stage", p.memory->worst_stage},
                           {"headroom_bytes", p.memory->verdict.headroom.count()},
                           {"reason", p.memory->verdict.reason}};
  }
  j["step"] = StepJson(p.time);
  j["cost_model"] = CostModelJson(r, p);
  ordered_json warnings = ordered_json::array();
  for (const Diagnostic& d : p.warnings) warnings.push_back(Format(d));
  j["warnings"] = warnings;
  return j.dump(2) + "\n";
}

namespace {

/// The cut's chunk starts after the first, in layers (parallel.stage_boundaries).
std::vector<int64_t> Boundaries(const Recipe& r, const BalancedCut& cut) {
  const std::vector<int64_t> starts = LayerStarts(r.model.layers);
  std::vector<int64_t> out;
  for (size_t c = 1; c < cut.stages.chunks.size(); ++c) out.push_back(LayerRangeOf(cut.stages.chunks[c], starts).first);
  return out;
}

}  // namespace

std::string DescribeBalancedCut(const Recipe& r, const BalancedCut& cut) {
  const double gib = (cut.worst_before - cut.worst_after).gib();
  const double step = cut.step_before_s > 0 ? 100.0 * (1.0 - cut.step_after_s / cut.step_before_s) : 0.0;
  auto change = [](const char* what, double saved, const char* unit) {
    return fmt::format("{} {} by {:.2f}{}", saved >= 0 ? "lowers" : "raises", what, saved >= 0 ? saved : -saved, unit);
  };
  return fmt::format(
      "balanced cut ({}-balanced{}): chunks at layers {}; it {} and {} (worst stage {} -> {}, step {} -> {} ms). "
      "Pin it with parallel.stage_boundaries: [{}] (plan --emit megatron then writes it as "
      "--pipeline-model-parallel-layout)",
      cut.basis == std::string("equal_layers") ? "equal" : cut.basis, cut.fits_after ? ", fits" : "",
      emit::ChunkRanges(cut.stages, r.model.layers), change("the worst stage", gib, " GiB"),
      change("the step", step, " %"), FormatGiB(cut.worst_before), FormatGiB(cut.worst_after), Ms(cut.step_before_s),
      Ms(cut.step_after_s), fmt::join(Boundaries(r, cut), ", "));
}

ordered_json BalancedCutJson(const Recipe& r, const BalancedCut& cut) {
  return {{"basis", cut.basis},
          {"stage_boundaries", Boundaries(r, cut)},
          {"fits", cut.fits_after},
          {"worst_stage_total_bytes_before", cut.worst_before.count()},
          {"worst_stage_total_bytes_after", cut.worst_after.count()},
          {"step_s_before", cut.step_before_s},
          {"step_s_after", cut.step_after_s}};
}

}  // namespace preflight

// Planner entry point: validation beyond the recipe parser's, then
// placement, stage partition and pricing.
#include <fmt/format.h>

#include "internal.h"
#include "preflight/recipe/partition.h"

namespace preflight {
namespace {

// Located like the parser's own messages (file, line, caret; or the
// `--set` override that set the key).
Diagnostic Make(const Recipe& r, Severity severity, const std::string& key, const std::string& value,
                const std::string& message) {
  return r.source.At(key, value, message, severity);
}

int64_t CountOf(const Recipe& r, BlockKind k) {
  int64_t n = 0;
  for (BlockKind b : r.model.layers) n += b == k ? 1 : 0;
  return n;
}

// CP on Mamba-2 layers is Megatron's all-to-all CP: the sequence-split
// activations are re-split by heads, so heads and groups must split over t*c
// (docs/formulas.md §1.4; mamba_context_parallel.py). R blocks follow the same
// pattern over their gate blocks [OURS].
void CheckCpOnRecurrentMixers(const Recipe& r, const Layout& l, std::vector<Diagnostic>* out) {
  // The state hand-off (cp_recurrent: handoff, [OURS]) keeps whole heads on
  // every rank; its conv-tail rule is the recipe validator's.
  if (l.cp <= 1 || l.cp_recurrent != CpRecurrent::kAllToAll) return;
  const int64_t tc = l.tp * l.cp;
  if (CountOf(r, BlockKind::kMamba) > 0) {
    const MambaConfig& m = r.model.mamba;
    const int64_t heads = m.Heads(r.model.hidden);
    if (heads % tc != 0) {
      out->push_back(Make(r, Severity::kError, "parallel.cp", std::to_string(l.cp),
                          fmt::format("Mamba all-to-all context parallelism splits the {} Mamba heads over tp*cp = {}, "
                                      "which does not divide them; use a cp with {} % (tp*cp) == 0",
                                      heads, tc, heads)));
    }
    const int64_t local_groups = m.groups / l.tp;
    if (local_groups > 0 && local_groups % l.cp != 0 && l.cp % local_groups != 0) {
      out->push_back(Make(r, Severity::kError, "parallel.cp", std::to_string(l.cp),
                          fmt::format("Mamba all-to-all context parallelism needs groups/tp = {} to be a multiple or a "
                                      "divisor of cp",
                                      local_groups)));
    }
  }
  if (CountOf(r, BlockKind::kRecurrent) > 0 && r.model.recurrent.heads % tc != 0) {
    out->push_back(Make(r, Severity::kError, "parallel.cp", std::to_string(l.cp),
                        fmt::format("recurrent all-to-all context parallelism splits the {} gate blocks "
                                    "(model.recurrent.heads) over tp*cp = {}, which does not divide them",
                                    r.model.recurrent.heads, tc)));
  }
}

/// Megatron's forward_backward_pipelining_with_interleaving (schedules.py)
/// raises unless pp <= g <= m, and unless the last group of m % g
/// micro-batches is empty or at least pp (a shorter one stalls the pipeline).
void CheckMicrobatchGroup(const Recipe& r, const Layout& l, std::vector<Diagnostic>* out) {
  const int64_t g = l.MicrobatchGroup(), m = l.micro_batches, p = l.pp;
  const std::string value = std::to_string(r.parallel.microbatch_group);
  if (g < p || g > m) {
    out->push_back(Make(r, Severity::kError, "parallel.microbatch_group", value,
                        fmt::format("the interleaved schedule's micro-batch group must be within [pp, micro-batches "
                                    "per step] = [{}, {}] (Megatron schedules.py); got {}",
                                    p, m, g)));
    return;
  }
  const int64_t last = m % g;
  if (last > 0 && last < p) {
    out->push_back(Make(r, Severity::kError, "parallel.microbatch_group", value,
                        fmt::format("micro-batches per step ({}) leave a last group of {} after groups of {}; Megatron "
                                    "refuses a last group shorter than pp ({}) (schedules.py: it stalls the pipeline); "
                                    "set parallel.microbatch_group to a divisor of {} in [{}, {}] or change "
                                    "training.global_batch",
                                    m, last, g, p, m, p, m)));
  }
}

void CheckSchedule(const Recipe& r, const Layout& l, std::vector<Diagnostic>* out) {
  const std::string sched = Name(l.schedule);
  if (l.schedule == Schedule::kDualPipe) {
    if (l.pp % 2 != 0 || l.pp < 2) {
      out->push_back(Make(r, Severity::kError, "parallel.pp", std::to_string(l.pp),
                          "DualPipe needs an even pipeline degree (each rank holds stage i and p-1-i)"));
    }
    if (l.micro_batches % 2 != 0) {
      out->push_back(Make(r, Severity::kError, "training.global_batch", std::to_string(r.training.global_batch),
                          fmt::format("DualPipe feeds half the micro-batches from each end; micro-batches per step "
                                      "= {} must be even",
                                      l.micro_batches)));
    }
  }
  if ((l.schedule == Schedule::kDualPipe || l.schedule == Schedule::kDualPipeV) && l.vpp != 1) {
    out->push_back(Make(r, Severity::kError, "parallel.vpp", std::to_string(l.vpp),
                        fmt::format("{} holds exactly two chunks per rank itself; vpp must be 1", sched)));
  }
  if (l.schedule == Schedule::kInterleaved && l.micro_batches < l.pp) {
    out->push_back(Make(r, Severity::kError, "training.global_batch", std::to_string(r.training.global_batch),
                        fmt::format("the interleaved schedule needs micro-batches per step ({}) >= pp ({}) "
                                    "(Megatron schedules.py)",
                                    l.micro_batches, l.pp)));
  } else if (l.schedule == Schedule::kInterleaved) {
    CheckMicrobatchGroup(r, l, out);
  }
}

/// The framework's split of this layout (a sweep or an advice move changes
/// pp, vpp and the schedule): refused as the framework refuses it.
void CheckSplit(const Recipe& r, const Layout& l, std::vector<Diagnostic>* out) {
  if (!r.parallel.stage_boundaries.empty()) return;  // CheckPinned
  const int64_t layers = LayerCount(r.model.layers);
  if (r.parallel.partition == Partition::kBalanced) {
    if (ChunkCount(l) > layers) {
      out->push_back(Make(r, Severity::kError, "parallel.pp", std::to_string(l.pp),
                          fmt::format("{} pipeline chunks for {} layers; every chunk needs at least one layer",
                                      ChunkCount(l), layers)));
    } else if (!BalancedSearchAffordable(layers, ChunkCount(l))) {
      out->push_back(Make(r, Severity::kError, "parallel.partition", "balanced",
                          fmt::format("searching the balanced cut of {} layers into {} chunks is too large (chunks x "
                                      "layers^2 / 2 over 2e9 steps); use partition: megatron or pin "
                                      "parallel.stage_boundaries",
                                      layers, ChunkCount(l))));
    }
    return;
  }
  const LayerSplit split = RecipeSplit(SplitFor(r.parallel, l.pp, l.vpp, l.schedule, layers), r.model.layers);
  if (!split.ok()) out->push_back(Make(r, Severity::kError, split.key, split.value, split.error));
}

void CheckPinned(const Recipe& r, const Layout& l, std::vector<Diagnostic>* out) {
  const auto& b = r.parallel.stage_boundaries;
  if (b.empty()) return;
  const int64_t layers = LayerCount(r.model.layers);
  const int64_t want = ChunkCount(l) - 1;
  const std::string key = "parallel.stage_boundaries";
  if (static_cast<int64_t>(b.size()) != want) {
    out->push_back(Make(r, Severity::kError, key, fmt::format("{} entries", b.size()),
                        fmt::format("needs {} boundaries (one per chunk after the first: pp*vpp - 1)", want)));
    return;
  }
  int64_t prev = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] < prev || b[i] > layers) {
      out->push_back(Make(
          r, Severity::kError, fmt::format("{}[{}]", key, i), std::to_string(b[i]),
          fmt::format("boundaries must not decrease and stay within [0, {}]; the previous one is {}", layers, prev)));
      return;
    }
    prev = b[i];
  }
}

void CheckHardware(const Recipe& r, std::vector<Diagnostic>* out) {
  const GpuSpec& g = r.cluster.spec;
  if (g.bf16_dense_tflops <= 0 || g.nvlink_gbps_per_dir <= 0 || g.ib_gbps_per_dir <= 0) {
    out->push_back(Make(r, Severity::kError, "cluster.gpu", r.cluster.gpu,
                        "the GPU preset has no peak FLOP rate or link bandwidths to price a step with"));
  }
}

void AddLocalityWarnings(const Recipe& r, const Layout& l, const Mesh& mesh, bool moe, std::vector<Diagnostic>* out) {
  struct Check {
    Axis axis;
    const char* key;
    const char* why;
  };
  const Check checks[] = {
      {Axis::kTp, "parallel.tp", "TP all-gathers/reduce-scatters every layer"},
      {Axis::kCp, "parallel.cp", "CP exchanges K/V every attention layer"},
      {Axis::kEp, "parallel.ep",
       r.model.moe.dispatcher == MoeDispatcher::kAllGather
           ? "the all-gather dispatcher gathers and reduce-scatters every MoE layer each way"
           : "EP all-to-alls twice per MoE layer each way"},
      {Axis::kExpertTp, "parallel.expert_tp", "expert TP gathers every MoE layer"},
  };
  for (const Check& c : checks) {
    const AxisLocality& loc = mesh.locality[static_cast<size_t>(c.axis)];
    if (loc.intra_node || loc.size <= 1) continue;
    if (!moe && (c.axis == Axis::kEp || c.axis == Axis::kExpertTp)) continue;
    out->push_back(Make(r, Severity::kWarning, c.key, std::to_string(loc.size),
                        fmt::format("{} groups span up to {} nodes (InfiniBand); {}", Key(c.axis), loc.max_nodes_spanned,
                                    c.why)));
  }
  if (moe && l.tp > 1 && !l.sp) {
    out->push_back(Make(r, Severity::kWarning, "parallel.sp", "false",
                        "MoE with tp > 1 needs sequence parallelism (Megatron moe_layer.py); priced with sp on"));
  }
}

struct PricedStages {
  std::vector<StageComm> comm;
  StepTime time;
  MemoryEstimate memory;
};

PricedStages PriceStages(const Inventory& inv, const PlanTables& tables, const Layout& layout, const StagePlan& stages,
                         const MeshLocality& locality, const CostModel& cost) {
  PricedStages p;
  p.comm = BuildStageComm(inv, tables, layout, stages, locality, cost);
  p.time = EstimateStepTime(inv, tables, layout, stages, &p.comm, cost);
  p.memory = EstimateMemory(inv, layout, stages);
  return p;
}

/// The fastest balanced cut that fits, else the time-balanced one; `chosen`
/// is its index in `cuts`.
PricedStages PriceBalanced(const Inventory& inv, const PlanTables& tables, const Layout& layout,
                           const std::vector<NamedCut>& cuts, const MeshLocality& locality, const CostModel& cost,
                           size_t* chosen) {
  *chosen = 0;
  std::optional<PricedStages> best;
  for (size_t i = 0; i < cuts.size(); ++i) {
    PricedStages priced = PriceStages(inv, tables, layout, cuts[i].stages, locality, cost);
    if (i == 0) {
      best = std::move(priced);
      if (best->memory.verdict.fits) break;
      continue;
    }
    const bool first_fit = !best->memory.verdict.fits;
    if (priced.memory.verdict.fits && (first_fit || priced.time.step_s < best->time.step_s)) {
      best = std::move(priced);
      *chosen = i;
    }
  }
  return std::move(*best);
}

Bytes WorstTotal(const MemoryEstimate& m) {
  return m.stages.empty() ? Bytes(0) : m.stages.at(static_cast<size_t>(m.worst_stage)).total();
}

/// The balanced cut, as advice beside a framework or pinned partition: said
/// when it makes the layout fit, lowers the worst stage by a GiB or more
/// without slowing the step by 1 %, or speeds the step by 1 % or more and
/// still clears the headroom floor.
std::optional<BalancedCut> AdviseBalancedCut(const Inventory& inv, const PlanTables& tables, const Layout& layout,
                                             const Plan& plan, const CostModel& cost) {
  if (ChunkCount(layout) <= 1 || ChunkCount(layout) > inv.layer_count() ||
      !BalancedSearchAffordable(inv.layer_count(), ChunkCount(layout))) {
    return std::nullopt;  // nothing to advise, or a search too large to run for advice
  }
  const std::vector<NamedCut> cuts = BalancedCuts(WeighLayers(inv, tables, layout, cost), layout, inv.layer_starts);
  size_t chosen = 0;
  const PricedStages priced = PriceBalanced(inv, tables, layout, cuts, plan.mesh.locality, cost, &chosen);
  BalancedCut cut;
  cut.basis = cuts[chosen].name;
  cut.stages = cuts[chosen].stages;
  cut.worst_before = WorstTotal(*plan.memory);
  cut.worst_after = WorstTotal(priced.memory);
  cut.step_before_s = plan.time.step_s;
  cut.step_after_s = priced.time.step_s;
  cut.fits_after = priced.memory.verdict.fits;
  const double gib_saved = (cut.worst_before - cut.worst_after).gib();
  const double step_saved = cut.step_before_s > 0 ? 1.0 - cut.step_after_s / cut.step_before_s : 0.0;
  const bool fixes = !plan.memory->verdict.fits && cut.fits_after;
  const bool lighter = gib_saved >= 1.0 && step_saved > -0.01;
  const bool faster = step_saved >= 0.01 && priced.memory.verdict.headroom_ok;
  if (!fixes && !lighter && !faster) return std::nullopt;
  return cut;
}

}  // namespace

std::vector<NamedCut> BalancedCuts(const LayerWeights& sublayer_weights, const Layout& layout,
                                   const std::vector<int64_t>& layer_starts) {
  // Memory as the partition's constraint (docs/formulas.md §4.3, "minimise
  // max_j cost_j subject to memory_j <= budget"): the time-balanced cut comes
  // first; the parameter-balanced cut (fewer layers beside the embedding and
  // head) and the equal-layer cut are the fallbacks the estimator judges.
  std::vector<NamedCut> out;
  out.push_back({"time", ToSublayers(PartitionStages(WeighFrameworkLayers(sublayer_weights, layer_starts), layout),
                                     layer_starts)});
  for (NamedCut& c : FallbackCuts(sublayer_weights, layout, layer_starts)) out.push_back(std::move(c));
  return out;
}

std::vector<NamedCut> FallbackCuts(const LayerWeights& sublayer_weights, const Layout& layout,
                                   const std::vector<int64_t>& layer_starts) {
  const LayerWeights w = WeighFrameworkLayers(sublayer_weights, layer_starts);
  std::vector<NamedCut> out;
  LayerWeights by_params = w;
  for (size_t l = 0; l < w.layer_s.size(); ++l) by_params.layer_s[l] = static_cast<double>(w.layer_params[l]);
  by_params.embedding_s = static_cast<double>(w.embedding_params);
  by_params.head_s = static_cast<double>(w.head_params);
  out.push_back({"parameters", ToSublayers(PartitionStages(by_params, layout), layer_starts)});
  if (layout.schedule != Schedule::kDualPipeV) {
    const int64_t layers = static_cast<int64_t>(layer_starts.size()) - 1;
    out.push_back(
        {"equal_layers", ToSublayers(EqualStagePlan(layers, layout.pp, ChunkCount(layout) / layout.pp), layer_starts)});
  }
  return out;
}

std::vector<Diagnostic> ValidateForPlan(const Recipe& r, const Layout& l) {
  std::vector<Diagnostic> out;
  CheckCpOnRecurrentMixers(r, l, &out);
  CheckSchedule(r, l, &out);
  CheckPinned(r, l, &out);
  CheckSplit(r, l, &out);
  CheckHardware(r, &out);
  return out;
}

/// The layout as Megatron runs it: MoE layers force sequence parallelism on
/// when tp > 1 (moe_layer.py); the plan warns and prices that (the recipe
/// validator refuses such a recipe; a Layout built in code can still ask).
Layout AsRun(const Inventory& inv, Layout layout) {
  if (layout.tp > 1 && inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))] > 0) layout.sp = true;
  return layout;
}

PlanResult MakePlan(const Inventory& inv, const Layout& requested, const CostModel& cost, bool advise_balanced_cut) {
  PlanResult result;
  const Recipe& r = inv.recipe;
  const Layout layout = AsRun(inv, requested);
  result.diagnostics = ValidateForPlan(r, layout);
  if (HasErrors(result.diagnostics)) return result;
  Plan plan;
  plan.name = r.name;
  plan.layout = layout;
  plan.cost = cost;
  plan.gpu = r.cluster.spec;
  plan.mesh = PlaceRanks(layout, r.cluster.gpus_per_node, r.model.embedding_on_last_stage(), NvlinkDomain(r.cluster));
  const PlanTables tables = BuildPlanTables(inv);
  if (auto fixed = RecipeStagePlan(inv, layout)) {
    // The framework's split (or the pinned one): the job that will run.
    plan.stages = *fixed;
    plan.stages_pinned = !r.parallel.stage_boundaries.empty();
    plan.partition = plan.stages_pinned ? "pinned" : Name(r.parallel.partition);
    PricedStages priced = PriceStages(inv, tables, layout, plan.stages, plan.mesh.locality, cost);
    plan.comm = std::move(priced.comm);
    plan.time = priced.time;
    plan.memory = std::move(priced.memory);
    if (advise_balanced_cut) plan.balanced_cut = AdviseBalancedCut(inv, tables, layout, plan, cost);
  } else {
    std::vector<NamedCut> cuts = BalancedCuts(WeighLayers(inv, tables, layout, cost), layout, inv.layer_starts);
    size_t chosen = 0;
    PricedStages best = PriceBalanced(inv, tables, layout, cuts, plan.mesh.locality, cost, &chosen);
    if (chosen != 0) {
      plan.warnings.push_back(
          Make(r, Severity::kWarning, "parallel.pp", std::to_string(layout.pp),
               fmt::format("the time-balanced stage partition does not fit in memory; using the {} partition, which "
                           "does",
                           cuts[chosen].name)));
    }
    plan.partition = cuts[chosen].name;
    plan.stages = std::move(cuts[chosen].stages);
    plan.comm = std::move(best.comm);
    plan.time = best.time;
    plan.memory = std::move(best.memory);
  }
  const bool moe = inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))] > 0;
  AddLocalityWarnings(r, requested, plan.mesh, moe, &plan.warnings);
  for (const Diagnostic& d : result.diagnostics) plan.warnings.push_back(d);
  result.plan = std::move(plan);
  return result;
}

}  // namespace preflight

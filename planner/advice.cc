// Fit advice (include/preflight/advice.h): a neighbourhood search over the
// recipe's own keys, every candidate re-validated and re-priced.
#include "preflight/planner/advice.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "preflight/planner/sweep.h"
#include "preflight/recipe/partition.h"

#include "internal.h"

namespace preflight {
namespace {

using planner_internal::HasMoe;

double StepSeconds(const Inventory& inv, const PlanTables& tables, const Recipe& r, const Layout& l,
                   const StagePlan& stages, const CostModel& cost) {
  if (HasErrors(ValidateForPlan(r, l))) return 0;
  const MeshLocality locality =
      LocalityOf(l, r.cluster.gpus_per_node, r.model.embedding_on_last_stage(), NvlinkDomain(r.cluster));
  std::vector<StageComm> comm = BuildStageComm(inv, tables, l, stages, locality, cost);
  return EstimateStepTime(inv, tables, l, stages, &comm, cost).step_s;
}

struct Candidate {
  Suggestion s;
  int first_move = 0;
  int second_move = 0;
};

// Prices `r` (already changed) exactly as `fit` does: its own inventory (the
// recipe it carries has the new degrees and pinned stages) and MakePlan's
// stage choice. nullopt when invalid, still over capacity, or (with
// `need_floor`) below the headroom floor.
std::optional<Suggestion> Price(const Recipe& r, const MemoryEstimate& before, double step_before,
                                const CostModel& cost, bool need_floor = false) {
  if (HasErrors(ValidateRecipe(r))) return std::nullopt;
  const Inventory inv = BuildInventory(r);
  const Layout l = LayoutOf(r);
  // A suggestion is priced, not advised on: no balanced-cut search (O(L^2)
  // per candidate made fit quadratic in the layer count).
  const PlanResult planned = MakePlan(inv, l, cost, /*advise_balanced_cut=*/false);
  if (!planned.plan || !planned.plan->memory) return std::nullopt;
  const MemoryEstimate& est = *planned.plan->memory;
  if (!est.verdict.fits || (need_floor && !est.verdict.headroom_ok)) return std::nullopt;
  Suggestion s;
  s.layout = l;
  s.peak = est.stages[static_cast<size_t>(est.worst_stage)].total();
  s.headroom = est.verdict.headroom;
  s.headroom_gain = est.verdict.headroom - before.verdict.headroom;
  s.headroom_ok = est.verdict.headroom_ok;
  s.step_s = planned.plan->time.step_s;
  s.step_change = step_before > 0 && s.step_s > 0 ? s.step_s / step_before - 1.0 : 0.0;
  return s;
}

/// Single moves that spend headroom for speed: those that still meet the
/// floor and shorten the step by more than the step-time model's stated
/// uncertainty (a smaller gain is not known to be real), fastest first.
std::vector<Suggestion> FasterMoves(const Recipe& recipe, const MemoryEstimate& before, double step_s,
                                    const AdviceOptions& options) {
  std::vector<Suggestion> out;
  if (step_s <= 0) return out;
  for (int m = kFirstFasterMove; m < kNumAdviceMoves; ++m) {
    AdviceChange change;
    auto r = ApplyMove(recipe, static_cast<AdviceMove>(m), &change);
    if (!r) continue;
    auto s = Price(*r, before, step_s, options.cost, /*need_floor=*/true);
    if (!s || s->step_s <= 0 || s->step_change >= -kStepTimeUncertainty) continue;
    s->changes = {change};
    out.push_back(*s);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Suggestion& a, const Suggestion& b) { return a.step_s < b.step_s; });
  if (static_cast<int64_t>(out.size()) > options.max_suggestions)
    out.resize(static_cast<size_t>(options.max_suggestions));
  return out;
}

bool Better(const Candidate& a, const Candidate& b) {
  if (a.s.headroom_ok != b.s.headroom_ok) return a.s.headroom_ok;
  if (a.s.step_s != b.s.step_s) return a.s.step_s < b.s.step_s;
  if (a.s.headroom != b.s.headroom) return a.s.headroom > b.s.headroom;
  if (a.first_move != b.first_move) return a.first_move < b.first_move;
  return a.second_move < b.second_move;
}

}  // namespace

const char* Key(AdviceMove m) {
  switch (m) {
    case AdviceMove::kMoreTp: return "more_tp";
    case AdviceMove::kSequenceParallel: return "sequence_parallel";
    case AdviceMove::kMoreEp: return "more_ep";
    case AdviceMove::kMorePp: return "more_pp";
    case AdviceMove::kMoreCp: return "more_cp";
    case AdviceMove::kZeroUp: return "zero_up";
    case AdviceMove::kMoreRecompute: return "more_recompute";
    case AdviceMove::kSmallerMicroBatch: return "smaller_micro_batch";
    case AdviceMove::kFewerReplicas: return "fewer_replicas";
    case AdviceMove::kMoreNodes: return "more_nodes";
    case AdviceMove::kLessTp: return "less_tp";
    case AdviceMove::kLessPp: return "less_pp";
    case AdviceMove::kLessCp: return "less_cp";
    case AdviceMove::kLessRecompute: return "less_recompute";
    case AdviceMove::kLargerMicroBatch: return "larger_micro_batch";
  }
  return "?";
}

std::string Suggestion::Summary() const {
  std::string out;
  for (const AdviceChange& c : changes) {
    out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", c.key, c.from, c.to);
    if (c.move == AdviceMove::kMoreNodes) out += fmt::format(" ({} GPUs)", layout.world());
  }
  return out;
}

std::optional<Recipe> ApplyMove(const Recipe& recipe, AdviceMove move, AdviceChange* change) {
  Recipe r = recipe;
  ParallelConfig& p = r.parallel;
  change->move = move;
  auto set = [&](const char* key, auto from, auto to) {
    change->key = key;
    change->from = fmt::format("{}", from);
    change->to = fmt::format("{}", to);
  };
  switch (move) {
    case AdviceMove::kMoreTp:
      // TP stays inside a node (its collectives run every layer, docs/formulas.md §7.2).
      if (p.tp * 2 > r.cluster.gpus_per_node) return std::nullopt;
      set("parallel.tp", p.tp, p.tp * 2);
      p.tp *= 2;
      break;
    case AdviceMove::kSequenceParallel:
      if (p.sp || p.tp == 1) return std::nullopt;
      set("parallel.sp", "false", "true");
      p.sp = true;
      break;
    case AdviceMove::kMoreEp:
      if (!HasMoe(r) || p.ep * 2 > r.model.moe.experts) return std::nullopt;
      set("parallel.ep", p.ep, p.ep * 2);
      p.ep *= 2;
      break;
    case AdviceMove::kMorePp:
      set("parallel.pp", p.pp, p.pp * 2);
      p = SplitFor(p, p.pp * 2, p.vpp, p.schedule, LayerCount(r.model.layers));
      p.stage_boundaries.clear();  // they described the old stages
      break;
    case AdviceMove::kMoreCp:
      // Context parallelism splits every sequence: activations per rank halve
      // where the recipe's blocks allow it (ValidateForPlan checks them).
      if (r.training.seq_len % (2 * p.cp) != 0) return std::nullopt;
      set("parallel.cp", p.cp, p.cp * 2);
      p.cp *= 2;
      break;
    case AdviceMove::kZeroUp:
      if (p.zero >= 3) return std::nullopt;
      set("parallel.zero", p.zero, p.zero + 1);
      p.zero += 1;
      break;
    case AdviceMove::kMoreRecompute: {
      const Recompute from = r.training.recompute;
      if (from == Recompute::kFull) return std::nullopt;
      const Recompute to = from == Recompute::kNone ? Recompute::kSelective : Recompute::kFull;
      set("training.recompute", Name(from), Name(to));
      r.training.recompute = to;
      break;
    }
    case AdviceMove::kSmallerMicroBatch:
      if (r.training.micro_batch == 1) return std::nullopt;
      set("training.micro_batch", r.training.micro_batch, r.training.micro_batch / 2);
      r.training.micro_batch /= 2;
      break;
    case AdviceMove::kFewerReplicas:
      // Half the HSDP replicas: each ZeRO group twice as large, its shards half as big.
      if (p.dp_replicate == 1) return std::nullopt;
      set("parallel.dp_replicate", p.dp_replicate, p.dp_replicate / 2);
      p.dp_replicate /= 2;
      break;
    case AdviceMove::kMoreNodes:
      set("cluster.nodes", r.cluster.nodes, r.cluster.nodes * 2);
      r.cluster.nodes *= 2;
      break;
    case AdviceMove::kLessTp:
      if (p.tp == 1 || p.tp % 2 != 0) return std::nullopt;
      set("parallel.tp", p.tp, p.tp / 2);
      p.tp /= 2;
      break;
    case AdviceMove::kLessPp:
      if (p.pp == 1 || p.pp % 2 != 0) return std::nullopt;
      set("parallel.pp", p.pp, p.pp / 2);
      p = SplitFor(p, p.pp / 2, p.vpp, p.schedule, LayerCount(r.model.layers));
      p.stage_boundaries.clear();  // they described the old stages
      break;
    case AdviceMove::kLessCp:
      if (p.cp == 1 || p.cp % 2 != 0) return std::nullopt;
      set("parallel.cp", p.cp, p.cp / 2);
      p.cp /= 2;
      break;
    case AdviceMove::kLessRecompute: {
      const Recompute from = r.training.recompute;
      if (from == Recompute::kNone) return std::nullopt;
      const Recompute to = from == Recompute::kFull ? Recompute::kSelective : Recompute::kNone;
      set("training.recompute", Name(from), Name(to));
      r.training.recompute = to;
      break;
    }
    case AdviceMove::kLargerMicroBatch:
      set("training.micro_batch", r.training.micro_batch, r.training.micro_batch * 2);
      r.training.micro_batch *= 2;
      break;
  }
  return r;
}

FitAdvice AdviseFit(const Inventory& inv, const Layout& layout, const StagePlan& stages,
                    const AdviceOptions& options) {
  const Recipe& recipe = inv.recipe;
  const PlanTables tables = BuildPlanTables(inv);
  const MemoryEstimate before = EstimateMemory(inv, layout, stages);
  FitAdvice advice;
  advice.fits = before.verdict.fits;
  advice.worst_stage = before.worst_stage;
  advice.step_s = StepSeconds(inv, tables, recipe, layout, stages, options.cost);
  for (size_t st = 0; st < before.stages.size(); ++st) {
    const Bytes peak = before.stages[st].total();
    if (st == 0 || peak > advice.heaviest) {
      advice.heaviest = peak;
      advice.heaviest_stage = static_cast<int64_t>(st);
    }
    if (st == 0 || peak < advice.lightest) {
      advice.lightest = peak;
      advice.lightest_stage = static_cast<int64_t>(st);
    }
  }
  if (advice.fits) {
    const RankMemory& worst = before.stages[static_cast<size_t>(before.worst_stage)];
    for (int c = 0; c < kNumCategories; ++c) {
      if (worst.bytes[static_cast<size_t>(c)] > advice.dominant_bytes) {
        advice.dominant = static_cast<Category>(c);
        advice.dominant_bytes = worst.bytes[static_cast<size_t>(c)];
      }
    }
    const Bytes total = worst.total();
    advice.dominant_share = total > Bytes(0) ? advice.dominant_bytes.gib() / total.gib() : 0.0;
    advice.below_floor = !before.verdict.headroom_ok;
    if (!advice.below_floor) {
      advice.faster = FasterMoves(recipe, before, advice.step_s, options);
      return advice;
    }
  }
  // Below the floor, a change counts only if it meets the floor.
  const bool need_floor = advice.below_floor;
  std::vector<Candidate> found;
  // Single moves first; pairs only when none of them fits.
  std::vector<std::pair<AdviceChange, Recipe>> singles;
  for (int m = 0; m < kNumSameGpuMoves; ++m) {
    AdviceChange change;
    auto r = ApplyMove(recipe, static_cast<AdviceMove>(m), &change);
    if (!r) continue;
    if (auto s = Price(*r, before, advice.step_s, options.cost, need_floor)) {
      s->changes = {change};
      found.push_back({*s, m, -1});
    }
    singles.emplace_back(change, std::move(*r));
  }
  if (found.empty()) {
    for (const auto& [first, r1] : singles) {
      const int m1 = static_cast<int>(first.move);
      for (int m2 = m1; m2 < kNumSameGpuMoves; ++m2) {
        AdviceChange second;
        auto r2 = ApplyMove(r1, static_cast<AdviceMove>(m2), &second);
        if (!r2) continue;
        if (auto s = Price(*r2, before, advice.step_s, options.cost, need_floor)) {
          s->changes = {first, second};
          found.push_back({*s, m1, m2});
        }
      }
    }
  }
  // Nothing fits on these GPUs: the fewest more nodes that do (x2, x4, x8).
  Recipe more = recipe;
  AdviceChange nodes{AdviceMove::kMoreNodes, "cluster.nodes", fmt::format("{}", recipe.cluster.nodes), ""};
  for (int doubling = 0; found.empty() && doubling < 3; ++doubling) {
    AdviceChange step;
    more = *ApplyMove(more, AdviceMove::kMoreNodes, &step);
    nodes.to = step.to;
    if (auto s = Price(more, before, advice.step_s, options.cost, need_floor)) {
      s->changes = {nodes};
      found.push_back({*s, static_cast<int>(AdviceMove::kMoreNodes), -1});
    }
  }
  std::sort(found.begin(), found.end(), Better);
  for (const Candidate& c : found) {
    if (static_cast<int64_t>(advice.suggestions.size()) >= options.max_suggestions) break;
    advice.suggestions.push_back(c.s);
  }
  return advice;
}

}  // namespace preflight

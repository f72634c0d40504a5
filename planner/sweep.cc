// The layout sweep (include/preflight/sweep.h). Work is split by item, one
// (tp, cp, pp, vpp, ep, expert_tp, micro_batch) each: the item is validated
// once (recompute and zero change no validity rule but ZeRO's 0..3 range,
// which the axis parser enforces), placed once (mesh locality), partitioned
// once per recompute mode and priced per ZeRO stage. Every item writes its
// rows at fixed positions, so the output does not depend on the threads.
#include "preflight/planner/sweep.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include <mutex>

#include "internal.h"
#include "preflight/estimator/estimate.h"
#include "preflight/estimator/estimate_by_zero.h"
#include "preflight/recipe/fields.h"
#include "preflight/recipe/first_error.h"
#include "preflight/recipe/partition.h"

namespace preflight {
namespace {

using planner_internal::HasMoe;

// "3.00 GiB", as the estimator's verdict and FormatGiB write it (the report
// library sits above the planner).
std::string GiBText(Bytes b) { return fmt::format("{:.2f} GiB", b.gib()); }

std::vector<int64_t> PowersOfTwoUpTo(int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t v = 1; v <= limit; v *= 2) out.push_back(v);
  return out;
}

bool ParseInt(std::string_view text, int64_t* value) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && end == text.data() + text.size();
}

std::vector<std::string_view> SplitCommas(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return parts;
    start = comma + 1;
  }
}

// Largest range a..b we expand (a typo like 1..100000000 must not eat memory).
constexpr int64_t kMaxAxisValues = 4096;
// The largest value an axis list takes: the recipe's bound on a parallel
// degree (2^24), far above any valid one; it also keeps `x <= high; ++x` and
// every product of degrees inside int64.
constexpr int64_t kMaxAxisValue = int64_t{1} << 24;

// An error as one line: "parallel.tp = 3: must divide ...".
std::string OneLine(const Diagnostic& d) {
  return d.value.empty() ? fmt::format("{}: {}", d.key_path, d.message)
                         : fmt::format("{} = {}: {}", d.key_path, d.value, d.message);
}

// The first error, as one line; "" when there is none.
std::string FirstError(const std::vector<Diagnostic>& ds) {
  for (const Diagnostic& d : ds) {
    if (d.severity == Severity::kError) return OneLine(d);
  }
  return "";
}

// Indices of the axes in item order; the item's mixed-radix number.
struct ItemSpace {
  const SweepSpace* space;
  int64_t count = 1;
  std::array<const std::vector<int64_t>*, 8> axes{};

  explicit ItemSpace(const SweepSpace& s) : space(&s) {
    axes = {&s.tp, &s.cp, &s.pp, &s.vpp, &s.ep, &s.expert_tp, &s.dp_replicate, &s.micro_batch};
    for (const auto* a : axes) count *= static_cast<int64_t>(a->size());
  }
  // Digit i of item (the last axis varies fastest).
  std::array<int64_t, 8> Digits(int64_t item) const {
    std::array<int64_t, 8> d{};
    for (int i = 7; i >= 0; --i) {
      const int64_t n = static_cast<int64_t>(axes[static_cast<size_t>(i)]->size());
      d[static_cast<size_t>(i)] = item % n;
      item /= n;
    }
    return d;
  }
  std::array<int64_t, 8> Values(const std::array<int64_t, 8>& digits) const {
    std::array<int64_t, 8> v{};
    for (size_t i = 0; i < 8; ++i) v[i] = (*axes[i])[static_cast<size_t>(digits[i])];
    return v;
  }
  // Mesh locality depends on (tp, cp, pp, ep, expert_tp, dp_replicate) only
  // (dp follows from them; vpp and micro_batch place nothing): its cache slot.
  int64_t LocalitySlots() const { return count / static_cast<int64_t>(space->vpp.size() * space->micro_batch.size()); }
  int64_t LocalitySlot(const std::array<int64_t, 8>& d) const {
    const auto n = [this](size_t i) { return static_cast<int64_t>(axes[i]->size()); };
    return ((((d[0] * n(1) + d[1]) * n(2) + d[2]) * n(4) + d[4]) * n(5) + d[5]) * n(6) + d[6];
  }
  // The dense axes' locality (DenseAxis) leaves out ep and expert_tp too.
  int64_t DenseSlots() const {
    return LocalitySlots() / static_cast<int64_t>(space->ep.size() * space->expert_tp.size());
  }
  int64_t DenseSlot(const std::array<int64_t, 8>& d) const {
    const auto n = [this](size_t i) { return static_cast<int64_t>(axes[i]->size()); };
    return ((d[0] * n(1) + d[1]) * n(2) + d[2]) * n(6) + d[6];
  }
};

// LocalityOf is O(world); computed once per slot, on first use, by whichever
// worker gets there first: the dense axes per dense slot, the expert axes per
// slot (an MoE space varies ep and expert_tp under every dense slot).
struct LocalityCache {
  LocalityCache(int64_t slots, int64_t dense_slots)
      : once(static_cast<size_t>(slots)),
        locality(static_cast<size_t>(slots)),
        dense_once(static_cast<size_t>(dense_slots)),
        dense(static_cast<size_t>(dense_slots)) {}
  std::vector<std::once_flag> once;
  std::vector<MeshLocality> locality;
  std::vector<std::once_flag> dense_once;
  std::vector<MeshLocality> dense;
};

const MeshLocality& LocalityFor(const Recipe& r, const Layout& layout, const ItemSpace& items,
                                const std::array<int64_t, 8>& digits, LocalityCache& cache) {
  const int64_t gpn = r.cluster.gpus_per_node, domain = NvlinkDomain(r.cluster);
  const bool tied = r.model.embedding_on_last_stage();
  const size_t slot = static_cast<size_t>(items.LocalitySlot(digits));
  std::call_once(cache.once[slot], [&] {
    if (items.DenseSlots() == items.LocalitySlots()) {  // one expert layout: one pass
      cache.locality[slot] = LocalityOf(layout, gpn, tied, domain);
      return;
    }
    const size_t dense = static_cast<size_t>(items.DenseSlot(digits));
    std::call_once(cache.dense_once[dense],
                   [&] { cache.dense[dense] = LocalityOf(layout, gpn, tied, domain, DenseAxis); });
    MeshLocality out = LocalityOf(layout, gpn, tied, domain, [](Axis a) { return !DenseAxis(a); });
    for (int a = 0; a < kNumAxes; ++a) {
      if (DenseAxis(static_cast<Axis>(a))) out[static_cast<size_t>(a)] = cache.dense[dense][static_cast<size_t>(a)];
    }
    cache.locality[slot] = out;
  });
  return cache.locality[slot];
}

// What LayerComputeTimes reads of a layout (planner/compute.cc): the
// degrees that shape the GEMMs and the attention, the micro-batch, sequence
// parallelism and the recompute policy.
using ComputeKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, int>;
ComputeKey ComputeKeyOf(const Layout& l) {
  return {l.tp, l.cp, l.ep, l.expert_tp, l.micro_batch, l.sequence_parallel(), static_cast<int>(l.recompute)};
}

// What the time-balanced partition reads of a layout besides pp, vpp and the
// schedule (chunk placement): each family's per-layer time and the head's
// (WeighLayers; parameter counts are the layout's own). Scaling every input
// of the partitioner's sums and comparisons by a power of two is exact in IEEE
// arithmetic, so the times are kept divided by the power of two of the
// largest: layouts whose times differ by that factor share one partition.
using PartitionKey = std::tuple<int64_t, int64_t, int, std::array<double, 6>>;
PartitionKey PartitionKeyOf(const Layout& l, const ComputeTimes& ct) {
  std::array<double, 6> times{};
  for (size_t f = 0; f < 5; ++f) times[f] = ct.family[f].total();
  times[5] = ct.head.total();
  int exponent = 0;
  std::frexp(*std::max_element(times.begin(), times.end()), &exponent);
  for (double& t : times) t = std::ldexp(t, -exponent);
  return {l.pp, l.vpp, static_cast<int>(l.schedule), times};
}

// One layout's communication and the stage plan it was built for.
// BuildStageComm reads of the recompute policy only which collectives
// backward reruns (CommRerunKey), so an item's recompute modes share it (one
// per ZeRO stage) when they share a partition and that.
struct CommSlot {
  const StagePlan* stages = nullptr;
  int rerun_key = 0;
  std::vector<StageComm> comm;
  std::vector<planner_internal::RankOptimizer> optimizer;  // each rank's, when this slot was built whole
  /// The RankOptimizer of `comm`'s ranks: this slot's `optimizer` or, for a
  /// slot built from a sibling, the one the sibling read (not copied).
  const std::vector<planner_internal::RankOptimizer>* kept = nullptr;
  StepTime time;  // the last step time priced on it, kept for its storage
};

// The cuts MakePlan tries when the time-balanced one does not fit, with,
// per cut, the rank that put the last layout priced on it over capacity:
// layouts of one cut mostly overflow on the same rank, so pricing it first
// usually settles a cut that does not fit in one walk (EstimateRanksByZero's
// first_rank; the order changes no figure).
struct Fallbacks {
  std::vector<NamedCut> cuts;
  std::vector<int64_t> first_rank;
};

// Per-thread state: a private recipe copy mutated in place (no copy per
// layout), the plan buffers reused across items and the caches.
struct Worker {
  Recipe recipe;
  std::vector<CommSlot> comm_by_zero;  // the current item's, by index into SweepSpace::zero
  CommSlot scratch;                    // the fallback cuts'
  /// The ranks' compute of the current item and recompute policy, shared by
  /// its ZeRO stages' step times (one stage plan at a time).
  planner_internal::SharedCompute rank_compute;
  /// The ZeRO stages an item prices and, for one stage plan, every rank's
  /// memory at each (EstimateRanksByZero): the time-balanced (or fixed) cut's
  /// and each fallback cut's, worked out when first asked.
  std::vector<int64_t> zeros;
  std::vector<std::vector<RankMemory>> memory;
  std::vector<std::vector<std::vector<RankMemory>>> fallback_memory;
  std::vector<bool> fallback_known;
  /// The ZeRO stages (of `zeros`) whose time-balanced cut does not fit: the
  /// only ones the fallback cuts price; over_at[i]: zeros[i]'s index there.
  std::vector<int64_t> over_zeros;
  std::vector<size_t> over_at;

  /// LayerComputeTimes by ComputeKeyOf: one per layout is enough, and
  /// layouts differing only in pp, vpp, replicas or ZeRO share it.
  std::map<ComputeKey, ComputeTimes> compute;
  /// Time-balanced stage partitions by PartitionKeyOf (see StagesFor).
  std::map<PartitionKey, StagePlan> partitions;
  /// The partitioner's weights of the current layout (ReweighFrameworkLayers;
  /// the parameter counts set once, when it is first weighed).
  LayerWeights layer_weights;
  /// The framework's (or pinned) partitions by (pp, vpp, schedule).
  std::map<std::tuple<int64_t, int64_t, int>, StagePlan> fixed;
  /// FallbackCuts by (pp, vpp, schedule).
  std::map<std::tuple<int64_t, int64_t, int>, Fallbacks> fallbacks;
};

const ComputeTimes& ComputeTimesFor(const Inventory& inv, const PlanTables& tables, const Layout& layout,
                                    const CostModel& cost, Worker& w) {
  const ComputeKey key = ComputeKeyOf(layout);
  auto it = w.compute.find(key);
  if (it == w.compute.end()) it = w.compute.emplace(key, LayerComputeTimes(inv, tables, layout, cost)).first;
  return it->second;
}

// The cuts MakePlan tries when the time-balanced one does not fit; they read
// the layers' parameter counts only.
Fallbacks& FallbackCutsFor(const Inventory& inv, const PlanTables& tables, const Layout& layout,
                           const ComputeTimes& times, Worker& w) {
  const auto key = std::make_tuple(layout.pp, layout.vpp, static_cast<int>(layout.schedule));
  auto it = w.fallbacks.find(key);
  if (it == w.fallbacks.end()) {
    Fallbacks f{FallbackCuts(WeighLayers(tables, times), layout, inv.layer_starts), {}};
    f.first_rank.assign(f.cuts.size(), 0);
    it = w.fallbacks.emplace(key, std::move(f)).first;
  }
  return it->second;
}

// The partition of a layout, as MakePlan cuts it, cached exactly.
const StagePlan& StagesFor(const Inventory& inv, const PlanTables& tables, const Layout& layout,
                           const ComputeTimes& times, Worker& w, bool* balanced) {
  // As MakePlan: the framework's split (or the pinned one) unless the recipe
  // asks for the balanced cut. Validation refused the layouts it cannot split.
  *balanced = inv.recipe.parallel.partition == Partition::kBalanced && inv.recipe.parallel.stage_boundaries.empty();
  if (!*balanced) {
    const auto key = std::make_tuple(layout.pp, layout.vpp, static_cast<int>(layout.schedule));
    auto it = w.fixed.find(key);
    if (it == w.fixed.end()) it = w.fixed.emplace(key, RecipeStagePlan(inv, layout).value_or(StagePlan{})).first;
    return it->second;
  }
  const PartitionKey key = PartitionKeyOf(layout, times);
  auto it = w.partitions.find(key);
  if (it == w.partitions.end()) {
    if (w.layer_weights.layer_params.empty()) {
      w.layer_weights = WeighFrameworkLayers(WeighLayers(tables, times), inv.layer_starts);
    }
    ReweighFrameworkLayers(tables, times, inv.layer_starts, &w.layer_weights);
    it = w.partitions.emplace(key, ToSublayers(PartitionStages(w.layer_weights, layout), inv.layer_starts)).first;
  }
  return it->second;
}

bool SameCut(const StagePlan& a, const StagePlan& b) {
  return std::equal(
      a.chunks.begin(), a.chunks.end(), b.chunks.begin(), b.chunks.end(), [](const StageChunk& x, const StageChunk& y) {
        return x.first_layer == y.first_layer && x.end_layer == y.end_layer && x.pipeline_rank == y.pipeline_rank &&
               x.virtual_index == y.virtual_index && x.owns_embedding == y.owns_embedding && x.owns_head == y.owns_head;
      });
}

Schedule ScheduleFor(Schedule recipe_schedule, int64_t vpp) {
  if (recipe_schedule == Schedule::kDualPipe || recipe_schedule == Schedule::kDualPipeV) return recipe_schedule;
  return vpp > 1 ? Schedule::kInterleaved : Schedule::k1F1B;
}

struct Priced {
  Bytes peak;
  Bytes capacity;
  Bytes host;  // the heaviest stage's offloaded optimizer state
  /// As EstimateMemory's verdict: the worst rank on the device, the offloaded
  /// optimizer state in the node's host memory.
  bool Fits(const Recipe& r) const { return peak <= capacity && HostMemoryFits(r, host); }
  int64_t worst = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  StepBreakdown parts;
};

// Memory of the worst pipeline rank, as EstimateMemory picks it (without its
// per-call vectors and verdict text).
Priced WorstOf(const std::vector<RankMemory>& ranks) {
  Priced p;
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const RankMemory& m = ranks[rank];
    p.host = std::max(p.host, m.host);
    if (rank == 0 || m.total() > p.peak) {
      p.peak = m.total();
      p.capacity = m.capacity;
      p.worst = static_cast<int64_t>(rank);
    }
  }
  return p;
}

// The step time of one stage plan into `p`. `siblings` (or null): the
// item's slots of the other ZeRO stages, whose pipeline items a stale slot
// takes when one of them is built for these stages.
void PriceTime(const Inventory& inv, const PlanTables& tables, const Layout& layout, const StagePlan& stages,
               const MeshLocality& locality, const CostModel& cost, const ComputeTimes& times, CommSlot& slot,
               std::vector<CommSlot>* siblings, planner_internal::SharedCompute& compute, Priced& p) {
  // The one policy input of the communication: which collectives backward
  // reruns (the layers' under full recompute, the modules' under selective).
  const int rerun_key = planner_internal::CommRerunKey(layout, inv.recipe.training);
  const auto built_for_this = [&](const CommSlot& c) { return c.stages == &stages && c.rerun_key == rerun_key; };
  if (!built_for_this(slot)) {
    const CommSlot* sibling = nullptr;
    if (siblings != nullptr) {
      for (const CommSlot& c : *siblings) {
        if (&c != &slot && built_for_this(c)) sibling = &c;
      }
    }
    if (sibling != nullptr) {
      planner_internal::BuildStageCommForZero(inv, tables, layout, stages, locality, cost, sibling->comm,
                                              *sibling->kept, &slot.comm, false);
      slot.kept = sibling->kept;  // this slot may be the next one's sibling
    } else {
      planner_internal::BuildStageComm(inv, tables, layout, stages, locality, cost, &slot.comm, &slot.optimizer, false);
      slot.kept = &slot.optimizer;
      // The slots that read this one's optimizer hold other stages' items now.
      if (siblings != nullptr) {
        for (CommSlot& c : *siblings) {
          if (&c != &slot && c.kept == &slot.optimizer) c.stages = nullptr;
        }
      }
    }
    slot.stages = &stages;
    slot.rerun_key = rerun_key;
  }
  // Only the step time is read: the ranks priced as an earlier one get no items.
  planner_internal::EstimateStepTime(inv, tables, layout, stages, &slot.comm, cost, times, &slot.time, false, &compute);
  const StepTime& time = slot.time;
  p.step_s = time.step_s;
  p.tokens_per_s = time.tokens_per_s;
  p.mfu = time.mfu;
  p.parts = BreakdownOf(time);
}

/// The recipe's rules on parallel.zero that no swept axis changes (the
/// validator's, in its words): each item is validated at the recipe's own
/// ZeRO stage, so rows at another stage are refused here.
std::array<std::string, 4> ZeroRefusals(const Recipe& r) {
  std::array<std::string, 4> out;
  if (r.training.precision.fp4 != Fp4Format::kNone) {
    out[3] = fmt::format("training.precision.fp4 = {}: is not priced under ZeRO 3", Name(r.training.precision.fp4));
  }
  for (size_t z = 0; z < out.size(); ++z) {
    if (r.parallel.fsdp_cpu_offload && z < 3) {
      out[z] = "parallel.fsdp_cpu_offload = true: offloads FSDP's parameter shards, ZeRO 3 only";
    }
    if (r.parallel.optimizer_sharding == OptimizerSharding::kLayerWise && z != 1) {
      out[z] = "parallel.optimizer_sharding = layer_wise: deals whole tensors' optimizer state, ZeRO 1 only";
    }
  }
  return out;
}

/// The validator's first error for the item in `r` under torchtitan's per-op
/// recompute, or "" where it is valid. `r` is left as it was.
std::string SelectiveOpError(Recipe& r) {
  const Recompute own = r.training.recompute;
  r.training.recompute = Recompute::kSelectiveOp;
  const std::optional<Diagnostic> recipe_error = FirstRecipeError(r);
  std::string error = recipe_error ? OneLine(*recipe_error) : FirstError(ValidateForPlan(r, LayoutOf(r)));
  r.training.recompute = own;
  return error;
}

void EvaluateItem(const Inventory& inv, const PlanTables& tables, const SweepSpace& space, const ItemSpace& items,
                  const SweepOptions& options, int64_t item, LocalityCache& cache, Worker& w, SweepResult& out) {
  const auto digits = items.Digits(item);
  const auto v = items.Values(digits);
  Recipe& r = w.recipe;
  ParallelConfig& p = r.parallel;
  p.tp = v[0];
  p.cp = v[1];
  p.pp = v[2];
  p.vpp = v[3];
  p.ep = v[4];
  p.expert_tp = v[5];
  p.dp_replicate = v[6];
  // Replicas need a ZeRO group: the item is validated at zero >= 1; its zero-0
  // rows are invalid (below).
  p.zero = p.dp_replicate > 1 ? std::max<int64_t>(1, inv.recipe.parallel.zero) : inv.recipe.parallel.zero;
  r.training.micro_batch = v[7];
  p.schedule = ScheduleFor(inv.recipe.parallel.schedule, p.vpp);
  // Megatron's uneven first/last stage re-derived for this pp (as MakePlan does).
  const ParallelConfig split = SplitFor(inv.recipe.parallel, p.pp, p.vpp, p.schedule, inv.layer_count());
  p.first_stage_layers = split.first_stage_layers;
  p.last_stage_layers = split.last_stage_layers;

  const size_t per_item = space.recompute.size() * space.zero.size();
  const size_t first_row = static_cast<size_t>(item) * per_item;
  // One policy's rows, a ZeRO stage each, from out.rows[*k] on.
  auto mark_policy = [&](size_t* k, Recompute rc, SweepStatus status) {
    for (int64_t z : space.zero) {
      SweepRow& row = out.rows[(*k)++];
      row = SweepRow{};
      row.item = static_cast<int32_t>(item);
      row.recompute = rc;
      row.zero = static_cast<int8_t>(z);
      row.status = status;
    }
  };
  auto mark_rows = [&](SweepStatus status) {
    size_t k = first_row;
    for (Recompute rc : space.recompute) mark_policy(&k, rc, status);
  };

  Layout layout;
  // Only the first error is shown: the others are not formatted.
  const std::optional<Diagnostic> recipe_error = FirstRecipeError(r);
  std::string error = recipe_error ? OneLine(*recipe_error) : "";
  if (error.empty()) {
    layout = LayoutOf(r);
    error = FirstError(ValidateForPlan(r, layout));
  } else {
    layout.tp = p.tp;
    layout.sp = p.sp;
    layout.cp = p.cp;
    layout.pp = p.pp;
    layout.vpp = p.vpp;
    layout.ep = p.ep;
    layout.expert_tp = p.expert_tp;
    layout.dp_replicate = p.dp_replicate;
    layout.micro_batch = r.training.micro_batch;
    layout.schedule = p.schedule;
    layout.microbatch_group = p.microbatch_group;
    layout.order = p.order;
    layout.cp_comm = p.cp_comm;
    layout.cp_recurrent = p.cp_recurrent;
    layout.cp_load_balance = p.cp_load_balance;
    const int64_t tcp = p.tp * p.cp * p.pp;
    layout.dp = tcp > 0 && r.world() % tcp == 0 ? r.world() / tcp : 0;
    const int64_t per_step = layout.micro_batch * layout.dp;
    layout.micro_batches = per_step > 0 && r.training.global_batch % per_step == 0 ? r.training.global_batch / per_step : 0;
  }
  out.items[static_cast<size_t>(item)] = layout;
  if (!error.empty()) {
    out.item_errors[static_cast<size_t>(item)] = std::move(error);
    mark_rows(SweepStatus::kInvalid);
    return;
  }
  // torchtitan's per-op policy has rules of its own (dense blocks, tp and cp
  // 1): an item valid under the other policies is validated again under it.
  bool op_invalid = false;
  if (!out.selective_op_errors.empty()) {
    std::string& op_error = out.selective_op_errors[static_cast<size_t>(item)];
    op_error = SelectiveOpError(r);
    op_invalid = !op_error.empty();
  }
  const MeshLocality& locality = LocalityFor(r, layout, items, digits, cache);
  w.comm_by_zero.resize(space.zero.size());
  for (CommSlot& c : w.comm_by_zero) {  // built for another item
    c.stages = nullptr;
    c.kept = nullptr;
  }
  size_t k = first_row;
  for (Recompute rc : space.recompute) {
    if (rc == Recompute::kSelectiveOp && op_invalid) {
      mark_policy(&k, rc, SweepStatus::kInvalid);
      continue;
    }
    layout.recompute = rc;
    w.rank_compute.Reset();  // kept across this policy's ZeRO stages only
    const ComputeTimes& times = ComputeTimesFor(inv, tables, layout, options.cost, w);
    bool balanced = false;
    const StagePlan& stages = StagesFor(inv, tables, layout, times, w, &balanced);
    // Every priced ZeRO stage's memory at once (they share each rank's walk).
    w.zeros.clear();
    for (int64_t z : space.zero) {
      if ((z != 0 || layout.dp_replicate == 1) && out.zero_refusal[static_cast<size_t>(z)].empty()) {
        w.zeros.push_back(z);
      }
    }
    EstimateRanksByZero(inv, layout, stages, w.zeros, &w.memory);
    w.fallback_known.assign(w.fallback_memory.size(), false);
    // A stage's figures do not depend on the other stages priced with it
    // (EstimateRanksByZero), so the fallback cuts price only the stages that
    // need them: a stage that fits there would keep every walk going.
    w.over_zeros.clear();
    w.over_at.assign(w.zeros.size(), 0);
    for (size_t i = 0; balanced && i < w.zeros.size(); ++i) {
      if (WorstOf(w.memory[i]).Fits(inv.recipe)) continue;
      w.over_at[i] = w.over_zeros.size();
      w.over_zeros.push_back(w.zeros[i]);
    }
    size_t priced_zero = 0;  // index into w.zeros
    for (size_t zi = 0; zi < space.zero.size(); ++zi) {
      const int64_t z = space.zero[zi];
      layout.zero = z;
      SweepRow& row = out.rows[k++];
      row = SweepRow{};
      row.item = static_cast<int32_t>(item);
      row.recompute = rc;
      row.zero = static_cast<int8_t>(z);
      // As the recipe checks: replicas need zero >= 1 (ZeroRefusals: the rest).
      if ((z == 0 && layout.dp_replicate > 1) || !out.zero_refusal[static_cast<size_t>(z)].empty()) {
        row.status = SweepStatus::kInvalid;
        continue;
      }
      const size_t at = priced_zero++;
      Priced best = WorstOf(w.memory[at]);
      bool found = false;  // a fallback cut replaced it
      if (balanced && !best.Fits(inv.recipe)) {
        // As MakePlan: when the time-balanced cut overflows a device, the
        // fastest of the other cuts that fits (FallbackCuts). Only a cut that
        // fits is timed.
        Fallbacks& fallbacks = FallbackCutsFor(inv, tables, layout, times, w);
        const std::vector<NamedCut>& cuts = fallbacks.cuts;
        if (w.fallback_memory.size() < cuts.size()) {
          w.fallback_memory.resize(cuts.size());
          w.fallback_known.resize(cuts.size(), false);
        }
        for (size_t c = 0; c < cuts.size(); ++c) {
          const NamedCut& cut = cuts[c];
          // A fallback that cuts where the time-balanced cut does has its memory.
          if (SameCut(cut.stages, stages)) continue;
          if (!w.fallback_known[c]) {
            // Only a fallback that fits is used: its ranks are priced until
            // every ZeRO stage has one over.
            EstimateRanksByZero(inv, layout, cut.stages, w.over_zeros, &w.fallback_memory[c], true,
                                &fallbacks.first_rank[c]);
            w.fallback_known[c] = true;
          }
          Priced priced = WorstOf(w.fallback_memory[c][w.over_at[at]]);
          if (!priced.Fits(inv.recipe)) continue;
          w.scratch.stages = nullptr;  // another ZeRO stage may have used it
          PriceTime(inv, tables, layout, cut.stages, locality, options.cost, times, w.scratch, nullptr, w.rank_compute,
                    priced);
          if (!found || priced.step_s < best.step_s) {
            best = priced;
            found = true;
          }
        }
      }
      if (!found) {
        PriceTime(inv, tables, layout, stages, locality, options.cost, times, w.comm_by_zero[zi], &w.comm_by_zero,
                  w.rank_compute, best);
      }
      row.peak = best.peak;
      row.worst_stage = static_cast<int16_t>(best.worst);
      const Bytes headroom = best.capacity - best.peak;
      // Host memory the offloaded optimizer overflows counts as over capacity.
      row.status = headroom < Bytes(0) || !HostMemoryFits(inv.recipe, best.host) ? SweepStatus::kOverCapacity
                   : headroom < out.min_headroom                                 ? SweepStatus::kTight
                                                                                 : SweepStatus::kFits;
      row.step_s = best.step_s;
      row.tokens_per_s = best.tokens_per_s;
      row.mfu = best.mfu;
      row.compute_s = static_cast<float>(best.parts.compute_s);
      row.exposed_comm_s = static_cast<float>(best.parts.exposed_comm_s);
      row.bubble_s = static_cast<float>(best.parts.bubble_s);
      row.optimizer_s = static_cast<float>(best.parts.optimizer_s);
    }
  }
}

}  // namespace

const char* Key(SweepStatus s) {
  switch (s) {
    case SweepStatus::kFits: return "fits";
    case SweepStatus::kTight: return "tight";
    case SweepStatus::kOverCapacity: return "over_capacity";
    case SweepStatus::kInvalid: return "invalid";
  }
  return "invalid";
}

std::optional<std::vector<int64_t>> ParseAxisList(const std::string& text, int64_t min_value, std::string* error) {
  std::vector<int64_t> values;
  for (std::string_view part : SplitCommas(text)) {
    const size_t dots = part.find("..");
    int64_t low = 0;
    int64_t high = 0;
    if (dots == std::string_view::npos) {
      if (!ParseInt(part, &low)) {
        *error = fmt::format("'{}': '{}' is not an integer; write a list like 1,2,4 or a range like 1..16", text, part);
        return std::nullopt;
      }
      high = low;
    } else {
      const std::string_view a = part.substr(0, dots);
      const std::string_view b = part.substr(dots + 2);
      if (!ParseInt(a, &low) || !ParseInt(b, &high)) {
        *error = fmt::format("'{}': '{}' is not an integer; write a range like 1..16",
                             text, ParseInt(a, &low) ? b : a);
        return std::nullopt;
      }
      if (high < low) {
        *error = fmt::format("'{}': range {}..{} is empty; write the smaller bound first", text, low, high);
        return std::nullopt;
      }
    }
    if (low < min_value) {
      *error = fmt::format("'{}': {} is below the smallest valid value {}", text, low, min_value);
      return std::nullopt;
    }
    if (high > kMaxAxisValue) {
      *error = fmt::format("'{}': {} is above the largest value an axis takes, {}", text, high, kMaxAxisValue);
      return std::nullopt;
    }
    if (high - low >= kMaxAxisValues) {
      *error = fmt::format("'{}': {}..{} has more than {} values", text, low, high, kMaxAxisValues);
      return std::nullopt;
    }
    for (int64_t x = low; x <= high; ++x) values.push_back(x);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

std::optional<std::vector<Recompute>> ParseRecomputeList(const std::string& text, std::string* error) {
  std::vector<Recompute> values;
  for (std::string_view part : SplitCommas(text)) {
    if (part == "none") {
      values.push_back(Recompute::kNone);
    } else if (part == "selective") {
      values.push_back(Recompute::kSelective);
    } else if (part == "full") {
      values.push_back(Recompute::kFull);
    } else if (part == "selective_op") {
      values.push_back(Recompute::kSelectiveOp);
    } else {
      *error =
          fmt::format("'{}': '{}' is not a recompute mode; valid: none, selective, full, selective_op", text, part);
      return std::nullopt;
    }
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

SweepSpace DefaultSweepSpace(const Recipe& r, SweepSpace s) {
  const int64_t gpn = std::min(r.cluster.gpus_per_node, std::max<int64_t>(s.gpus, 1));
  const int64_t layers = static_cast<int64_t>(r.model.layers.size());
  const bool moe = HasMoe(r);
  const bool dualpipe = r.parallel.schedule == Schedule::kDualPipe || r.parallel.schedule == Schedule::kDualPipeV;
  if (s.tp.empty()) s.tp = PowersOfTwoUpTo(gpn);
  if (s.cp.empty()) s.cp = PowersOfTwoUpTo(std::min<int64_t>(8, std::max<int64_t>(s.gpus, 1)));
  if (s.pp.empty()) s.pp = PowersOfTwoUpTo(std::min(layers, std::max<int64_t>(s.gpus, 1)));
  if (s.vpp.empty()) s.vpp = dualpipe ? std::vector<int64_t>{1} : PowersOfTwoUpTo(std::min<int64_t>(8, layers));
  if (s.ep.empty()) s.ep = moe ? PowersOfTwoUpTo(std::min(r.model.moe.experts, std::max<int64_t>(s.gpus, 1)))
                               : std::vector<int64_t>{1};
  if (s.expert_tp.empty()) s.expert_tp = moe ? PowersOfTwoUpTo(gpn) : std::vector<int64_t>{1};
  if (s.micro_batch.empty()) s.micro_batch = PowersOfTwoUpTo(std::min<int64_t>(8, r.training.global_batch));
  if (s.recompute.empty()) {
    s.recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
    // torchtitan's per-op policy only where the recipe runs it: its rules
    // (dense blocks, no tp or cp) would refuse it on the other recipes.
    if (r.training.recompute == Recompute::kSelectiveOp) s.recompute.push_back(Recompute::kSelectiveOp);
  }
  if (s.dp_replicate.empty()) s.dp_replicate = {r.parallel.dp_replicate};
  // HSDP replicas need a ZeRO group to shard over (zero >= 1).
  const bool replicas = std::any_of(s.dp_replicate.begin(), s.dp_replicate.end(), [](int64_t x) { return x > 1; });
  const bool plain = std::any_of(s.dp_replicate.begin(), s.dp_replicate.end(), [](int64_t x) { return x == 1; });
  if (s.zero.empty()) s.zero = replicas && !plain ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{0, 1, 2, 3};
  return s;
}

std::optional<Recipe> SweepRecipe(const Recipe& recipe, int64_t gpus, std::string* error, bool sequence_parallel) {
  Recipe r = recipe;
  r.parallel.sp = sequence_parallel;
  const int64_t gpn = r.cluster.gpus_per_node;
  if (gpus <= 0) {
    *error = fmt::format("--gpus {}: must be positive", gpus);
    return std::nullopt;
  }
  if (gpus > kMaxSweepGpus) {
    *error = fmt::format("--gpus {}: more than a recipe's largest cluster ({} GPUs: cluster.nodes 2^24 of 1024)", gpus,
                         kMaxSweepGpus);
    return std::nullopt;
  }
  if (gpus < gpn) {
    r.cluster.gpus_per_node = gpus;
    r.cluster.nodes = 1;
  } else if (gpus % gpn != 0) {
    *error = fmt::format("--gpus {}: must be a multiple of cluster.gpus_per_node ({}); try {} or {}", gpus, gpn,
                         gpus / gpn * gpn, (gpus / gpn + 1) * gpn);
    return std::nullopt;
  } else {
    r.cluster.nodes = gpus / gpn;
  }
  r.parallel.stage_boundaries.clear();
  return r;
}

std::optional<int64_t> CheckedSweepSize(const SweepSpace& s) {
  int64_t n = static_cast<int64_t>(s.recompute.size());
  for (const auto* a : {&s.tp, &s.cp, &s.pp, &s.vpp, &s.ep, &s.expert_tp, &s.dp_replicate, &s.micro_batch, &s.zero}) {
    if (__builtin_mul_overflow(n, static_cast<int64_t>(a->size()), &n)) return std::nullopt;
  }
  return n;
}

int64_t SweepSize(const SweepSpace& s) {
  int64_t n = 1;
  for (const auto* a : {&s.tp, &s.cp, &s.pp, &s.vpp, &s.ep, &s.expert_tp, &s.dp_replicate, &s.micro_batch, &s.zero}) {
    n *= static_cast<int64_t>(a->size());
  }
  return n * static_cast<int64_t>(s.recompute.size());
}

int64_t SweepResult::CountOf(SweepStatus s) const {
  return std::count_if(rows.begin(), rows.end(), [s](const SweepRow& r) { return r.status == s; });
}

Layout SweepResult::LayoutOf(const SweepRow& row) const {
  Layout l = items[static_cast<size_t>(row.item)];
  l.recompute = row.recompute;
  l.zero = row.zero;
  return l;
}

std::optional<int64_t> SweepResult::RowOf(const Layout& layout) const {
  for (size_t i = 0; i < rows.size(); ++i) {
    const Layout l = LayoutOf(rows[i]);
    if (l.tp == layout.tp && l.cp == layout.cp && l.pp == layout.pp && l.vpp == layout.vpp && l.ep == layout.ep &&
        l.expert_tp == layout.expert_tp && l.dp_replicate == layout.dp_replicate &&
        l.micro_batch == layout.micro_batch && l.recompute == layout.recompute && l.zero == layout.zero) {
      return static_cast<int64_t>(i);
    }
  }
  return std::nullopt;
}

std::string SweepResult::ReasonOf(const SweepRow& row) const {
  if (row.status == SweepStatus::kInvalid) {
    const std::string& error = item_errors[static_cast<size_t>(row.item)];
    const int64_t replicas = items[static_cast<size_t>(row.item)].dp_replicate;
    if (error.empty() && row.recompute == Recompute::kSelectiveOp && !selective_op_errors.empty() &&
        !selective_op_errors[static_cast<size_t>(row.item)].empty()) {
      return selective_op_errors[static_cast<size_t>(row.item)];
    }
    if (error.empty() && row.zero == 0 && replicas > 1) {
      return fmt::format("parallel.dp_replicate = {}: needs parallel.zero >= 1", replicas);
    }
    if (error.empty() && !zero_refusal[static_cast<size_t>(row.zero)].empty()) {
      return zero_refusal[static_cast<size_t>(row.zero)];
    }
    return error;
  }
  const Bytes headroom = HeadroomOf(row);
  if (row.status == SweepStatus::kOverCapacity) {
    if (headroom >= Bytes(0)) return "the offloaded optimizer state exceeds the nodes' host memory";
    return fmt::format("stage {} over capacity by {}", row.worst_stage, GiBText(Bytes(0) - headroom));
  }
  if (row.status == SweepStatus::kTight) {
    return fmt::format("stage {} leaves {} headroom, below the {} floor", row.worst_stage, GiBText(headroom),
                       GiBText(min_headroom));
  }
  return fmt::format("stage {} leaves {} headroom", row.worst_stage, GiBText(headroom));
}

NoFitReasons WhyNothingFits(const SweepResult& r, size_t most) {
  NoFitReasons out;
  std::map<std::string, NoFitReasons::Group> groups;
  std::vector<std::string> order;  // keys in the canonical order of their first row
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const SweepRow& row = r.rows[i];
    if (row.status == SweepStatus::kInvalid) {
      ++out.invalid_rows;
      const std::string reason = r.ReasonOf(row);
      const std::string key = reason.substr(0, reason.find_first_of(" :"));
      auto [it, added] = groups.try_emplace(key, NoFitReasons::Group{key, 0, reason});
      if (added) order.push_back(key);
      ++it->second.rows;
    } else if (row.status != SweepStatus::kFits) {
      ++out.over_rows;
      // The smallest peak misses by least (every row has the same capacity).
      if (!out.closest || row.peak < r.rows[static_cast<size_t>(*out.closest)].peak) {
        out.closest = static_cast<int64_t>(i);
      }
    }
  }
  for (const std::string& key : order) out.invalid.push_back(groups.at(key));
  std::stable_sort(out.invalid.begin(), out.invalid.end(),
                   [](const NoFitReasons::Group& a, const NoFitReasons::Group& b) { return a.rows > b.rows; });
  if (out.invalid.size() > most) out.invalid.resize(most);
  return out;
}

std::vector<int64_t> TieGroups(const std::vector<SweepRow>& rows, const std::vector<int64_t>& ranked) {
  std::vector<int64_t> groups;
  groups.reserve(ranked.size());
  double first_step = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const double step = rows[static_cast<size_t>(ranked[i])].step_s;
    if (i == 0 || step > first_step * (1.0 + kStepTimeUncertainty)) {
      groups.push_back(static_cast<int64_t>(i) + 1);
      first_step = step;
    } else {
      groups.push_back(groups.back());
    }
  }
  return groups;
}

std::vector<int64_t> RankByThroughput(const std::vector<SweepRow>& rows, int64_t top) {
  std::vector<int64_t> idx;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].status == SweepStatus::kFits) idx.push_back(static_cast<int64_t>(i));
  }
  // Total order: tokens/s descending, then peak ascending, then canonical index.
  auto better = [&rows](int64_t a, int64_t b) {
    const SweepRow& x = rows[static_cast<size_t>(a)];
    const SweepRow& y = rows[static_cast<size_t>(b)];
    if (x.tokens_per_s != y.tokens_per_s) return x.tokens_per_s > y.tokens_per_s;
    if (x.peak != y.peak) return x.peak < y.peak;
    return a < b;
  };
  const size_t keep = std::min(idx.size(), static_cast<size_t>(std::max<int64_t>(top, 0)));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep), idx.end(), better);
  idx.resize(keep);
  return idx;
}

std::vector<int64_t> ParetoFront(const std::vector<SweepRow>& rows) {
  std::vector<int64_t> idx;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].status == SweepStatus::kFits) idx.push_back(static_cast<int64_t>(i));
  }
  std::sort(idx.begin(), idx.end(), [&rows](int64_t a, int64_t b) {
    const SweepRow& x = rows[static_cast<size_t>(a)];
    const SweepRow& y = rows[static_cast<size_t>(b)];
    if (x.peak != y.peak) return x.peak < y.peak;
    if (x.step_s != y.step_s) return x.step_s < y.step_s;
    return a < b;
  });
  // Walking by ascending peak, a point is on the front when it is faster than
  // every point before it, or equal to the last kept point on both axes.
  std::vector<int64_t> front;
  for (int64_t i : idx) {
    const SweepRow& x = rows[static_cast<size_t>(i)];
    if (front.empty()) {
      front.push_back(i);
      continue;
    }
    const SweepRow& last = rows[static_cast<size_t>(front.back())];
    if (x.step_s < last.step_s || (x.step_s == last.step_s && x.peak == last.peak)) front.push_back(i);
  }
  return front;
}

namespace {

/// The layout keys a sweep varies (SweepSpace's axes; dp_replicate when it
/// is given more than one value).
bool Swept(std::string_view path, const SweepSpace& space) {
  if (path == "parallel.dp_replicate") return space.dp_replicate.size() > 1;
  // Megatron's uneven first/last stage follows pp (SplitFor).
  if (path == "parallel.first_stage_layers" || path == "parallel.last_stage_layers") return space.pp.size() > 1;
  for (std::string_view axis : {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.vpp", "parallel.ep",
                                "parallel.expert_tp", "parallel.zero", "training.micro_batch", "training.recompute"}) {
    if (path == axis) return true;
  }
  return false;
}

/// Keys away from their defaults only: the defaults are documented, and a
/// recipe's own choice (sp: false, say) is what can bias a search.
std::vector<std::string> HeldFixed(const Recipe& r, const SweepSpace& space) {
  std::vector<std::string> out;
  // The schedule follows vpp (ScheduleFor) unless the recipe runs DualPipe(V).
  const bool schedule_follows_vpp =
      r.parallel.schedule != Schedule::kDualPipe && r.parallel.schedule != Schedule::kDualPipeV;
  for (const RecipeField& f : RecipeFields()) {
    if (f.path == "parallel.schedule" && schedule_follows_vpp) continue;
    if (f.path == "parallel.sp") continue;  // the sweep's own rule (SweepResult::sequence_parallel)
    const bool layout_key = f.path.rfind("parallel.", 0) == 0 || f.path.rfind("training.", 0) == 0;
    if (!layout_key || f.kind == FieldKind::kSection || !f.text || f.affects == kAffectsNothing ||
        Swept(f.path, space)) {
      continue;
    }
    const std::string value = f.text(r);
    if (value != DefaultText(f)) out.push_back(fmt::format("{}={}", f.path, value));
  }
  return out;
}

}  // namespace

SweepResult RunSweep(const Inventory& inventory, const SweepSpace& space, const SweepOptions& options) {
  const Recipe& r = inventory.recipe;
  SweepResult out;
  out.gpus = r.world();
  out.nodes = r.cluster.nodes;
  out.gpus_per_node = r.cluster.gpus_per_node;
  out.device = DeviceLabel(r.cluster);
  out.priced_rates = PricedRates(r, options.cost);
  // Capacity as the estimator sees it (any layout: it is a cluster property).
  out.capacity = EstimateRank(inventory, Layout{}, EqualStagePlan(static_cast<int64_t>(r.model.layers.size()), 1, 1), 0)
                     .capacity;
  out.min_headroom = GiB(r.cluster.min_headroom_gib);  // EstimateMemory's floor
  out.held_fixed = HeldFixed(r, space);
  out.sequence_parallel = r.parallel.sp;
  out.zero_refusal = ZeroRefusals(r);
  const ItemSpace items(space);
  out.items.resize(static_cast<size_t>(items.count));
  out.item_errors.resize(static_cast<size_t>(items.count));
  // Items are validated under the recipe's own recompute, or none where that
  // is selective_op (whose rules bind its own rows only, below).
  Recipe item_recipe = r;
  const bool op_rows =
      std::find(space.recompute.begin(), space.recompute.end(), Recompute::kSelectiveOp) != space.recompute.end();
  if (item_recipe.training.recompute == Recompute::kSelectiveOp) item_recipe.training.recompute = Recompute::kNone;
  if (op_rows) out.selective_op_errors.resize(static_cast<size_t>(items.count));
  out.rows.resize(static_cast<size_t>(SweepSize(space)));
  const PlanTables tables = BuildPlanTables(inventory);
  LocalityCache cache(items.LocalitySlots(), items.DenseSlots());

  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  const int64_t per_item = static_cast<int64_t>(space.recompute.size() * space.zero.size());
  auto work = [&] {
    Worker w{item_recipe, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    // An item's reason is FirstError's key, value and message, ordered by the
    // source marks: the file's name and text each diagnostic would copy are
    // not read (an empty name sorts as the file's, as the name did).
    w.recipe.source.file.clear();
    w.recipe.source.lines.reset();
    while (true) {
      const int64_t item = next.fetch_add(1);
      if (item >= items.count) return;
      try {
        EvaluateItem(inventory, tables, space, items, options, item, cache, w, out);
      } catch (const ArithmeticOverflow& e) {
        // Degrees so large that a byte count overflows: invalid, not a crash.
        out.item_errors[static_cast<size_t>(item)] = fmt::format("sizes exceed 64-bit byte arithmetic ({})", e.what());
        for (int64_t k = 0; k < per_item; ++k) {
          SweepRow& row = out.rows[static_cast<size_t>(item * per_item + k)];
          row = SweepRow{};
          row.item = static_cast<int32_t>(item);
          row.recompute = space.recompute[static_cast<size_t>(k) / space.zero.size()];
          row.zero = static_cast<int8_t>(space.zero[static_cast<size_t>(k) % space.zero.size()]);
        }
      }
      done.fetch_add(per_item, std::memory_order_relaxed);
    }
  };
  const int64_t threads = std::clamp<int64_t>(options.threads, 1, std::max<int64_t>(items.count, 1));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  if (options.progress) {
    // The calling thread reports; the workers do the work.
    pool.emplace_back(work);
    const int64_t total = static_cast<int64_t>(out.rows.size());
    while (done.load() < total) {
      options.progress(done.load(), total);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    options.progress(total, total);
  } else {
    work();
  }
  for (std::thread& t : pool) t.join();
  out.top = RankByThroughput(out.rows, options.top);
  out.pareto = ParetoFront(out.rows);
  return out;
}

}  // namespace preflight

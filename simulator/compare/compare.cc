// The agreement check of `preflight simulate` (docs/architecture.md): counted bytes
// against the planner, measured peaks against the estimator, for the same
// scaled recipe. The executor never calls these models while it runs; this
// file only puts their figures beside its measurements.
//
// Stage by stage. Communication: every (axis, kind, pass, what) bucket, the
// most bytes any rank of the stage sent in it, beside the planner's item for
// the stage (which prices its busiest rank). Exact (bytes must be equal)
// unless the bytes depend on the routing: the EP/ETP buckets of a dropless or
// unpadded-capacity MoE, where the planner prices uniform routing (k*T
// copies) and the executor moves what its router chose; those rows are
// informational, as is the executor's int64 count exchange ("moe_counts"),
// which the planner does not price. Optimizer-step traffic (gradient
// reductions, parameter gathers, Muon gathers) is exact.
//
// Memory: peak per category over the stage's ranks beside the estimator's
// figure for the stage. Parameters, gradients, both optimizer states, the
// number of micro-batches in flight and the saved activations are exact, and
// under recompute the largest rerun set (exact but for uniform groups of
// several layers, where the estimator's figure is a bound).
// With routing-dependent MoE shapes the executor holds the rows its router
// chose: under a capacity without padding the estimator prices the capacity
// bound (every expert receiving C tokens from every source, capped by what
// the sources can send), so the measured peak must not exceed it; dropless,
// it prices the skewed expectation (moe.dropless_skew), and the measured peak
// must be within kDroplessActivationTolerance of it. Routing scratch is
// informational (transient buffers whose lifetimes the estimator models as
// one peak, docs/formulas.md §5).
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/simulator/sim.h"

namespace preflight {
namespace {

constexpr double kDroplessActivationTolerance = 0.50;

bool RoutingDependent(const Recipe& r) {
  bool moe = false;
  for (BlockKind k : r.model.layers) moe = moe || k == BlockKind::kMoe;
  return moe && (r.model.moe.dropless || !r.model.moe.pad_to_capacity);
}

bool IsRoutedBucket(CommWhat what) {
  return what == CommWhat::kMoeDispatch || what == CommWhat::kMoeCombine || what == CommWhat::kMoeExperts ||
         what == CommWhat::kMoeCounts;
}

/// The planner's collective for a runtime kind: one point-to-point send is
/// one send_recv message; receives mirror sends and broadcasts are not
/// planned (nullopt).
std::optional<Collective> PlannedKind(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return Collective::kAllReduce;
    case CollectiveKind::kAllGather: return Collective::kAllGather;
    case CollectiveKind::kReduceScatter: return Collective::kReduceScatter;
    case CollectiveKind::kAllToAll: return Collective::kAllToAll;
    case CollectiveKind::kSend: return Collective::kSendRecv;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kRecv: return std::nullopt;
  }
  return std::nullopt;
}

/// One typed bucket; ordered by its printed names so reports list buckets
/// alphabetically by axis, then kind, pass and what.
struct Bucket {
  Axis axis;
  Collective kind;
  Pass pass;
  CommWhat what;
  bool operator<(const Bucket& o) const {
    const std::string_view a = Key(axis), b = Key(o.axis), ka = Key(kind), kb = Key(o.kind), w = Key(what),
                           wo = Key(o.what);
    return std::tie(a, ka, pass, w) < std::tie(b, kb, o.pass, wo);
  }
};
using Key4 = Bucket;

/// The stage's ranks, worst per bucket: the planner prices the busiest rank
/// of a stage (uneven CP hand-off chains, the first DP shard).
std::map<Key4, std::pair<int64_t, int64_t>> MeasuredComm(const SimulationReport& report, int64_t stage) {
  std::map<Key4, std::pair<int64_t, int64_t>> out;  // sent, calls
  for (const RankMeasurement& m : report.per_rank) {
    if (m.pipeline_rank != stage) continue;
    std::map<Key4, std::pair<int64_t, int64_t>> mine;
    for (const CommCount& c : m.comm) {
      const std::optional<Collective> kind = PlannedKind(c.kind);
      if (!kind) continue;
      auto& slot = mine[{c.axis, *kind, c.pass, c.what}];
      slot.first += c.bytes_sent;
      slot.second += c.calls;
    }
    for (const auto& [k, v] : mine) {
      auto& slot = out[k];
      if (v.first >= slot.first) slot = v;
    }
  }
  return out;
}

void CompareComm(const Recipe& scaled, const StageComm& comm, const SimulationReport& report, StageComparison* out) {
  std::map<Key4, int64_t> modeled;
  for (const CommItem& item : comm.items) {
    if (item.send.count() == 0) continue;
    modeled[{item.axis, item.kind, item.pass, item.what}] += item.send.count();
  }
  const std::map<Key4, std::pair<int64_t, int64_t>> counted = MeasuredComm(report, out->pipeline_rank);
  std::set<Key4> keys;
  for (const auto& [k, v] : modeled) keys.insert(k);
  for (const auto& [k, v] : counted) keys.insert(k);
  const bool routed = RoutingDependent(scaled);
  for (const Key4& k : keys) {
    CommAgreement a;
    a.axis = Key(k.axis);
    a.kind = Key(k.kind);
    a.pass = Key(k.pass);
    a.what = Key(k.what);
    const auto m = modeled.find(k);
    const auto c = counted.find(k);
    a.in_model = m != modeled.end();
    a.in_run = c != counted.end();
    a.modeled_sent = a.in_model ? m->second : 0;
    a.measured_sent = a.in_run ? c->second.first : 0;
    a.calls = a.in_run ? c->second.second : 0;
    a.exact = !(IsRoutedBucket(k.what) && (routed || k.what == CommWhat::kMoeCounts));
    a.agrees = !a.exact || a.measured_sent == a.modeled_sent;
    if (!a.in_run && a.modeled_sent == 0) continue;
    out->comm.push_back(a);
  }
}

int64_t WorstOfStage(const SimulationReport& report, int64_t stage, SimCategory c) {
  int64_t m = 0;
  for (const RankMeasurement& r : report.per_rank) {
    if (r.pipeline_rank == stage) m = std::max(m, r.peak_bytes[static_cast<size_t>(c)]);
  }
  return m;
}

MemoryAgreement Row(const std::string& category, int64_t measured, int64_t modeled, double tolerance,
                    const std::string& note = "") {
  MemoryAgreement m;
  m.category = category;
  m.measured = measured;
  m.modeled = modeled;
  m.tolerance = std::max(0.0, tolerance);
  m.note = note;
  if (!note.empty()) {
    m.agrees = true;
  } else if (modeled == 0) {
    m.agrees = measured == 0;
  } else {
    const double rel = std::fabs(static_cast<double>(measured - modeled)) / static_cast<double>(modeled);
    m.agrees = rel <= tolerance;
  }
  return m;
}

/// The allocator's figures (fit's allocated_static_bytes and
/// allocated_peak_bytes, docs/allocated.md): the stage's worst rank beside
/// the estimator's, and the stage's last rank (Megatron logs the last global
/// rank) beside its last-rank figures. The executor runs no library: fit's
/// cuBLAS workspaces leave the modeled figures. Informational rows: the
/// peak holds the executor's optimizer-step and named temporaries, which are
/// not the transients fit prices, and between steps later pipeline stages
/// hold a few hundred bytes less than fit (not yet traced; the executor
/// also keeps no last pipeline input, estimate.cc PipelineInputsKept).
void CompareAllocated(const RankMemory& est, const SimulationReport& report, int64_t stage, StageComparison* out) {
  int64_t worst_static = 0, worst_peak = 0;
  const RankMeasurement* last = nullptr;
  for (const RankMeasurement& r : report.per_rank) {
    if (r.pipeline_rank != stage) continue;
    worst_static = std::max(worst_static, r.allocated_static_bytes);
    worst_peak = std::max(worst_peak, r.allocated_peak_bytes);
    if (last == nullptr || r.rank > last->rank) last = &r;
  }
  if (last == nullptr) return;
  const Bytes unmodeled = est.of(Category::kLibraryWorkspaces);
  const std::string note = "(allocator figure, informational)";
  const auto row = [&](const std::string& name, int64_t measured, Bytes modeled) {
    out->memory.push_back(Row(name, measured, (modeled - unmodeled).count(), 0.0, note));
  };
  row("allocated between steps", worst_static, est.allocated_static);
  row("allocated peak", worst_peak, est.allocated_peak);
  row("allocated between steps, last rank", last->allocated_static_bytes, est.last_rank_allocated_static);
  row("allocated peak, last rank", last->allocated_peak_bytes, est.last_rank_allocated_peak);
}

void CompareMemory(const Recipe& scaled, const RankMemory& est, const SimulationReport& report, StageComparison* out) {
  const int64_t stage = out->pipeline_rank;
  const auto worst = [&](SimCategory c) { return WorstOfStage(report, stage, c); };
  struct Exact {
    SimCategory sim;
    Category model;
  };
  const Exact exact[] = {{SimCategory::kReplicatedParams, Category::kReplicatedParams},
                         {SimCategory::kTpShardedParams, Category::kTpShardedParams},
                         {SimCategory::kEpShardedParams, Category::kEpShardedParams},
                         {SimCategory::kGradients, Category::kGradients},
                         {SimCategory::kOptimizerMuon, Category::kOptimizerMuon},
                         {SimCategory::kOptimizerAdamW, Category::kOptimizerAdamW}};
  // ZeRO 3 keeps the parameters as flat shares that mix the three classes,
  // so the classes are compared as their sum (each row informational).
  const bool zero3 = scaled.parallel.zero >= 3;
  // Megatron's layer-wise optimizer deals whole tensors: the ranks keep
  // unequal Muon and AdamW shares and fit prices the rank with the most state
  // bytes, so the two are compared as one rank's sum.
  const bool layer_wise =
      scaled.parallel.zero == 1 && scaled.parallel.optimizer_sharding == OptimizerSharding::kLayerWise;
  for (const Exact& e : exact) {
    const bool param_class = e.sim == SimCategory::kReplicatedParams || e.sim == SimCategory::kTpShardedParams ||
                             e.sim == SimCategory::kEpShardedParams;
    const bool state = e.sim == SimCategory::kOptimizerMuon || e.sim == SimCategory::kOptimizerAdamW;
    out->memory.push_back(Row(Key(e.sim), worst(e.sim), est.of(e.model).count(), 0.0,
                              zero3 && param_class  ? "(ZeRO 3: compared as the sum below)"
                              : layer_wise && state ? "(layer-wise: compared as one rank's sum below)"
                                                    : ""));
  }
  if (layer_wise) {
    int64_t measured = 0;
    for (const RankMeasurement& r : report.per_rank) {
      if (r.pipeline_rank != stage) continue;
      measured = std::max(measured, r.peak_bytes[static_cast<size_t>(SimCategory::kOptimizerMuon)] +
                                        r.peak_bytes[static_cast<size_t>(SimCategory::kOptimizerAdamW)]);
    }
    const Bytes modeled = est.of(Category::kOptimizerMuon) + est.of(Category::kOptimizerAdamW);
    MemoryAgreement row = Row("optimizer state (one rank's sum)", measured, modeled.count(), 0.0);
    // Expert tensors are dealt over their own group: fit adds the heaviest
    // dense and the heaviest expert member, who may be two ranks (a bound).
    if (std::find(scaled.model.layers.begin(), scaled.model.layers.end(), BlockKind::kMoe) !=
        scaled.model.layers.end()) {
      row.bound = true;
      row.agrees = row.measured <= row.modeled;
    }
    out->memory.push_back(row);
  }
  if (zero3) {
    int64_t measured = 0;
    for (const RankMeasurement& r : report.per_rank) {
      if (r.pipeline_rank != stage) continue;
      int64_t sum = 0;
      for (SimCategory c : {SimCategory::kReplicatedParams, SimCategory::kTpShardedParams, SimCategory::kEpShardedParams}) {
        sum += r.peak_bytes[static_cast<size_t>(c)];
      }
      measured = std::max(measured, sum);
    }
    const Bytes modeled = est.of(Category::kReplicatedParams) + est.of(Category::kTpShardedParams) +
                          est.of(Category::kEpShardedParams);
    out->memory.push_back(Row("params (sum of classes)", measured, modeled.count(), 0.0));
  }
  // Saved activations: the estimator's figure less its one-layer transient
  // (scan workspace, ring buffers), which the executor holds as temporaries.
  // Routing-dependent MoE rows: within the dropless tolerance, or under the
  // capacity bound.
  const auto activation_row = [&](SimCategory c, Bytes modeled, bool bound) {
    MemoryAgreement row = Row(Key(c), worst(c), modeled.count(), 0.0);
    if (RoutingDependent(scaled) && scaled.model.moe.dropless) {
      row = Row(row.category, row.measured, row.modeled, kDroplessActivationTolerance);
    } else if (RoutingDependent(scaled) || bound) {
      row.bound = true;
      row.agrees = row.measured <= row.modeled;
    }
    return row;
  };
  out->memory.push_back(
      activation_row(SimCategory::kActivations, est.of(Category::kActivations) - est.activations_transient, false));
  if (scaled.training.recompute != Recompute::kNone) {
    // What a recompute rerun regenerates in backward beyond the kept
    // tensors, the largest layer's (or group's). The estimator prices a
    // uniform group of recompute_layers as that many of its largest family,
    // and the block method's reruns as the largest family on the rank: bounds
    // when the group mixes families or the block's layers miss one.
    const TrainingConfig& t = scaled.training;
    // Under activation offload the estimator's selective rerun also holds a
    // layer's offloaded groups, which Megatron's bulk_reload brings back one
    // group ahead while a layer's backward runs
    // (fine_grained_activation_offload.py); the executor reloads a layer's
    // groups at its own backward, so it measures at most that: a bound.
    const bool offload_rerun = !t.activation_offload.empty() && t.recompute == Recompute::kSelective;
    const bool bound = offload_rerun || (t.recompute == Recompute::kFull &&
                                         (t.recompute_method == RecomputeMethod::kBlock || t.recompute_layers > 1));
    out->memory.push_back(activation_row(SimCategory::kRecomputed, est.activations_rerun, bound));
  }
  CompareAllocated(est, report, stage, out);
  int64_t in_flight = 0;
  for (const RankMeasurement& r : report.per_rank) {
    if (r.pipeline_rank == stage) in_flight = std::max(in_flight, r.peak_in_flight);
  }
  out->memory.push_back(Row("in-flight micro-batches", in_flight, est.in_flight_microbatches, 0.0));
  out->memory.push_back(Row(Key(SimCategory::kRoutingScratch), worst(SimCategory::kRoutingScratch),
                            est.of(Category::kRoutingScratch).count(), 0.0, "(informational: transient buffers)"));
  // The activation peak split by block family, beside the estimator's split
  // (informational: it locates a disagreement of the total).
  const RankMeasurement* peak_rank = nullptr;
  for (const RankMeasurement& r : report.per_rank) {
    const size_t a = static_cast<size_t>(SimCategory::kActivations);
    if (r.pipeline_rank == stage && (peak_rank == nullptr || r.peak_bytes[a] > peak_rank->peak_bytes[a])) peak_rank = &r;
  }
  if (peak_rank == nullptr) return;
  const auto at_peak = [&](const std::string& owner) {
    const auto it = peak_rank->activations_at_peak.find(owner);
    return it == peak_rank->activations_at_peak.end() ? int64_t{0} : it->second;
  };
  for (BlockKind k : kAllBlockKinds) {
    const std::string owner(1, Letter(k));
    const int64_t modeled = est.activations_by_family[static_cast<size_t>(FamilyIndex(k))].count();
    if (at_peak(owner) == 0 && modeled == 0) continue;
    out->memory.push_back(Row("activations " + owner, at_peak(owner), modeled, 0.0, "(by family, informational)"));
  }
  out->memory.push_back(Row("activations ends", at_peak("ends"), est.activations_ends.count(), 0.0,
                            "(embedding ids, head and loss; informational)"));
}

/// The offloads (optimizer offload_fraction, FSDP's CPU offload, activation
/// offload): host memory against the estimator's `host`, and the bytes copied
/// over the host link in the step against the planner's `host_transfer` and
/// `activation_offload`. Exact; shown only where either side has some.
void CompareHost(const Recipe& scaled, const RankMemory& est, const StageComm& comm, const SimulationReport& report,
                 StageComparison* out) {
  // The routed experts' offloaded rows are the router's choice where the
  // routing is: the rules of the activations row, and informational bytes.
  const OffloadSet offload = scaled.training.activation_offload;
  const bool routed =
      RoutingDependent(scaled) && (offload.has(OffloadModule::kExpertFc1) || offload.has(OffloadModule::kMoeAct));
  int64_t host = 0, copied = 0;
  for (const RankMeasurement& r : report.per_rank) {
    if (r.pipeline_rank != out->pipeline_rank) continue;
    host = std::max(host, r.host_peak_bytes);
    copied = std::max(copied, r.bytes_to_host + r.bytes_to_device);
  }
  if (host > 0 || est.host.count() > 0) {
    MemoryAgreement row = Row("host (offloaded)", host, est.host.count(), 0.0);
    if (routed && scaled.model.moe.dropless) {
      row = Row(row.category, row.measured, row.modeled, kDroplessActivationTolerance);
    } else if (routed) {
      row.bound = true;
      row.agrees = row.measured <= row.modeled;
    }
    out->memory.push_back(row);
  }
  const int64_t modeled = comm.host_transfer.count() + comm.activation_offload.count();
  if (copied > 0 || modeled > 0) {
    CommAgreement a;
    a.axis = "host";
    a.kind = "copy";
    a.pass = "step";
    a.what = "offload";
    a.measured_sent = copied;
    a.modeled_sent = modeled;
    a.exact = !routed;
    a.agrees = !a.exact || a.measured_sent == a.modeled_sent;
    out->comm.push_back(a);
  }
}

}  // namespace

SimComparison CompareWithModels(const Recipe& scaled, const SimulationReport& report, SimPrecision precision) {
  SimComparison out;
  out.tolerance = ToleranceFor(precision);
  out.numerics_ok = NumericsAgree(report, out.tolerance);
  const Inventory inv = BuildInventory(scaled);
  const Layout layout = LayoutOf(scaled);
  const StagePlan stages = SimulatedStages(scaled);
  const PlanTables tables = BuildPlanTables(inv);
  const Mesh mesh = PlaceRanks(layout, scaled.cluster.gpus_per_node, scaled.model.tie_embeddings);
  const std::vector<StageComm> comm = BuildStageComm(inv, tables, layout, stages, mesh.locality, CostModel{});
  for (int64_t s = 0; s < layout.pp; ++s) {
    StageComparison stage;
    stage.pipeline_rank = s;
    CompareComm(scaled, comm.at(static_cast<size_t>(s)), report, &stage);
    const RankMemory est = EstimateRank(inv, layout, stages, s);
    CompareMemory(scaled, est, report, &stage);
    CompareHost(scaled, est, comm.at(static_cast<size_t>(s)), report, &stage);
    out.stages.push_back(std::move(stage));
  }
  if (RoutingDependent(scaled)) {
    out.notes.push_back(
        "EP/ETP buckets are informational: the MoE routing is dropless or unpadded, so the bytes depend on the "
        "router's choices (the planner prices uniform routing); set moe.pad_to_capacity for an exact check");
  }
  return out;
}

}  // namespace preflight

// The agreement check of `preflight simulate` (GUIDE.md 6): counted bytes
// against the planner, measured peaks against the estimator, for the same
// scaled recipe. The executor never calls these models while it runs; this
// file only puts their figures beside its measurements.
//
// Communication: every (axis, kind, pass, what) bucket of the simulated rank
// beside the planner's item for that rank's pipeline stage. Exact (bytes must
// be equal) unless the bytes depend on the routing: the EP/ETP buckets of a
// dropless or unpadded-capacity MoE, where the planner prices uniform routing
// (k*T copies) and the executor moves what its router chose; those rows are
// informational, as is the executor's int64 count exchange ("moe_counts"),
// which the planner does not price. Optimizer-step traffic (parameter
// gathers, Muon) is part 2 of the executor and listed as not compared.
//
// Memory: peak per category over the simulated ranks beside the estimator's
// rank. Parameters and gradients are exact. Activations within
// kActivationTolerance: the executor's saved set follows MATH.md 3.2 but
// keeps rstd in MoE layers, charges logits as a temporary, and in a MoE with
// routing-dependent shapes holds what its router chose, not the estimator's
// uniform (or skewed) expectation; with such MoE routing the tolerance is
// kRoutedActivationTolerance. Routing scratch is informational (transient
// buffers whose lifetimes the estimator models as one peak, MATH.md 5).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "preflight/estimate.h"
#include "preflight/inventory.h"
#include "preflight/layout.h"
#include "preflight/plan.h"
#include "preflight/sim.h"

namespace preflight {
namespace {

constexpr double kActivationTolerance = 0.10;
constexpr double kRoutedActivationTolerance = 0.50;


std::string SimAxis(const std::string& planner_axis) {
  if (planner_axis == Key(Axis::kExpertTp)) return "etp";
  if (planner_axis == Key(Axis::kExpertDp)) return "edp";
  if (planner_axis == Key(Axis::kDpCp)) return "dp";
  return planner_axis;
}
std::string SimPassName(Pass p) {
  switch (p) {
    case Pass::kForward: return Name(SimPass::kForward);
    case Pass::kBackward: return Name(SimPass::kBackward);
    case Pass::kOptimizer: return Name(SimPass::kOptimizer);
  }
  return "?";
}

bool RoutingDependent(const Recipe& r) {
  bool moe = false;
  for (BlockKind k : r.model.layers) moe = moe || k == BlockKind::kMoe;
  return moe && (r.model.moe.dropless || !r.model.moe.pad_to_capacity);
}


/// Optimizer-pass buckets the executor runs in part 1: gradient reductions.

bool IsRoutedBucket(const std::string& what) {
  return what == "moe_dispatch" || what == "moe_combine" || what == "moe_experts" || what == "moe_counts";
}

/// Optimizer-pass buckets the executor runs in part 1: gradient reductions.
bool IsGradSync(const std::string& what) {
  return what == "grads" || what == "expert_grads" || what == "replicated_grads";
}

using Key4 = std::tuple<std::string, std::string, std::string, std::string>;  // axis, kind, pass, what

void CompareComm(const Recipe& scaled, const Inventory& inv, const Layout& layout, const StagePlan& stages,
                 const RankMeasurement& measured, SimComparison* out) {
  const PlanTables tables = BuildPlanTables(inv);
  const Mesh mesh = PlaceRanks(layout, scaled.cluster.gpus_per_node, scaled.model.tie_embeddings);
  const std::vector<StageComm> comm = BuildStageComm(inv, tables, layout, stages, mesh.locality, CostModel{});
  std::map<Key4, int64_t> modeled;
  std::set<std::string> skipped;
  for (const CommItem& item : comm.at(0).items) {
    if (item.send.count() == 0) continue;
    const std::string pass = SimPassName(item.pass);
    const std::string what(item.what);
    if (item.pass == Pass::kOptimizer && !IsGradSync(what)) {
      skipped.insert(what);
      continue;
    }
    modeled[{SimAxis(Key(item.axis)), Key(item.kind), pass, what}] += item.send.count();
  }
  std::map<Key4, std::pair<int64_t, int64_t>> counted;  // sent, calls
  for (const CommCount& c : measured.comm) {
    auto& slot = counted[{c.axis, Name(c.kind), Name(c.pass), c.what}];
    slot.first += c.bytes_sent;
    slot.second += c.calls;
  }
  std::set<Key4> keys;
  for (const auto& [k, v] : modeled) keys.insert(k);
  for (const auto& [k, v] : counted) keys.insert(k);
  const bool routed = RoutingDependent(scaled);
  for (const Key4& k : keys) {
    CommAgreement a;
    std::tie(a.axis, a.kind, a.pass, a.what) = k;
    const auto m = modeled.find(k);
    const auto c = counted.find(k);
    a.in_model = m != modeled.end();
    a.in_run = c != counted.end();
    a.modeled_sent = a.in_model ? m->second : 0;
    a.measured_sent = a.in_run ? c->second.first : 0;
    a.calls = a.in_run ? c->second.second : 0;
    a.exact = !(IsRoutedBucket(a.what) && (routed || a.what == "moe_counts"));
    a.agrees = !a.exact || a.measured_sent == a.modeled_sent;
    if (!a.in_run && a.modeled_sent == 0) continue;
    out->comm.push_back(a);
  }
  for (const std::string& what : skipped) {
    out->notes.push_back("planner bucket '" + what + "' (optimizer step) not compared: the executor's optimizers are part 2");
  }
  if (routed) {
    out->notes.push_back(
        "EP/ETP buckets are informational: the MoE routing is dropless or unpadded, so the bytes depend on the "
        "router's choices (the planner prices uniform routing); set moe.pad_to_capacity for an exact check");
  }
}

void CompareMemory(const Recipe& scaled, const Inventory& inv, const Layout& layout, const StagePlan& stages,
                   const SimulationReport& report, SimComparison* out) {
  const RankMemory est = EstimateRank(inv, layout, stages, 0);
  const auto worst = [&](SimCategory c) {
    int64_t m = 0;
    for (const RankMeasurement& r : report.per_rank) m = std::max(m, r.peak_bytes[static_cast<size_t>(c)]);
    return m;
  };
  struct Row {
    SimCategory sim;
    Category model;
    double tolerance;  // < 0: informational
    const char* note;
  };
  const double act_tol = RoutingDependent(scaled) ? kRoutedActivationTolerance : kActivationTolerance;
  const Row rows[] = {
      {SimCategory::kReplicatedParams, Category::kReplicatedParams, 0.0, ""},
      {SimCategory::kTpShardedParams, Category::kTpShardedParams, 0.0, ""},
      {SimCategory::kEpShardedParams, Category::kEpShardedParams, 0.0, ""},
      {SimCategory::kGradients, Category::kGradients, 0.0, ""},
      {SimCategory::kActivations, Category::kActivations, act_tol, ""},
      {SimCategory::kRoutingScratch, Category::kRoutingScratch, -1.0, "(informational: transient buffers)"},
  };
  for (const Row& row : rows) {
    MemoryAgreement m;
    m.category = Key(row.sim);
    m.measured = worst(row.sim);
    m.modeled = est.of(row.model).count();
    m.tolerance = std::max(0.0, row.tolerance);
    m.note = row.note;
    if (row.tolerance < 0) {
      m.agrees = true;
    } else if (m.modeled == 0) {
      m.agrees = m.measured == 0;
    } else {
      const double rel = std::fabs(static_cast<double>(m.measured - m.modeled)) / static_cast<double>(m.modeled);
      m.agrees = rel <= row.tolerance;
    }
    out->memory.push_back(m);
  }
  // The activation peak split by block family, beside the estimator's split
  // (informational: it locates a disagreement of the total).
  const RankMeasurement* peak_rank = &report.per_rank.front();
  for (const RankMeasurement& r : report.per_rank) {
    const size_t a = static_cast<size_t>(SimCategory::kActivations);
    if (r.peak_bytes[a] > peak_rank->peak_bytes[a]) peak_rank = &r;
  }
  for (BlockKind k : kAllBlockKinds) {
    const std::string owner(1, Letter(k));
    const auto it = peak_rank->activations_at_peak.find(owner);
    const int64_t modeled = est.activations_by_family[static_cast<size_t>(FamilyIndex(k))].count();
    if (it == peak_rank->activations_at_peak.end() && modeled == 0) continue;
    MemoryAgreement m;
    m.category = "activations " + owner;
    m.measured = it == peak_rank->activations_at_peak.end() ? 0 : it->second;
    m.modeled = modeled;
    m.note = "(by family, informational)";
    out->memory.push_back(m);
  }
  const auto ends = peak_rank->activations_at_peak.find("ends");
  MemoryAgreement m;
  m.category = "activations ends";
  m.measured = ends == peak_rank->activations_at_peak.end() ? 0 : ends->second;
  m.modeled = est.activations_ends.count();
  m.note = "(embedding ids, head and loss; informational)";
  out->memory.push_back(m);
  out->notes.push_back("optimizer state not compared: the executor's optimizers are part 2");
}

}  // namespace

SimComparison CompareWithModels(const Recipe& scaled, const SimulationReport& report, SimPrecision precision,
                                int64_t rank) {
  SimComparison out;
  out.tolerance = ToleranceFor(precision);
  out.numerics_ok = NumericsAgree(report, out.tolerance);
  out.compared_rank = rank;
  const Inventory inv = BuildInventory(scaled);
  const Layout layout = LayoutOf(scaled);
  const StagePlan stages = EqualStagePlan(static_cast<int64_t>(scaled.model.layers.size()), 1, 1);
  CompareComm(scaled, inv, layout, stages, report.per_rank.at(static_cast<size_t>(rank)), &out);
  CompareMemory(scaled, inv, layout, stages, report, &out);
  return out;
}

}  // namespace preflight

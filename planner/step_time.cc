// Step time: compute at an achievable fraction of peak, exposed
// communication under the overlap rules of docs/plan.md, and the pipeline
// bubble of the schedule (MATH.md 4.2, 7.1).
#include <algorithm>

#include "internal.h"

namespace preflight {

using planner_internal::AchievableFlops;
using planner_internal::ChunkCompute;
using planner_internal::ChunksOn;
using planner_internal::ComputeOf;
using planner_internal::RankChunk;

double BubbleFraction(Schedule schedule, int64_t p, int64_t v, int64_t m) {
  const double pp = static_cast<double>(p);
  const double mm = static_cast<double>(m);
  switch (schedule) {
    case Schedule::k1F1B: return (pp - 1.0) / (mm + pp - 1.0);
    case Schedule::kInterleaved: return (pp - 1.0) / (static_cast<double>(v) * mm + pp - 1.0);
    case Schedule::kDualPipe:
    case Schedule::kDualPipeV: {
      // (p/2-1)(F&B + B - 3W) with F&B = F+B, B = 2F, W = B/2: (p/2-1)*2F,
      // against m(F+B) = 3mF of work.
      const double bubble = (pp / 2.0 - 1.0) * 2.0;
      return bubble / (3.0 * mm + bubble);
    }
  }
  return 0.0;
}

namespace {

bool IsGradSync(const CommItem& i) {
  return i.pass == Pass::kOptimizer && (i.what == CommWhat::kGrads || i.what == CommWhat::kExpertGrads);
}
bool IsParamGather(const CommItem& i) {
  return i.pass == Pass::kOptimizer && (i.what == CommWhat::kParams || i.what == CommWhat::kExpertParams);
}
// ZeRO 2/3 traffic issued unit by unit in every micro-batch: the parameter
// gathers (ZeRO 3, forward and backward) and the gradient reductions after
// each unit's backward (the DP reduce-scatters, the SP all-reduce over TP).
bool IsPerUnit(const CommItem& i) {
  if (i.pass == Pass::kOptimizer) return false;
  if (i.what == CommWhat::kParams || i.what == CommWhat::kExpertParams) return true;
  return i.pass == Pass::kBackward && (i.what == CommWhat::kGrads || i.what == CommWhat::kExpertGrads || i.what == CommWhat::kReplicatedGrads);
}

// Time of one gradient bucket on the item's group: the part of the reduce
// that runs after the last backward and cannot hide (Megatron overlap_grad_reduce).
double BucketSeconds(const CommItem& i, const Inventory& inv, const CostModel& cost) {
  const int64_t elements = i.payload.count() / std::max<int64_t>(1, SizeOf(inv.recipe.training.precision.grads));
  if (elements <= cost.dp_bucket_elements || i.calls == 0) return i.seconds;
  return i.seconds * static_cast<double>(cost.dp_bucket_elements) / static_cast<double>(elements);
}

// Spreads `exposed` over `items` in proportion to their seconds.
void Distribute(std::vector<CommItem*>& items, double exposed) {
  double total = 0;
  for (const CommItem* i : items) total += i->seconds;
  for (CommItem* i : items) i->exposed_seconds = total > 0 ? exposed * i->seconds / total : 0.0;
}

}  // namespace

StepTime EstimateStepTime(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                          std::vector<StageComm>* comm, const CostModel& cost) {
  StepTime st;
  const bool dual = l.schedule == Schedule::kDualPipe || l.schedule == Schedule::kDualPipeV;
  const double peak = AchievableFlops(inv, cost);
  const int64_t m = l.micro_batches;
  double max_chunk_f = 0, max_chunk_b = 0;
  std::vector<double> tails(static_cast<size_t>(l.pp), 0.0);
  std::vector<std::array<double, kNumAxes>> by_axis(static_cast<size_t>(l.pp));
  std::vector<double> busy(static_cast<size_t>(l.pp), 0.0);
  double one_p2p_s = 0;

  for (int64_t r = 0; r < l.pp; ++r) {
    StageTime stage;
    stage.pipeline_rank = r;
    // Per step on this rank: compute of every chunk times its micro-batches.
    double fwd_step = 0, bwd_step = 0, re_step = 0, core_fwd_step = 0, muon_flops = 0;
    for (const RankChunk& c : ChunksOn(stages, l, r)) {
      const ChunkCompute cc = ComputeOf(inv, t, l, c.range, cost);
      const double mb = static_cast<double>(c.microbatches);
      fwd_step += mb * cc.forward_s;
      bwd_step += mb * cc.backward_s;
      re_step += mb * cc.recompute_s;
      core_fwd_step += mb * cc.attention_core_fwd_s;
      max_chunk_f = std::max(max_chunk_f, cc.forward_s);
      max_chunk_b = std::max(max_chunk_b, cc.backward_s + cc.recompute_s);
      // Newton-Schulz on full matrices, redundantly on every DP rank
      // (Moonshot Distributed Muon + TP duplicated): dense matrices of the
      // chunk and the rank's E/e experts.
      const size_t a = static_cast<size_t>(c.range.first_layer), b = static_cast<size_t>(c.range.end_layer);
      muon_flops += t.muon_ns_dense_flops_prefix[b] - t.muon_ns_dense_flops_prefix[a] +
                    (t.muon_ns_expert_flops_prefix[b] - t.muon_ns_expert_flops_prefix[a]) / static_cast<double>(l.ep);
    }
    const double compute_step = fwd_step + bwd_step + re_step;
    double exposed_in_pipeline = 0;  // TP + CP + EP exposed, per step
    std::vector<CommItem*> grads, gathers;
    double grads_bucket = 0, gathers_bucket = 0, opt_other = 0;
    std::array<std::vector<CommItem*>, 2> per_unit;  // [forward, backward]
    double ep_s = 0;
    std::vector<CommItem*> ep_items;
    auto& axis_acc = by_axis[static_cast<size_t>(r)];
    for (CommItem& i : (*comm)[static_cast<size_t>(r)].items) {
      if (i.axis == Axis::kPp) {
        // Steady-state p2p hides under compute; the fill/drain path is
        // charged to the bubble below.
        i.exposed_seconds = 0;
        one_p2p_s = std::max(one_p2p_s, i.calls > 0 ? i.seconds / static_cast<double>(i.calls) : 0.0);
        continue;
      }
      if (i.axis == Axis::kCp && i.kind == Collective::kSendRecv && i.what == CommWhat::kAttentionKv) {
        // The causal p2p ring overlaps each KV step with the attention
        // core; only the excess is exposed. (The M/R state hand-off is a
        // chain with nothing to hide under: fully exposed, priced in comm.cc.)
        const double window = i.pass == Pass::kForward ? core_fwd_step : 2.0 * core_fwd_step;
        i.exposed_seconds = std::max(0.0, i.seconds - window);
      } else if (IsGradSync(i)) {
        grads.push_back(&i);
        grads_bucket = std::max(grads_bucket, BucketSeconds(i, inv, cost));
        continue;
      } else if (IsParamGather(i)) {
        gathers.push_back(&i);
        gathers_bucket = std::max(gathers_bucket, BucketSeconds(i, inv, cost));
        continue;
      } else if (IsPerUnit(i)) {
        per_unit[i.pass == Pass::kForward ? 0 : 1].push_back(&i);
        continue;
      } else if (dual && (i.axis == Axis::kEp || i.axis == Axis::kExpertTp)) {
        ep_items.push_back(&i);
        ep_s += i.seconds;
        continue;
      }
      if (i.pass == Pass::kOptimizer) {
        opt_other += i.exposed_seconds;
      } else {
        exposed_in_pipeline += i.exposed_seconds;
      }
      axis_acc[static_cast<size_t>(i.axis)] += i.exposed_seconds;
    }
    // DualPipe overlaps one direction's EP all-to-alls with the other's compute.
    if (!ep_items.empty()) {
      const double ep_exposed = std::max(0.0, ep_s - compute_step);
      Distribute(ep_items, ep_exposed);
      exposed_in_pipeline += ep_exposed;
      for (const CommItem* i : ep_items) axis_acc[static_cast<size_t>(i->axis)] += i->exposed_seconds;
    }
    // ZeRO 2/3 unit by unit, as DeepSpeed (overlap_comm) and FSDP run it: a
    // pass's collectives run on their own stream beside the pass's compute,
    // a gather prefetched one unit ahead, a unit's reduce during the next
    // unit's backward. Exposed: what exceeds the pass's compute, and at least
    // what waits for nothing to hide under (each chunk's first gather and last
    // reduce in every micro-batch: CommItem::unhidden_seconds).
    const double windows[2] = {fwd_step, bwd_step + re_step};
    for (size_t pass = 0; pass < 2; ++pass) {
      if (per_unit[pass].empty()) continue;
      double total = 0, floor = 0;
      for (const CommItem* i : per_unit[pass]) {
        total += i->seconds;
        floor += i->unhidden_seconds;
      }
      const double e = std::max(floor, total - windows[pass]);
      Distribute(per_unit[pass], e);
      exposed_in_pipeline += e;
      for (const CommItem* i : per_unit[pass]) axis_acc[static_cast<size_t>(i->axis)] += i->exposed_seconds;
    }
    // Gradient reduce overlaps the last micro-batch's backward except the
    // last bucket; the parameter gather overlaps the next step's forward
    // except the first bucket (Megatron overlap_grad_reduce / overlap_param_gather).
    const double mbs = static_cast<double>(std::max<int64_t>(1, l.schedule == Schedule::kDualPipe ? m / 2 : m));
    double dp_exposed = 0;
    if (!grads.empty()) {
      double total = 0;
      for (const CommItem* i : grads) total += i->seconds;
      const double e = std::max(grads_bucket, total - bwd_step / mbs);
      Distribute(grads, e);
      dp_exposed += e;
    }
    if (!gathers.empty()) {
      double total = 0;
      for (const CommItem* i : gathers) total += i->seconds;
      const double e = std::max(gathers_bucket, total - fwd_step / mbs);
      Distribute(gathers, e);
      dp_exposed += e;
    }
    for (const CommItem* i : grads) axis_acc[static_cast<size_t>(i->axis)] += i->exposed_seconds;
    for (const CommItem* i : gathers) axis_acc[static_cast<size_t>(i->axis)] += i->exposed_seconds;

    const double per_mb = static_cast<double>(std::max<int64_t>(1, m));
    stage.forward_s = fwd_step / per_mb;
    stage.backward_s = bwd_step / per_mb;
    stage.recompute_s = re_step / per_mb;
    stage.exposed_comm_s = exposed_in_pipeline / per_mb;
    busy[static_cast<size_t>(r)] = compute_step + exposed_in_pipeline;
    tails[static_cast<size_t>(r)] = dp_exposed + opt_other + muon_flops / peak;
    st.dp_exposed_s = std::max(st.dp_exposed_s, dp_exposed);
    st.optimizer_s = std::max(st.optimizer_s, opt_other + muon_flops / peak);
    st.stages.push_back(stage);
  }

  // Steady state: the busiest rank sets the pace.
  for (int64_t r = 0; r < l.pp; ++r) {
    if (busy[static_cast<size_t>(r)] > busy[static_cast<size_t>(st.slowest_stage)]) st.slowest_stage = r;
  }
  st.steady_s = busy[static_cast<size_t>(st.slowest_stage)];
  const int64_t n_chunks = static_cast<int64_t>(stages.chunks.size());
  const double p = static_cast<double>(l.pp);
  double bubble = 0;
  if (l.pp > 1) {
    if (dual) {
      // (p/2-1)(F&B + B - 3W) with F&B = F + B and W = B/2 [OURS] (MATH.md 4.2).
      bubble = (p / 2.0 - 1.0) * (max_chunk_f + 0.5 * max_chunk_b);
    } else {
      // (p-1)/v micro-batch times of the slowest stage (MATH.md 4.2).
      bubble = (p - 1.0) / static_cast<double>(l.vpp) * st.steady_s / static_cast<double>(std::max<int64_t>(1, m));
    }
    // The first micro-batch's activations and the last one's gradients cross
    // every chunk boundary once with nothing to hide under.
    const double fill = 2.0 * static_cast<double>(n_chunks - 1) * one_p2p_s;
    bubble += fill;
    for (auto& a : by_axis) a[static_cast<size_t>(Axis::kPp)] = fill;
  }
  st.bubble_s = bubble;
  double tail = 0;
  for (double x : tails) tail = std::max(tail, x);
  st.step_s = st.steady_s + st.bubble_s + tail;
  st.bubble_fraction = st.step_s > 0 ? st.bubble_s / st.step_s : 0.0;
  st.exposed_by_axis = by_axis[static_cast<size_t>(st.slowest_stage)];

  // Model FLOPs (no recompute): 3x forward per token over the global batch.
  const double seq = static_cast<double>(inv.recipe.training.seq_len);
  double per_token = 3.0 * t.head_flops;
  const auto& all = t.family_count_prefix.back();
  for (size_t f = 0; f < 5; ++f) {
    const FamilyCost& fc = t.family[f];
    per_token += 3.0 * static_cast<double>(all[f]) * (fc.matmul_flops + fc.scan_flops + fc.flops_per_token_per_seq * seq);
  }
  const double tokens = seq * static_cast<double>(l.micro_batch) * static_cast<double>(m) * static_cast<double>(l.dp);
  st.model_flops = per_token * tokens;
  if (st.step_s > 0) {
    st.tokens_per_s = tokens / st.step_s;
    const double raw_peak = inv.recipe.cluster.spec.bf16_dense_tflops * 1e12;
    st.mfu = st.model_flops / (st.step_s * static_cast<double>(l.world()) * raw_peak);
  }
  return st;
}

}  // namespace preflight

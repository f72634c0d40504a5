// Step time: compute at an achievable fraction of peak, exposed
// communication under the overlap rules of docs/plan.md, and the pipeline
// bubble of the schedule (docs/formulas.md §4.2, 7.1).
#include <algorithm>

#include "internal.h"

namespace preflight {

using planner_internal::BlockRecomputeEnd;
using planner_internal::ChunkCompute;
using planner_internal::ChunkCounts;
using planner_internal::ComputeOf;
using planner_internal::ParamsOf;
using planner_internal::RankChunk;
using planner_internal::RankCompute;

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
  return i.pass == Pass::kBackward &&
         (i.what == CommWhat::kGrads || i.what == CommWhat::kExpertGrads || i.what == CommWhat::kReplicatedGrads);
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

// Elements of chunk `c` the rank's optimizer updates: its shard of the
// dense (replicated and TP-sharded) and expert parameters, [0] without ZeRO
// and [1] under it, less the share offloaded to the host.
std::array<double, 2> OptimizerElements(const Inventory& inv, const PlanTables& t, const Layout& l,
                                        const StageChunk& c) {
  const ParamTotals p = ParamsOf(t, c.first_layer, c.end_layer);
  double dense = static_cast<double>(p.of(ShardClass::kReplicated)) +
                 static_cast<double>(p.of(ShardClass::kTpSharded)) / static_cast<double>(l.tp);
  double expert = static_cast<double>(p.of(ShardClass::kEpSharded)) / static_cast<double>(l.ep * l.expert_tp);
  if (c.owns_embedding) dense += static_cast<double>(t.embedding_params) / static_cast<double>(l.tp);
  if (c.owns_head) {
    dense += static_cast<double>(t.head_params + t.mtp_params) / static_cast<double>(l.tp) +
             static_cast<double>(t.final_norm_params);
  }
  const double kept = 1.0 - inv.recipe.training.optimizer.offload_fraction;
  return {(dense + expert) * kept,
          (dense / static_cast<double>(l.zero_group()) + expert / static_cast<double>(l.expert_zero_group())) * kept};
}

// Full recompute's block method reruns only the first n framework layers of
// a chunk (Megatron recompute.py): the rest of the chunk's rerun is removed.
void KeepBlockRecompute(const Inventory& inv, const PlanTables& t, const ComputeTimes& times, const StageChunk& range,
                        int64_t n, ChunkCompute* cc) {
  StageChunk rest = range;
  rest.first_layer = BlockRecomputeEnd(inv, range, n);
  rest.owns_head = false;
  const auto counts = ChunkCounts(t, rest);
  for (size_t f = 0; f < 5; ++f) {
    const LayerSeconds& ls = times.family[f];
    const double k = static_cast<double>(counts[f]);
    cc->recompute_s -= k * ls.recompute.total();
    cc->gemm_backward_s -= k * ls.recompute.gemm;
    cc->by_family_s[f] -= k * ls.recompute.total();
  }
}

RankCompute ComputeOnRank(const Inventory& inv, const PlanTables& t, const ComputeTimes& times, const Layout& l,
                          std::span<const RankChunk> chunks) {
  RankCompute out;
  const TrainingConfig& tr = inv.recipe.training;
  const bool block = l.recompute == Recompute::kFull && tr.recompute_method == RecomputeMethod::kBlock;
  for (const RankChunk& c : chunks) {
    ChunkCompute cc = ComputeOf(times, t, c.range);
    if (block) KeepBlockRecompute(inv, t, times, c.range, tr.recompute_layers, &cc);
    const double mb = static_cast<double>(c.microbatches);
    for (size_t f = 0; f < 5; ++f) out.by_family_s[f] += mb * cc.by_family_s[f];
    out.head_s += mb * cc.head_s;
    const std::array<double, 2> elements = OptimizerElements(inv, t, l, c.range);
    for (size_t z = 0; z < 2; ++z) out.optimizer_elements[z] += elements[z];
    out.forward_s += mb * cc.forward_s;
    out.backward_s += mb * cc.backward_s;
    out.recompute_s += mb * cc.recompute_s;
    out.attention_core_forward_s += mb * cc.attention_core_fwd_s;
    out.gemm_forward_s += mb * cc.gemm_forward_s;
    out.gemm_backward_s += mb * cc.gemm_backward_s;
    out.max_chunk_forward_s = std::max(out.max_chunk_forward_s, cc.forward_s);
    out.max_chunk_backward_s = std::max(out.max_chunk_backward_s, cc.backward_s + cc.recompute_s);
    // Newton-Schulz on full matrices, redundantly on every DP rank
    // (Moonshot Distributed Muon + TP duplicated): dense matrices of the
    // chunk and the rank's E/e experts.
    const size_t a = static_cast<size_t>(c.range.first_layer), b = static_cast<size_t>(c.range.end_layer);
    out.muon_flops += t.muon_ns_dense_flops_prefix[b] - t.muon_ns_dense_flops_prefix[a] +
                      (t.muon_ns_expert_flops_prefix[b] - t.muon_ns_expert_flops_prefix[a]) / static_cast<double>(l.ep);
  }
  return out;
}

/// One pipeline rank's communication after the overlap rules: what stays
/// exposed inside the pipeline (per step), in the data-parallel tail and in
/// the optimizer, per axis.
struct RankExposure {
  double in_pipeline_s = 0;  // TP + CP + EP (+ ZeRO 2/3 per-unit traffic)
  double dp_tail_s = 0;      // gradient reduce + parameter gather not hidden
  double optimizer_s = 0;    // optimizer-pass collectives
  double one_p2p_s = 0;      // one pipeline send, for the fill/drain path
  std::array<double, kNumAxes> by_axis{};
};

/// Items that overlap as a group, sorted out of a rank's items by the first
/// pass of ExposeRank.
struct OverlapGroups {
  std::vector<CommItem*> grads, gathers;
  double grads_bucket = 0, gathers_bucket = 0;
  std::array<std::vector<CommItem*>, 2> per_unit;  // [forward, backward]
  std::array<std::vector<CommItem*>, 2> tp;        // --tp-comm-overlap's TP collectives [forward, backward]
  std::vector<CommItem*> ep;  // EP all-to-alls under DualPipe or --overlap-moe-expert-parallel-comm
  double ep_s = 0;
  /// Empties the groups, keeping their storage for the next rank.
  void Clear() {
    for (auto* v : {&grads, &gathers, &per_unit[0], &per_unit[1], &tp[0], &tp[1], &ep}) v->clear();
    grads_bucket = gathers_bucket = ep_s = 0;
  }
};

/// ZeRO 2/3 unit by unit, as DeepSpeed (overlap_comm) and FSDP run it: a
/// pass's collectives run on their own stream beside the pass's compute, a
/// gather prefetched one unit ahead, a unit's reduce during the next unit's
/// backward. Exposed: what exceeds the pass's compute, and at least what waits
/// for nothing to hide under (each chunk's first gather and last reduce in
/// every micro-batch: CommItem::unhidden_seconds).
void ExposePerUnit(std::array<std::vector<CommItem*>, 2>& per_unit, const RankCompute& rc, RankExposure& out) {
  const double windows[2] = {rc.forward_s, rc.backward_s + rc.recompute_s};
  for (size_t pass = 0; pass < 2; ++pass) {
    if (per_unit[pass].empty()) continue;
    double total = 0, floor = 0;
    for (const CommItem* i : per_unit[pass]) {
      total += i->seconds;
      floor += i->unhidden_seconds;
    }
    const double e = std::max(floor, total - windows[pass]);
    Distribute(per_unit[pass], e);
    out.in_pipeline_s += e;
    for (const CommItem* i : per_unit[pass]) out.by_axis[static_cast<size_t>(i->axis)] += i->exposed_seconds;
  }
}

/// Exposes the part of `items` that runs past `window_s`, and at least one
/// bucket's time `bucket_s`; returns it.
double ExposeTail(std::vector<CommItem*>& items, double bucket_s, double window_s) {
  if (items.empty()) return 0;
  double total = 0;
  for (const CommItem* i : items) total += i->seconds;
  const double e = std::max(bucket_s, total - window_s);
  Distribute(items, e);
  return e;
}

/// Gradient reduce overlaps the last micro-batch's backward except the last
/// bucket; the parameter gather overlaps the next step's forward except the
/// first bucket (Megatron overlap_grad_reduce / overlap_param_gather).
/// Without the overlap flags (Megatron's default) both run whole after the
/// last backward.
void ExposeDataParallel(OverlapGroups& g, const RankCompute& rc, const Layout& l, const Overlap& o, RankExposure& out) {
  const int64_t m = l.micro_batches;
  const double mbs = static_cast<double>(std::max<int64_t>(1, l.schedule == Schedule::kDualPipe ? m / 2 : m));
  out.dp_tail_s += ExposeTail(g.grads, g.grads_bucket, o.grad_reduce ? rc.backward_s / mbs : 0.0);
  out.dp_tail_s += ExposeTail(g.gathers, g.gathers_bucket, o.param_gather ? rc.forward_s / mbs : 0.0);
  for (const CommItem* i : g.grads) out.by_axis[static_cast<size_t>(i->axis)] += i->exposed_seconds;
  for (const CommItem* i : g.gathers) out.by_axis[static_cast<size_t>(i->axis)] += i->exposed_seconds;
}

/// Sets every item's exposed_seconds on pipeline rank r and sums them; `g` is
/// scratch, emptied first.
RankExposure ExposeRank(std::vector<CommItem>& items, const RankCompute& rc, const Inventory& inv, const Layout& l,
                        const CostModel& cost, OverlapGroups& g) {
  const Overlap overlap = OverlapOf(inv.recipe, l);
  RankExposure out;
  g.Clear();
  for (CommItem& i : items) {
    if (i.axis == Axis::kPp) {
      // Steady-state p2p hides under compute; the fill/drain path is
      // charged to the bubble.
      i.exposed_seconds = 0;
      out.one_p2p_s = std::max(out.one_p2p_s, i.calls > 0 ? i.seconds / static_cast<double>(i.calls) : 0.0);
      continue;
    }
    if (i.axis == Axis::kCp && i.kind == Collective::kSendRecv && i.what == CommWhat::kAttentionKv) {
      // The causal p2p ring overlaps each KV step with the attention
      // core; only the excess is exposed. (The M/R state hand-off is a
      // chain with nothing to hide under: fully exposed, priced in comm.cc.)
      const double window = i.pass == Pass::kForward ? rc.attention_core_forward_s : 2.0 * rc.attention_core_forward_s;
      i.exposed_seconds = std::max(0.0, i.seconds - window);
    } else if (IsGradSync(i)) {
      g.grads.push_back(&i);
      g.grads_bucket = std::max(g.grads_bucket, BucketSeconds(i, inv, cost));
      continue;
    } else if (IsParamGather(i)) {
      g.gathers.push_back(&i);
      g.gathers_bucket = std::max(g.gathers_bucket, BucketSeconds(i, inv, cost));
      continue;
    } else if (IsPerUnit(i)) {
      g.per_unit[i.pass == Pass::kForward ? 0 : 1].push_back(&i);
      continue;
    } else if (overlap.ep && (i.axis == Axis::kEp || i.axis == Axis::kExpertTp)) {
      g.ep.push_back(&i);
      g.ep_s += i.seconds;
      continue;
    } else if (overlap.tp && i.axis == Axis::kTp && i.pass != Pass::kOptimizer) {
      g.tp[i.pass == Pass::kForward ? 0 : 1].push_back(&i);
      continue;
    } else {
      // Nothing hides it. Set, not assumed, so that the items of one layout
      // can be exposed again under another recompute policy (sweeps).
      i.exposed_seconds = i.seconds;
    }
    if (i.pass == Pass::kOptimizer) {
      out.optimizer_s += i.exposed_seconds;
    } else {
      out.in_pipeline_s += i.exposed_seconds;
    }
    out.by_axis[static_cast<size_t>(i.axis)] += i.exposed_seconds;
  }
  // TE userbuffers: each TP all-gather / reduce-scatter runs under the GEMM
  // beside it; what exceeds the pass's GEMM time stays exposed.
  const double gemm_windows[2] = {rc.gemm_forward_s, rc.gemm_backward_s};
  for (size_t pass = 0; pass < 2; ++pass) {
    double total = 0;
    for (const CommItem* i : g.tp[pass]) total += i->seconds;
    const double e = std::max(0.0, total - gemm_windows[pass]);
    Distribute(g.tp[pass], e);
    out.in_pipeline_s += e;
    for (const CommItem* i : g.tp[pass]) out.by_axis[static_cast<size_t>(i->axis)] += i->exposed_seconds;
  }
  // DualPipe, and Megatron's EP overlap, run one micro-batch's EP all-to-alls
  // under another's compute.
  if (!g.ep.empty()) {
    const double ep_exposed = std::max(0.0, g.ep_s - rc.total_s());
    Distribute(g.ep, ep_exposed);
    out.in_pipeline_s += ep_exposed;
    for (const CommItem* i : g.ep) out.by_axis[static_cast<size_t>(i->axis)] += i->exposed_seconds;
  }
  ExposePerUnit(g.per_unit, rc, out);
  ExposeDataParallel(g, rc, l, overlap, out);
  return out;
}

/// The schedule's bubble: DualPipe's from the largest chunk's F and B, the
/// others (p-1)/v micro-batch times of the slowest stage, plus the pipeline
/// sends of the fill and drain path, which nothing hides.
double PipelineBubble(const Layout& l, const StagePlan& stages, double steady_s, double max_chunk_forward_s,
                      double max_chunk_backward_s, double one_p2p_s, double* fill_s) {
  *fill_s = 0;
  if (l.pp <= 1) return 0;
  const bool dual = l.schedule == Schedule::kDualPipe || l.schedule == Schedule::kDualPipeV;
  const double p = static_cast<double>(l.pp);
  double bubble = 0;
  if (dual) {
    // (p/2-1)(F&B + B - 3W) with F&B = F + B and W = B/2 [OURS] (docs/formulas.md §4.2).
    bubble = (p / 2.0 - 1.0) * (max_chunk_forward_s + 0.5 * max_chunk_backward_s);
  } else {
    // (p-1)/v micro-batch times of the slowest stage (docs/formulas.md §4.2).
    bubble =
        (p - 1.0) / static_cast<double>(l.vpp) * steady_s / static_cast<double>(std::max<int64_t>(1, l.micro_batches));
  }
  // The first micro-batch's activations and the last one's gradients cross
  // every chunk boundary once with nothing to hide under.
  const int64_t n_chunks = static_cast<int64_t>(stages.chunks.size());
  *fill_s = 2.0 * static_cast<double>(n_chunks - 1) * one_p2p_s;
  return bubble + *fill_s;
}

/// Model FLOPs (no recompute: 3x forward per token over the global batch),
/// tokens per second and MFU against the raw dense bf16 peak.
void SetThroughput(const Inventory& inv, const PlanTables& t, const Layout& l, StepTime& st) {
  const double seq = static_cast<double>(inv.recipe.training.seq_len);
  double per_token = 3.0 * (t.head_flops + t.mtp_extra_flops);
  const auto& all = t.family_count_prefix.back();
  for (size_t f = 0; f < 5; ++f) {
    const FamilyCost& fc = t.family[f];
    per_token += 3.0 * static_cast<double>(all[f] + t.mtp_counts[f]) *
                 (fc.matmul_flops + fc.scan_flops + fc.flops_per_token_per_seq * seq);
  }
  const double tokens =
      seq * static_cast<double>(l.micro_batch) * static_cast<double>(l.micro_batches) * static_cast<double>(l.dp);
  st.model_flops = per_token * tokens;
  if (st.step_s > 0) {
    st.tokens_per_s = tokens / st.step_s;
    const double raw_peak = inv.recipe.cluster.spec.bf16_dense_tflops * 1e12;
    st.mfu = st.model_flops / (st.step_s * static_cast<double>(l.world()) * raw_peak);
  }
}

}  // namespace

Overlap OverlapOf(const Recipe& r, const Layout& l) {
  const ParallelConfig& p = r.parallel;
  const bool dual = l.schedule == Schedule::kDualPipe || l.schedule == Schedule::kDualPipeV;
  Overlap o;
  o.grad_reduce = p.overlap_grad_reduce;
  o.param_gather = p.overlap_param_gather && p.overlap_grad_reduce;
  o.tp = p.tp_comm_overlap && l.sequence_parallel();
  o.ep = dual || (p.ep_comm_overlap && l.recompute != Recompute::kFull && (l.pp == 1 || l.vpp > 1));
  return o;
}

StepBreakdown BreakdownOf(const StepTime& t) {
  StepBreakdown b;
  b.compute_s = t.head_compute_s;
  for (double s : t.compute_by_family_s) b.compute_s += s;
  for (double s : t.exposed_by_axis) b.exposed_comm_s += s;
  b.exposed_comm_s += t.activation_offload_exposed_s;
  b.bubble_s = t.bubble_s - t.exposed_by_axis[static_cast<size_t>(Axis::kPp)];
  b.optimizer_s = t.newton_schulz_s + t.optimizer_step_s + t.host_offload_s;
  return b;
}

StepTime EstimateStepTime(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                          std::vector<StageComm>* comm, const CostModel& cost) {
  return EstimateStepTime(inv, t, l, stages, comm, cost, LayerComputeTimes(inv, t, l, cost));
}

StepTime EstimateStepTime(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                          std::vector<StageComm>* comm, const CostModel& cost, const ComputeTimes& times) {
  StepTime st;
  EstimateStepTime(inv, t, l, stages, comm, cost, times, &st);
  return st;
}

void EstimateStepTime(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                      std::vector<StageComm>* comm, const CostModel& cost, const ComputeTimes& times, StepTime* out) {
  planner_internal::EstimateStepTime(inv, t, l, stages, comm, cost, times, out, true);
}

void planner_internal::EstimateStepTime(const Inventory& inv, const PlanTables& t, const Layout& l,
                                        const StagePlan& stages, std::vector<StageComm>* comm, const CostModel& cost,
                                        const ComputeTimes& times, StepTime* out, bool copy_alike,
                                        SharedCompute* shared) {
  std::vector<StageTime> stages_storage = std::move(out->stages);
  stages_storage.clear();
  *out = StepTime{};
  out->stages = std::move(stages_storage);  // its storage kept
  StepTime& st = *out;
  const GpuSpec& gpu = inv.recipe.cluster.spec;
  // Newton-Schulz runs as large GEMMs: the device's GEMM rate.
  const double peak = gpu.bf16_dense_tflops * 1e12 * GemmEfficiency(gpu, cost);
  double max_chunk_f = 0, max_chunk_b = 0, one_p2p_s = 0, tail = 0;
  const double per_mb = static_cast<double>(std::max<int64_t>(1, l.micro_batches));
  // Per-thread buffers (a sweep prices millions of layouts): the ranks'
  // chunks, each distinct rank's compute and exposure (which the ranks priced
  // as it take), and the overlap groups of one rank.
  thread_local RankChunks own_chunks;
  thread_local std::vector<std::pair<RankCompute, RankExposure>> priced;
  thread_local OverlapGroups groups;
  const bool reuse = shared != nullptr && shared->stages == &stages;
  RankChunks& by_rank = shared != nullptr ? shared->by_rank : own_chunks;
  if (!reuse) FillRankChunks(stages, l, &by_rank);
  if (shared != nullptr && !reuse) {
    shared->stages = &stages;
    shared->ranks.resize(static_cast<size_t>(l.pp));
    shared->known.assign(static_cast<size_t>(l.pp), 0);
  }
  priced.resize(static_cast<size_t>(l.pp));
  st.stages.reserve(static_cast<size_t>(l.pp));
  for (int64_t r = 0; r < l.pp; ++r) {
    const int64_t as = (*comm)[static_cast<size_t>(r)].priced_as;
    const size_t q = static_cast<size_t>(as >= 0 && as < r ? as : r);
    if (q == static_cast<size_t>(r)) {
      if (shared == nullptr) {
        priced[q].first = ComputeOnRank(inv, t, times, l, by_rank.On(r));
      } else {
        if (shared->known[q] == 0) {
          shared->ranks[q] = ComputeOnRank(inv, t, times, l, by_rank.On(r));
          shared->known[q] = 1;
        }
        priced[q].first = shared->ranks[q];
      }
      priced[q].second = ExposeRank((*comm)[q].items, priced[q].first, inv, l, cost, groups);
    } else if (copy_alike) {
      (*comm)[static_cast<size_t>(r)].items = (*comm)[q].items;  // with the exposure set
    }
    const RankCompute& rc = priced[q].first;
    const RankExposure& ex = priced[q].second;
    max_chunk_f = std::max(max_chunk_f, rc.max_chunk_forward_s);
    max_chunk_b = std::max(max_chunk_b, rc.max_chunk_backward_s);
    one_p2p_s = std::max(one_p2p_s, ex.one_p2p_s);
    const double host_link = inv.recipe.cluster.spec.host_link_gbps_per_dir * 1e9;
    // Activation offload runs on its own copy streams beside the compute:
    // only what outlasts the forward (down) or the backward (up) shows.
    const double offload_each_way = static_cast<double>((*comm)[static_cast<size_t>(r)].activation_offload.count()) / 2;
    const double offload_s = host_link > 0 ? offload_each_way / host_link : 0.0;
    const double offload_exposed =
        std::max(0.0, offload_s - rc.forward_s) + std::max(0.0, offload_s - rc.backward_s - rc.recompute_s);
    // Steady state: the busiest rank (the first of equals) sets the pace.
    const double busy = rc.total_s() + ex.in_pipeline_s + offload_exposed;
    if (r == 0 || busy > st.steady_s) {
      st.slowest_stage = r;
      st.steady_s = busy;
      st.exposed_by_axis = ex.by_axis;
      st.compute_by_family_s = rc.by_family_s;
      st.head_compute_s = rc.head_s;
      st.activation_offload_s = offload_s;
      st.activation_offload_exposed_s = offload_exposed;
    }
    const double host_s =
        host_link > 0 ? static_cast<double>((*comm)[static_cast<size_t>(r)].host_transfer.count()) / host_link : 0.0;
    st.host_offload_s = std::max(st.host_offload_s, host_s);
    const double update_s = AdamStepSeconds(rc.OptimizerElements(l), gpu);
    st.optimizer_step_s = std::max(st.optimizer_step_s, update_s);
    tail = std::max(tail, ex.dp_tail_s + ex.optimizer_s + rc.muon_flops / peak + host_s + update_s);
    st.dp_exposed_s = std::max(st.dp_exposed_s, ex.dp_tail_s);
    st.optimizer_s = std::max(st.optimizer_s, ex.optimizer_s + rc.muon_flops / peak);
    st.newton_schulz_s = std::max(st.newton_schulz_s, rc.muon_flops / peak);
    st.stages.push_back(
        {r, rc.forward_s / per_mb, rc.backward_s / per_mb, rc.recompute_s / per_mb, ex.in_pipeline_s / per_mb});
  }
  double fill = 0;
  st.bubble_s = PipelineBubble(l, stages, st.steady_s, max_chunk_f, max_chunk_b, one_p2p_s, &fill);
  if (l.pp > 1) st.exposed_by_axis[static_cast<size_t>(Axis::kPp)] = fill;
  st.step_s = st.steady_s + st.bubble_s + tail;
  st.bubble_fraction = st.step_s > 0 ? st.bubble_s / st.step_s : 0.0;
  SetThroughput(inv, t, l, st);
}

}  // namespace preflight

// The capacity model: per-rank memory of one pipeline rank (docs/architecture.md,
// "Memory geometry"; docs/formulas.md §1-6). One walk computes every figure; the same
// walk, given a sink, also records each figure's formula and inputs for
// --explain, so the explanation can never drift from the number.
//
// Modelling choices where the sources leave room (each also named in the
// --explain line it affects):
// - Parameters of the layers on every chunk of the rank, each class divided by
//   1, t or e*t_e (rounded up: the worst rank). Parameter bytes come from each
//   tensor's dtype (Mamba A_log and D stay fp32); grads use precision.grads.
// - Tied embeddings with the ends on different ranks: the last stage keeps a
//   second V_pad*h/t copy, as Megatron does (docs/formulas.md §1.1).
// - DualPipe: rank r also holds stage p-1-r, so its params, grads and
//   optimizer state double; DualPipeV holds only its own chunks (docs/formulas.md §4.1).
//   In flight: see ForEachChunk.
// - ZeRO groups: dense state over d*c, expert state over d_e (docs/formulas.md §2.2).
//   ZeRO >= 1 shards the optimizer state per unit (a layer, the embedding,
//   the head with the final norm) and per flat buffer of the unit (dense or
//   expert x optimizer x element dtype), each zero-padded to a multiple of D
//   as Megatron's distributed optimizer pads its buffers: the busiest rank
//   (rank 0 of the group) keeps ceil(n/D) elements of each buffer's state.
//   ZeRO 2 (DeepSpeed stage 2; simulator/dist_optimizer.h): gradients are the
//   owned shares, sum of ceil(n/D) * beta_g, plus the largest unit's
//   unsharded gradients (every buffer, local elements * beta_g), live from its
//   backward until its reduce-scatter in each micro-batch.
//   ZeRO 3 (FSDP, reshard after forward): gradients as ZeRO 2; parameters are
//   the owned shares, sum of ceil(n/D) * element bytes, plus per class the
//   most two adjacent units of a chunk hold gathered (current + prefetched,
//   forward and backward; GatherPeak). The executor compares the three
//   parameter rows as their sum; the owned dense shares are shown as
//   ceil(REP bytes/D) replicated and the rest TP-sharded (PriceParams).
// - Activations: per family (memory_terms.h) x layers x micro-batches in flight:
//   1F1B min(m, p-r); interleaved: each chunk's live micro-batches at the
//   instant its rank's live bytes peak, found by replaying Megatron's order
//   with each chunk's own bytes (pipeline_replay.h; the head's logits count
//   only when that instant is the head's forward); DualPipe p+1
//   stage-micro-batches, ceil half on the own stage and the rest on the mirror;
//   DualPipeV 2p+1 V-stage-micro-batches, p+1 on the down and p on the up stage.
// - The largest one-layer transient is added once: under full recompute the
//   layer being recomputed holds its no-recompute activations; Mamba's SSD
//   workspace and the CP ring KV buffers are live while their layer runs.
// - MoE: capacity C per rank from its local router tokens (Megatron), so a
//   rank's experts receive up to E*C; tokens the local experts process (R, for
//   activations and scratch): padded E*C; capacity mode its bound
//   min(E*C, T*e*min(k, E/e)); dropless ceil(skew*T*k) capped by the worst case
//   T*e*min(k, E/e) (both shown in --explain); times t_e under expert TP.
//   Routing scratch is one layer's (the peak), never summed over layers.
// - Serving state (when the recipe has `serving`) is colocated with training on
//   the same layout: KV for A layers, conv + SSM state for M, RG-LRU state for R
//   of this rank's own stages, serving.batch sequences per model replica.
// - Allocator overhead: a fraction of every allocator-managed byte (all but the
//   runtime reserve).
#include "preflight/estimator/estimate.h"
#include "preflight/estimator/estimate_by_zero.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <span>
#include <string>

#include "internal.h"
#include "preflight/estimator/geometry.h"
#include "preflight/estimator/memory_terms.h"

namespace preflight {
namespace {

using estimator_detail::ActivationRates;
using estimator_detail::Add;
using estimator_detail::AddEndShares;
using estimator_detail::AddInto;
using estimator_detail::Cat;
using estimator_detail::Context;
using estimator_detail::Decimal;
using estimator_detail::Ends;
using estimator_detail::EndsOf;
using estimator_detail::Inputs;
using estimator_detail::LocalParams;
using estimator_detail::Mul;
using estimator_detail::Note;
using estimator_detail::Offer;
using estimator_detail::PriceActivations;
using estimator_detail::PriceGradients;
using estimator_detail::PriceOptimizer;
using estimator_detail::PriceParams;
using estimator_detail::PriceRoutingScratch;
using estimator_detail::PriceServing;
using estimator_detail::Sink;
using estimator_detail::UnitOf;
using estimator_detail::Walk;
using estimator_detail::WalkRank;

/// Runtime reserve: memory outside PyTorch's caching allocator. Default 3 GiB
/// (cluster.reserve_gib): the CUDA context takes ~0.5 GiB on Hopper (PyTorch
/// "CUDA semantics" notes, visible as the gap between nvidia-smi and
/// memory_allocated), NCCL keeps per-communicator channel buffers
/// (NCCL_BUFFSIZE 4 MiB per channel per peer; a rank sits in TP, CP, DP, EP,
/// PP and embedding groups); docs/formulas.md §2.4 puts the sum at 2-3 GiB,
/// to be calibrated with torch.cuda.mem_get_info. The cuBLAS workspaces go
/// through the allocator and are their own row (PriceWorkspaces).
Bytes RuntimeReserve(const Recipe& rc) { return GiB(rc.cluster.reserve_gib); }

/// cuBLAS workspaces the libraries allocate once through PyTorch's caching
/// allocator (so they show in memory_allocated and stay between steps):
/// - PyTorch keeps one per (cuBLAS handle, stream) that ran a GEMM
///   (ATen/cuda/CublasHandlePool.cpp, cublas_handle_stream_to_workspace;
///   cuBLASLt shares it under TORCH_CUBLASLT_UNIFIED_WORKSPACE, the default).
///   Handles are per thread and autograd runs the backward on its own device
///   thread, so a rank that runs torch GEMMs holds two. Those GEMMs are every
///   linear without Transformer Engine; with TE, Megatron's output layer
///   (ColumnParallelLinear, a torch matmul) and the MoE router.
/// - Transformer Engine keeps one for all its GEMMs (pytorch/module/base.py
///   get_workspace) and, for grouped-GEMM experts (GroupedLinear),
///   get_multi_stream_cublas_workspace: num_cublas_streams = 4 more.
/// Each is cluster.cublas_workspace_mib (32 MiB on Hopper and later).
struct Workspaces {
  int64_t torch = 0, te = 0, te_grouped = 0;
  int64_t count() const { return torch + te + te_grouped; }
};
Workspaces WorkspacesOf(const Recipe& rc, const Walk& w) {
  const bool te = rc.training.transformer_engine;
  const bool moe = MoeOnRank(w, rc);
  Workspaces out;
  out.torch = !te || w.head || moe ? 2 : 0;
  out.te = te ? 1 : 0;
  out.te_grouped = te && moe && rc.model.moe.grouped_gemm ? 4 : 0;
  return out;
}

/// Megatron's own attention core (the local implementation: no Transformer
/// Engine, no flash attention) writes the raw scores of every attention
/// layer into one buffer it keeps for the run: DotProductAttention.forward
/// takes its baddbmm input, [b * heads/t, s_q, s_k] in the activation
/// dtype, from the global memory buffer ("mpu"), which allocates the
/// largest size asked for once and never frees it (core/utils.py
/// GlobalMemoryBuffer.get_tensor; Megatron-LM d98e8a6). s_q is one CP
/// rank's queries (Megatron's local core refuses CP > 1).
Bytes ScoresBuffer(const Recipe& rc, const Layout& l, const Walk& w) {
  const bool local_core = !rc.training.transformer_engine && !rc.training.flash_attention && !rc.model.mla;
  if (!local_core || w.layer_count[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))] == 0) return Bytes(0);
  const int64_t heads = (rc.model.attention.heads + l.tp - 1) / l.tp;
  return Bytes(
      Mul(Mul(Mul(TokensOf(rc, l).cp_rank, heads), rc.training.seq_len), SizeOf(rc.training.precision.activations)));
}

/// Megatron's all-gather token dispatcher gathers the tokens of the ETP x EP
/// group into the same global memory buffer ("mpu", the activation dtype):
/// [T * t_e * e, h] (token_dispatcher.py MoEAllGatherTokenDispatcher
/// token_dispatch, gather_from_sequence_parallel_region with
/// use_global_buffer=True; tensor_parallel/mappings.py _gather_along_first_dim
/// skips the gather on a group of one). One buffer per (name, dtype), grown
/// to the largest request and kept: the row is the larger of the two users.
Bytes GatheredTokensBuffer(const Recipe& rc, const Layout& l, const Walk& w) {
  const int64_t group = Mul(l.expert_tp, l.ep);
  if (rc.model.moe.dispatcher != MoeDispatcher::kAllGather || group == 1 || !MoeOnRank(w, rc)) return Bytes(0);
  return Bytes(
      Mul(Mul(Mul(TokensOf(rc, l).router, group), rc.model.hidden), SizeOf(rc.training.precision.activations)));
}

void PriceWorkspaces(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, Sink* sink) {
  const Workspaces ws = WorkspacesOf(rc, w);
  const Bytes cublas = MiB(Mul(ws.count(), rc.cluster.cublas_workspace_mib));
  const Bytes scores = ScoresBuffer(rc, l, w);
  const Bytes gathered = GatheredTokensBuffer(rc, l, w);
  out.bytes[static_cast<int>(Category::kLibraryWorkspaces)] = cublas + std::max(scores, gathered);
  if (sink && cublas.count() > 0) {
    Note(sink, Category::kLibraryWorkspaces,
         "cuBLAS workspaces: PyTorch's per (thread handle, stream), TE's, TE grouped GEMM's per stream",
         "(torch + te + te_grouped) * cublas_workspace_mib * 2^20",
         Inputs({{"torch", ws.torch},
                 {"te", ws.te},
                 {"te_grouped", ws.te_grouped},
                 {"cublas_workspace_mib", rc.cluster.cublas_workspace_mib}}),
         cublas);
  }
  // One buffer: the larger user's row (the other's request fits inside it).
  if (sink && gathered > scores) {
    Note(sink, Category::kLibraryWorkspaces, "Megatron's global buffer for the MoE all-gather dispatcher's tokens",
         "T * t_e * e * h * beta_a",
         Inputs({{"T", TokensOf(rc, l).router},
                 {"t_e", l.expert_tp},
                 {"e", l.ep},
                 {"h", rc.model.hidden},
                 {"beta_a", SizeOf(rc.training.precision.activations)}}),
         gathered);
  }
  if (sink && scores.count() > 0 && scores >= gathered) {
    Note(sink, Category::kLibraryWorkspaces, "Megatron's global buffer for the local attention core's raw scores",
         "(s/c * b) * ceil(heads/t) * s * beta_a",
         Inputs({{"tokens", TokensOf(rc, l).cp_rank},
                 {"heads", rc.model.attention.heads},
                 {"t", l.tp},
                 {"s", rc.training.seq_len},
                 {"beta_a", SizeOf(rc.training.precision.activations)}}),
         scores);
  }
}

Context ContextOf(const Recipe& rc, const Layout& l) {
  Context x;
  // ZeRO shards over one HSDP replica's ranks (all of d*c without HSDP).
  x.dense_group = l.zero_group();
  x.expert_group = std::max<int64_t>(1, l.expert_zero_group());
  x.beta_g = SizeOf(rc.training.precision.grads);
  x.beta_p = SizeOf(rc.training.precision.params);
  x.zero3 = l.zero >= 3;
  x.fsdp_cpu_offload = x.zero3 && rc.parallel.fsdp_cpu_offload;
  x.fp4 = rc.training.precision.fp4;
  x.fp4_params = x.fp4 != Fp4Format::kNone && rc.training.precision.fp4_params;
  x.layer_wise = rc.parallel.optimizer_sharding == OptimizerSharding::kLayerWise;
  const PrecisionConfig& prec = rc.training.precision;
  // fp32 master copies exist only when the parameters are kept in lower precision.
  x.master = prec.master && prec.params != DType::kFp32 ? SizeOf(*prec.master) : 0;
  x.momentum = SizeOf(rc.training.optimizer.muon_momentum);
  return x;
}

/// What every pipeline rank of one layout prices alike, worked out once.
struct LayoutFigures {
  /// `shared`: the activation rates of the layout at another ZeRO stage (they
  /// do not depend on it), else its own.
  LayoutFigures(const Inventory& inv, const Layout& l, const StagePlan& plan, ActivationRates* shared = nullptr)
      : x(ContextOf(inv.recipe, l)),
        own(inv, l),
        rates(shared != nullptr ? *shared : own),
        regular(estimator_detail::RegularPlan(plan, l.pp)) {}
  Context x;
  ActivationRates own;
  ActivationRates& rates;
  bool regular = false;  // RegularPlan
  estimator_detail::LayerMemos memo{};
};

/// A rank's walk with its ends, their units offered: what ZeRO 0-2 price alike.
struct Walked {
  Walk w;
  Ends ends;
  Bytes inputs_kept;  // PipelineInputsKept
};

/// Megatron keeps, between steps, the last micro-batch's pipeline input of
/// every model chunk that receives one, with its gradient: forward_step hands
/// the received tensor to the model (schedules.py forward_step,
/// set_input_tensor), whose decoder stores it (TransformerBlock and
/// HybridStack set_input_tensor: self.input_tensor) until the next
/// micro-batch replaces it, and backward_step retains its gradient
/// (schedules.py backward_step, x.retain_grad()), so the tensor carries .grad
/// (Megatron-LM d98e8a6). Every chunk but the pipeline's first (rank 0,
/// virtual index 0) receives; each tensor is one micro-batch's residual
/// stream on this rank (s/c tokens, split over TP under sequence
/// parallelism) in the activation dtype (Megatron's pipeline_dtype is
/// params_dtype). 1F1B and interleaved only: DualPipe is not Megatron's.
Bytes PipelineInputsKept(const Recipe& rc, const Layout& l, const StagePlan& plan, int64_t r) {
  if (l.pp <= 1 || (l.schedule != Schedule::k1F1B && l.schedule != Schedule::kInterleaved)) return Bytes(0);
  const int64_t chunks = static_cast<int64_t>(plan.chunks.size()) / l.pp - (r == 0 ? 1 : 0);
  const int64_t stream = Mul(Mul(TokensOf(rc, l).router, rc.model.hidden), SizeOf(rc.training.precision.activations));
  return Bytes(Mul(Mul(2, chunks), stream));
}

Walked WalkOf(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, LayoutFigures& shared) {
  const Context& x = shared.x;
  Walked b{WalkRank(inv, l, plan, r, shared.regular, x, shared.rates, shared.memo),
           {},
           PipelineInputsKept(inv.recipe, l, plan, r)};
  Walk& w = b.w;
  if (!inv.recipe.training.activation_offload.empty()) {
    w.offload = ActivationOffloadOnRank(inv.recipe, l, plan, r, CheckpointedSublayers(inv, l, plan));
  }
  b.ends = EndsOf(inv, l, w, x);
  Offer(w, UnitOf(b.ends.embedding, x, -1));
  LocalParams head_unit = b.ends.head;
  AddInto(head_unit, b.ends.final_norm);
  Offer(w, UnitOf(head_unit, x, -1));
  AddEndShares(w, inv, l, x);
  if (x.zero3) w.gathered = w.gather.Peak(b.ends.embedding.Gathered(), head_unit.Gathered());
  if (x.layer_wise) w.layer_wise = estimator_detail::LayerWiseOf(inv, l, plan, r, shared.regular, w, x);
  return b;
}

/// Parameters, gradients and optimizer state: the categories ZeRO changes.
void PriceModelState(RankMemory& out, const Walked& b, const Recipe& rc, const Layout& l, const Context& x,
                     Sink* sink) {
  PriceParams(out, b.w, b.ends, l, x, sink);
  PriceGradients(out, b.w, b.ends, l, x, sink);
  PriceOptimizer(out, b.w, b.ends, rc, l, x, sink);
}

/// Activations, routing scratch, serving state and workspaces: the
/// categories ZeRO does not change.
void PriceTransients(RankMemory& out, const Walked& b, const Inventory& inv, const Layout& l, ActivationRates& rates,
                     Sink* sink) {
  const Recipe& rc = inv.recipe;
  out.in_flight_microbatches = b.w.in_flight;
  PriceActivations(out, b.w, inv, l, rates, sink);
  PriceRoutingScratch(out, b.w, rc, l, rates, sink);
  PriceServing(out, b.w, rc, l, sink);
  PriceWorkspaces(out, b.w, rc, l, sink);
}

/// Megatron-FSDP (ZeRO 3) with --overlap-param-gather: the optimizer step
/// ends in start_param_sync (distrib_optimizer.py step_with_ready_grads),
/// which all-gathers the bucket of the model's first parameter with
/// prefetch (megatron_fsdp.py start_param_sync); the prefetch takes the
/// following buckets in forward order until suggested_AG_prefetch_size
/// elements, max(1e9, 2 x a unit's elements) / 2 = 500M (megatron_fsdp.py
/// __init__, param_and_grad_buffer.py all_gather_params). Those unsharded
/// weights stay allocated until the next forward uses and reshards them: the
/// rank's local parameter bytes, up to 500M elements after the embedding
/// (an approximation of the bucket order: the bucket that crosses the limit
/// is gathered whole). FSDP2 and Megatron-FSDP without the flag gather in
/// the forward.
Bytes PrefetchedAfterStep(const Walked& b, const Recipe& rc, const Layout& l, const Context& x) {
  if (l.zero < 3 || !rc.parallel.overlap_param_gather) return Bytes(0);
  constexpr int64_t kPrefetchElements = 500'000'000;
  int64_t all = 0, first = 0;
  for (int c = 0; c < 3; ++c) {
    first = Add(first, b.ends.embedding.bytes[c]);
    all = Add(all, Add(Add(b.w.layers.bytes[c], b.ends.embedding.bytes[c]),
                       Add(b.ends.head.bytes[c], b.ends.final_norm.bytes[c])));
  }
  return Bytes(std::min(all, Add(first, Mul(kPrefetchElements, x.beta_p))));
}

/// The allocator figures, the runtime reserve and the allocator overhead of
/// a rank whose categories are priced.
void FinishRank(RankMemory& out, const Walked& b, const Recipe& rc, const Layout& l, const Context& x, Sink* sink) {
  const Bytes managed = out.total();
  // Allocator figures: everything priced so far goes through PyTorch's caching
  // allocator; the reserve and fragmentation below do not show in
  // torch.cuda.max_memory_allocated() (docs/allocated.md).
  // Between steps ZeRO 3 has resharded every gathered unit and ZeRO 2/3 have
  // reduce-scattered (and freed) every unit's full gradients: only the shares
  // stay (FSDP2 reshard_after_forward/backward; Megatron-FSDP frees its
  // unsharded bucket buffers, but gathers the next step's early under
  // overlap_param_gather: PrefetchedAfterStep; DeepSpeed stage 2 its
  // reduction buckets).
  Bytes step_transients;
  for (int64_t g : b.w.gathered) step_transients += Bytes(g);
  if (l.zero >= 2) step_transients += Bytes(b.w.grad_unit.grads);
  out.allocated_static =
      out.of(Category::kReplicatedParams) + out.of(Category::kTpShardedParams) + out.of(Category::kEpShardedParams) +
      out.of(Category::kGradients) + out.of(Category::kOptimizerMuon) + out.of(Category::kOptimizerAdamW) +
      out.of(Category::kServingState) + out.of(Category::kLibraryWorkspaces) - step_transients +
      estimator_detail::MainGradCopies(b.w, b.ends, rc, l, x) + PrefetchedAfterStep(b, rc, l, x) + b.inputs_kept;
  // max_memory_allocated covers every instant, between steps included: the
  // gradient copies and the prefetch are gone by the activations' peak, and
  // the kept pipeline inputs are replaced by the next step's.
  out.allocated_peak = std::max(managed, out.allocated_static);
  const Bytes last_less = estimator_detail::LayerWiseLastLess(b.w, l, x);
  out.last_rank_allocated_static = out.allocated_static - last_less;
  out.last_rank_allocated_peak = out.allocated_peak - last_less;
  out.bytes[static_cast<int>(Category::kRuntimeReserve)] = RuntimeReserve(rc);
  // Fragmentation of the caching allocator, a fraction of what it manages
  // (Megatron's estimator multiplies activations by 1.05; docs/formulas.md §2.4).
  out.bytes[static_cast<int>(Category::kAllocatorOverhead)] =
      Bytes(CeilFraction(managed.count(), rc.cluster.allocator_overhead));
  out.capacity = MiB(rc.cluster.capacity_mib > 0 ? rc.cluster.capacity_mib : rc.cluster.spec.capacity_mib);
  if (sink) {
    Note(sink, Category::kRuntimeReserve, "CUDA context + NCCL buffers (outside the caching allocator)",
         "cluster.reserve_gib * 2^30", Cat({"reserve_gib=", Decimal(rc.cluster.reserve_gib)}),
         out.of(Category::kRuntimeReserve));
    Note(sink, Category::kAllocatorOverhead, "caching-allocator fragmentation",
         "ceil(allocator_overhead * (params + grads + optimizer + activations + scratch + serving + workspaces))",
         Cat({"allocator_overhead=", Decimal(rc.cluster.allocator_overhead), " ",
              Inputs({{"managed", managed.count()}})}),
         out.of(Category::kAllocatorOverhead));
  }
}

RankMemory Compute(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, LayoutFigures& shared,
                   Sink* sink) {
  const Walked b = WalkOf(inv, l, plan, r, shared);
  RankMemory out;
  PriceModelState(out, b, inv.recipe, l, shared.x, sink);
  PriceTransients(out, b, inv, l, shared.rates, sink);
  FinishRank(out, b, inv.recipe, l, shared.x, sink);
  return out;
}

/// Every rank's RankVisits, shared by the ZeRO groups of one layout and
/// worked out when a group first reaches the rank (a sweep's fallback cuts
/// stop at the first rank over).
struct Visits {
  std::vector<std::vector<estimator_detail::VisitKey>> keys;
  std::vector<estimator_detail::InFlight> in_flight;
  std::vector<char> comparable;
  std::vector<char> known;
  /// Empties every rank's entry for a layout of `pp` ranks (keeping storage).
  void Reset(size_t pp) {
    if (keys.size() < pp) keys.resize(pp);
    in_flight.resize(pp);
    comparable.resize(pp);
    known.assign(pp, 0);
  }
  /// Whether rank i's visits can be compared (RankVisits), working them out first.
  bool Comparable(const Inventory& inv, const Layout& l, const StagePlan& stages, bool regular, ActivationRates& rates,
                  size_t i) {
    if (known[i] == 0) {
      comparable[i] =
          estimator_detail::RankVisits(inv, l, stages, static_cast<int64_t>(i), regular, rates, &keys[i], &in_flight[i])
              ? 1
              : 0;
      known[i] = 1;
    }
    return comparable[i] != 0;
  }
};

/// ZeRO stages of one layout priced from the same walk: members index
/// `zeros`, all below 3 or all 3, and `x` is their context. until_all_over
/// tracks, per member, whether one of its ranks is over.
struct ZeroGroup {
  std::span<const size_t> members;
  Context x;
  std::array<bool, 8> is_over{};
  size_t members_over = 0;
  bool done = false;  // until_all_over: every member has a rank over
};

/// A ZeRO 3 walk as a walk below ZeRO 3 leaves it: the ZeRO 3 walk only adds
/// the gathered units (GatherPeak) and the owned shares' parameter bytes
/// (UnitShares), both read under ZeRO 3 only.
Walked BelowZero3(const Walked& b) {
  Walked out = b;
  out.w.gather = {};
  out.w.gathered = {};
  out.w.shares.param_bytes = {};
  return out;
}

/// Every rank of `layout` at the ZeRO stages of `groups` into out[i] for i in
/// each group's members: each rank walked once, with the last group's
/// context (ZeRO 3 when the groups are below 3 and 3: that walk is a
/// superset, BelowZero3), and its ZeRO-independent categories priced once.
/// Ranks whose walks agree (RankVisits: pipelines repeat their middle
/// stages) are priced once. With two groups every group must allow that
/// (ZeRO 3 only in a transformer stack, GatherByFamilies).
/// The ranks are visited from `start` on, wrapping (until_all_over: a rank
/// likely over first); the rank that ends an until_all_over walk goes into
/// *stopped_at.
void EstimateGroups(const Inventory& inv, const Layout& layout, const StagePlan& stages, std::span<const int64_t> zeros,
                    std::span<ZeroGroup> groups, bool until_all_over, int64_t start, int64_t* stopped_at,
                    ActivationRates& rates, Visits& v, std::vector<std::vector<RankMemory>>& out) {
  Layout l = layout;
  l.zero = zeros[groups.back().members.front()];
  LayoutFigures shared(inv, l, stages, &rates);
  const auto& visits = v.keys;
  const auto& in_flight = v.in_flight;
  const bool zero3_by_counts = !shared.x.zero3 || estimator_detail::TransformerStack(inv);
  thread_local std::vector<int64_t> distinct;  // ranks priced, with comparable visits (per-thread buffer)
  distinct.clear();
  const auto over = [&](const RankMemory& m) { return m.total() > m.capacity || !HostMemoryFits(inv.recipe, m.host); };
  // until_all_over: whether rank i puts the last member of `g` over.
  const auto note_over = [&](ZeroGroup& g, size_t i) {
    for (size_t k = 0; k < g.members.size() && k < g.is_over.size(); ++k) {
      if (!g.is_over[k] && over(out[g.members[k]][i])) {
        g.is_over[k] = true;
        ++g.members_over;
      }
    }
    return until_all_over && g.members_over == g.members.size();
  };
  size_t open = groups.size();  // groups not done
  for (int64_t t = 0; t < l.pp; ++t) {
    const int64_t r = (start + t) % l.pp;
    const size_t i = static_cast<size_t>(r);
    bool priced = false;
    if (zero3_by_counts && v.Comparable(inv, layout, stages, shared.regular, shared.rates, i)) {
      const auto same = std::find_if(distinct.begin(), distinct.end(), [&](int64_t q) {
        const size_t j = static_cast<size_t>(q);
        // The in-flight figures first: under 1F1B they tell most ranks apart.
        return in_flight[j].units == in_flight[i].units && in_flight[j].head_units == in_flight[i].head_units &&
               in_flight[j].loss_transient_live == in_flight[i].loss_transient_live && visits[j] == visits[i];
      });
      if (same != distinct.end()) {
        for (const ZeroGroup& g : groups) {
          if (g.done) continue;
          for (size_t m : g.members) out[m][i] = out[m][static_cast<size_t>(*same)];
        }
        priced = true;  // an equal rank was checked already
      } else {
        distinct.push_back(r);
      }
    }
    if (priced) continue;
    const Walked b = WalkOf(inv, l, stages, r, shared);
    RankMemory transients;
    PriceTransients(transients, b, inv, l, shared.rates, nullptr);
    std::optional<Walked> below;  // the ZeRO 3 walk as the stages below 3 see it
    for (ZeroGroup& g : groups) {
      if (g.done) continue;
      const bool superset = g.x.zero3 != shared.x.zero3;
      if (superset && !below) below = BelowZero3(b);
      const Walked& walked = superset ? *below : b;
      for (size_t m : g.members) {
        Layout at = layout;
        at.zero = zeros[m];
        RankMemory& mem = out[m][i];
        mem = transients;
        PriceModelState(mem, walked, inv.recipe, at, g.x, nullptr);
        FinishRank(mem, walked, inv.recipe, at, g.x, nullptr);
      }
      if (until_all_over && note_over(g, i)) {
        for (int64_t later = t + 1; later < l.pp; ++later) {  // the ranks not visited
          for (size_t m : g.members) out[m][static_cast<size_t>((start + later) % l.pp)] = RankMemory{};
        }
        g.done = true;
        if (--open == 0) {
          *stopped_at = r;
          return;
        }
      }
    }
  }
}

std::string GiBText(Bytes b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b.gib());
  return buf;
}

}  // namespace

RankMemory EstimateRank(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                        int64_t pipeline_rank) {
  LayoutFigures shared(inventory, layout, stages);
  return Compute(inventory, layout, stages, pipeline_rank, shared, nullptr);
}

namespace {

/// EstimateRanksByZero with the ranks visited from `start` on (EstimateGroups).
void EstimateFrom(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                  std::span<const int64_t> zeros, std::vector<std::vector<RankMemory>>* out, bool until_all_over,
                  int64_t start, int64_t* stopped_at) {
  out->resize(zeros.size());
  for (std::vector<RankMemory>& ranks : *out) ranks.resize(static_cast<size_t>(layout.pp));
  thread_local std::vector<size_t> group;
  // The groups share the activation rates and each rank's pipeline replay.
  thread_local ActivationRates::Replays replays;
  replays.peak.resize(static_cast<size_t>(layout.pp));
  replays.dual.resize(static_cast<size_t>(layout.pp));
  replays.known.assign(static_cast<size_t>(layout.pp), 0);
  ActivationRates rates(inventory, layout);
  rates.replays = &replays;
  // Per-thread buffers: a sweep prices millions of layouts.
  thread_local Visits visits;
  visits.Reset(static_cast<size_t>(layout.pp));
  group.clear();
  for (size_t i = 0; i < zeros.size(); ++i) {
    if (zeros[i] < 3) group.push_back(i);
  }
  const size_t below = group.size();
  for (size_t i = 0; i < zeros.size(); ++i) {
    if (zeros[i] >= 3) group.push_back(i);
  }
  // The ZeRO stages below 3 and ZeRO 3, each with its context.
  std::array<ZeroGroup, 2> groups;
  size_t n = 0;
  for (const auto& [first, end] : {std::pair<size_t, size_t>{0, below}, {below, group.size()}}) {
    if (first == end) continue;
    Layout at = layout;
    at.zero = zeros[group[first]];
    groups[n].members = std::span<const size_t>(group).subspan(first, end - first);
    groups[n++].x = ContextOf(inventory.recipe, at);
  }
  // One walk for both when ZeRO 3's walks group alike too (a transformer
  // stack, EstimateGroups). Should it overflow, the walks one group at a time
  // raise what they raised before.
  if (n == 2 && estimator_detail::TransformerStack(inventory)) {
    try {
      EstimateGroups(inventory, layout, stages, zeros, std::span<ZeroGroup>(groups.data(), 2), until_all_over, start,
                     stopped_at, rates, visits, *out);
      return;
    } catch (const ArithmeticOverflow&) {
      for (ZeroGroup& g : groups) g = ZeroGroup{g.members, g.x};
    }
  }
  // The last group's stop when every group stopped; a group that fits keeps
  // the caller's rank (as the one walk does).
  int64_t last_stop = *stopped_at;
  bool every_group_stopped = true;
  for (size_t g = 0; g < n; ++g) {
    int64_t stop = -1;
    EstimateGroups(inventory, layout, stages, zeros, std::span<ZeroGroup>(&groups[g], 1), until_all_over, start, &stop,
                   rates, visits, *out);
    every_group_stopped = every_group_stopped && stop >= 0;
    if (stop >= 0) last_stop = stop;
  }
  if (every_group_stopped) *stopped_at = last_stop;
}

}  // namespace

void EstimateRanksByZero(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                         std::span<const int64_t> zeros, std::vector<std::vector<RankMemory>>* out, bool until_all_over,
                         int64_t* first_rank) {
  int64_t stopped_at = 0;
  if (until_all_over && first_rank != nullptr && *first_rank > 0 && *first_rank < layout.pp) {
    try {
      stopped_at = *first_rank;
      EstimateFrom(inventory, layout, stages, zeros, out, true, *first_rank, &stopped_at);
      *first_rank = stopped_at;
      return;
    } catch (const ArithmeticOverflow&) {
      // Rank 0 first, as without a hint: whether the walks overflow before
      // every stage is over depends on the order.
    }
  }
  EstimateFrom(inventory, layout, stages, zeros, out, until_all_over, 0, &stopped_at);
  if (first_rank != nullptr) *first_rank = stopped_at;
}

void EstimateRanks(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                   std::vector<RankMemory>* out) {
  thread_local std::vector<std::vector<RankMemory>> one;
  EstimateRanksByZero(inventory, layout, stages, std::span<const int64_t>(&layout.zero, 1), &one);
  std::swap(*out, one.front());
}

std::vector<Explanation> ExplainRank(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                                     int64_t pipeline_rank) {
  std::vector<Explanation> out;
  LayoutFigures shared(inventory, layout, stages);
  Compute(inventory, layout, stages, pipeline_rank, shared, &out);
  return out;
}

bool HostMemoryFits(const Recipe& r, Bytes heaviest_stage_host) {
  return heaviest_stage_host.count() == 0 ||
         heaviest_stage_host * r.cluster.gpus_per_node <= GiB(r.cluster.spec.host_memory_gib);
}

MemoryEstimate EstimateMemory(const Inventory& inventory, const Layout& layout, const StagePlan& stages) {
  MemoryEstimate est;
  EstimateRanks(inventory, layout, stages, &est.stages);
  for (int64_t r = 0; r < layout.pp; ++r) {
    if (est.stages[static_cast<size_t>(r)].total() > est.stages[static_cast<size_t>(est.worst_stage)].total()) {
      est.worst_stage = r;
    }
  }
  const RankMemory& worst = est.stages[static_cast<size_t>(est.worst_stage)];
  const Bytes floor = GiB(inventory.recipe.cluster.min_headroom_gib);
  est.verdict.headroom = worst.headroom();
  est.verdict.fits = worst.total() <= worst.capacity;
  est.verdict.headroom_ok = est.verdict.headroom >= floor;
  const std::string stage = Cat({"stage ", std::to_string(est.worst_stage)});
  // Offloaded optimizer state: the heaviest stage's host bytes on every GPU
  // of a node, against the node's host memory.
  Bytes host;
  for (const RankMemory& m : est.stages) host = std::max(host, m.host);
  est.verdict.host_per_node = host * inventory.recipe.cluster.gpus_per_node;
  const Bytes host_capacity = GiB(inventory.recipe.cluster.spec.host_memory_gib);
  est.verdict.host_fits = HostMemoryFits(inventory.recipe, host);
  if (!est.verdict.host_fits) {
    est.verdict.fits = false;
    est.verdict.reason =
        Cat({"host memory: ", GiBText(est.verdict.host_per_node), " of offloaded optimizer state a node (",
             std::to_string(inventory.recipe.cluster.gpus_per_node), " GPUs x ", GiBText(host), ") exceeds ",
             GiBText(host_capacity)});
    return est;
  }
  if (!est.verdict.fits) {
    est.verdict.reason = Cat({stage, " over capacity by ", GiBText(Bytes(0) - est.verdict.headroom)});
  } else if (!est.verdict.headroom_ok) {
    est.verdict.reason = Cat({stage, " fits with ", GiBText(est.verdict.headroom), " headroom, below the ",
                              GiBText(floor), " floor"});
  } else {
    est.verdict.reason = Cat({"worst ", stage, " leaves ", GiBText(est.verdict.headroom), " headroom"});
  }
  return est;
}

}  // namespace preflight

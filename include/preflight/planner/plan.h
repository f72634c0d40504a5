// The planner: mesh placement (rank -> node/GPU, group locality per axis),
// pipeline-stage partition, communication volume per axis per step and a
// step-time estimate (DESIGN.md, `preflight plan`; MATH.md 4, 7).
//
// Speed contract: BuildPlanTables walks the inventory once; every pricing
// function after it (PartitionStages on tables, BuildStageComm, EstimateStepTime)
// is arithmetic on those tables, with no I/O and no allocation beyond its
// result vectors, so a sweep can price millions of layouts. PlaceRanks lists
// every rank and group (O(world)); a sweep caches its MeshLocality per
// (degrees, order) instead of re-placing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/comm.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Mesh placement (MATH.md 7.3)


/// Where one global rank sits and its coordinate on every axis.
struct RankCoord {
  int64_t rank = 0;
  int64_t node = 0;       // rank / gpus_per_node
  int64_t local_gpu = 0;  // rank % gpus_per_node
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
  int64_t expert_tp = 0, ep = 0, expert_dp = 0;
};

/// Summary of the groups of one axis.
struct AxisLocality {
  Axis axis = Axis::kTp;
  int64_t size = 1;                 // ranks per group
  int64_t groups = 0;               // number of groups
  bool intra_node = true;           // every group inside one node (NVLink only)
  int64_t max_nodes_spanned = 1;    // over all groups
  /// Fewest members a spanning group has on one of its nodes (g_loc of MATH.md
  /// 7.1 B_eff; NCCL spreads a ring's channels over that many NICs). Equals
  /// `size` for intra-node axes.
  int64_t min_members_per_node = 1;
};
using MeshLocality = std::array<AxisLocality, kNumAxes>;

struct Mesh {
  int64_t world = 0;
  int64_t gpus_per_node = 8;
  int64_t nodes = 0;
  std::vector<RankCoord> ranks;  // indexed by global rank
  /// groups[axis] = every group of that axis, each a list of global ranks in
  /// axis-coordinate order. kEmbedding is empty unless the head is tied and pp > 1.
  std::array<std::vector<std::vector<int64_t>>, kNumAxes> groups;
  MeshLocality locality;
};

/// Global rank of (tp, cp, dp, pp) coordinates under layout.order:
/// tp->cp->dp->pp: i_tp + t*(i_cp + c*(i_dp + d*i_pp)) (Megatron default);
/// tp->cp->pp->dp: i_tp + t*(i_cp + c*(i_pp + p*i_dp)) (Llama 3).
int64_t RankOf(const Layout& layout, int64_t tp, int64_t cp, int64_t dp, int64_t pp);
/// Coordinates of `rank`, expert view included (MoE folding, MATH.md 7.3).
RankCoord CoordOf(const Layout& layout, int64_t rank, int64_t gpus_per_node);
/// Every rank and group of the layout, with locality per axis.
/// `tied_embedding` adds the kEmbedding groups when pp > 1.
Mesh PlaceRanks(const Layout& layout, int64_t gpus_per_node, bool tied_embedding = false);

// ---------------------------------------------------------------------------
// Collectives (MATH.md 7.1, NCCL ring convention). Payload S is the full
// buffer of one call: the input of an all-reduce, the gathered output of an
// all-gather, the unscattered input of a reduce-scatter, and the local send
// buffer of an all-to-all. Results floor when n does not divide the product
// (NCCL then sends uneven chunks; the floor is the per-rank mean).


/// 2(n-1)/n * S.
Bytes RingAllReduceSendBytes(Bytes payload, int64_t n);
/// (n-1)/n * S.
Bytes RingAllGatherSendBytes(Bytes payload, int64_t n);
/// (n-1)/n * S.
Bytes RingReduceScatterSendBytes(Bytes payload, int64_t n);
/// (n-1)/n * S (uniform destinations; the self share stays local).
Bytes AllToAllSendBytes(Bytes payload, int64_t n);
/// Dispatch on `kind`; kSendRecv sends the whole payload.
Bytes SendBytes(Collective kind, Bytes payload, int64_t n);
/// Sequential steps of the ring algorithm (latency term): AR 2(n-1), AG/RS/A2A n-1, p2p 1.
int64_t RingSteps(Collective kind, int64_t n);

/// Cost-model knobs; every default is [OURS] (MATH.md 7.1 "calibrate").
struct CostModel {
  /// Achieved fraction of the dense bf16 peak for the model's FLOPs. 0.5 sits
  /// between the 38-43% BF16 MFU of Llama 3 405B (Llama 3 paper, Table 4) and
  /// the ~55% reached by tuned dense Megatron runs.
  double compute_efficiency = 0.5;
  double nvlink_efficiency = 0.8;   // eta_nvl, MATH.md 7.1 (0.75-0.85)
  double ib_efficiency = 0.8;       // eta_ib
  double latency_s = 8e-6;          // alpha per ring step, MATH.md 7.1 (5-10 us)
  /// Gradient bucket (elements); Megatron DDP's default bucket_size is
  /// max(40M, 1M * dp) parameters. The last bucket's reduce is exposed.
  int64_t dp_bucket_elements = 40'000'000;
};

/// Link rates of one GPU, per direction (GpuSpec, decimal GB/s).
struct Links {
  double nvlink_bytes_per_s = 0;
  double ib_bytes_per_s = 0;
};
Links LinksOf(const GpuSpec& spec);

/// Time of one collective call on a group with `locality` (MATH.md 7.1):
/// alpha * steps + wire / B_eff, with B_eff = eta_nvl*NVLink inside a node,
/// min(eta_nvl*NVLink, g_loc*eta_ib*IB) for a spanning ring, and the
/// NVLink/IB split of a spanning all-to-all.
double CollectiveSeconds(Collective kind, Bytes payload, const AxisLocality& locality, const Links& links,
                         const CostModel& cost);

// ---------------------------------------------------------------------------
// Context-parallel state hand-off of M and R blocks (cp_recurrent: handoff,
// [OURS]; docs/plan.md). The sequence is cut into n chunks (n = 2c with causal
// load balancing, CP rank r holding chunks r and 2c-1-r; else c, rank r
// holding chunk r). The conv tail and the recurrent state pass along the
// chain 0 -> 1 -> ... -> n-1 in forward and back along it in backward; an
// edge j -> j+1 is a message when another CP rank owns chunk j+1.

/// The CP rank holding sequence chunk `chunk`.
int64_t CpChunkOwner(int64_t cp, bool load_balance, int64_t chunk);
/// Messages CP rank `cp_rank` sends per layer per micro-batch in one pass
/// (forward sends on the forward edges, backward as many on the reverse
/// edges). Balanced: ranks 0 and c-1 send 1, the others 2; unbalanced: every
/// rank but the last (forward) sends 1.
int64_t CpHandoffSends(int64_t cp, bool load_balance, int64_t cp_rank);
/// The busiest CP rank's CpHandoffSends: what the planner reports per
/// pipeline rank (its items are per pipeline rank, not per CP rank).
int64_t CpHandoffMaxSends(int64_t cp, bool load_balance);
/// Message edges on the chain, the sequential p2p steps of one pass:
/// c - 1 unbalanced, 2c - 2 balanced (chunks c-1 and c share a rank).
int64_t CpHandoffChainMessages(int64_t cp, bool load_balance);

// ---------------------------------------------------------------------------
// Per-layer tables (built once per inventory)

/// Layout-independent constants of one layer family (all layers of a family
/// share their shapes). FLOPs are forward, per token, unsharded.
struct FamilyCost {
  /// 2 * parameters one token touches (routed experts: top_k of them).
  double matmul_flops = 0;
  /// Attention core, causal: per token per unit of sequence length, so the
  /// FLOPs are this * s (QK^T and PV over s/2 keys on average):
  /// GQA 2*n_q*d_h, MLA n_q*(d_nope + d_rope + d_v).
  double flops_per_token_per_seq = 0;
  /// Sequence-length-independent non-matmul work per token (Mamba-2 SSD
  /// chunked scan, [OURS]): Q*G*N + Q*H*P + 4*H*P*N.
  double scan_flops = 0;
  int64_t tp_regions = 0;  // column-in -> row-out pairs (MATH.md 7.2)
  /// CP exchange width, elements per token, unsharded: attention K and V
  /// (p2p / all_gather), the Ulysses Q,K,V,O width (a2a), or Mamba/R
  /// all-to-all hand-off width.
  int64_t cp_kv_width = 0;
  int64_t cp_a2a_width = 0;
  /// Backward all-to-all width. Ulysses attention sends O again: TE's
  /// AttnFuncWithCPAndQKVOA2A saves the sequence-split O and its backward
  /// all-to-alls [O, dO] to heads, then [dQ, dK, dV] back, so GQA is
  /// (3 n_q + 2 n_kv) d_h against (2 n_q + 2 n_kv) d_h forward. M and R: as forward.
  int64_t cp_a2a_bwd_width = 0;
  bool is_moe = false;
};

struct PlanTables {
  int64_t layers = 0;
  std::vector<BlockKind> kinds;
  std::array<FamilyCost, 5> family{};              // indexed by FamilyIndex
  /// Prefix sums over layers (size layers + 1): entry i covers layers [0, i).
  std::vector<std::array<int64_t, 5>> family_count_prefix;
  std::vector<ParamTotals> params_prefix;
  /// Elements of Muon-managed TP-sharded matrices (global) and of every Muon
  /// matrix, for the Muon gathers; Newton-Schulz FLOPs of the dense Muon
  /// matrices (full matrix) and of all experts' matrices (divide by ep).
  std::vector<double> muon_ns_dense_flops_prefix;
  std::vector<double> muon_ns_expert_flops_prefix;
  int64_t embedding_params = 0;   // V*h (logical)
  int64_t head_params = 0;        // V*h when untied, else 0
  int64_t final_norm_params = 0;
  double head_flops = 0;          // forward per token: 2*V*h (+ loss, negligible)
  double muon_ns_head_flops = 0;  // 0: embedding/head are AdamW (MATH.md 9.4)
};

PlanTables BuildPlanTables(const Inventory& inventory);

// ---------------------------------------------------------------------------
// Pipeline stages (MATH.md 4.3)

/// Forward+backward(+recompute) time of each layer, and of the embedding and
/// head+loss ends, for one micro-batch on one rank under `layout`; the
/// partitioner's weights. Seconds.
struct LayerWeights {
  std::vector<double> layer_s;
  double embedding_s = 0;
  double head_s = 0;
  std::vector<int64_t> layer_params;  // tiebreak: parameter elements per layer
  int64_t embedding_params = 0;
  int64_t head_params = 0;
};
LayerWeights WeighLayers(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                         const CostModel& cost = {});

/// Cuts the layer list into ChunkCount(layout) contiguous chunks
/// minimising the slowest chunk (DP over prefix sums, O(L^2 * chunks)); ties
/// go to the smaller largest parameter count. Embedding charged to the first
/// chunk, head + loss to the last. Every chunk gets at least one layer.
StagePlan PartitionStages(const LayerWeights& weights, const Layout& layout);
StagePlan PartitionStages(const Inventory& inventory, const Layout& layout);

/// Chunks the schedule has: pp*vpp for 1F1B/interleaved, pp for DualPipe
/// (rank i also runs stage p-1-i in the reverse direction), 2*pp for
/// DualPipeV (V shape: device i holds chunks i and 2p-1-i).
int64_t ChunkCount(const Layout& layout);
/// Pipeline rank that holds chunk `chunk` of `chunks` (Megatron interleaving
/// c mod pp; DualPipeV's V shape).
int64_t PipelineRankOfChunk(const Layout& layout, int64_t chunk, int64_t chunks);

// ---------------------------------------------------------------------------
// Communication per step (MATH.md 7.2)


/// One collective stream of one rank in one training step: `calls` calls of
/// `payload` each. The simulator counts its real messages per (axis, kind,
/// pass, what) and compares with send/recv.
struct CommItem {
  Axis axis = Axis::kTp;
  Collective kind = Collective::kAllReduce;
  Pass pass = Pass::kForward;
  CommWhat what = CommWhat::kAttention;
  int64_t group_size = 1;
  Bytes payload;          // S of one call (see Collective)
  int64_t calls = 0;      // per step on this rank
  Bytes send;             // calls * SendBytes(kind, payload, group_size)
  Bytes recv;             // ring/a2a symmetric: == send; p2p: what the rank receives
  double seconds = 0;     // all calls, before overlap
  double exposed_seconds = 0;  // after the overlap assumptions (docs/plan.md)
  /// Of `seconds`, the part no overlap can hide, the floor of exposed_seconds;
  /// set for traffic issued unit by unit (ZeRO 2/3: the collectives of each
  /// chunk's first or last unit, docs/plan.md "overlap rules"), else 0.
  double unhidden_seconds = 0;
};

struct StageComm {
  int64_t pipeline_rank = 0;
  std::vector<CommItem> items;
  Bytes send_total() const;
  Bytes send_on(Axis a) const;
  Bytes recv_on(Axis a) const;
};

// ---------------------------------------------------------------------------
// Step time (MATH.md 4.2, 7.1)

/// Bubble as a fraction of the whole step (MATH.md 4.2 "fraction of the
/// total step", bubble/(m(t_F+t_B)+bubble)) for equal stages:
/// 1F1B (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1);
/// DualPipe (p/2-1)(F+2B-3W)/(m(F+B)+that) with B=2F, W=B/2 [OURS].
double BubbleFraction(Schedule schedule, int64_t p, int64_t v, int64_t m);

struct StageTime {
  int64_t pipeline_rank = 0;
  double forward_s = 0;       // compute, per micro-batch, all chunks on the rank
  double backward_s = 0;
  double recompute_s = 0;
  double exposed_comm_s = 0;  // TP + CP + EP exposed, per micro-batch
  double per_microbatch_s() const { return forward_s + backward_s + recompute_s + exposed_comm_s; }
};

struct StepTime {
  std::vector<StageTime> stages;
  int64_t slowest_stage = 0;
  double steady_s = 0;        // m * slowest per-micro-batch time (DualPipe: pair time)
  double bubble_s = 0;        // schedule bubble, incl. PP p2p of fill/drain
  double dp_exposed_s = 0;    // gradient reduce + param gather not hidden
  double optimizer_s = 0;     // Muon gathers + Newton-Schulz + small all-reduces
  double step_s = 0;
  double bubble_fraction = 0; // bubble_s / step_s
  double model_flops = 0;     // per step, whole cluster, no recompute (MFU numerator)
  double tokens_per_s = 0;
  double mfu = 0;             // model_flops / (step_s * world * peak)
  /// Exposed seconds per axis over the step (the slowest stage's rank).
  std::array<double, kNumAxes> exposed_by_axis{};
};

/// Everything the plan prices for one layout. Warnings (groups crossing
/// nodes, forced SP) go in `warnings`.
struct Plan {
  std::string name;               // the recipe's name
  Layout layout;
  Mesh mesh;
  StagePlan stages;
  bool stages_pinned = false;
  /// Which cut MakePlan took: "pinned", "time" (the partitioner's), or, when
  /// that one does not fit in memory, "parameters" or "equal_layers".
  std::string partition = "time";
  std::vector<StageComm> comm;    // one per pipeline rank
  StepTime time;
  CostModel cost;
  GpuSpec gpu;
  /// Per-stage memory from the estimator for `stages` (MakePlan fills it;
  /// the pricing functions never need it).
  std::optional<MemoryEstimate> memory;
  std::vector<Diagnostic> warnings;
};

/// Pricing for a given stage plan. `locality` from PlaceRanks (cached by sweeps).
std::vector<StageComm> BuildStageComm(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                                      const StagePlan& stages, const MeshLocality& locality, const CostModel& cost);
/// Fills each item's exposed_seconds (the overlap rules of docs/plan.md) and
/// returns the step time.
StepTime EstimateStepTime(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                          const StagePlan& stages, std::vector<StageComm>* comm, const CostModel& cost);

/// Planner validation beyond the recipe parser's (MATH.md 7.2/7.3): CP on
/// Mamba/R layers (all-to-all head split), DualPipe degrees, micro-batch
/// count vs pp, pinned boundaries. Errors carry key path and line from
/// recipe.source.
std::vector<Diagnostic> ValidateForPlan(const Recipe& recipe, const Layout& layout);

/// The stage cuts MakePlan chooses among, in its order: the time-balanced
/// cut (PartitionStages), the parameter-balanced cut and (except DualPipeV)
/// the equal-layer cut. MakePlan takes the first when it fits in memory, else
/// the fastest that fits. For sweeps that price the same choice cheaply.
std::vector<StagePlan> PartitionCandidates(const LayerWeights& weights, const Layout& layout, int64_t layers);

/// Places, partitions (or takes the recipe's pinned stages), prices. Memory
/// is the partition's constraint: when the time-balanced cut overflows a
/// device (estimator verdict), the parameter-balanced and equal-layer cuts are
/// priced and the fastest that fits is taken, with a warning. Returns
/// diagnostics (errors) instead when the layout cannot be planned.
struct PlanResult {
  std::optional<Plan> plan;
  std::vector<Diagnostic> diagnostics;
};
PlanResult MakePlan(const Inventory& inventory, const Layout& layout, const CostModel& cost = {});

}  // namespace preflight

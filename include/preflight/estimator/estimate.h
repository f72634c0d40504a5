// The capacity model: per-rank, per-stage memory geometry (docs/architecture.md,
// "Memory geometry"). Pure functions of (inventory, layout, stage plan); no
// I/O, no globals, and EstimateRank allocates nothing, so sweeps can call it
// millions of times.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Memory categories, always in this order and always all shown (docs/formulas.md §2.4).
enum class Category : int {
  kReplicatedParams = 0,
  kTpShardedParams,
  kEpShardedParams,
  kGradients,
  kOptimizerMuon,      // momentum (+ fp32 master of Muon-owned params)
  kOptimizerAdamW,     // two moments (+ fp32 master of AdamW-owned params)
  kActivations,        // saved for backward, x in-flight micro-batches of the schedule
  kRoutingScratch,     // MoE dispatch/combine buffers (transient, peak layer)
  kServingState,       // KV cache + Mamba conv/SSM state + R state (serving block only)
  kLibraryWorkspaces,  // cuBLAS workspaces of PyTorch and Transformer Engine (allocator-managed)
  kRuntimeReserve,     // CUDA context, NCCL buffers
  kAllocatorOverhead,  // fragmentation of allocator-managed bytes
};
inline constexpr int kNumCategories = 12;
/// Stable snake_case key ("replicated_params"), used in JSON and CSV.
const char* Key(Category c);
/// Human label ("replicated params").
const char* Label(Category c);

/// One rank's memory, every category, plain numbers.
struct RankMemory {
  std::array<Bytes, kNumCategories> bytes{};
  /// Activation bytes by block family, indexed like kAllBlockKinds (A, M, E, R, D),
  /// plus the embedding/head/loss terms of the pipeline ends in `activations_ends`.
  std::array<Bytes, 5> activations_by_family{};
  Bytes activations_ends;
  /// The largest one-layer transient on this rank (included in kActivations):
  /// the layer being recomputed under full recompute, Mamba SSD workspace, CP ring buffers.
  Bytes activations_transient;
  /// Of it, what a recompute rerun regenerates beyond the tensors kept for
  /// it (the largest layer's, or uniform group's): the simulator measures it apart.
  /// Under the per-op policy (selective_op) it also counts the saved outputs
  /// no backward reads, which the rerun takes back and frees: the transient,
  /// the peak's excess over the saved set, nets them out.
  Bytes activations_rerun;
  /// Activation offloading (training.activation_offload): the offloaded
  /// tensors still on the device, the last layer of each family before the
  /// first backward (Megatron keeps each module's last group so that its
  /// reload cannot stall the backward) and the next layer's, reloaded ahead
  /// of its backward. Included in kActivations; the rest is in `host`.
  Bytes activations_offload_kept;
  int64_t in_flight_microbatches = 0;  // of the schedule, on this pipeline rank
  Bytes capacity;                      // device capacity as CUDA reports it
  /// What PyTorch's caching allocator reports (docs/allocated.md): the bytes
  /// that stay allocated between steps (params, gradient buffers, optimizer
  /// state, serving state; torch.cuda.memory_allocated()) and the most
  /// allocated during a step (that plus activations at the schedule's peak
  /// and transients: total() minus runtime reserve and allocator overhead;
  /// torch.cuda.max_memory_allocated()).
  Bytes allocated_static;
  Bytes allocated_peak;
  /// The same two figures for the stage's last data-parallel rank (Megatron
  /// logs the last global rank): equal to them, except under
  /// parallel.optimizer_sharding: layer_wise, where whole tensors' optimizer
  /// state is dealt out by size and the last rank may own less than the
  /// heaviest (docs/allocated.md).
  Bytes last_rank_allocated_static;
  Bytes last_rank_allocated_peak;
  /// Host memory this rank's offloaded optimizer state takes
  /// (training.optimizer.offload_fraction): fp32 param, grad, Adam m and v.
  Bytes host;
  Bytes total() const;                 // sum of every category
  Bytes headroom() const { return capacity - total(); }
  Bytes of(Category c) const { return bytes[static_cast<int>(c)]; }
};

/// Memory of pipeline rank `pipeline_rank` (the worst TP/EP/DP rank of that
/// stage: vocab padding and uneven splits are charged to it).
RankMemory EstimateRank(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                        int64_t pipeline_rank);

/// Every pipeline rank's EstimateRank into `out` (resized to layout.pp, its
/// storage reused), the figures the ranks of one layout share worked out once.
void EstimateRanks(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                   std::vector<RankMemory>* out);

struct Verdict {
  bool fits = false;               // total <= capacity
  bool headroom_ok = false;        // headroom >= recipe's min_headroom_gib
  Bytes headroom;                  // of the worst rank
  std::string reason;              // one line, e.g. "stage 0 over capacity by 3.20 GiB"
  /// Offloaded optimizer state on one node: the heaviest stage's host bytes
  /// times the GPUs of a node (an upper bound: a node's GPUs may hold
  /// lighter stages), against cluster host memory. 0 without offload.
  Bytes host_per_node;
  bool host_fits = true;
};

struct MemoryEstimate {
  std::vector<RankMemory> stages;  // one per pipeline rank
  int64_t worst_stage = 0;         // pipeline rank with the largest total
  Verdict verdict;
};

/// Whether the node's offloaded optimizer state fits its host memory: the
/// heaviest stage's host bytes on every GPU of a node (Verdict::host_fits).
bool HostMemoryFits(const Recipe& recipe, Bytes heaviest_stage_host);

/// Every pipeline rank, the worst one and the verdict against the recipe's
/// capacity and headroom floor.
MemoryEstimate EstimateMemory(const Inventory& inventory, const Layout& layout, const StagePlan& stages);

/// One line of `--explain`: a figure, its formula and the numbers in it.
struct Explanation {
  Category category;
  std::string item;     // "activations A (x12 layers)"
  std::string formula;  // "s*b/(c*t) * (4h + 2(2n_q+2n_kv)d_h + 4n_q + 4) * layers * in_flight"
  std::string inputs;   // "s=8192 b=1 c=1 t=4 h=4096 ..."
  Bytes bytes;
};
/// The figures of EstimateRank with their formulas (slow path, for --explain).
std::vector<Explanation> ExplainRank(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                                     int64_t pipeline_rank);

}  // namespace preflight

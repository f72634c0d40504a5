// The reference executor (docs/architecture.md): runs a scaled copy of a
// recipe's blocks on simulated ranks inside one process and reports what it
// measured. Plain structs only; Eigen stays inside preflight_simulator.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "preflight/inventory/comm_bucket.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"

namespace preflight {
namespace sim {
class Transport;
}

/// Collective kinds of the simulated runtime (NCCL's set; the planner's
/// Collective prices kSend/kRecv as one kSendRecv, and has no broadcast).
enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSend, kRecv };
const char* Name(CollectiveKind k);

/// Bytes one rank moved for one (axis, kind, pass) bucket, counted from the
/// copies the simulated ring/direct algorithms made, in the modeled dtype.
struct CommCount {
  Axis axis = Axis::kTp;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  Pass pass = Pass::kForward;
  CommWhat what = CommWhat::kUnlabeled;  // what issued it (the planner's buckets)
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

/// Memory categories the executor tags every buffer with. Bytes are counted
/// in the modeled dtype (bf16 = 2 B/element) although the math runs in fp64.
enum class SimCategory : int {
  kReplicatedParams = 0,
  kTpShardedParams,
  kEpShardedParams,
  kGradients,
  kOptimizerMuon,   // Muon momentum + fp32 master copy
  kOptimizerAdamW,  // AdamW m, v + fp32 master copy
  kActivations,     // saved for backward
  kRoutingScratch,  // MoE routing/dispatch/combine buffers
  kTemporaries,     // other named buffers a block materialises (gathered inputs, projections,
                    // partial outputs); Eigen's expression temporaries are not counted
  kRecomputed,      // what a recompute rerun regenerates in backward, beyond the tensors kept for it
};
inline constexpr int kNumSimCategories = 10;
const char* Key(SimCategory c);

struct RankMeasurement {
  int rank = 0;
  int pipeline_rank = 0;
  /// Most (chunk, micro-batch) forwards whose backward had not run yet: the
  /// micro-batches in flight under the pipeline schedule (docs/formulas.md §4.1).
  int64_t peak_in_flight = 0;
  std::vector<CommCount> comm;                         // sorted by (axis, kind, pass, what)
  std::array<int64_t, kNumSimCategories> peak_bytes{};  // per category
  std::array<int64_t, kNumSimCategories> final_bytes{};  // live at the end of the step
  int64_t peak_total_bytes = 0;                         // peak of the sum over categories
  /// Host memory (offloaded optimizer state, FSDP's CPU shards): peak of its
  /// sum, and the bytes copied device to host and host to device in the step.
  int64_t host_peak_bytes = 0;
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  /// What PyTorch's allocator would report for the step: the bytes still
  /// allocated right after the optimizer step (torch.cuda.memory_allocated()
  /// between steps) and the most allocated at any instant of the step, the
  /// optimizer's transients included (torch.cuda.max_memory_allocated()).
  int64_t allocated_static_bytes = 0;
  int64_t allocated_peak_bytes = 0;
  /// Activation bytes by owner ("A", "D", "E", "ends") at the activation peak.
  std::map<std::string, int64_t> activations_at_peak;
};

/// How a simulated rank's program ended when it did not finish (the MPI
/// runtime reports it from rank 0, the thread runtime by what it rethrows).
enum class SimFailure {
  kUnsupported,  // a SimUnsupported: the layout is refused (exit 2)
  kOutOfMemory,  // std::bad_alloc: a resource limit of this machine (exit 2)
  kFailed,       // a mismatch, a deadlock or hang, or an exception (exit 1)
};

/// Numerics scalar for the run.
enum class SimPrecision { kFp64, kFp32 };

struct SimOptions {
  SimPrecision precision = SimPrecision::kFp64;
  uint64_t seed = 1234;
  /// Scale for initial weights (std of the uniform init) and inputs.
  double init_scale = 0.5;
  /// Learning rates of the one optimizer step (AdamW and Muon defaults of
  /// simulator/optimizers.h: KJ muon.py / PyTorch conventions).
  double adamw_lr = 1e-3;
  double muon_lr = 0.02;
  /// The runtime: null runs every rank as a thread of this process; else
  /// this process runs the transport's rank (the MPI runtime) and only rank 0
  /// gets the report (the others get an empty one).
  sim::Transport* transport = nullptr;
};

/// Error of one compared quantity: max |a-b| and max |a-b| / max(|a|,|b|) over
/// elements (relative to the largest magnitude of the reference tensor).
struct ErrorStat {
  std::string name;
  int64_t elements = 0;
  double max_abs = 0.0;
  double max_rel = 0.0;  // max_abs / max(max |reference|, tiny)
};

struct SimulationReport {
  std::string recipe_name;
  int64_t ranks = 0;
  int64_t microbatches = 0;            // per pipeline per step
  double loss_sharded = 0.0;           // mean over the global batch
  double loss_reference = 0.0;
  ErrorStat loss;                      // per micro-batch losses
  ErrorStat output;                    // the final hidden states of every micro-batch
  std::vector<ErrorStat> gradients;    // every parameter, gathered from the shards
  ErrorStat worst_gradient;
  /// The optimizer step: every parameter's update (new - old), gathered from
  /// each data-parallel replica (all replicas must hold the same values).
  std::vector<ErrorStat> updates;
  ErrorStat worst_update;
  std::vector<RankMeasurement> per_rank;
  int64_t dropped_pairs = 0;           // token-expert pairs dropped by capacity, all E layers, all ranks
  int64_t dropped_pairs_reference = 0; // the same count in the unsharded reference
  double flops = 0.0;                  // multiply-adds x2 of the sharded run's matmuls, all ranks
};

/// Numerics tolerance of docs/formulas.md §8: max relative error 1e-10 in fp64, 1e-5 in
/// fp32, for the loss, the output and every gradient (relative to the largest
/// magnitude of the reference tensor). Parameter updates in fp32 get more room:
/// Newton-Schulz amplifies small input differences by up to a^5 ~ 485
/// (simulator/optimizers.h), so a 1e-7 gradient difference can become ~5e-5.
struct NumericsTolerance {
  double values = 1e-10;
  double gradients = 1e-10;
  double updates = 1e-10;
};
NumericsTolerance ToleranceFor(SimPrecision p);
/// True when loss, output and every gradient are within `tol`.
bool NumericsAgree(const SimulationReport& report, const NumericsTolerance& tol);

/// One bucket of counted bytes beside the model's figure (docs/architecture.md).
struct CommAgreement {
  std::string axis, kind, pass, what;
  int64_t calls = 0;          // measured, on the busiest rank of the stage
  int64_t measured_sent = 0;  // most bytes a simulated rank of the stage put on the wire in this bucket
  int64_t modeled_sent = 0;   // the planner's figure for the stage (its busiest rank)
  bool in_model = true;       // the planner has this bucket
  bool in_run = true;         // the simulator issued this bucket
  bool exact = true;          // the model claims this exactly (else: routing-dependent, informational)
  bool agrees = true;
};

/// One memory category: measured peak beside the estimator's figure.
struct MemoryAgreement {
  std::string category;
  int64_t measured = 0;   // peak bytes, worst simulated rank of the stage
  int64_t modeled = 0;    // estimator, modeled bytes
  double tolerance = 0;   // allowed |measured - modeled| / modeled
  bool bound = false;     // the model is an upper bound: agrees when measured <= modeled
  bool agrees = true;
  std::string note;       // non-empty: informational row
};

/// The comparison of one pipeline stage: every rank of the stage measured,
/// the worst (busiest) one beside the planner's and estimator's figure for
/// the stage, which model that rank.
struct StageComparison {
  int64_t pipeline_rank = 0;
  std::vector<CommAgreement> comm;
  std::vector<MemoryAgreement> memory;
};

struct SimComparison {
  bool numerics_ok = false;
  NumericsTolerance tolerance;
  std::vector<StageComparison> stages;
  std::vector<std::string> notes;       // what was not compared, and why
  bool comm_ok() const;
  bool memory_ok() const;
  bool agrees() const { return numerics_ok && comm_ok() && memory_ok(); }
};

/// The pipeline stages the executor runs for `scaled`: the planner's
/// partition (MakePlan), as `fit` and `plan` price it; one stage without a planner.
StagePlan SimulatedStages(const Recipe& scaled);

/// Compares `report` (a run of `scaled`) stage by stage with the planner's
/// per-collective breakdown and the estimator's memory figures for the same
/// scaled recipe. Exactness and tolerances: see simulator/compare.cc.
SimComparison CompareWithModels(const Recipe& scaled, const SimulationReport& report, SimPrecision precision);

/// Thrown for input the executor cannot run (a block family it does not
/// implement yet, a layout with pp/cp/dp > 1, ...). The message says why.
class SimUnsupported : public std::runtime_error {
 public:
  explicit SimUnsupported(const std::string& what) : std::runtime_error(what) {}
};

/// The executor core (library preflight_executor): runs one training step of
/// `recipe` (already scaled) on its layout's simulated ranks, with `stages` as
/// the pipeline partition, and the same step on one unsharded rank, and
/// compares their numerics. Throws SimUnsupported for what it cannot run.
SimulationReport RunExecutor(const Recipe& recipe, const StagePlan& stages, const SimOptions& options = {});

/// Throws what RunExecutor would throw as SimUnsupported for `recipe`,
/// without running it: under MPI, checked before the processes are counted.
void CheckExecutorSupports(const Recipe& recipe, bool in_process);

/// RunExecutor on SimulatedStages(recipe) (library preflight_simulator).
SimulationReport Simulate(const Recipe& recipe, const SimOptions& options = {});

/// How to shrink a recipe for simulation.
struct ScaleOptions {
  int64_t hidden = 32;
  int64_t head_dim = 8;
  int64_t ffn_hidden = 32;     // dense MLP
  int64_t moe_ffn_hidden = 16; // per routed expert (and per shared expert)
  int64_t vocab = 64;
  int64_t seq_len = 16;
  int64_t repeat = 1;          // pattern repeats
  // Mamba-2 (M): d_i = expand * hidden stays; heads = d_i / head_dim.
  int64_t mamba_head_dim = 4;
  int64_t mamba_d_state = 4;
  int64_t mamba_chunk = 4;     // SSD chunk length (the chunked form is checked against the scan)
  // RG-LRU (R): width d_r; the recipe's gate blocks (heads) are kept.
  int64_t recurrent_width = 64;
  /// Most simulated ranks: a larger layout keeps tp, cp, pp, ep and expert_tp
  /// and shrinks dp to the smallest degree the expert folding allows (>= 2
  /// where the recipe has dp >= 2).
  int64_t max_world = 64;
  /// Micro-batches per pipeline per step: 0 = 2 x pp (the schedule reaches
  /// its steady state; 2 at pp = 1 so gradients accumulate).
  int64_t microbatches = 0;
};

/// A scaled copy of `recipe` on its layout: same pattern (repeated `repeat`
/// times, more when the pipeline needs a layer per chunk), same heads,
/// kv_heads, experts, top_k, capacity factor, Mamba groups, R gate blocks,
/// every parallel degree and mode (tp, sp, cp and its modes, pp, vpp,
/// schedule, ep, expert_tp, zero, order; dp as max_world allows); hidden,
/// head_dim, ffn, vocab and seq_len shrunk (seq_len rounded up so every CP
/// chunk and SP slice divides evenly), micro_batch 1, the recipe's recompute policy, pinned
/// stage boundaries dropped (they name layers of the full model).
Recipe ScaleRecipe(const Recipe& recipe, const ScaleOptions& scale);

}  // namespace preflight

// The layout sweep (`preflight sweep`, docs/architecture.md): every combination of
// parallel degrees, micro-batch, recompute and ZeRO stage for a GPU count,
// checked with the recipe validator's own rules (ValidateRecipe on a
// per-thread recipe copy, then the planner's ValidateForPlan), priced with the
// estimator (memory) and the planner (step time). The inventory and plan
// tables are built once; results are deterministic whatever the thread count.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// The values each axis takes; an empty list means the axis's default
/// (DefaultSweepSpace).
struct SweepSpace {
  int64_t gpus = 0;
  std::vector<int64_t> tp, cp, pp, vpp, ep, expert_tp, micro_batch, zero;
  std::vector<int64_t> dp_replicate;  // HSDP replicas (parallel.dp_replicate)
  std::vector<Recompute> recompute;
};

/// Parses an axis list: "1,2,4", "1..16" (every integer from a to b; the
/// validator rejects the degrees that do not divide), or a mix "1,3..8";
/// sorted ascending, duplicates dropped. Values must be positive (`min_value` lets --zero take 0)
/// and at most 2^24 (the recipe's bound on a degree).
/// nullopt with `error` set ("'3..x': 'x' is not an integer") when malformed.
std::optional<std::vector<int64_t>> ParseAxisList(const std::string& text, int64_t min_value, std::string* error);
/// Parses "none,selective,full" (any subset, comma-separated).
std::optional<std::vector<Recompute>> ParseRecomputeList(const std::string& text, std::string* error);

/// Fills the empty axes of `space` with powers of two within what the model
/// and cluster allow: tp <= gpus_per_node, cp <= 8, pp <= layers, vpp <= 8
/// (1 for DualPipe schedules), ep <= experts and expert_tp <= gpus_per_node
/// (1 without MoE layers), micro_batch <= 8, every recompute mode, ZeRO 0..3
/// (1..3 when replicas are swept), dp_replicate the recipe's value.
SweepSpace DefaultSweepSpace(const Recipe& recipe, SweepSpace space);

/// The recipe a sweep prices: `recipe` on `gpus` GPUs (nodes = gpus /
/// gpus_per_node; fewer GPUs than a node make one node of that many) with the
/// pinned stage boundaries dropped (the planner partitions each layout) and
/// parallel.sp set to `sequence_parallel`: on by default, so sequence
/// parallelism follows tp (in effect wherever tp > 1, as Megatron-LM runs TP)
/// instead of a tp-1 recipe's `sp: false` biasing every tp > 1 row.
/// nullopt with `error` when gpus is not a multiple of gpus_per_node.
std::optional<Recipe> SweepRecipe(const Recipe& recipe, int64_t gpus, std::string* error,
                                  bool sequence_parallel = true);

/// "fits": under capacity with at least cluster.min_headroom_gib left;
/// "tight": under capacity but below that floor; "over_capacity"; "invalid".
enum class SweepStatus : uint8_t { kFits, kTight, kOverCapacity, kInvalid };
/// Stable key ("fits", "tight", "over_capacity", "invalid").
const char* Key(SweepStatus s);

/// One evaluated layout, compact (a 1024-GPU sweep holds millions): the
/// degrees and micro-batch live in SweepResult::items[item]; recompute and
/// zero vary within an item. Time fields are 0 for invalid layouts.
struct SweepRow {
  int32_t item = 0;
  Recompute recompute = Recompute::kSelective;
  int8_t zero = 1;
  SweepStatus status = SweepStatus::kInvalid;
  int16_t worst_stage = 0;
  Bytes peak;              // total of the worst pipeline rank (0 when invalid)
  double step_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  /// The step's parts (StepBreakdown), single precision to keep rows small.
  float compute_s = 0, exposed_comm_s = 0, bubble_s = 0, optimizer_s = 0;
};

struct SweepResult {
  int64_t gpus = 0;
  int64_t nodes = 0;
  int64_t gpus_per_node = 0;
  Bytes capacity;
  Bytes min_headroom;
  std::string device;        // DeviceLabel of the recipe's cluster
  std::string priced_rates;  // PricedRates: the rates every step time used
  /// One layout per (tp, cp, pp, vpp, ep, expert_tp, dp_replicate, micro_batch), in the
  /// canonical order, with the validator's first error ("parallel.tp = 3:
  /// must divide ...") beside it, or "" when valid.
  std::vector<Layout> items;
  std::vector<std::string> item_errors;
  /// Beside each item valid under the other policies, the validator's first
  /// error under recompute selective_op (torchtitan's per-op policy, with
  /// rules of its own), or "" where valid; empty when no row is selective_op.
  std::vector<std::string> selective_op_errors;
  /// Every evaluated layout in the canonical order (tp, cp, pp, vpp, ep,
  /// expert_tp, dp_replicate, micro_batch, recompute, zero), each axis ascending.
  std::vector<SweepRow> rows;
  /// Indices into rows: the best fitting layouts by tokens/s (ties: lower
  /// peak, then canonical order), at most `top`.
  std::vector<int64_t> top;
  /// Indices into rows: the fitting layouts no other fitting layout beats on
  /// both peak memory and step time, by ascending peak.
  std::vector<int64_t> pareto;
  /// The recipe's training and parallel keys that move memory or time
  /// (RecipeField::affects), that the sweep does not vary and that the recipe
  /// sets away from their defaults, as "parallel.sp=false": every row holds
  /// them fixed.
  std::vector<std::string> held_fixed;
  /// parallel.sp of every row (SweepRecipe's `sequence_parallel`): on means
  /// in effect wherever tp > 1.
  bool sequence_parallel = true;
  /// Why this recipe's rows at ZeRO stage z (the index) are invalid whatever
  /// the layout, as `fit` would refuse them ("training.precision.fp4 = nvfp4:
  /// is not priced under ZeRO 3"), or "" where they are not.
  std::array<std::string, 4> zero_refusal;

  int64_t CountOf(SweepStatus s) const;
  /// The full layout of a row.
  Layout LayoutOf(const SweepRow& row) const;
  /// The row of `layout` (matched on every swept degree, micro-batch,
  /// recompute and ZeRO stage), or nullopt when the space does not hold it.
  std::optional<int64_t> RowOf(const Layout& layout) const;
  Bytes HeadroomOf(const SweepRow& row) const { return capacity - row.peak; }
  /// Why a row has its status: the validator's error, or the memory verdict
  /// ("peak 120.50 GiB leaves 19.12 GiB headroom").
  std::string ReasonOf(const SweepRow& row) const;
};

/// Why a sweep found nothing that fits: the invalid rows grouped by the key
/// their first error names (most first, with one reason as an example), and
/// the over-capacity row that misses by least.
struct NoFitReasons {
  struct Group {
    std::string key;  // "parallel.pp"
    int64_t rows = 0;
    std::string example;  // the first row's reason
  };
  std::vector<Group> invalid;  // at most `most` groups
  int64_t invalid_rows = 0;
  int64_t over_rows = 0;           // over capacity or under the headroom floor
  std::optional<int64_t> closest;  // index into rows: the smallest overflow (or the tightest)
};
NoFitReasons WhyNothingFits(const SweepResult& result, size_t most = 3);

struct SweepOptions {
  int64_t threads = 1;  // >= 1
  int64_t top = 10;
  CostModel cost;
  /// Called from the calling thread about every 100 ms with (done, total)
  /// layouts; may be empty.
  std::function<void(int64_t, int64_t)> progress;
};

/// Number of layouts the space enumerates (product of the axis sizes).
int64_t SweepSize(const SweepSpace& space);
/// SweepSize in checked arithmetic: nullopt when the product overflows.
std::optional<int64_t> CheckedSweepSize(const SweepSpace& space);
/// The most GPUs a sweep lays out: the recipe's bounds (2^24 nodes of at most
/// 1024 GPUs), so node counts and their products stay inside int64.
inline constexpr int64_t kMaxSweepGpus = int64_t{1} << 34;
/// The most layouts one sweep prices. Each row is kept: about 380 B a layout
/// with the working set (bench/README.md "Limits"), so about 7.5 GB here.
inline constexpr int64_t kMaxSweepLayouts = 20'000'000;

/// Evaluates every layout of `space` (its axes already filled) against
/// `inventory`, built from SweepRecipe's result.
SweepResult RunSweep(const Inventory& inventory, const SweepSpace& space, const SweepOptions& options);

/// Indices of the fitting rows ranked by tokens/s (see SweepResult::top).
std::vector<int64_t> RankByThroughput(const std::vector<SweepRow>& rows, int64_t top);

/// The step-time model's stated uncertainty: its median |error| against the
/// published runs' throughput (bench/README.md "throughput": 2.1 % since full
/// recompute's rerun collectives are priced, stated as 2.5 %;
/// tests/published_runs_test.cc holds the median under it). Layouts closer
/// than this in step time are a tie, not a ranking.
inline constexpr double kStepTimeUncertainty = 0.025;

/// For each position of `ranked` (indices into `rows`, best first), the
/// 1-based position of the first row of its tie group: a group starts at a
/// row and takes the following rows whose step time is within
/// kStepTimeUncertainty of that first row's. {10 s, 10.1 s, 10.5 s} -> {1, 1, 3}.
std::vector<int64_t> TieGroups(const std::vector<SweepRow>& rows, const std::vector<int64_t>& ranked);
/// Pareto front of the fitting rows over (peak, step_s), both minimised; equal
/// points are all kept. By ascending peak, then canonical order.
std::vector<int64_t> ParetoFront(const std::vector<SweepRow>& rows);

}  // namespace preflight

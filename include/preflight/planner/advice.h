// Fit advice (`preflight fit`): when a recipe does not fit, the few cheapest
// changes in its neighbourhood that make it fit, each with the headroom it
// gives and its estimated step-time cost; when it fits, the category that
// dominates the worst rank. Candidates are checked with the recipe
// validator's and the planner's rules (ValidateRecipe, ValidateForPlan),
// priced with EstimateMemory and the planner's step time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// The moves searched, in this order (also the tiebreak order). Every move but
/// kMoreNodes keeps the GPU count; kMoreNodes is searched only when none of
/// the others, alone or in pairs, fits.
enum class AdviceMove : int {
  kMoreTp = 0,         // parallel.tp x2 (dp halves), within one node
  kSequenceParallel,   // parallel.sp false -> true (tp > 1)
  kMoreEp,             // parallel.ep x2 (MoE only)
  kMorePp,             // parallel.pp x2 (dp halves; stages re-partitioned)
  kMoreCp,             // parallel.cp x2 (dp halves; each rank holds half the sequence)
  kZeroUp,             // parallel.zero + 1 (<= 3)
  kMoreRecompute,      // training.recompute none -> selective -> full
  kSmallerMicroBatch,  // training.micro_batch / 2 (more micro-batches)
  kFewerReplicas,      // parallel.dp_replicate / 2 (HSDP: larger ZeRO groups)
  kMoreNodes,          // cluster.nodes x2 (dp doubles: ZeRO shards and micro-batches per rank halve)
  // The moves that spend headroom for speed, searched when the recipe fits
  // with headroom to spare (FitAdvice::faster); each keeps the GPU count.
  kLessTp,            // parallel.tp / 2 (dp doubles)
  kLessPp,            // parallel.pp / 2 (dp doubles; stages re-partitioned)
  kLessCp,            // parallel.cp / 2 (dp doubles)
  kLessRecompute,     // training.recompute full -> selective -> none
  kLargerMicroBatch,  // training.micro_batch x2 (half the micro-batches)
};
inline constexpr int kNumAdviceMoves = 15;
/// The moves that keep the GPU count and lower memory: the first kNumSameGpuMoves of AdviceMove.
inline constexpr int kNumSameGpuMoves = 9;
/// The moves that trade memory for speed: kLessTp .. kLargerMicroBatch.
inline constexpr int kFirstFasterMove = static_cast<int>(AdviceMove::kLessTp);
/// Stable key ("more_tp", "sequence_parallel", "more_ep", "more_pp", "more_cp",
/// "zero_up", "more_recompute", "smaller_micro_batch", "fewer_replicas", "more_nodes",
/// "less_tp", "less_pp", "less_cp", "less_recompute", "larger_micro_batch").
const char* Key(AdviceMove m);

/// One recipe key changed by a suggestion.
struct AdviceChange {
  AdviceMove move = AdviceMove::kMoreTp;
  std::string key;   // "parallel.tp"
  std::string from;  // "2"
  std::string to;    // "4"
};

struct Suggestion {
  std::vector<AdviceChange> changes;  // one, or two when no single change fits
  Layout layout;                      // the layout after the changes
  Bytes peak;                         // worst rank after
  Bytes headroom;                     // after (capacity - peak)
  Bytes headroom_gain;                // headroom after - headroom before
  bool headroom_ok = false;           // after >= cluster.min_headroom_gib
  double step_s = 0;                  // estimated step time after
  double step_change = 0;             // step_s / step time before - 1 (0.05 = 5% slower)
  /// "parallel.tp 2 -> 4, training.recompute selective -> full"; a change of
  /// cluster.nodes adds the GPU count it needs ("cluster.nodes 8 -> 16 (128 GPUs)").
  std::string Summary() const;
};

struct FitAdvice {
  bool fits = false;
  /// Fits, but with less headroom than cluster.min_headroom_gib: `suggestions`
  /// then lists the changes that meet the floor.
  bool below_floor = false;
  double step_s = 0;  // the recipe's own estimated step time (0 when it cannot be planned)
  /// When it does not fit (or misses the floor): the cheapest changes that fit, best first
  /// (headroom floor met first, then the smallest step-time cost, then the
  /// most headroom, then move order); at most AdviceOptions::max_suggestions.
  std::vector<Suggestion> suggestions;
  /// When it fits: the largest category of the worst rank and its share of the total.
  Category dominant = Category::kActivations;
  Bytes dominant_bytes;
  double dominant_share = 0;
  int64_t worst_stage = 0;
  /// When it fits above the floor: single changes that still do and shorten
  /// the step by more than the step-time model's uncertainty, fastest first.
  std::vector<Suggestion> faster;
  /// The stages' memory spread: the heaviest and the lightest stage's peak.
  int64_t heaviest_stage = 0;
  int64_t lightest_stage = 0;
  Bytes heaviest;
  Bytes lightest;
};

struct AdviceOptions {
  int64_t max_suggestions = 3;
  CostModel cost;
};

/// Searches single moves from the recipe's layout, and pairs of moves (a move
/// may repeat: tp x4) when no single move fits; when nothing on the same GPUs
/// fits, twice, four and eight times the nodes (the first that fits). `inventory.recipe` is the
/// recipe; `layout` and `stages` what `fit` priced.
FitAdvice AdviseFit(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                    const AdviceOptions& options = {});

/// The recipe with one move applied (nullopt when the move does not apply,
/// e.g. zero already 3); pinned stage boundaries are dropped when pp changes.
/// Exposed so tests can re-estimate a suggestion through the ordinary path.
std::optional<Recipe> ApplyMove(const Recipe& recipe, AdviceMove move, AdviceChange* change);

}  // namespace preflight

// A default H200 launch layout for a model that comes without one (the
// recipe written by `preflight import hf` when no --layout is given).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "preflight/inventory/inventory.h"

namespace preflight {

struct DefaultLayout {
  int64_t nodes = 1;          // of 8 H200 GPUs each
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t ep = 1;
  int64_t dp = 1;             // 8 * nodes / (tp * pp)
  /// Megatron's uneven first/last stage when pp does not divide the layers
  /// (recipe/partition.h UnevenEnds); 0 = the even split.
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  int64_t global_batch = 512;  // sequences per step
  int64_t seq_len = 8192;
  /// Model-state bytes per GPU the rule estimated (params + grads + sharded optimizer).
  int64_t static_bytes_per_gpu = 0;
};

/// Degrees the user fixed (--layout); the rule searches only layouts that keep them.
struct LayoutPins {
  std::optional<int64_t> nodes;
  std::optional<int64_t> tp;
  std::optional<int64_t> pp;
  std::optional<int64_t> ep;
};

/// Static budget of the rule: half of an H200's 143771 MiB (docs/formulas.md §2.4), the
/// other half left for activations, transients and the runtime reserve.
inline constexpr int64_t kDefaultStaticBudgetBytes = 143771LL * 1048576LL / 2;

/// The smallest H200 cluster (1, 2, 4, ... 128 nodes of 8 GPUs) on which the
/// model state fits in kDefaultStaticBudgetBytes per GPU, and on it the
/// smallest model-parallel size tp * pp (tp inside a node first, tp valid for
/// every head count; on more than one node dp >= 2), with ep the largest power of two dividing the expert
/// count and the tp*dp ranks (at most 64). Model state per parameter with
/// bf16 params, fp32 grads and an AdamW distributed optimizer (ZeRO-1):
/// 6 + 12/D bytes, D the data-parallel degree of that parameter (docs/formulas.md §2.2).
/// nullopt when even 128 nodes do not suffice (or nothing keeps the pins).
std::optional<DefaultLayout> DefaultH200Layout(const Inventory& inventory, const LayoutPins& pins = {});

/// Every layout of the rule's search space (up to 128 nodes) whose model
/// state fits the budget, in the rule's order of preference: fewest nodes,
/// smallest tp * pp, larger tp. DefaultH200Layout is the first of them.
std::vector<DefaultLayout> H200LayoutCandidates(const Inventory& inventory, const LayoutPins& pins = {});

}  // namespace preflight

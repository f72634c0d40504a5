// The framework's unit of depth (its layer) and its rule for cutting layers
// into pipeline stages, on the recipe alone (validation, planner and emitters
// read the same split).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight {

/// True when every mixer is attention followed by exactly one MLP: Megatron's
/// GPTModel, whose layer is that pair (a transformer layer). Anything else
/// (Mamba, recurrent, a lone MLP or mixer) is Megatron's hybrid model, whose
/// layer is one pattern symbol.
bool IsTransformerStack(const std::vector<BlockKind>& sublayers);

/// Index of the sublayer where each layer starts, then the sublayer count
/// (size = layers + 1).
std::vector<int64_t> LayerStarts(const std::vector<BlockKind>& sublayers);
/// The number of layers (LayerStarts(sublayers).size() - 1).
int64_t LayerCount(const std::vector<BlockKind>& sublayers);

/// Model chunks a schedule runs: pp x vpp for 1F1B / interleaved, pp for
/// DualPipe (the mirrored chunks are copies), 2 pp for DualPipeV.
int64_t ChunkCountOf(Schedule schedule, int64_t pp, int64_t vpp);

/// Megatron first/last stage layer counts that split `layers` over `pp`
/// stages (vpp 1) when the even split does not: the middle stages take
/// ceil(layers / pp) each (floor when that leaves the ends empty) and the first
/// and last share the rest, the first the smaller half (it also holds the
/// embedding). {0, 0} when the even split divides; nullopt when no such
/// split gives every end a layer.
std::optional<std::pair<int64_t, int64_t>> UnevenEnds(int64_t layers, int64_t pp);

/// The recipe's split settings for other degrees (a sweep's layout, an
/// advice move): pp, vpp and the schedule replaced; Megatron's uneven
/// first/last stage counts describe the recipe's own pp, so for another pp
/// they are re-derived with UnevenEnds (left as they are when none exists,
/// for validation to refuse).
ParallelConfig SplitFor(const ParallelConfig& recipe, int64_t pp, int64_t vpp, Schedule schedule, int64_t layers);

/// Layers per model chunk (in chunk order) under the recipe's rule, or why
/// the framework refuses the layout (then `key`/`value` name the recipe key
/// to change).
struct LayerSplit {
  std::vector<int64_t> layers;
  std::string key;
  std::string value;
  std::string error;
  bool ok() const { return error.empty(); }
};

/// Megatron-LM's split (transformer_block.py get_num_layers_to_build,
/// transformer_config.py; hybrid models hybrid_layer_allocation.py), or
/// torchtitan's (pipeline_parallel.py generate_llm_fqn_per_model_part), of
/// `layers` layers. Balanced partitions have no rule: call only for
/// Partition::kMegatron and kTorchtitan.
LayerSplit RuleSplit(const ParallelConfig& p, int64_t layers, bool transformer_stack);

/// The pinned split (parallel.stage_boundaries, in layers), or the rule's,
/// of the stack `sublayers`; empty `layers` for a balanced partition with
/// nothing pinned.
LayerSplit RecipeSplit(const ParallelConfig& p, const std::vector<BlockKind>& sublayers);

}  // namespace preflight

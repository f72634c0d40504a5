// Which layers of a model chunk the executor checkpoints (keeps only their
// input, reruns their forward in backward), as Megatron-LM's
// TransformerBlock._checkpointed_forward (transformer_block.py) and the
// hybrid stack's (mamba_block.py) choose them.
#pragma once

#include <cstdint>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight::sim {

/// Blocks [first, end) of a chunk (indices into the chunk's blocks) that one
/// checkpoint covers: their input is kept, their forward keeps nothing, and
/// backward reruns them together before the last one's backward.
struct CheckpointGroup {
  int64_t first = 0, end = 0;
  friend bool operator==(const CheckpointGroup&, const CheckpointGroup&) = default;
};

/// The checkpoints of the chunk holding sublayers [first, end) of `layers`
/// (the whole model's kinds; a framework layer is recipe/partition.h's
/// LayerStarts: a transformer layer is its attention and MLP pair). Full
/// recompute, uniform: every group of recompute_layers consecutive framework
/// layers (the last may be shorter); block: each of the chunk's first
/// recompute_layers framework layers, the rest not checkpointed. Per-op
/// selective (selective_op): every framework layer on its own. Selective
/// recompute with "mlp": each dense MLP sublayer on its own (with Transformer
/// Engine its norm is inside the MLP module, so its checkpoint is the
/// sublayer's input; without, the block reruns its MLP from the norm output
/// itself). None otherwise.
std::vector<CheckpointGroup> CheckpointGroups(const std::vector<BlockKind>& layers, int64_t first, int64_t end,
                                              const TrainingConfig& training);

}  // namespace preflight::sim

#include "recompute.h"

#include <algorithm>

#include "preflight/recipe/partition.h"

namespace preflight::sim {

std::vector<CheckpointGroup> CheckpointGroups(const std::vector<BlockKind>& layers, int64_t first, int64_t end,
                                              const TrainingConfig& training) {
  std::vector<CheckpointGroup> out;
  if (training.recompute == Recompute::kSelective && training.recompute_modules.has(RecomputeModule::kMlp)) {
    // Without Transformer Engine the checkpoint is the separate norm's
    // output: the D block reruns its MLP itself (dense_blocks.cc).
    if (!training.transformer_engine) return out;
    for (int64_t i = first; i < end; ++i) {
      if (layers[static_cast<size_t>(i)] == BlockKind::kDenseMlp) out.push_back({i - first, i - first + 1});
    }
    return out;
  }
  // torchtitan's per-op policy checkpoints each transformer block
  // (SelectiveAC wraps model.layers' blocks): a uniform group of one layer.
  const bool op = training.recompute == Recompute::kSelectiveOp;
  if (training.recompute != Recompute::kFull && !op) return out;
  // The chunk's framework layers: the starts inside [first, end), then end.
  std::vector<int64_t> starts;
  for (int64_t s : LayerStarts(layers)) {
    if (s >= first && s < end) starts.push_back(s - first);
  }
  const auto count = static_cast<int64_t>(starts.size());
  starts.push_back(end - first);
  const int64_t n = op ? 1 : std::max<int64_t>(1, training.recompute_layers);
  const bool block = !op && training.recompute_method == RecomputeMethod::kBlock;
  const int64_t step = block ? 1 : n;
  const int64_t limit = block ? std::min(n, count) : count;
  for (int64_t k = 0; k < limit; k += step) {
    out.push_back({starts[static_cast<size_t>(k)], starts[static_cast<size_t>(std::min(k + step, count))]});
  }
  return out;
}

}  // namespace preflight::sim

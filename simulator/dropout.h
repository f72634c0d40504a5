// Dropout of the reference executor (training.dropout), seeded so that the
// sharded run draws exactly the unsharded reference's masks.
//
// Megatron draws its masks from CUDA RNG streams (megatron/core/tensor_parallel/
// random.py model_parallel_cuda_manual_seed): the default stream (the seed,
// + 100 per pipeline rank, the same on TP and DP ranks) and the tracker's
// model-parallel stream (seed + 2718 + tp_rank, forked by
// get_cuda_rng_tracker().fork()). Which one a site uses:
//   hidden dropout (bias-dropout-add, transformer_layer.py self_attn_bda /
//     mlp_bda, ssm/mamba_layer.py mamba_bda): the default stream, under
//     torch.enable_grad only (bias_dropout_add_exec_handler), with or without SP;
//   attention probabilities (transformer/dot_product_attention.py, unfused):
//     the model-parallel stream without SP (each TP rank its own heads), the
//     default stream with SP; Transformer Engine's DotProductAttention forks
//     the tracker too (get_rng_state_tracker) and keeps only the RNG state;
//   embedding dropout (models/common/embeddings/language_model_embedding.py):
//     the model-parallel stream with SP (after the scatter), else the default.
// A stream's draws depend on the layout, so no sharded Megatron run repeats
// an unsharded one's masks. The executor keeps what the streams guarantee (a
// replicated tensor's mask is the same on the ranks holding it; the shards of
// a split one draw independently) and makes each element's keep a pure
// function of (seed, site, layer, global micro-batch, the element's global
// coordinates), so every layout draws the same masks and a recompute rerun
// redraws its forward's (Megatron's CheckpointFunction saves and restores the
// RNG states around the rerun).
#pragma once

#include <cstdint>

#include "blocks.h"

namespace preflight::sim {

/// Where a mask is drawn (part of its key).
enum class DropoutSite : uint64_t { kEmbedding = 1, kHidden = 2, kAttention = 3 };

/// Whether the dropout at `site` of `layer` keeps the element at global
/// coordinates (a, b, c) of the micro-batch ctx.data_index: a hash
/// (splitmix64) of the key, uniform in [0, 1), at least ctx.dropout.
bool DropoutKeeps(const Ctx& ctx, DropoutSite site, int64_t layer, int64_t a, int64_t b, int64_t c);

/// The scale a kept element gets, 1 / (1 - p) (torch's inverted dropout).
inline double DropoutScale(const Ctx& ctx) { return 1.0 / (1.0 - ctx.dropout); }

/// The scaled keep mask (DropoutScale or 0) of this rank's rows of the
/// residual stream, rows x cols: local row i is its SP slice's (with
/// ctx.sp) at its CP position, keyed by (global position, batch row, column).
template <class T>
Mat<T> ResidualDropoutMask(const Ctx& ctx, DropoutSite site, int64_t layer, int64_t batch, int64_t rows, int64_t cols);

}  // namespace preflight::sim

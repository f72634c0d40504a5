// A scaled copy of a recipe for the executor: the pattern and every
// divisibility the layout needs stay; sizes shrink.
#include <algorithm>

#include "preflight/sim.h"

namespace preflight {

namespace {
/// Pattern x repeat, with E slots turned into D by first_k_dense / layer_freq
/// (recipe.h, MoeConfig): E slot j is MoE iff j >= first_k_dense and
/// (j - first_k_dense) % layer_freq == layer_offset.
std::vector<BlockKind> ExpandLayers(const ModelConfig& m) {
  std::vector<BlockKind> out;
  int64_t e_slot = 0;
  for (int64_t i = 0; i < m.repeat; ++i) {
    for (char c : m.pattern) {
      BlockKind k = static_cast<BlockKind>(c);
      if (k == BlockKind::kMoe) {
        const int64_t j = e_slot++;
        const bool moe = j >= m.moe.first_k_dense && m.moe.layer_freq > 0 &&
                         (j - m.moe.first_k_dense) % m.moe.layer_freq == m.moe.layer_offset;
        if (!moe) k = BlockKind::kDenseMlp;
      }
      out.push_back(k);
    }
  }
  return out;
}
}  // namespace

Recipe ScaleRecipe(const Recipe& recipe, const ScaleOptions& s) {
  Recipe r = recipe;
  ModelConfig& m = r.model;
  m.hidden = s.hidden;
  m.attention.head_dim = s.head_dim;
  m.mlp.ffn_hidden = s.ffn_hidden;
  const int64_t shared_count = m.moe.SharedWidth() > 0 ? std::max<int64_t>(1, m.moe.shared_experts) : 0;
  m.moe.ffn_hidden = s.moe_ffn_hidden;
  m.moe.shared_ffn_hidden = shared_count * s.moe_ffn_hidden;
  m.vocab = s.vocab;
  m.mamba.head_dim = s.mamba_head_dim;
  m.mamba.d_state = s.mamba_d_state;
  m.mamba.chunk = s.mamba_chunk;
  m.recurrent.width = s.recurrent_width;
  m.vocab_pad_multiple = 8;  // Megatron's 128 would dwarf a 64-token vocabulary
  m.repeat = s.repeat;
  m.layers = ExpandLayers(m);
  r.training.seq_len = s.seq_len;
  r.training.micro_batch = 1;
  r.training.recompute = Recompute::kNone;  // the executor keeps every saved tensor
  r.parallel.pp = 1;
  r.parallel.vpp = 1;
  r.parallel.cp = 1;
  r.parallel.stage_boundaries.clear();
  r.cluster.nodes = 1;
  r.cluster.gpus_per_node = r.parallel.tp;  // dp = 1
  r.training.global_batch = 1;
  // Gradients are synchronised DDP-style (all-reduce) until the distributed
  // optimizer is in the executor (part 2).
  r.parallel.zero = 0;
  // Expert degrees mean nothing without E layers (the parser warns); drop them
  // so the one-node scaled layout stays valid.
  bool has_moe = false;
  for (BlockKind k : m.layers) has_moe = has_moe || k == BlockKind::kMoe;
  if (!has_moe) {
    r.parallel.ep = 1;
    r.parallel.expert_tp = 1;
  }
  r.serving.reset();
  return r;
}

}  // namespace preflight

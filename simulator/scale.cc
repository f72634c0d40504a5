// A scaled copy of a recipe for the executor: the pattern, the layout and
// every divisibility the layout needs stay; sizes shrink.
#include <algorithm>
#include <numeric>

#include "preflight/recipe/partition.h"
#include "preflight/simulator/sim.h"

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

/// The recipe's dp when the world fits in max_dp, else the largest divisor
/// dp' <= max_dp of it for which the expert folding divides, (tp cp dp') %
/// (ep expert_tp) == 0 (docs/formulas.md §7.3); when none does, the smallest that does.
int64_t ScaledDp(const ParallelConfig& p, int64_t dp, int64_t max_dp) {
  // HSDP replicas must split the dense and the expert groups evenly too.
  const auto valid = [&](int64_t d) {
    const int64_t folded = p.tp * p.cp * d;
    return dp % d == 0 && folded % (p.ep * p.expert_tp) == 0 && (p.cp * d) % p.dp_replicate == 0 &&
           (folded / (p.ep * p.expert_tp)) % p.dp_replicate == 0;
  };
  for (int64_t d = std::min(dp, max_dp); d >= 1; --d) {
    if (valid(d)) return d;
  }
  for (int64_t d = max_dp + 1; d < dp; ++d) {
    if (valid(d)) return d;
  }
  return dp;
}

/// Sequence length: at least `wanted`, divisible into the CP chunks with each
/// CP rank's positions divisible by tp (SP), each chunk at least `min_chunk`.
int64_t ScaledSeq(const ParallelConfig& p, int64_t wanted, int64_t min_chunk) {
  const int64_t chunks = p.cp > 1 && p.cp_load_balance ? 2 * p.cp : p.cp;
  const int64_t unit = std::lcm(chunks, p.cp * p.tp);
  return RoundUp(std::max(wanted, chunks * min_chunk), unit);
}
}  // namespace

Recipe ScaleRecipe(const Recipe& recipe, const ScaleOptions& s) {
  Recipe r = recipe;
  ModelConfig& m = r.model;
  ParallelConfig& p = r.parallel;
  m.hidden = s.hidden;
  m.attention.head_dim = s.head_dim;
  if (m.mla) {
    // Distinct widths, so a slip between them shows: nope = head_dim, rope
    // head_dim/2 (even), v 3/4 head_dim, latents 3/4 and 1/2 hidden.
    MlaConfig& a = *m.mla;
    a.qk_nope_head_dim = s.head_dim;
    a.qk_rope_head_dim = RoundUp(std::max<int64_t>(2, s.head_dim / 2), 2);
    a.v_head_dim = std::max<int64_t>(1, 3 * s.head_dim / 4);
    if (a.q_lora_rank > 0) a.q_lora_rank = std::max<int64_t>(1, 3 * s.hidden / 4);
    a.kv_lora_rank = std::max<int64_t>(1, s.hidden / 2);
  }
  m.mlp.ffn_hidden = s.ffn_hidden;
  const int64_t shared_count = m.moe.SharedWidth() > 0 ? std::max<int64_t>(1, m.moe.shared_experts) : 0;
  m.moe.ffn_hidden = s.moe_ffn_hidden;
  m.moe.shared_ffn_hidden = shared_count * s.moe_ffn_hidden;
  m.vocab = s.vocab;
  m.vocab_pad_multiple = 8;  // Megatron's 128 would dwarf a 64-token vocabulary
  m.mamba.head_dim = s.mamba_head_dim;
  m.mamba.d_state = s.mamba_d_state;
  m.mamba.chunk = s.mamba_chunk;
  m.recurrent.width = s.recurrent_width;
  // Every pipeline chunk needs a layer (the framework's: a transformer layer
  // is two letters).
  std::vector<BlockKind> once;
  for (char c : m.pattern) once.push_back(static_cast<BlockKind>(c));
  const int64_t per_repeat = std::max<int64_t>(1, LayerCount(once));
  const int64_t chunks = ChunkCountOf(p.schedule, p.pp, p.vpp);
  m.repeat = std::max(s.repeat, (chunks + per_repeat - 1) / per_repeat);
  m.layers = ExpandLayers(m);
  bool has_moe = false;
  for (BlockKind k : m.layers) has_moe = has_moe || k == BlockKind::kMoe;
  if (!has_moe) {  // expert degrees mean nothing without E layers (the parser warns)
    p.ep = 1;
    p.expert_tp = 1;
  }
  p.stage_boundaries.clear();
  // The framework's split when it splits the scaled stack, else the
  // planner's balanced cut (the executor measures whichever the plan takes).
  if (!RecipeSplit(p, m.layers).ok()) {
    p.partition = Partition::kBalanced;
    p.first_stage_layers = 0;
    p.last_stage_layers = 0;
    p.embedding_in_split = false;
    p.loss_in_split = false;
  }

  const int64_t min_chunk = std::max({m.mamba.d_conv, m.recurrent.d_conv, int64_t{2}}) - 1;
  r.training.seq_len = ScaledSeq(p, s.seq_len, min_chunk);
  // A learned position table has one row per position of the scaled sequence.
  if (m.learned_positions > 0) m.learned_positions = r.training.seq_len;
  r.training.micro_batch = 1;

  const int64_t model_ranks = p.tp * p.cp * p.pp;
  const int64_t dp = ScaledDp(p, recipe.dp(), std::max<int64_t>(1, s.max_world / model_ranks));
  const int64_t world = model_ranks * dp;
  r.cluster.gpus_per_node = world % recipe.cluster.gpus_per_node == 0 ? recipe.cluster.gpus_per_node : world;
  r.cluster.nodes = world / r.cluster.gpus_per_node;
  const int64_t microbatches = s.microbatches > 0 ? s.microbatches : 2 * p.pp;
  r.training.global_batch = microbatches * dp;
  r.serving.reset();
  return r;
}

}  // namespace preflight

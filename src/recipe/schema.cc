#include "schema.h"

#include <algorithm>
#include <utility>

namespace preflight::recipe_internal {
namespace {

using Keys = std::vector<std::string>;

const std::vector<std::pair<std::string, Keys>>& Schema() {
  static const std::vector<std::pair<std::string, Keys>> kSchema = {
      {"", {"name", "model", "training", "parallel", "cluster", "serving"}},
      {"model",
       {"pattern", "repeat", "layers", "hidden", "vocab", "vocab_pad_multiple", "tie_embeddings", "norm", "attention",
        "mla", "mlp", "moe", "mamba", "recurrent"}},
      {"model.attention", {"heads", "kv_heads", "head_dim", "qk_norm"}},
      {"model.mla",
       {"heads", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"}},
      {"model.mlp", {"ffn_hidden", "activation"}},
      {"model.moe",
       {"experts", "top_k", "ffn_hidden", "shared_experts", "shared_ffn_hidden", "capacity_factor", "dropless",
        "pad_to_capacity", "dropless_skew", "router", "router_bias", "shared_gate", "first_k_dense", "layer_freq",
        "layer_offset"}},
      {"model.mamba", {"d_state", "d_conv", "expand", "head_dim", "groups", "chunk", "fused_norm_out_proj"}},
      {"model.recurrent", {"width", "heads", "d_conv"}},
      {"training",
       {"seq_len", "micro_batch", "global_batch", "recompute", "flash_attention", "dropout", "precision",
        "optimizer"}},
      {"training.precision", {"params", "grads", "master", "activations"}},
      {"training.optimizer", {"matrices", "other", "muon_momentum", "mamba_in_proj", "router"}},
      {"parallel",
       {"tp", "sp", "cp", "pp", "vpp", "ep", "expert_tp", "zero", "schedule", "order", "cp_comm",
        "stage_boundaries"}},
      {"cluster",
       {"gpu", "nodes", "gpus_per_node", "reserve_gib", "min_headroom_gib", "allocator_overhead", "capacity_mib"}},
      {"serving", {"batch", "context", "kv_dtype", "ssm_dtype"}},
  };
  return kSchema;
}

}  // namespace

const std::vector<std::string>& KeysOf(const std::string& path) {
  static const Keys kNone;
  for (const auto& [map_path, keys] : Schema()) {
    if (map_path == path) return keys;
  }
  return kNone;
}

std::optional<std::string> MapHoldingKey(const std::string& key, const std::string& except_path) {
  for (const auto& [map_path, keys] : Schema()) {
    if (map_path == except_path || map_path.empty()) continue;
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) return map_path;
  }
  return std::nullopt;
}

}  // namespace preflight::recipe_internal

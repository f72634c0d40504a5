#include "schema.h"

#include "recipe_bounds.h"

#include <algorithm>
#include <map>
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
       {"tp", "sp", "cp", "pp", "vpp", "ep", "expert_tp", "zero", "schedule", "order", "cp_comm", "cp_recurrent",
        "cp_load_balance", "stage_boundaries"}},
      {"cluster",
       {"gpu", "nodes", "gpus_per_node", "reserve_gib", "min_headroom_gib", "allocator_overhead", "capacity_mib"}},
      {"serving", {"batch", "context", "kv_dtype", "ssm_dtype"}},
  };
  return kSchema;
}

const std::map<std::string, IntRange, std::less<>>& IntRanges() {
  static const std::map<std::string, IntRange, std::less<>> kRanges = {
      {"model.attention.heads", {1, kMaxHeads}},
      {"model.attention.kv_heads", {1, kMaxHeads}},
      {"model.attention.head_dim", {1, kMaxHeadDim}},
      {"model.mla.heads", {1, kMaxHeads}},
      {"model.mla.q_lora_rank", {0, kMaxWidth}},
      {"model.mla.kv_lora_rank", {1, kMaxWidth}},
      {"model.mla.qk_rope_head_dim", {1, kMaxHeadDim}},
      {"model.mla.qk_nope_head_dim", {1, kMaxHeadDim}},
      {"model.mla.v_head_dim", {1, kMaxHeadDim}},
      {"model.mlp.ffn_hidden", {1, kMaxWidth}},
      {"model.moe.experts", {1, kMaxHeads}},
      {"model.moe.top_k", {1, kMaxHeads}},
      {"model.moe.ffn_hidden", {1, kMaxWidth}},
      {"model.moe.shared_experts", {0, 1024}},
      {"model.moe.shared_ffn_hidden", {0, kMaxWidth}},
      {"model.moe.first_k_dense", {0, kMaxLayers}},
      {"model.moe.layer_freq", {1, kMaxLayers}},
      {"model.moe.layer_offset", {0, kMaxLayers}},
      {"model.mamba.d_state", {1, kMaxHeadDim}},
      {"model.mamba.d_conv", {1, kMaxConv}},
      {"model.mamba.expand", {1, 1024}},
      {"model.mamba.head_dim", {1, kMaxHeadDim}},
      {"model.mamba.groups", {1, kMaxHeads}},
      {"model.mamba.chunk", {1, kMaxWidth}},
      {"model.recurrent.width", {1, kMaxWidth}},
      {"model.recurrent.heads", {1, kMaxHeads}},
      {"model.recurrent.d_conv", {1, kMaxConv}},
      {"model.repeat", {1, kMaxLayers}},
      {"model.hidden", {1, kMaxWidth}},
      {"model.vocab", {1, kMaxVocab}},
      {"model.vocab_pad_multiple", {1, kMaxWidth}},
      {"training.seq_len", {1, kMaxSeqLen}},
      {"training.micro_batch", {1, kMaxBatch}},
      {"training.global_batch", {1, kMaxBatch}},
      {"parallel.tp", {1, kMaxDegree}},
      {"parallel.cp", {1, kMaxDegree}},
      {"parallel.pp", {1, kMaxDegree}},
      {"parallel.vpp", {1, kMaxLayers}},
      {"parallel.ep", {1, kMaxDegree}},
      {"parallel.expert_tp", {1, kMaxDegree}},
      {"parallel.zero", {0, 3}},
      {"cluster.nodes", {1, kMaxNodes}},
      {"cluster.gpus_per_node", {1, kMaxGpusPerNode}},
      {"cluster.capacity_mib", {0, int64_t{1} << 40}},
      {"serving.batch", {1, kMaxBatch}},
      {"serving.context", {1, kMaxSeqLen}},
  };
  return kRanges;
}

}  // namespace

IntRange IntRangeOf(std::string_view path) {
  const auto& ranges = IntRanges();
  const auto it = ranges.find(path);
  return it == ranges.end() ? IntRange{0, -1} : it->second;
}

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

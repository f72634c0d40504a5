// The recipe field table (include/preflight/recipe/fields.h). Units are the
// ones docs/recipe.md prints (docs_recipe_fields_test holds the two
// together); ranges are the parser's (recipe_bounds.h names the limits).
#include "preflight/recipe/fields.h"

#include <fmt/format.h>

#include "recipe_bounds.h"

namespace preflight {
namespace {

using K = FieldKind;
using recipe_internal::kMaxBatch;
using recipe_internal::kMaxConv;
using recipe_internal::kMaxDegree;
using recipe_internal::kMaxGpusPerNode;
using recipe_internal::kMaxHeadDim;
using recipe_internal::kMaxHeads;
using recipe_internal::kMaxLayers;
using recipe_internal::kMaxNodes;
using recipe_internal::kMaxSeqLen;
using recipe_internal::kMaxVocab;
using recipe_internal::kMaxWidth;

// Optional sections read as their defaults when absent (docs/recipe.md lists those defaults).
const MlaConfig& MlaOf(const Recipe& r) {
  static const MlaConfig kDefault;
  return r.model.mla ? *r.model.mla : kDefault;
}
const ServingConfig& ServingOf(const Recipe& r) {
  static const ServingConfig kDefault;
  return r.serving ? *r.serving : kDefault;
}

std::string Int(int64_t x) { return fmt::format("{}", x); }
std::string Bool(bool b) { return b ? "true" : "false"; }
// Shortest text that reads back to the same double ("3", "1.25").
std::string Real(double x) { return fmt::format("{}", x); }

RecipeField Section(std::string_view path) { return {path, K::kSection, "map"}; }
RecipeField IntField(std::string_view path, std::string_view unit, int64_t min, int64_t max,
                     std::string (*text)(const Recipe&)) {
  RecipeField f{path, K::kInt, unit};
  f.min = min;
  f.max = max;
  f.text = text;
  return f;
}
RecipeField RealField(std::string_view path, std::string_view unit, double min, double max, bool max_exclusive,
                      std::string (*text)(const Recipe&)) {
  RecipeField f{path, K::kReal, unit};
  f.real_min = min;
  f.real_max = max;
  f.max_exclusive = max_exclusive;
  f.text = text;
  return f;
}
RecipeField Field(std::string_view path, FieldKind kind, std::string_view unit, std::string (*text)(const Recipe&)) {
  RecipeField f{path, kind, unit};
  f.text = text;
  return f;
}

std::vector<RecipeField> MakeFields() {
  const int64_t kNoLimit = int64_t{1} << 40;
  return {
      Field("name", K::kString, "—", [](const Recipe& r) { return r.name; }),
      Section("model"),
      Field("model.pattern", K::kLetters, "letters", [](const Recipe& r) { return r.model.pattern; }),
      IntField("model.repeat", "count", 1, kMaxLayers, [](const Recipe& r) { return Int(r.model.repeat); }),
      Field("model.layers", K::kLetters, "letters", nullptr),
      IntField("model.hidden", "elements", 1, kMaxWidth, [](const Recipe& r) { return Int(r.model.hidden); }),
      IntField("model.vocab", "tokens", 1, kMaxVocab, [](const Recipe& r) { return Int(r.model.vocab); }),
      IntField("model.vocab_pad_multiple", "tokens", 1, kMaxWidth,
               [](const Recipe& r) { return Int(r.model.vocab_pad_multiple); }),
      Field("model.tie_embeddings", K::kBool, "bool", [](const Recipe& r) { return Bool(r.model.tie_embeddings); }),
      Field("model.linear_bias", K::kBool, "bool", [](const Recipe& r) { return Bool(r.model.linear_bias); }),
      IntField("model.learned_positions", "positions", 0, kMaxSeqLen,
               [](const Recipe& r) { return Int(r.model.learned_positions); }),
      Field("model.norm", K::kEnum, "enum", [](const Recipe& r) { return std::string(Name(r.model.norm)); }),
      Section("model.attention"),
      IntField("model.attention.heads", "heads", 1, kMaxHeads,
               [](const Recipe& r) { return Int(r.model.attention.heads); }),
      IntField("model.attention.kv_heads", "heads", 1, kMaxHeads,
               [](const Recipe& r) { return Int(r.model.attention.kv_heads); }),
      IntField("model.attention.head_dim", "elements", 1, kMaxHeadDim,
               [](const Recipe& r) { return Int(r.model.attention.head_dim); }),
      Field("model.attention.qk_norm", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.model.attention.qk_norm); }),
      Section("model.mla"),
      IntField("model.mla.heads", "heads", 1, kMaxHeads, [](const Recipe& r) { return Int(MlaOf(r).heads); }),
      IntField("model.mla.q_lora_rank", "elements", 0, kMaxWidth,
               [](const Recipe& r) { return Int(MlaOf(r).q_lora_rank); }),
      IntField("model.mla.kv_lora_rank", "elements", 1, kMaxWidth,
               [](const Recipe& r) { return Int(MlaOf(r).kv_lora_rank); }),
      IntField("model.mla.qk_rope_head_dim", "elements", 1, kMaxHeadDim,
               [](const Recipe& r) { return Int(MlaOf(r).qk_rope_head_dim); }),
      IntField("model.mla.qk_nope_head_dim", "elements", 1, kMaxHeadDim,
               [](const Recipe& r) { return Int(MlaOf(r).qk_nope_head_dim); }),
      IntField("model.mla.v_head_dim", "elements", 1, kMaxHeadDim,
               [](const Recipe& r) { return Int(MlaOf(r).v_head_dim); }),
      Section("model.mlp"),
      IntField("model.mlp.ffn_hidden", "elements", 1, kMaxWidth,
               [](const Recipe& r) { return Int(r.model.mlp.ffn_hidden); }),
      Field("model.mlp.activation", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.model.mlp.activation)); }),
      Section("model.moe"),
      IntField("model.moe.experts", "experts", 1, kMaxHeads, [](const Recipe& r) { return Int(r.model.moe.experts); }),
      IntField("model.moe.top_k", "experts", 1, kMaxHeads, [](const Recipe& r) { return Int(r.model.moe.top_k); }),
      IntField("model.moe.ffn_hidden", "elements", 1, kMaxWidth,
               [](const Recipe& r) { return Int(r.model.moe.ffn_hidden); }),
      IntField("model.moe.shared_experts", "experts", 0, 1024,
               [](const Recipe& r) { return Int(r.model.moe.shared_experts); }),
      IntField("model.moe.shared_ffn_hidden", "elements", 0, kMaxWidth,
               [](const Recipe& r) { return Int(r.model.moe.shared_ffn_hidden); }),
      RealField("model.moe.capacity_factor", "factor", 0.01, 1024.0, false,
                [](const Recipe& r) { return Real(r.model.moe.capacity_factor); }),
      Field("model.moe.dropless", K::kBool, "bool", [](const Recipe& r) { return Bool(r.model.moe.dropless); }),
      Field("model.moe.pad_to_capacity", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.model.moe.pad_to_capacity); }),
      RealField("model.moe.dropless_skew", "factor", 1.0, 1024.0, false,
                [](const Recipe& r) { return Real(r.model.moe.dropless_skew); }),
      Field("model.moe.router", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.model.moe.router)); }),
      Field("model.moe.router_bias", K::kBool, "bool", [](const Recipe& r) { return Bool(r.model.moe.router_bias); }),
      Field("model.moe.shared_gate", K::kBool, "bool", [](const Recipe& r) { return Bool(r.model.moe.shared_gate); }),
      Field("model.moe.activation", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.model.moe.activation)); }),
      Field("model.moe.grouped_gemm", K::kBool, "bool", [](const Recipe& r) { return Bool(r.model.moe.grouped_gemm); }),
      IntField("model.moe.first_k_dense", "E slots", 0, kMaxLayers,
               [](const Recipe& r) { return Int(r.model.moe.first_k_dense); }),
      IntField("model.moe.layer_freq", "E slots", 1, kMaxLayers,
               [](const Recipe& r) { return Int(r.model.moe.layer_freq); }),
      IntField("model.moe.layer_offset", "E slots", 0, kMaxLayers,
               [](const Recipe& r) { return Int(r.model.moe.layer_offset); }),
      Section("model.mamba"),
      IntField("model.mamba.d_state", "elements", 1, kMaxHeadDim,
               [](const Recipe& r) { return Int(r.model.mamba.d_state); }),
      IntField("model.mamba.d_conv", "taps", 1, kMaxConv, [](const Recipe& r) { return Int(r.model.mamba.d_conv); }),
      IntField("model.mamba.expand", "factor", 1, 1024, [](const Recipe& r) { return Int(r.model.mamba.expand); }),
      IntField("model.mamba.head_dim", "elements", 1, kMaxHeadDim,
               [](const Recipe& r) { return Int(r.model.mamba.head_dim); }),
      IntField("model.mamba.groups", "groups", 1, kMaxHeads, [](const Recipe& r) { return Int(r.model.mamba.groups); }),
      IntField("model.mamba.chunk", "tokens", 1, kMaxWidth, [](const Recipe& r) { return Int(r.model.mamba.chunk); }),
      Field("model.mamba.fused_norm_out_proj", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.model.mamba.fused_norm_out_proj); }),
      Section("model.recurrent"),
      IntField("model.recurrent.width", "elements", 1, kMaxWidth,
               [](const Recipe& r) { return Int(r.model.recurrent.width); }),
      IntField("model.recurrent.heads", "blocks", 1, kMaxHeads,
               [](const Recipe& r) { return Int(r.model.recurrent.heads); }),
      IntField("model.recurrent.d_conv", "taps", 1, kMaxConv,
               [](const Recipe& r) { return Int(r.model.recurrent.d_conv); }),
      Section("training"),
      IntField("training.seq_len", "tokens", 1, kMaxSeqLen, [](const Recipe& r) { return Int(r.training.seq_len); }),
      IntField("training.micro_batch", "sequences", 1, kMaxBatch,
               [](const Recipe& r) { return Int(r.training.micro_batch); }),
      IntField("training.global_batch", "sequences", 1, kMaxBatch,
               [](const Recipe& r) { return Int(r.training.global_batch); }),
      Field("training.recompute", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.training.recompute)); }),
      Field("training.flash_attention", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.training.flash_attention); }),
      RealField("training.dropout", "fraction", 0.0, 1.0, true,
                [](const Recipe& r) { return Real(r.training.dropout); }),
      Field("training.transformer_engine", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.training.transformer_engine); }),
      Field("training.defer_head_wgrad", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.training.defer_head_wgrad); }),
      IntField("training.head_wgrad_deferral_limit", "micro-batches", 0, kMaxBatch,
               [](const Recipe& r) { return Int(r.training.head_wgrad_deferral_limit); }),
      Section("training.precision"),
      Field("training.precision.params", K::kEnum, "dtype",
            [](const Recipe& r) { return std::string(Name(r.training.precision.params)); }),
      Field("training.precision.grads", K::kEnum, "dtype",
            [](const Recipe& r) { return std::string(Name(r.training.precision.grads)); }),
      Field("training.precision.master", K::kEnum, "dtype",
            [](const Recipe& r) {
              return r.training.precision.master ? std::string(Name(*r.training.precision.master)) : "none";
            }),
      Field("training.precision.activations", K::kEnum, "dtype",
            [](const Recipe& r) { return std::string(Name(r.training.precision.activations)); }),
      Section("training.optimizer"),
      Field("training.optimizer.matrices", K::kEnum, "optimizer",
            [](const Recipe& r) { return std::string(Name(r.training.optimizer.matrices)); }),
      Field("training.optimizer.other", K::kEnum, "optimizer",
            [](const Recipe& r) { return std::string(Name(r.training.optimizer.other)); }),
      Field("training.optimizer.muon_momentum", K::kEnum, "dtype",
            [](const Recipe& r) { return std::string(Name(r.training.optimizer.muon_momentum)); }),
      Field("training.optimizer.mamba_in_proj", K::kEnum, "optimizer",
            [](const Recipe& r) { return std::string(Name(r.training.optimizer.mamba_in_proj)); }),
      Field("training.optimizer.router", K::kEnum, "optimizer",
            [](const Recipe& r) { return std::string(Name(r.training.optimizer.router)); }),
      Section("parallel"),
      IntField("parallel.tp", "ranks", 1, kMaxDegree, [](const Recipe& r) { return Int(r.parallel.tp); }),
      Field("parallel.sp", K::kBool, "bool", [](const Recipe& r) { return Bool(r.parallel.sp); }),
      IntField("parallel.cp", "ranks", 1, kMaxDegree, [](const Recipe& r) { return Int(r.parallel.cp); }),
      IntField("parallel.pp", "ranks", 1, kMaxDegree, [](const Recipe& r) { return Int(r.parallel.pp); }),
      IntField("parallel.vpp", "chunks", 1, kMaxLayers, [](const Recipe& r) { return Int(r.parallel.vpp); }),
      IntField("parallel.ep", "ranks", 1, kMaxDegree, [](const Recipe& r) { return Int(r.parallel.ep); }),
      IntField("parallel.expert_tp", "ranks", 1, kMaxDegree, [](const Recipe& r) { return Int(r.parallel.expert_tp); }),
      IntField("parallel.zero", "stage", 0, 3, [](const Recipe& r) { return Int(r.parallel.zero); }),
      Field("parallel.schedule", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.parallel.schedule)); }),
      Field("parallel.order", K::kEnum, "enum", [](const Recipe& r) { return std::string(Name(r.parallel.order)); }),
      Field("parallel.cp_comm", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.parallel.cp_comm)); }),
      Field("parallel.cp_recurrent", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(r.parallel.cp_recurrent)); }),
      Field("parallel.cp_load_balance", K::kBool, "bool",
            [](const Recipe& r) { return Bool(r.parallel.cp_load_balance); }),
      Field("parallel.stage_boundaries", K::kIntList, "layer indices",
            [](const Recipe& r) { return fmt::format("[{}]", fmt::join(r.parallel.stage_boundaries, ", ")); }),
      Section("cluster"),
      Field("cluster.gpu", K::kString, "preset", [](const Recipe& r) { return r.cluster.gpu; }),
      IntField("cluster.nodes", "nodes", 1, kMaxNodes, [](const Recipe& r) { return Int(r.cluster.nodes); }),
      IntField("cluster.gpus_per_node", "GPUs", 1, kMaxGpusPerNode,
               [](const Recipe& r) { return Int(r.cluster.gpus_per_node); }),
      RealField("cluster.reserve_gib", "GiB", 0.0, 1e6, false,
                [](const Recipe& r) { return Real(r.cluster.reserve_gib); }),
      RealField("cluster.min_headroom_gib", "GiB", 0.0, 1e6, false,
                [](const Recipe& r) { return Real(r.cluster.min_headroom_gib); }),
      RealField("cluster.allocator_overhead", "fraction", 0.0, 1.0, true,
                [](const Recipe& r) { return Real(r.cluster.allocator_overhead); }),
      IntField("cluster.capacity_mib", "MiB", 0, kNoLimit, [](const Recipe& r) { return Int(r.cluster.capacity_mib); }),
      IntField("cluster.cublas_workspace_mib", "MiB", 0, 4096,
               [](const Recipe& r) { return Int(r.cluster.cublas_workspace_mib); }),
      Section("serving"),
      IntField("serving.batch", "sequences", 1, kMaxBatch, [](const Recipe& r) { return Int(ServingOf(r).batch); }),
      IntField("serving.context", "tokens", 1, kMaxSeqLen, [](const Recipe& r) { return Int(ServingOf(r).context); }),
      Field("serving.kv_dtype", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(ServingOf(r).kv_dtype)); }),
      Field("serving.ssm_dtype", K::kEnum, "enum",
            [](const Recipe& r) { return std::string(Name(ServingOf(r).ssm_dtype)); }),
  };
}

}  // namespace

std::string_view RecipeField::key() const {
  const size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

std::string_view RecipeField::parent() const {
  const size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

const std::vector<RecipeField>& RecipeFields() {
  static const std::vector<RecipeField> kFields = MakeFields();
  return kFields;
}

const RecipeField* FindRecipeField(std::string_view path) {
  for (const RecipeField& f : RecipeFields()) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

}  // namespace preflight

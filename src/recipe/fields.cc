// The recipe field table (include/preflight/recipe/fields.h). Units are the
// ones docs/recipe.md prints (docs_recipe_fields_test holds the two
// together); ranges are the parser's (recipe_bounds.h names the limits).
#include "preflight/recipe/fields.h"

#include <fmt/format.h>

#include "reader.h"
#include "recipe_bounds.h"

namespace preflight {
namespace {

using K = FieldKind;
using recipe_internal::kMaxBatch;
using recipe_internal::kMaxConv;
using recipe_internal::kMaxDegree;
using recipe_internal::kMaxFlextronChoices;
using recipe_internal::kMaxGpusPerNode;
using recipe_internal::kMaxHeadDim;
using recipe_internal::kMaxHeads;
using recipe_internal::kMaxLayers;
using recipe_internal::kMaxNameLength;
using recipe_internal::kMaxNodes;
using recipe_internal::kMaxSeqLen;
using recipe_internal::kMaxVocab;
using recipe_internal::kMaxWidth;
using recipe_internal::MapReader;

// Optional sections read as their defaults when absent (docs/recipe.md lists
// those defaults); the parser opens them (RecipeField::open) when written.
const MlaConfig& MlaOf(const Recipe& r) {
  static const MlaConfig kDefault;
  return r.model.mla ? *r.model.mla : kDefault;
}
MlaConfig& MlaOf(Recipe& r) { return r.model.mla ? *r.model.mla : r.model.mla.emplace(); }
const ServingConfig& ServingOf(const Recipe& r) {
  static const ServingConfig kDefault;
  return r.serving ? *r.serving : kDefault;
}
ServingConfig& ServingOf(Recipe& r) { return r.serving ? *r.serving : r.serving.emplace(); }
const CustomDevice& DeviceOf(const Recipe& r) {
  static const CustomDevice kNone;
  return r.cluster.device ? *r.cluster.device : kNone;
}
CustomDevice& DeviceOf(Recipe& r) { return r.cluster.device ? *r.cluster.device : r.cluster.device.emplace(); }

// Each enum's words, as recipes write them.
template <class E>
using Names = std::vector<std::pair<std::string, E>>;
const Names<DType> kDTypes = {
    {"fp32", DType::kFp32}, {"bf16", DType::kBf16}, {"fp16", DType::kFp16}, {"fp8", DType::kFp8}};
const Names<std::optional<DType>> kMasterDTypes = {{"fp32", DType::kFp32},
                                                   {"bf16", DType::kBf16},
                                                   {"fp16", DType::kFp16},
                                                   {"fp8", DType::kFp8},
                                                   {"none", std::nullopt}};
const Names<Fp4Format> kFp4Formats = {
    {"none", Fp4Format::kNone}, {"nvfp4", Fp4Format::kNvfp4}, {"mxfp4", Fp4Format::kMxfp4}};
const Names<OptimizerKind> kOptimizers = {{"muon", OptimizerKind::kMuon}, {"adamw", OptimizerKind::kAdamW}};
// Muon only orthogonalises 2-D hidden matrices; everything else is AdamW.
const Names<OptimizerKind> kAdamWOnly = {{"adamw", OptimizerKind::kAdamW}};
const Names<NormKind> kNorms = {{"rmsnorm", NormKind::kRmsNorm}, {"layernorm", NormKind::kLayerNorm}};
const Names<FfnActivation> kFfnActivations = {
    {"swiglu", FfnActivation::kSwiglu}, {"gelu", FfnActivation::kGelu}, {"relu2", FfnActivation::kRelu2}};
const Names<RouterScore> kRouterScores = {{"softmax", RouterScore::kSoftmax}, {"sigmoid", RouterScore::kSigmoid}};
const Names<MoeDispatcher> kMoeDispatchers = {
    {"alltoall", MoeDispatcher::kAllToAll}, {"allgather", MoeDispatcher::kAllGather}, {"flex", MoeDispatcher::kFlex}};
const Names<Recompute> kRecomputes = {{"none", Recompute::kNone},
                                      {"selective", Recompute::kSelective},
                                      {"full", Recompute::kFull},
                                      {"selective_op", Recompute::kSelectiveOp}};
const Names<RecomputeMethod> kRecomputeMethods = {{"uniform", RecomputeMethod::kUniform},
                                                  {"block", RecomputeMethod::kBlock}};
const Names<CrossEntropy> kCrossEntropies = {{"vocab_parallel", CrossEntropy::kVocabParallel},
                                             {"fp32_upcast", CrossEntropy::kFp32Upcast}};
const Names<Schedule> kSchedules = {{"1f1b", Schedule::k1F1B},
                                    {"interleaved", Schedule::kInterleaved},
                                    {"dualpipe", Schedule::kDualPipe},
                                    {"dualpipev", Schedule::kDualPipeV}};
const Names<Partition> kPartitions = {
    {"megatron", Partition::kMegatron}, {"torchtitan", Partition::kTorchtitan}, {"balanced", Partition::kBalanced}};
const Names<EmbeddingSplit> kEmbeddingSplits = {{"vocab_parallel", EmbeddingSplit::kVocabParallel},
                                                {"replicated", EmbeddingSplit::kReplicated}};
const Names<AxisOrder> kAxisOrders = {{"tp-cp-dp-pp", AxisOrder::kTpCpDpPp}, {"tp-cp-pp-dp", AxisOrder::kTpCpPpDp}};
const Names<CpComm> kCpComms = {{"p2p", CpComm::kP2p}, {"all_gather", CpComm::kAllGather}, {"a2a", CpComm::kA2a}};
const Names<OptimizerSharding> kOptimizerShardings = {{"flat", OptimizerSharding::kFlat},
                                                      {"layer_wise", OptimizerSharding::kLayerWise}};
const Names<CpRecurrent> kCpRecurrents = {{"all_to_all", CpRecurrent::kAllToAll}, {"handoff", CpRecurrent::kHandoff}};

std::string Int(int64_t x) { return fmt::format("{}", x); }
std::string Bool(bool b) { return b ? "true" : "false"; }
// Shortest text that reads back to the same double ("3", "1.25").
std::string Real(double x) { return fmt::format("{}", x); }

std::string KeyOf(std::string_view path) {
  const size_t dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

// Each helper takes the member as a generic accessor, [](auto& r) -> auto& {
// return r.parallel.tp; }, so one lambda serves the text (const Recipe) and
// the parser (Recipe).
RecipeField Section(std::string_view path, std::function<void(Recipe&)> open = nullptr) {
  RecipeField f{path, K::kSection, "map"};
  f.open = std::move(open);
  f.affects = kAffectsNothing;
  return f;
}
template <class Member>
RecipeField IntField(std::string_view path, std::string_view unit, int64_t min, int64_t max, Member member) {
  RecipeField f{path, K::kInt, unit};
  f.min = min;
  f.max = max;
  f.text = [member](const Recipe& r) { return Int(member(r)); };
  f.read = [member, key = KeyOf(path)](MapReader& m, Recipe& r) { return m.Int(key, &member(r)); };
  return f;
}
template <class Member>
RecipeField RealField(std::string_view path, std::string_view unit, double min, double max, bool max_exclusive,
                      Member member) {
  RecipeField f{path, K::kReal, unit};
  f.real_min = min;
  f.real_max = max;
  f.max_exclusive = max_exclusive;
  f.text = [member](const Recipe& r) { return Real(member(r)); };
  f.read = [member, key = KeyOf(path)](MapReader& m, Recipe& r) { return m.Double(key, &member(r)); };
  return f;
}
template <class Member>
RecipeField BoolField(std::string_view path, Member member) {
  RecipeField f{path, K::kBool, "bool"};
  f.text = [member](const Recipe& r) { return Bool(member(r)); };
  f.read = [member, key = KeyOf(path)](MapReader& m, Recipe& r) { return m.Bool(key, &member(r)); };
  return f;
}
/// A set of words (EnumSet), written "[a, b]" in the enum's order.
template <class E, size_t N, class Member>
RecipeField SetField(std::string_view path, const E (&all)[N], std::string (*text)(EnumSet<E>), Member member) {
  RecipeField f{path, K::kWords, "list"};
  for (E e : all) f.names.push_back(Name(e));
  f.text = [member, text](const Recipe& r) { return text(member(r)); };
  f.read = [member, names = f.names, key = KeyOf(path)](MapReader& m, Recipe& r) {
    return m.Choices(key, &member(r).bits, names);
  };
  return f;
}
template <class E, class Member>
RecipeField EnumField(std::string_view path, std::string_view unit, const Names<E>& names, Member member) {
  RecipeField f{path, K::kEnum, unit};
  for (const auto& entry : names) f.names.push_back(entry.first);
  f.text = [member, &names](const Recipe& r) {
    for (const auto& [name, value] : names) {
      if (value == member(r)) return name;
    }
    return std::string("?");
  };
  f.read = [member, &names, key = KeyOf(path)](MapReader& m, Recipe& r) { return m.Enum(key, &member(r), names); };
  return f;
}
constexpr std::string_view kNone = kNoCounterpart;
constexpr std::string_view kOurs = kPreflightOnly;
RecipeField Spell(RecipeField f, std::string_view megatron, std::string_view torchtitan) {
  f.megatron = megatron;
  f.torchtitan = torchtitan;
  return f;
}
/// A key that moves fewer figures than both (RecipeField::affects).
RecipeField Moves(Affects affects, RecipeField f) {
  f.affects = affects;
  return f;
}
/// A figure that must be positive: (min, max].
RecipeField Positive(RecipeField f) {
  f.min_exclusive = true;
  return f;
}
/// A key of cluster.device: preflight's own; no value ("") while the recipe
/// names a preset, so diff and the docs show none.
RecipeField Device(Affects affects, RecipeField f) {
  f.text = [text = std::move(f.text)](const Recipe& r) { return r.cluster.device ? text(r) : std::string(); };
  f.affects = affects;
  f.megatron = kOurs;
  f.torchtitan = kOurs;
  return f;
}
/// cluster.device.based_on: the preset whose figures the device starts from.
/// It comes first in the table, so the parser reads it before the other
/// device keys, which then overwrite the preset's figures they give.
RecipeField DeviceBasedOn() {
  RecipeField f{"cluster.device.based_on", K::kEnum, "preset"};
  f.names = GpuPresetNames();
  f.text = [](const Recipe& r) { return DeviceOf(r).based_on; };
  f.read = [](MapReader& m, Recipe& r) {
    const std::vector<std::string> presets = GpuPresetNames();
    int index = -1;
    if (!m.Choice("based_on", &index, presets)) return false;
    if (index < 0) return true;
    CustomDevice& device = DeviceOf(r);
    device.based_on = presets[static_cast<size_t>(index)];
    device.spec = *GpuPreset(device.based_on);
    return true;
  };
  return f;
}
RecipeField DeviceName() {
  RecipeField f{"cluster.device.name", K::kString, "—"};
  f.text = [](const Recipe& r) { return DeviceOf(r).spec.name; };
  f.read = [](MapReader& m, Recipe& r) { return m.String("name", &DeviceOf(r).spec.name, kMaxNameLength); };
  return f;
}

/// A typed key whose reading the parser does by hand, with its neighbours.
RecipeField ByHand(RecipeField f) {
  f.read = nullptr;
  return f;
}
/// A key the parser reads by hand (its text only).
RecipeField Field(std::string_view path, FieldKind kind, std::string_view unit,
                  std::function<std::string(const Recipe&)> text) {
  RecipeField f{path, kind, unit};
  f.text = std::move(text);
  return f;
}

std::vector<RecipeField> MakeFields() {
  const int64_t kNoLimit = int64_t{1} << 40;
  return {
      Moves(kAffectsNothing,
            Spell(Field("name", K::kString, "—", [](const Recipe& r) { return r.name; }), kOurs, kOurs)),
      Section("model"),
      Spell(Field("model.pattern", K::kLetters, "letters", [](const Recipe& r) { return r.model.pattern; }),
            "--num-layers / --hybrid-layer-pattern", "(model flavor)"),
      Spell(ByHand(IntField(
                "model.repeat", "count", 1, kMaxLayers, [](auto& r) -> auto& { return r.model.repeat; })),
            "--num-layers / --hybrid-layer-pattern", "(model flavor)"),
      Spell(Field("model.layers", K::kLetters, "letters", nullptr), "--num-layers / --hybrid-layer-pattern",
            "(model flavor)"),
      Spell(IntField(
                "model.hidden", "elements", 1, kMaxWidth, [](auto& r) -> auto& { return r.model.hidden; }),
            "--hidden-size", "(model flavor)"),
      Spell(IntField(
                "model.vocab", "tokens", 1, kMaxVocab, [](auto& r) -> auto& { return r.model.vocab; }),
            "--vocab-size", "(model flavor)"),
      Spell(IntField(
                "model.vocab_pad_multiple", "tokens", 1, kMaxWidth,
                [](auto& r) -> auto& { return r.model.vocab_pad_multiple; }),
            "--make-vocab-size-divisible-by", "(model flavor)"),
      Spell(BoolField(
                "model.tie_embeddings", [](auto& r) -> auto& { return r.model.tie_embeddings; }),
            "--untie-embeddings-and-output-weights", "(model flavor)"),
      Spell(BoolField(
                "model.linear_bias", [](auto& r) -> auto& { return r.model.linear_bias; }),
            "--disable-bias-linear", "(model flavor)"),
      Spell(IntField(
                "model.learned_positions", "positions", 0, kMaxSeqLen,
                [](auto& r) -> auto& { return r.model.learned_positions; }),
            "--position-embedding-type learned_absolute, --max-position-embeddings", kNone),
      Spell(IntField(
                "model.mtp_layers", "modules", 0, 64, [](auto& r) -> auto& { return r.model.mtp_layers; }),
            "--mtp-num-layers", "model_registry(num_mtp_layers=...)"),
      Spell(BoolField(
                "model.mtp_shared_layer", [](auto& r) -> auto& { return r.model.mtp_shared_layer; }),
            "--mtp-use-repeated-layer", kNone),
      Spell(EnumField(
                "model.norm", "enum", kNorms, [](auto& r) -> auto& { return r.model.norm; }),
            "--normalization", "(model flavor)"),
      Section("model.attention"),
      Spell(
          IntField(
              "model.attention.heads", "heads", 1, kMaxHeads, [](auto& r) -> auto& { return r.model.attention.heads; }),
          "--num-attention-heads", "(model flavor)"),
      Spell(IntField(
                "model.attention.kv_heads", "heads", 1, kMaxHeads,
                [](auto& r) -> auto& { return r.model.attention.kv_heads; }),
            "--num-query-groups", "(model flavor)"),
      Spell(IntField(
                "model.attention.head_dim", "elements", 1, kMaxHeadDim,
                [](auto& r) -> auto& { return r.model.attention.head_dim; }),
            "--kv-channels", "(model flavor)"),
      Spell(BoolField(
                "model.attention.qk_norm", [](auto& r) -> auto& { return r.model.attention.qk_norm; }),
            "--qk-layernorm", "(model flavor)"),
      Section("model.mla", [](Recipe& r) { r.model.mla.emplace(); }),
      Spell(IntField(
                "model.mla.heads", "heads", 1, kMaxHeads, [](auto& r) -> auto& { return MlaOf(r).heads; }),
            "--num-attention-heads", "(model flavor)"),
      Spell(
          IntField(
              "model.mla.q_lora_rank", "elements", 0, kMaxWidth, [](auto& r) -> auto& { return MlaOf(r).q_lora_rank; }),
          "--q-lora-rank", "(model flavor)"),
      Spell(IntField(
                "model.mla.kv_lora_rank", "elements", 1, kMaxWidth,
                [](auto& r) -> auto& { return MlaOf(r).kv_lora_rank; }),
            "--kv-lora-rank", "(model flavor)"),
      Spell(IntField(
                "model.mla.qk_rope_head_dim", "elements", 1, kMaxHeadDim,
                [](auto& r) -> auto& { return MlaOf(r).qk_rope_head_dim; }),
            "--qk-pos-emb-head-dim", "(model flavor)"),
      Spell(IntField(
                "model.mla.qk_nope_head_dim", "elements", 1, kMaxHeadDim,
                [](auto& r) -> auto& { return MlaOf(r).qk_nope_head_dim; }),
            "--qk-head-dim", "(model flavor)"),
      Spell(
          IntField(
              "model.mla.v_head_dim", "elements", 1, kMaxHeadDim, [](auto& r) -> auto& { return MlaOf(r).v_head_dim; }),
          "--v-head-dim", "(model flavor)"),
      Section("model.mlp"),
      Spell(IntField(
                "model.mlp.ffn_hidden", "elements", 1, kMaxWidth,
                [](auto& r) -> auto& { return r.model.mlp.ffn_hidden; }),
            "--ffn-hidden-size", "(model flavor)"),
      Spell(
          EnumField(
              "model.mlp.activation", "enum", kFfnActivations, [](auto& r) -> auto& { return r.model.mlp.activation; }),
          "--swiglu / --squared-relu", "(model flavor)"),
      Section("model.moe"),
      Spell(IntField(
                "model.moe.experts", "experts", 1, kMaxHeads, [](auto& r) -> auto& { return r.model.moe.experts; }),
            "--num-experts", "(model flavor)"),
      Spell(IntField(
                "model.moe.top_k", "experts", 1, kMaxHeads, [](auto& r) -> auto& { return r.model.moe.top_k; }),
            "--moe-router-topk", "(model flavor)"),
      Spell(IntField(
                "model.moe.ffn_hidden", "elements", 1, kMaxWidth,
                [](auto& r) -> auto& { return r.model.moe.ffn_hidden; }),
            "--moe-ffn-hidden-size", "(model flavor)"),
      Spell(IntField(
                "model.moe.shared_experts", "experts", 0, 1024,
                [](auto& r) -> auto& { return r.model.moe.shared_experts; }),
            "--moe-shared-expert-intermediate-size", "(model flavor)"),
      Spell(IntField(
                "model.moe.shared_ffn_hidden", "elements", 0, kMaxWidth,
                [](auto& r) -> auto& { return r.model.moe.shared_ffn_hidden; }),
            "--moe-shared-expert-intermediate-size", "(model flavor)"),
      Spell(RealField(
                "model.moe.capacity_factor", "factor", 0.01, 1024.0, false,
                [](auto& r) -> auto& { return r.model.moe.capacity_factor; }),
            "--moe-expert-capacity-factor", "(model flavor)"),
      Spell(BoolField(
                "model.moe.dropless", [](auto& r) -> auto& { return r.model.moe.dropless; }),
            "--moe-expert-capacity-factor (absent)", "(model flavor)"),
      Spell(BoolField(
                "model.moe.pad_to_capacity", [](auto& r) -> auto& { return r.model.moe.pad_to_capacity; }),
            "--moe-pad-expert-input-to-capacity", "(model flavor)"),
      Moves(kAffectsMemory, Spell(RealField(
                                      "model.moe.dropless_skew", "factor", 1.0, 1024.0, false,
                                      [](auto& r) -> auto& { return r.model.moe.dropless_skew; }),
                                  kOurs, kOurs)),
      Moves(kAffectsNothing,
            Spell(EnumField(
                      "model.moe.router", "enum", kRouterScores, [](auto& r) -> auto& { return r.model.moe.router; }),
                  "--moe-router-score-function", "(model flavor)")),
      Spell(BoolField(
                "model.moe.router_bias", [](auto& r) -> auto& { return r.model.moe.router_bias; }),
            "--moe-router-enable-expert-bias", "(model flavor)"),
      Spell(BoolField(
                "model.moe.shared_gate", [](auto& r) -> auto& { return r.model.moe.shared_gate; }),
            "--moe-shared-expert-gate", "(model flavor)"),
      Spell(
          EnumField(
              "model.moe.activation", "enum", kFfnActivations, [](auto& r) -> auto& { return r.model.moe.activation; }),
          "--swiglu / --squared-relu", "(model flavor)"),
      Moves(kAffectsMemory,
            Spell(BoolField(
                      "model.moe.grouped_gemm", [](auto& r) -> auto& { return r.model.moe.grouped_gemm; }),
                  "--moe-grouped-gemm", "(model flavor)")),
      Spell(
          EnumField(
              "model.moe.dispatcher", "enum", kMoeDispatchers, [](auto& r) -> auto& { return r.model.moe.dispatcher; }),
          "--moe-token-dispatcher-type", "(model flavor)"),
      Spell(IntField(
                "model.moe.first_k_dense", "E slots", 0, kMaxLayers,
                [](auto& r) -> auto& { return r.model.moe.first_k_dense; }),
            "--moe-layer-freq", "(model flavor)"),
      Spell(IntField(
                "model.moe.layer_freq", "E slots", 1, kMaxLayers,
                [](auto& r) -> auto& { return r.model.moe.layer_freq; }),
            "--moe-layer-freq", "(model flavor)"),
      Spell(IntField(
                "model.moe.layer_offset", "E slots", 0, kMaxLayers,
                [](auto& r) -> auto& { return r.model.moe.layer_offset; }),
            "--moe-layer-freq", "(model flavor)"),
      Section("model.mamba"),
      Spell(IntField(
                "model.mamba.d_state", "elements", 1, kMaxHeadDim,
                [](auto& r) -> auto& { return r.model.mamba.d_state; }),
            "--mamba-state-dim", "(no Mamba or R block)"),
      Spell(IntField(
                "model.mamba.d_conv", "taps", 1, kMaxConv, [](auto& r) -> auto& { return r.model.mamba.d_conv; }),
            "(fixed: 4)", "(no Mamba or R block)"),
      Spell(IntField(
                "model.mamba.expand", "factor", 1, 1024, [](auto& r) -> auto& { return r.model.mamba.expand; }),
            "--mamba-num-heads", "(no Mamba or R block)"),
      Spell(IntField(
                "model.mamba.heads", "heads", 0, kMaxHeads, [](auto& r) -> auto& { return r.model.mamba.heads; }),
            "--mamba-num-heads", "(no Mamba or R block)"),
      Spell(IntField(
                "model.mamba.head_dim", "elements", 1, kMaxHeadDim,
                [](auto& r) -> auto& { return r.model.mamba.head_dim; }),
            "--mamba-head-dim", "(no Mamba or R block)"),
      Spell(IntField(
                "model.mamba.groups", "groups", 1, kMaxHeads, [](auto& r) -> auto& { return r.model.mamba.groups; }),
            "--mamba-num-groups", "(no Mamba or R block)"),
      Spell(IntField(
                "model.mamba.chunk", "tokens", 1, kMaxWidth, [](auto& r) -> auto& { return r.model.mamba.chunk; }),
            "(fixed: 128)", "(no Mamba or R block)"),
      Moves(kAffectsMemory, Spell(BoolField(
                                      "model.mamba.fused_norm_out_proj",
                                      [](auto& r) -> auto& { return r.model.mamba.fused_norm_out_proj; }),
                                  kNone, "(no Mamba or R block)")),
      Section("model.recurrent"),
      Spell(IntField(
                "model.recurrent.width", "elements", 1, kMaxWidth,
                [](auto& r) -> auto& { return r.model.recurrent.width; }),
            "(no R block)", "(no Mamba or R block)"),
      Spell(IntField(
                "model.recurrent.heads", "blocks", 1, kMaxHeads,
                [](auto& r) -> auto& { return r.model.recurrent.heads; }),
            "(no R block)", "(no Mamba or R block)"),
      Spell(
          IntField(
              "model.recurrent.d_conv", "taps", 1, kMaxConv, [](auto& r) -> auto& { return r.model.recurrent.d_conv; }),
          "(no R block)", "(no Mamba or R block)"),
      Section("training"),
      Spell(IntField(
                "training.seq_len", "tokens", 1, kMaxSeqLen, [](auto& r) -> auto& { return r.training.seq_len; }),
            "--seq-length", "training.max_context_length"),
      Spell(IntField(
                "training.micro_batch", "sequences", 1, kMaxBatch,
                [](auto& r) -> auto& { return r.training.micro_batch; }),
            "--micro-batch-size", "training.num_tokens_per_microbatch_per_dp_rank"),
      Spell(IntField(
                "training.global_batch", "sequences", 1, kMaxBatch,
                [](auto& r) -> auto& { return r.training.global_batch; }),
            "--global-batch-size", "training.num_tokens_per_train_step"),
      Spell(EnumField(
                "training.recompute", "enum", kRecomputes, [](auto& r) -> auto& { return r.training.recompute; }),
            "--recompute-granularity", "activation_checkpoint (SelectiveAC / FullAC / None)"),
      Spell(EnumField(
                "training.recompute_method", "enum", kRecomputeMethods,
                [](auto& r) -> auto& { return r.training.recompute_method; }),
            "--recompute-method", kNone),
      Spell(IntField(
                "training.recompute_layers", "layers", 1, kMaxLayers,
                [](auto& r) -> auto& { return r.training.recompute_layers; }),
            "--recompute-num-layers", kNone),
      Spell(SetField(
                "training.recompute_modules", kAllRecomputeModules, RecomputeModulesText,
                [](auto& r) -> auto& { return r.training.recompute_modules; }),
            "--recompute-modules", kNone),
      Spell(SetField(
                "training.activation_offload", kAllOffloadModules, OffloadModulesText,
                [](auto& r) -> auto& { return r.training.activation_offload; }),
            "--offload-modules", kNone),
      Spell(IntField(
                "training.activation_offload_min_elements", "elements", 0, int64_t{1} << 40,
                [](auto& r) -> auto& { return r.training.activation_offload_min_elements; }),
            "--min-offloaded-tensor-size", kNone),
      Spell(EnumField(
                "training.cross_entropy", "enum", kCrossEntropies,
                [](auto& r) -> auto& { return r.training.cross_entropy; }),
            kNone, "compile.components"),
      Spell(BoolField(
                "training.flash_attention", [](auto& r) -> auto& { return r.training.flash_attention; }),
            "--attention-backend", "(model flavor)"),
      // Time through the masks' host transfers under activation offloading.
      Spell(RealField(
                "training.dropout", "fraction", 0.0, 1.0, true, [](auto& r) -> auto& { return r.training.dropout; }),
            "--hidden-dropout, --attention-dropout", "(model flavor)"),
      Spell(BoolField(
                "training.transformer_engine", [](auto& r) -> auto& { return r.training.transformer_engine; }),
            "--transformer-impl", "(plain PyTorch)"),
      Moves(kAffectsTime,
            Spell(BoolField(
                      "training.fused_elementwise", [](auto& r) -> auto& { return r.training.fused_elementwise; }),
                  kNone, "compile.enable")),
      Moves(kAffectsMemory,
            Spell(BoolField(
                      "training.defer_head_wgrad", [](auto& r) -> auto& { return r.training.defer_head_wgrad; }),
                  "--defer-embedding-wgrad-compute", kNone)),
      Moves(kAffectsMemory, Spell(IntField(
                                      "training.head_wgrad_deferral_limit", "micro-batches", 0, kMaxBatch,
                                      [](auto& r) -> auto& { return r.training.head_wgrad_deferral_limit; }),
                                  "--wgrad-deferral-limit", kNone)),
      Moves(kAffectsMemory, Spell(IntField(
                                      "training.flextron_emb_choices", "widths", 0, kMaxFlextronChoices,
                                      [](auto& r) -> auto& { return r.training.flextron_emb_choices; }),
                                  kNone, kNone)),
      Moves(kAffectsMemory, Spell(IntField(
                                      "training.flextron_mamba_choices", "head counts", 0, kMaxFlextronChoices,
                                      [](auto& r) -> auto& { return r.training.flextron_mamba_choices; }),
                                  kNone, kNone)),
      Section("training.precision"),
      Spell(EnumField(
                "training.precision.params", "dtype", kDTypes,
                [](auto& r) -> auto& { return r.training.precision.params; }),
            "--bf16 / --fp16", "training.mixed_precision_param"),
      Spell(EnumField(
                "training.precision.grads", "dtype", kDTypes,
                [](auto& r) -> auto& { return r.training.precision.grads; }),
            "--grad-reduce-in-bf16", "training.mixed_precision_reduce"),
      Moves(kAffectsMemory, Spell(EnumField(
                                      "training.precision.master", "dtype", kMasterDTypes,
                                      [](auto& r) -> auto& { return r.training.precision.master; }),
                                  "--bf16 / --fp16 (fp32 main params)", "(FSDP2 fp32 shards)")),
      Spell(EnumField(
                "training.precision.activations", "dtype", kDTypes,
                [](auto& r) -> auto& { return r.training.precision.activations; }),
            "--bf16 / --fp16", "training.mixed_precision_param"),
      Spell(EnumField(
                "training.precision.fp4", "format", kFp4Formats,
                [](auto& r) -> auto& { return r.training.precision.fp4; }),
            "--fp4-format e2m1 --fp4-recipe nvfp4", "(NVFP4LinearConverter, a model converter)"),
      Moves(kAffectsMemory, Spell(BoolField(
                                      "training.precision.fp4_params",
                                      [](auto& r) -> auto& { return r.training.precision.fp4_params; }),
                                  "--fp4-param-gather", kNone)),
      Section("training.optimizer"),
      Spell(EnumField(
                "training.optimizer.matrices", "optimizer", kOptimizers,
                [](auto& r) -> auto& { return r.training.optimizer.matrices; }),
            "--optimizer", "optimizer (default_adamw)"),
      Spell(EnumField(
                "training.optimizer.other", "optimizer", kAdamWOnly,
                [](auto& r) -> auto& { return r.training.optimizer.other; }),
            "--optimizer", "optimizer (default_adamw)"),
      Spell(EnumField(
                "training.optimizer.muon_momentum", "dtype", kDTypes,
                [](auto& r) -> auto& { return r.training.optimizer.muon_momentum; }),
            kNone, kNone),
      Spell(EnumField(
                "training.optimizer.mamba_in_proj", "optimizer", kOptimizers,
                [](auto& r) -> auto& { return r.training.optimizer.mamba_in_proj; }),
            kNone, kNone),
      Spell(EnumField(
                "training.optimizer.router", "optimizer", kOptimizers,
                [](auto& r) -> auto& { return r.training.optimizer.router; }),
            "(Muon takes the router)", kNone),
      Spell(RealField(
                "training.optimizer.offload_fraction", "fraction", 0.0, 1.0, false,
                [](auto& r) -> auto& { return r.training.optimizer.offload_fraction; }),
            "--optimizer-offload-fraction", kNone),
      Section("parallel"),
      Spell(IntField(
                "parallel.tp", "ranks", 1, kMaxDegree, [](auto& r) -> auto& { return r.parallel.tp; }),
            "--tensor-model-parallel-size", "parallelism.tensor_parallel_degree"),
      Spell(BoolField(
                "parallel.sp", [](auto& r) -> auto& { return r.parallel.sp; }),
            "--sequence-parallel", "parallelism.enable_sequence_parallel"),
      Spell(IntField(
                "parallel.cp", "ranks", 1, kMaxDegree, [](auto& r) -> auto& { return r.parallel.cp; }),
            "--context-parallel-size", "parallelism.context_parallel_degree"),
      Spell(IntField(
                "parallel.pp", "ranks", 1, kMaxDegree, [](auto& r) -> auto& { return r.parallel.pp; }),
            "--pipeline-model-parallel-size", "parallelism.pipeline_parallel_degree"),
      Spell(IntField(
                "parallel.vpp", "chunks", 1, kMaxLayers, [](auto& r) -> auto& { return r.parallel.vpp; }),
            "--num-virtual-stages-per-pipeline-rank", "parallelism.module_fqns_per_model_part"),
      Spell(IntField(
                "parallel.ep", "ranks", 1, kMaxDegree, [](auto& r) -> auto& { return r.parallel.ep; }),
            "--expert-model-parallel-size", "parallelism.expert_parallel_degree"),
      Spell(IntField(
                "parallel.expert_tp", "ranks", 1, kMaxDegree, [](auto& r) -> auto& { return r.parallel.expert_tp; }),
            "--expert-tensor-parallel-size", kNone),
      Spell(IntField(
                "parallel.zero", "stage", 0, 3, [](auto& r) -> auto& { return r.parallel.zero; }),
            "--use-distributed-optimizer, --data-parallel-sharding-strategy", "parallelism.data_parallel_shard_degree"),
      Spell(IntField(
                "parallel.dp_replicate", "replicas", 1, kMaxDegree,
                [](auto& r) -> auto& { return r.parallel.dp_replicate; }),
            "--num-distributed-optimizer-instances", "parallelism.data_parallel_replicate_degree"),
      // Memory and time: the planner prices the layer-wise gradient all-reduce and uneven all-gather.
      Spell(EnumField(
                "parallel.optimizer_sharding", "enum", kOptimizerShardings,
                [](auto& r) -> auto& { return r.parallel.optimizer_sharding; }),
            "--no-use-layer-wise-param-layout (with --optimizer muon --use-distributed-optimizer)", kNone),
      Spell(BoolField(
                "parallel.fsdp_cpu_offload", [](auto& r) -> auto& { return r.parallel.fsdp_cpu_offload; }),
            kNone, "training.enable_cpu_offload"),
      Spell(EnumField(
                "parallel.schedule", "enum", kSchedules, [](auto& r) -> auto& { return r.parallel.schedule; }),
            "(1F1B, interleaved)", "parallelism.pipeline_parallel_schedule"),
      // Memory: the interleaved schedule's in-flight micro-batches (its warm-up).
      Moves(kAffectsMemory, Spell(IntField(
                                      "parallel.microbatch_group", "micro-batches", 0, kMaxDegree,
                                      [](auto& r) -> auto& { return r.parallel.microbatch_group; }),
                                  "--microbatch-group-size-per-virtual-pipeline-stage", kNone)),
      Moves(kAffectsTime,
            Spell(EnumField(
                      "parallel.order", "enum", kAxisOrders, [](auto& r) -> auto& { return r.parallel.order; }),
                  "--use-tp-pp-dp-mapping", "(tp-cp-dp-pp mesh)")),
      Spell(EnumField(
                "parallel.cp_comm", "enum", kCpComms, [](auto& r) -> auto& { return r.parallel.cp_comm; }),
            "--cp-comm-type", "(K/V all-gather)"),
      Spell(
          EnumField(
              "parallel.cp_recurrent", "enum", kCpRecurrents, [](auto& r) -> auto& { return r.parallel.cp_recurrent; }),
          kNone, kNone),
      Spell(BoolField(
                "parallel.cp_load_balance", [](auto& r) -> auto& { return r.parallel.cp_load_balance; }),
            kNone, "parallelism.context_parallel_load_balancer"),
      Spell(Field("parallel.stage_boundaries", K::kIntList, "layer indices",
                  [](const Recipe& r) { return fmt::format("[{}]", fmt::join(r.parallel.stage_boundaries, ", ")); }),
            "--pipeline-model-parallel-layout", "parallelism.module_fqns_per_model_part"),
      Spell(EnumField(
                "parallel.partition", "enum", kPartitions, [](auto& r) -> auto& { return r.parallel.partition; }),
            "--pipeline-model-parallel-layout", "parallelism.module_fqns_per_model_part"),
      Spell(IntField(
                "parallel.first_stage_layers", "layers", 0, kMaxLayers,
                [](auto& r) -> auto& { return r.parallel.first_stage_layers; }),
            "--decoder-first-pipeline-num-layers", "parallelism.module_fqns_per_model_part"),
      Spell(IntField(
                "parallel.last_stage_layers", "layers", 0, kMaxLayers,
                [](auto& r) -> auto& { return r.parallel.last_stage_layers; }),
            "--decoder-last-pipeline-num-layers", "parallelism.module_fqns_per_model_part"),
      Spell(BoolField(
                "parallel.embedding_in_split", [](auto& r) -> auto& { return r.parallel.embedding_in_split; }),
            "--account-for-embedding-in-pipeline-split", "parallelism.module_fqns_per_model_part"),
      Spell(BoolField(
                "parallel.loss_in_split", [](auto& r) -> auto& { return r.parallel.loss_in_split; }),
            "--account-for-loss-in-pipeline-split", "parallelism.module_fqns_per_model_part"),
      Spell(EnumField(
                "parallel.embedding", "enum", kEmbeddingSplits, [](auto& r) -> auto& { return r.parallel.embedding; }),
            kNone, kNone),
      Moves(kAffectsTime,
            Spell(BoolField(
                      "parallel.overlap_grad_reduce", [](auto& r) -> auto& { return r.parallel.overlap_grad_reduce; }),
                  "--overlap-grad-reduce", "(FSDP overlaps)")),
      Moves(kAffectsTime, Spell(BoolField(
                                    "parallel.overlap_param_gather",
                                    [](auto& r) -> auto& { return r.parallel.overlap_param_gather; }),
                                "--overlap-param-gather", "(FSDP overlaps)")),
      Moves(kAffectsTime,
            Spell(BoolField(
                      "parallel.tp_comm_overlap", [](auto& r) -> auto& { return r.parallel.tp_comm_overlap; }),
                  "--tp-comm-overlap", "(async TP)")),
      Moves(kAffectsTime,
            Spell(BoolField(
                      "parallel.ep_comm_overlap", [](auto& r) -> auto& { return r.parallel.ep_comm_overlap; }),
                  "--overlap-moe-expert-parallel-comm", kNone)),
      Section("cluster"),
      Moves(kAffectsTime,
            Spell(Field("cluster.gpu", K::kString, "preset", [](const Recipe& r) { return r.cluster.gpu; }), kOurs,
                  kOurs)),
      Spell(IntField(
                "cluster.nodes", "nodes", 1, kMaxNodes, [](auto& r) -> auto& { return r.cluster.nodes; }),
            kOurs, kOurs),
      Spell(IntField(
                "cluster.gpus_per_node", "GPUs", 1, kMaxGpusPerNode,
                [](auto& r) -> auto& { return r.cluster.gpus_per_node; }),
            kOurs, kOurs),
      Moves(kAffectsMemory, Spell(RealField(
                                      "cluster.reserve_gib", "GiB", 0.0, 1e6, false,
                                      [](auto& r) -> auto& { return r.cluster.reserve_gib; }),
                                  kOurs, kOurs)),
      Moves(kAffectsNothing, Spell(RealField(
                                       "cluster.min_headroom_gib", "GiB", 0.0, 1e6, false,
                                       [](auto& r) -> auto& { return r.cluster.min_headroom_gib; }),
                                   kOurs, kOurs)),
      Moves(kAffectsMemory, Spell(RealField(
                                      "cluster.allocator_overhead", "fraction", 0.0, 1.0, true,
                                      [](auto& r) -> auto& { return r.cluster.allocator_overhead; }),
                                  kOurs, kOurs)),
      Moves(kAffectsNothing, Spell(IntField(
                                       "cluster.capacity_mib", "MiB", 0, kNoLimit,
                                       [](auto& r) -> auto& { return r.cluster.capacity_mib; }),
                                   kOurs, kOurs)),
      Moves(kAffectsNothing, Spell(RealField(
                                       "cluster.host_memory_gib", "GiB", 0.0, 1e9, false,
                                       [](auto& r) -> auto& { return r.cluster.host_memory_gib; }),
                                   kOurs, kOurs)),
      Moves(kAffectsMemory, Spell(IntField(
                                      "cluster.cublas_workspace_mib", "MiB", 0, 4096,
                                      [](auto& r) -> auto& { return r.cluster.cublas_workspace_mib; }),
                                  kOurs, kOurs)),
      // A custom device instead of a preset (docs/recipe.md "cluster.device").
      Section("cluster.device", [](Recipe& r) { r.cluster.device.emplace(); }),
      Device(kAffectsTime, DeviceBasedOn()),
      Device(kAffectsNothing, DeviceName()),
      Device(kAffectsNothing, IntField(
                                  "cluster.device.capacity_mib", "MiB", 1, kNoLimit,
                                  [](auto& r) -> auto& { return DeviceOf(r).spec.capacity_mib; })),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.bf16_dense_tflops", "TFLOP/s", 0.0, 1e6, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.bf16_dense_tflops; }))),
      Device(kAffectsTime, RealField(
                               "cluster.device.fp8_dense_tflops", "TFLOP/s", 0.0, 1e6, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.fp8_dense_tflops; })),
      Device(kAffectsNothing, RealField(
                                  "cluster.device.fp4_dense_tflops", "TFLOP/s", 0.0, 1e6, false,
                                  [](auto& r) -> auto& { return DeviceOf(r).spec.fp4_dense_tflops; })),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.hbm_gbps", "GB/s", 0.0, 1e6, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.hbm_gbps; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.nvlink_gbps_per_dir", "GB/s", 0.0, 1e6, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.nvlink_gbps_per_dir; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.ib_gbps_per_dir", "GB/s", 0.0, 1e6, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.ib_gbps_per_dir; }))),
      Device(kAffectsTime, IntField(
                               "cluster.device.nvlink_domain", "GPUs", 0, kMaxDegree,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.nvlink_domain; })),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.host_link_gbps_per_dir", "GB/s", 0.0, 1e6, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.host_link_gbps_per_dir; }))),
      Device(kAffectsNothing, Positive(RealField(
                                  "cluster.device.host_memory_gib", "GiB", 0.0, 1e9, false,
                                  [](auto& r) -> auto& { return DeviceOf(r).spec.host_memory_gib; }))),
      Section("cluster.device.rates"),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.rates.gemm", "fraction", 0.0, 1.0, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.gemm; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.rates.gemm_fp8", "fraction", 0.0, 1.0, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.gemm_fp8; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.rates.gemm_memory", "fraction", 0.0, 1.0, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.gemm_memory; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.rates.hbm", "fraction", 0.0, 1.0, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.hbm; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.rates.attention_fused", "fraction", 0.0, 1.0, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.attention_fused; }))),
      Device(kAffectsTime, Positive(RealField(
                               "cluster.device.rates.attention_flash2", "fraction", 0.0, 1.0, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.attention_flash2; }))),
      Device(kAffectsTime, RealField(
                               "cluster.device.rates.attention_half_seq", "tokens", 0.0, 1e9, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.attention_half_seq; })),
      Device(kAffectsTime, RealField(
                               "cluster.device.rates.gemm_tile_k", "K steps", 0.0, 1e9, false,
                               [](auto& r) -> auto& { return DeviceOf(r).spec.rates.gemm_tile_k; })),
      Section("serving", [](Recipe& r) { r.serving.emplace(); }),
      Moves(kAffectsMemory,
            Spell(IntField(
                      "serving.batch", "sequences", 1, kMaxBatch, [](auto& r) -> auto& { return ServingOf(r).batch; }),
                  kOurs, kOurs)),
      Moves(kAffectsMemory, Spell(IntField(
                                      "serving.context", "tokens", 1, kMaxSeqLen,
                                      [](auto& r) -> auto& { return ServingOf(r).context; }),
                                  kOurs, kOurs)),
      Moves(kAffectsMemory,
            Spell(EnumField(
                      "serving.kv_dtype", "enum", kDTypes, [](auto& r) -> auto& { return ServingOf(r).kv_dtype; }),
                  kOurs, kOurs)),
      Moves(kAffectsMemory,
            Spell(EnumField(
                      "serving.ssm_dtype", "enum", kDTypes, [](auto& r) -> auto& { return ServingOf(r).ssm_dtype; }),
                  kOurs, kOurs)),
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

std::string DefaultText(const RecipeField& field) {
  static const Recipe kDefaults;
  return field.text ? field.text(kDefaults) : std::string();
}

const RecipeField* FindRecipeField(std::string_view path) {
  for (const RecipeField& f : RecipeFields()) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

}  // namespace preflight

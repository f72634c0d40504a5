// Every line `plan --emit` writes, over every shipped recipe and a grid of
// layouts (each ZeRO stage, pipeline schedule, precision, CP mode, MoE
// option), held against the flags and fields of the upstream each emitter
// targets. The tables below are transcribed from the upstream sources, not
// from the emitters:
//   Megatron-LM d98e8a6: the argparse actions megatron/training/arguments.py
//     builds (name, kind, choices), the list values TransformerConfig accepts
//     (megatron/core/transformer/transformer_config.py: cp_comm_type,
//     recompute_modules, offload_modules), the hybrid layer symbols
//     (megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols) and the
//     pipeline-layout letters (pipeline_parallel_layer_layout.py parse_str_to_list).
//   torchtitan b5bcd76 (2026-08-21): Trainer.Config (torchtitan/trainer.py),
//     TrainingConfig / ParallelismConfig / CompileConfig
//     (torchtitan/config/configs.py), SelectiveAC / FullAC
//     (torchtitan/distributed/activation_checkpoint.py), default_adamw
//     (torchtitan/components/optimizer), the model registries' flavors
//     (torchtitan/models/<family>/__init__.py) and the pipeline module names
//     (torchtitan/distributed/pipeline_parallel.py).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::emit_table_test {
namespace {

using testing::SourcePath;

// ---------------------------------------------------------------------------
// Megatron-LM d98e8a6

constexpr const char* kMegatronCommit = "d98e8a6";

enum class ArgKind {
  kBare,     // store_true / store_false: no value
  kInt,      // type=int
  kFloat,    // type=float
  kString,   // type=str, free text (checked by kind-specific rules below)
  kChoice,   // choices=[...]
  kList,     // nargs='+': one or more words from `allowed`
  kMoeFreq,  // type=moe_freq_type: an int or a Python list expression of 0/1
};

struct MegatronArg {
  const char* name;
  ArgKind kind;
  std::vector<std::string> allowed;
};

// The flags preflight may emit, as d98e8a6's parser defines them.
const MegatronArg kMegatronArgs[] = {
    {"--account-for-embedding-in-pipeline-split", ArgKind::kBare, {}},
    {"--account-for-loss-in-pipeline-split", ArgKind::kBare, {}},
    {"--attention-backend", ArgKind::kChoice, {"flash", "fused", "unfused", "local", "auto"}},
    {"--attention-dropout", ArgKind::kFloat, {}},
    {"--bf16", ArgKind::kBare, {}},
    {"--ckpt-format", ArgKind::kChoice, {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"}},
    {"--context-parallel-size", ArgKind::kInt, {}},
    // TransformerConfig.cp_comm_type: "p2p", "all_gather", "a2a" or "a2a+p2p".
    {"--cp-comm-type", ArgKind::kList, {"p2p", "all_gather", "a2a", "a2a+p2p"}},
    {"--data-parallel-sharding-strategy", ArgKind::kChoice, {"no_shard", "optim", "optim_grads", "optim_grads_params"}},
    {"--decoder-first-pipeline-num-layers", ArgKind::kInt, {}},
    {"--decoder-last-pipeline-num-layers", ArgKind::kInt, {}},
    {"--defer-embedding-wgrad-compute", ArgKind::kBare, {}},
    {"--disable-bias-linear", ArgKind::kBare, {}},
    {"--expert-model-parallel-size", ArgKind::kInt, {}},
    {"--expert-tensor-parallel-size", ArgKind::kInt, {}},
    {"--ffn-hidden-size", ArgKind::kInt, {}},
    {"--fine-grained-activation-offloading", ArgKind::kBare, {}},
    {"--fp16", ArgKind::kBare, {}},
    {"--fp8-format", ArgKind::kChoice, {"e4m3", "hybrid"}},
    {"--fp8-param-gather", ArgKind::kBare, {}},
    // transformer_config.py: fp4 Literal['e2m1'] as --fp4-format, fp4_recipe
    // Literal['nvfp4', 'custom'], fp4_param as --fp4-param-gather.
    {"--fp4-format", ArgKind::kChoice, {"e2m1"}},
    {"--fp4-recipe", ArgKind::kChoice, {"nvfp4", "custom"}},
    {"--fp4-param-gather", ArgKind::kBare, {}},
    {"--global-batch-size", ArgKind::kInt, {}},
    {"--grad-reduce-in-bf16", ArgKind::kBare, {}},
    {"--group-query-attention", ArgKind::kBare, {}},
    {"--hidden-dropout", ArgKind::kFloat, {}},
    {"--hidden-size", ArgKind::kInt, {}},
    {"--hybrid-layer-pattern", ArgKind::kString, {}},
    {"--kv-channels", ArgKind::kInt, {}},
    {"--kv-lora-rank", ArgKind::kInt, {}},
    {"--make-vocab-size-divisible-by", ArgKind::kInt, {}},
    {"--mamba-head-dim", ArgKind::kInt, {}},
    {"--mamba-num-groups", ArgKind::kInt, {}},
    {"--mamba-num-heads", ArgKind::kInt, {}},
    {"--mamba-state-dim", ArgKind::kInt, {}},
    {"--max-position-embeddings", ArgKind::kInt, {}},
    {"--micro-batch-size", ArgKind::kInt, {}},
    {"--min-offloaded-tensor-size", ArgKind::kInt, {}},
    {"--moe-expert-capacity-factor", ArgKind::kFloat, {}},
    {"--moe-ffn-hidden-size", ArgKind::kInt, {}},
    {"--moe-grouped-gemm", ArgKind::kBare, {}},
    {"--moe-layer-freq", ArgKind::kMoeFreq, {}},
    {"--moe-pad-expert-input-to-capacity", ArgKind::kBare, {}},
    {"--moe-router-enable-expert-bias", ArgKind::kBare, {}},
    {"--moe-router-score-function", ArgKind::kChoice, {"softmax", "sigmoid", "sqrtsoftplus"}},
    {"--moe-router-topk", ArgKind::kInt, {}},
    {"--moe-shared-expert-gate", ArgKind::kBare, {}},
    {"--moe-shared-expert-intermediate-size", ArgKind::kInt, {}},
    {"--moe-token-dispatcher-type", ArgKind::kChoice, {"allgather", "alltoall", "flex"}},
    {"--mtp-num-layers", ArgKind::kInt, {}},
    {"--mtp-use-repeated-layer", ArgKind::kBare, {}},
    {"--multi-latent-attention", ArgKind::kBare, {}},
    {"--muon-tp-mode", ArgKind::kChoice, {"blockwise", "duplicated", "distributed"}},
    {"--normalization", ArgKind::kChoice, {"LayerNorm", "RMSNorm"}},
    {"--num-attention-heads", ArgKind::kInt, {}},
    {"--num-distributed-optimizer-instances", ArgKind::kInt, {}},
    {"--num-experts", ArgKind::kInt, {}},
    {"--num-layers", ArgKind::kInt, {}},
    {"--num-query-groups", ArgKind::kInt, {}},
    {"--num-virtual-stages-per-pipeline-rank", ArgKind::kInt, {}},
    {"--microbatch-group-size-per-virtual-pipeline-stage", ArgKind::kInt, {}},
    // TransformerConfig.__post_init__'s allowed offload_modules.
    {"--offload-modules",
     ArgKind::kList,
     {"core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act", "attn_norm", "mlp_norm", "qkv_linear",
      "gdp_qkv"}},
    {"--optimizer", ArgKind::kChoice, {"adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"}},
    {"--optimizer-cpu-offload", ArgKind::kBare, {}},
    {"--optimizer-offload-fraction", ArgKind::kFloat, {}},
    {"--overlap-grad-reduce", ArgKind::kBare, {}},
    {"--overlap-moe-expert-parallel-comm", ArgKind::kBare, {}},
    {"--overlap-param-gather", ArgKind::kBare, {}},
    {"--pipeline-model-parallel-layout", ArgKind::kString, {}},
    {"--pipeline-model-parallel-size", ArgKind::kInt, {}},
    {"--position-embedding-type", ArgKind::kChoice, {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"}},
    {"--q-lora-rank", ArgKind::kInt, {}},
    {"--qk-head-dim", ArgKind::kInt, {}},
    {"--qk-layernorm", ArgKind::kBare, {}},
    {"--qk-pos-emb-head-dim", ArgKind::kInt, {}},
    {"--recompute-granularity", ArgKind::kChoice, {"full", "selective"}},
    {"--recompute-method", ArgKind::kChoice, {"uniform", "block"}},
    // TransformerConfig.__post_init__'s allowed recompute_modules.
    {"--recompute-modules",
     ArgKind::kList,
     {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out", "gdp_in_proj",
      "gdp_qkv", "mhc"}},
    {"--recompute-num-layers", ArgKind::kInt, {}},
    {"--seq-length", ArgKind::kInt, {}},
    {"--sequence-parallel", ArgKind::kBare, {}},
    {"--squared-relu", ArgKind::kBare, {}},
    {"--swiglu", ArgKind::kBare, {}},
    {"--tensor-model-parallel-size", ArgKind::kInt, {}},
    {"--tp-comm-overlap", ArgKind::kBare, {}},
    {"--transformer-impl", ArgKind::kChoice, {"local", "transformer_engine", "inference_optimized"}},
    {"--untie-embeddings-and-output-weights", ArgKind::kBare, {}},
    {"--use-distributed-optimizer", ArgKind::kBare, {}},
    {"--use-megatron-fsdp", ArgKind::kBare, {}},
    {"--use-precision-aware-optimizer", ArgKind::kBare, {}},
    {"--use-tp-pp-dp-mapping", ArgKind::kBare, {}},
    {"--v-head-dim", ArgKind::kInt, {}},
    {"--wgrad-deferral-limit", ArgKind::kInt, {}},
};

// hybrid_layer_allocation.py Symbols: M, G, *, D, +, -, E; '|' between
// pipeline segments, '/' before MTP layers.
const std::string kHybridSymbols = "MG*D+-E|/";
// parse_str_to_list: E embedding, L loss, t decoder layer, m MTP; '|' between
// stages, "(..)*n" and "x*n" repeats, cosmetic commas.
const std::string kLayoutSymbols = "ELtm|()*,0123456789";

const MegatronArg* FindMegatronArg(const std::string& name) {
  for (const MegatronArg& a : kMegatronArgs) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

bool IsInt(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

bool IsFloat(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

std::vector<std::string> Words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// "" when `line` (one emitted argument line, without " \") is a flag of the
/// table with a value it accepts; else what is wrong.
std::string CheckMegatronLine(std::string line) {
  const size_t space = line.find(' ');
  const std::string name = line.substr(0, space);
  const MegatronArg* arg = FindMegatronArg(name);
  if (arg == nullptr) return "not a flag of arguments.py @ " + std::string(kMegatronCommit);
  std::string value = space == std::string::npos ? "" : line.substr(space + 1);
  const bool quoted = value.size() >= 2 && value.front() == '"' && value.back() == '"';
  if (quoted) value = value.substr(1, value.size() - 2);
  switch (arg->kind) {
    case ArgKind::kBare: return value.empty() ? "" : "takes no value";
    case ArgKind::kInt: return IsInt(value) ? "" : "not an int: " + value;
    case ArgKind::kFloat: return IsFloat(value) ? "" : "not a float: " + value;
    case ArgKind::kChoice:
      return std::find(arg->allowed.begin(), arg->allowed.end(), value) != arg->allowed.end()
                 ? ""
                 : "not a choice: " + value;
    case ArgKind::kList: {
      const std::vector<std::string> words = Words(value);
      if (words.empty()) return "nargs='+' needs a value";
      for (const std::string& w : words) {
        if (std::find(arg->allowed.begin(), arg->allowed.end(), w) == arg->allowed.end()) return "not allowed: " + w;
      }
      return "";
    }
    case ArgKind::kMoeFreq: {
      if (IsInt(value)) return "";
      const std::string ok = "()[]01*+0123456789";
      const bool list = quoted && value.front() == '(' && std::all_of(value.begin(), value.end(), [&](char c) {
                          return ok.find(c) != std::string::npos;
                        });
      return list ? "" : "not an int or a 0/1 list expression: " + value;
    }
    case ArgKind::kString: {
      const std::string& symbols = name == "--hybrid-layer-pattern" ? kHybridSymbols : kLayoutSymbols;
      const bool known = name == "--hybrid-layer-pattern" || name == "--pipeline-model-parallel-layout";
      if (!known) return "";
      for (char c : value) {
        if (symbols.find(c) == std::string::npos) return std::string("symbol not in upstream's grammar: ") + c;
      }
      return quoted ? "" : "unquoted (the shell would read '*' and '|')";
    }
  }
  return "";
}

// ---------------------------------------------------------------------------
// torchtitan b5bcd76

constexpr const char* kTorchtitanCommit = "b5bcd76";

enum class FieldType {
  kInt,
  kBool,      // True / False
  kLiteral,   // one of `allowed`, as a quoted Python string
  kOptional,  // None, or a quoted string of `allowed` (empty: any string)
  kFqnLists,  // list[list[str]] | None: module names
  kExpr,      // one of `allowed` verbatim (a constructor call)
};

struct TorchtitanField {
  const char* section;  // "" for Trainer.Config's own fields
  const char* name;
  FieldType type;
  std::vector<std::string> allowed;
};

const TorchtitanField kTorchtitanFields[] = {
    // Trainer.Config (trainer.py)
    {"", "model_spec", FieldType::kExpr, {}},  // model_registry(...) of a flavor below, or None
    {"", "optimizer", FieldType::kExpr, {"default_adamw()"}},
    {"", "activation_checkpoint", FieldType::kExpr, {"None", "SelectiveAC.Config()", "FullAC.Config()"}},
    // TrainingConfig (configs.py)
    {"training", "num_tokens_per_microbatch_per_dp_rank", FieldType::kInt, {}},
    {"training", "num_tokens_per_train_step", FieldType::kInt, {}},
    {"training", "max_context_length", FieldType::kInt, {}},
    {"training", "enable_cpu_offload", FieldType::kBool, {}},
    {"training", "disable_cuda_graphs", FieldType::kBool, {}},
    {"training", "dtype", FieldType::kLiteral, {"bfloat16", "float32"}},
    {"training", "mixed_precision_param", FieldType::kLiteral, {"bfloat16", "float32"}},
    {"training", "mixed_precision_reduce", FieldType::kLiteral, {"float32"}},
    // ParallelismConfig (configs.py)
    {"parallelism", "data_parallel_replicate_degree", FieldType::kInt, {}},
    {"parallelism", "data_parallel_shard_degree", FieldType::kInt, {}},
    {"parallelism", "fsdp_reshard_after_forward", FieldType::kLiteral, {"default", "always", "never"}},
    {"parallelism", "tensor_parallel_degree", FieldType::kInt, {}},
    {"parallelism", "enable_sequence_parallel", FieldType::kBool, {}},
    {"parallelism", "pipeline_parallel_degree", FieldType::kInt, {}},
    {"parallelism", "module_fqns_per_model_part", FieldType::kFqnLists, {}},
    // A str checked by PyTorch's get_schedule_class (case-insensitive names).
    {"parallelism",
     "pipeline_parallel_schedule",
     FieldType::kLiteral,
     {"1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}},
    {"parallelism", "num_pp_microbatches", FieldType::kInt, {}},
    {"parallelism", "context_parallel_degree", FieldType::kInt, {}},
    {"parallelism", "context_parallel_load_balancer", FieldType::kOptional, {"headtail", "ptrr"}},
    {"parallelism", "expert_parallel_degree", FieldType::kInt, {}},
    // CompileConfig (configs.py)
    {"compile", "enable", FieldType::kBool, {}},
    {"compile", "enable_async_tensor_parallel", FieldType::kBool, {}},
    // components: list[str], of "model" and "loss" (CompileConfig.components).
    {"compile", "components", FieldType::kExpr, {"[\"model\"]", "[\"model\", \"loss\"]", "[\"loss\"]"}},
};

// The classes a Trainer.Config keyword may be built from, by section.
const std::map<std::string, std::string> kSectionClasses = {
    {"training", "TrainingConfig"}, {"parallelism", "ParallelismConfig"}, {"compile", "CompileConfig"}};

// model_registry flavors at b5bcd76, per family (the *_configs dicts).
const std::map<std::string, std::set<std::string>> kFlavors = {
    {"llama3", {"debugmodel", "1B", "3B", "8B", "70B", "405B"}},
    {"qwen3",
     {"debugmodel", "debugmodel_non_fused_qkv", "0.6B", "1.7B", "4B", "8B", "14B", "32B", "debugmodel_moe", "30B-A3B",
      "235B-A22B"}},
    {"deepseek_v3", {"debugmodel", "16B", "236B", "671B"}},
    {"gpt_oss", {"debugmodel", "20b", "120b"}},
};

// The names each import line may bring in.
const std::map<std::string, std::set<std::string>> kImports = {
    {"torchtitan.components.optimizer", {"default_adamw"}},
    {"torchtitan.config", {"CompileConfig", "ParallelismConfig", "TrainingConfig"}},
    {"torchtitan.distributed.activation_checkpoint", {"FullAC", "SelectiveAC"}},
    {"torchtitan.models.llama3", {"model_registry"}},
    {"torchtitan.models.qwen3", {"model_registry"}},
    {"torchtitan.models.deepseek_v3", {"model_registry"}},
    {"torchtitan.models.gpt_oss", {"model_registry"}},
    {"torchtitan.trainer", {"Trainer"}},
};

const TorchtitanField* FindField(const std::string& section, const std::string& name) {
  for (const TorchtitanField& f : kTorchtitanFields) {
    if (section == f.section && name == f.name) return &f;
  }
  return nullptr;
}

std::string Unquote(const std::string& v) {
  return v.size() >= 2 && v.front() == '"' && v.back() == '"' ? v.substr(1, v.size() - 2) : "";
}

/// "" when `value` fits the field; else what is wrong. `family` is the
/// model family imported (for model_registry flavors).
std::string CheckValue(const TorchtitanField& f, const std::string& value, const std::string& family) {
  switch (f.type) {
    case FieldType::kInt: return IsInt(value) ? "" : "not an int";
    case FieldType::kBool: return value == "True" || value == "False" ? "" : "not a bool";
    case FieldType::kLiteral: {
      const std::string s = Unquote(value);
      return std::find(f.allowed.begin(), f.allowed.end(), s) != f.allowed.end() ? "" : "not one of the literals";
    }
    case FieldType::kOptional:
      if (value == "None") return "";
      return std::find(f.allowed.begin(), f.allowed.end(), Unquote(value)) != f.allowed.end() ? "" : "not allowed";
    case FieldType::kFqnLists: return "";  // its lines are checked one by one
    case FieldType::kExpr:
      if (std::string(f.name) == "model_spec") {
        if (value.rfind("None", 0) == 0) return "";
        const std::string prefix = "model_registry(\"";
        if (value.rfind(prefix, 0) != 0 || kFlavors.count(family) == 0) return "not model_registry(<flavor>)";
        const size_t close = value.find('"', prefix.size());
        const std::string flavor = value.substr(prefix.size(), close - prefix.size());
        if (kFlavors.at(family).count(flavor) == 0) return "no flavor " + flavor + " in " + family;
        const std::string rest = value.substr(close + 1);
        // deepseek_v3's model_registry(flavor, ..., num_mtp_layers: int = 0).
        if (rest == ")") return "";
        const std::string mtp = ", num_mtp_layers=";
        if (family == "deepseek_v3" && rest.rfind(mtp, 0) == 0 && rest.back() == ')' &&
            IsInt(rest.substr(mtp.size(), rest.size() - mtp.size() - 1))) {
          return "";
        }
        return "unknown model_registry arguments " + rest;
      }
      return std::find(f.allowed.begin(), f.allowed.end(), value) != f.allowed.end() ? "" : "not an allowed value";
  }
  return "";
}

/// Every problem of an emitted config module against the tables: each line
/// is a comment, an import of the table, the config function's frame, a
/// keyword of a known section with a valid value, or a module-name list.
std::vector<std::string> CheckTorchtitanModule(const std::string& text) {
  std::vector<std::string> problems;
  std::string family;
  std::string section;  // inside training=TrainingConfig( ... ),
  bool in_fqns = false;
  auto bad = [&](const std::string& line, const std::string& why) { problems.push_back(why + ": " + line); };
  for (const std::string& raw : Lines(text)) {
    const size_t first = raw.find_first_not_of(' ');
    if (first == std::string::npos || raw[first] == '#') continue;
    const std::string line = raw.substr(first);
    if (line.rfind("from ", 0) == 0) {
      const size_t imp = line.find(" import ");
      const std::string module = line.substr(5, imp - 5);
      if (kImports.count(module) == 0) {
        bad(line, "no such upstream module in the table");
        continue;
      }
      std::string names = line.substr(imp + 8);
      std::replace(names.begin(), names.end(), ',', ' ');
      for (const std::string& n : Words(names)) {
        if (kImports.at(module).count(n) == 0) bad(line, "no " + n + " in " + module);
      }
      if (module.rfind("torchtitan.models.", 0) == 0) family = module.substr(18);
      continue;
    }
    if (line == "def preflight_config() -> Trainer.Config:" || line == "return Trainer.Config(" || line == ")")
      continue;
    if (in_fqns) {
      if (line == "],") {
        in_fqns = false;
        continue;
      }
      // ["tok_embeddings", "layers.0", ...], with torchtitan's names.
      if (line.front() != '[' || line.substr(line.size() - 2) != "],") {
        bad(line, "not a module list");
        continue;
      }
      std::string names = line.substr(1, line.size() - 3);
      std::replace(names.begin(), names.end(), ',', ' ');
      for (const std::string& w : Words(names)) {
        const std::string n = Unquote(w);
        const bool layer = n.rfind("layers.", 0) == 0 && IsInt(n.substr(7));
        if (!layer && n != "tok_embeddings" && n != "norm" && n != "lm_head") bad(line, "not a module name: " + w);
      }
      continue;
    }
    if (line == "),") {
      if (section.empty()) bad(line, "closes nothing");
      section.clear();
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      bad(line, "not a keyword argument");
      continue;
    }
    const std::string key = line.substr(0, eq);
    std::string value = line.substr(eq + 1);
    if (section.empty() && kSectionClasses.count(key) && value == kSectionClasses.at(key) + "(") {
      section = key;
      continue;
    }
    if (value.rfind("CompileConfig(", 0) == 0 && section.empty() && key == "compile") {
      // compile=CompileConfig(enable=True, ...),: each keyword a CompileConfig field.
      std::string args = value.substr(14, value.rfind(')') - 14);
      std::replace(args.begin(), args.end(), ',', ' ');
      for (const std::string& kv : Words(args)) {
        const size_t e = kv.find('=');
        const TorchtitanField* f = FindField("compile", kv.substr(0, e));
        if (f == nullptr || e == std::string::npos || !CheckValue(*f, kv.substr(e + 1), family).empty()) {
          bad(line, "CompileConfig has no such field or value: " + kv);
        }
      }
      continue;
    }
    const TorchtitanField* f = FindField(section, key);
    if (f == nullptr) {
      bad(line,
          "no field " + key + " in " + (section.empty() ? "Trainer.Config" : section) + " @ " + kTorchtitanCommit);
      continue;
    }
    if (f->type == FieldType::kFqnLists && value == "[") {
      in_fqns = true;
      continue;
    }
    const size_t comment = value.find("  #");
    if (comment != std::string::npos) value.resize(comment);
    if (value.empty() || value.back() != ',') {
      bad(line, "a keyword argument ends with a comma");
      continue;
    }
    value.pop_back();
    const std::string why = CheckValue(*f, value, family);
    if (!why.empty()) bad(line, why);
  }
  if (in_fqns || !section.empty()) problems.push_back("unclosed list or section");
  return problems;
}

// ---------------------------------------------------------------------------
// The grid: every shipped recipe x layouts.

struct Variant {
  const char* name;
  std::vector<std::string> sets;
};

const Variant kVariants[] = {
    {"as_is", {}},
    {"zero0", {"parallel.zero=0"}},
    {"zero1", {"parallel.zero=1"}},
    {"zero2", {"parallel.zero=2"}},
    {"zero3", {"parallel.zero=3"}},
    {"hsdp", {"parallel.zero=3", "parallel.dp_replicate=2"}},
    {"adamw_zero0", {"training.optimizer.matrices=adamw", "parallel.zero=0"}},
    {"pp2_1f1b", {"parallel.pp=2", "parallel.schedule=1f1b"}},
    {"pp2_interleaved", {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved"}},
    {"pp2_dualpipev", {"parallel.pp=2", "parallel.schedule=dualpipev"}},
    {"pp4_balanced", {"parallel.pp=4", "parallel.schedule=1f1b", "parallel.partition=balanced"}},
    {"pp4_torchtitan", {"parallel.pp=4", "parallel.schedule=1f1b", "parallel.partition=torchtitan"}},
    {"fp32", {"training.precision.params=fp32", "training.precision.activations=fp32"}},
    {"fp16", {"training.precision.params=fp16", "training.precision.activations=fp16"}},
    {"fp8_params", {"training.precision.params=fp8"}},
    {"act_fp8", {"training.precision.activations=fp8"}},
    {"nvfp4_gb200", {"cluster.gpu=gb200", "training.precision.fp4=nvfp4"}},
    {"nvfp4_params_gb200", {"cluster.gpu=gb200", "training.precision.fp4=nvfp4", "training.precision.fp4_params=true"}},
    {"mxfp4_gb200", {"cluster.gpu=gb200", "training.precision.fp4=mxfp4"}},
    {"grads_bf16", {"training.precision.grads=bf16"}},
    {"master_none", {"training.precision.master=none"}},
    {"cp2_p2p", {"parallel.cp=2"}},
    {"cp2_all_gather", {"parallel.cp=2", "parallel.cp_comm=all_gather"}},
    {"cp2_a2a", {"parallel.cp=2", "parallel.cp_comm=a2a"}},
    {"cp2_no_balance", {"parallel.cp=2", "parallel.cp_load_balance=false"}},
    {"cp2_handoff", {"parallel.cp=2", "parallel.cp_recurrent=handoff"}},
    {"tp2_sp", {"parallel.tp=2", "parallel.sp=true"}},
    {"tp2_no_sp", {"parallel.tp=2", "parallel.sp=false"}},
    {"ep2", {"parallel.ep=2"}},
    {"expert_tp2", {"parallel.expert_tp=2"}},
    {"moe_capacity", {"model.moe.dropless=false", "model.moe.capacity_factor=1.25"}},
    {"recompute_none", {"training.recompute=none"}},
    {"recompute_full_block", {"training.recompute=full", "training.recompute_method=block"}},
    {"offload", {"training.activation_offload=[core_attn]"}},
    {"optimizer_offload", {"training.optimizer.matrices=adamw", "training.optimizer.offload_fraction=0.5"}},
    {"overlaps", {"parallel.overlap_grad_reduce=true", "parallel.overlap_param_gather=true"}},
};

// Each variant on the recipe as written and on a base torchtitan can run as
// planned (FSDP2 = ZeRO 3, AdamW, plain PyTorch, its loss, full recompute, its mesh
// order), so both emitters meet both outcomes.
const std::vector<std::string> kBases[] = {
    {},
    {"parallel.zero=3", "training.optimizer.matrices=adamw", "training.transformer_engine=false",
     "training.cross_entropy=fp32_upcast", "training.recompute=full", "parallel.order=tp-cp-dp-pp",
     "parallel.cp_comm=all_gather"},
};

std::vector<std::string> ShippedRecipes() {
  return {"deepseek-v3-h200", "gpt-oss-120b-h200", "jamba-v0.1-h200", "llama3-405b-h200",   "llama3-8b-h200",
          "mamba2-2.7b-h200", "mixtral-8x7b-h200", "nam56r-h200",     "nemotron-h-8b-h200", "qwen3-30b-a3b-h200"};
}

struct GridCounts {
  int layouts = 0, emitted = 0, refused = 0;
};

// Every emitted line of both emitters against the tables; refusals and the
// WARNING block agree; every refusal names its reason.
TEST(EmitTable, EveryEmittedLineIsUpstreams) {
  std::map<std::string, GridCounts> counts;
  for (const std::string& name : ShippedRecipes()) {
    for (size_t base = 0; base < std::size(kBases); ++base)
      for (const Variant& v : kVariants) {
        std::vector<Override> overrides;
        for (const std::string& s : kBases[base]) overrides.push_back(*ParseOverride(s));
        for (const std::string& s : v.sets) overrides.push_back(*ParseOverride(s));
        const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/" + name + ".yaml"), overrides);
        if (!loaded.ok()) continue;  // a layout the recipe cannot take (exit 2)
        const Inventory inventory = BuildInventory(*loaded.recipe);
        const PlanResult planned = MakePlan(inventory, LayoutOf(*loaded.recipe));
        if (!planned.plan) continue;
        for (EmitTarget target : {EmitTarget::kMegatron, EmitTarget::kTorchtitan}) {
          const std::string where = name + " / base " + std::to_string(base) + " / " + v.name + " / " + Name(target);
          const Emission e = Emit(target, *loaded.recipe, *planned.plan);
          GridCounts& c = counts[Name(target)];
          ++c.layouts;
          e.refusals.empty() ? ++c.emitted : ++c.refused;
          EXPECT_EQ(e.text.rfind("# WARNING: ", 0) == 0, !e.refusals.empty()) << where << "\n" << e.text;
          for (const std::string& r : e.refusals) {
            EXPECT_FALSE(r.empty()) << where;
            EXPECT_NE(e.text.find("# WARNING: - " + r), std::string::npos) << where << ": " << r;
          }
          if (target == EmitTarget::kMegatron) {
            for (std::string line : Lines(e.text)) {
              if (line.empty() || line[0] == '#') continue;
              if (line.size() >= 2 && line.compare(line.size() - 2, 2, " \\") == 0) line.resize(line.size() - 2);
              const std::string why = CheckMegatronLine(line);
              EXPECT_TRUE(why.empty()) << where << ": " << line << ": " << why;
            }
          } else {
            for (const std::string& p : CheckTorchtitanModule(e.text)) ADD_FAILURE() << where << ": " << p;
          }
        }
      }
  }
  // The grid reaches both outcomes for both emitters.
  for (const char* target : {"megatron", "torchtitan"}) {
    EXPECT_GT(counts[target].emitted, 0) << target;
    EXPECT_GT(counts[target].refused, 0) << target;
  }
}

// The checks themselves can fail: a line upstream does not know is caught.
TEST(EmitTable, CheckersCatchWhatUpstreamRejects) {
  EXPECT_FALSE(CheckMegatronLine("--num-layers-per-virtual-pipeline-stage 2").empty());  // removed upstream
  EXPECT_FALSE(CheckMegatronLine("--cp-comm-type allgather").empty());                   // TE's word is all_gather
  EXPECT_FALSE(CheckMegatronLine("--recompute-modules").empty());                        // nargs='+'
  EXPECT_FALSE(CheckMegatronLine("--hybrid-layer-pattern \"*EMR\"").empty());            // R is no Megatron layer
  EXPECT_FALSE(CheckMegatronLine("--hybrid-layer-pattern *EME").empty());                // unquoted
  EXPECT_FALSE(CheckMegatronLine("--swiglu 1").empty());
  EXPECT_TRUE(CheckMegatronLine("--moe-layer-freq \"([0]*3+[1]*58)\"").empty());
  EXPECT_TRUE(CheckMegatronLine("--pipeline-model-parallel-layout \"Et*7|(t*8|)*3t*6mL\"").empty());
  const std::string frame =
      "from torchtitan.config import ParallelismConfig, TrainingConfig\nfrom torchtitan.models.llama3 import "
      "model_registry\n\ndef preflight_config() -> Trainer.Config:\n    return Trainer.Config(\n";
  // TOML-era keys, removed expert TP, a float reduce dtype upstream forbids, an unknown flavor.
  EXPECT_FALSE(CheckTorchtitanModule(frame + "        training=TrainingConfig(\n            local_batch_size=1,\n"
                                             "        ),\n    )\n")
                   .empty());
  EXPECT_FALSE(CheckTorchtitanModule(frame + "        parallelism=ParallelismConfig(\n"
                                             "            expert_tensor_parallel_degree=1,\n        ),\n    )\n")
                   .empty());
  EXPECT_FALSE(CheckTorchtitanModule(frame + "        training=TrainingConfig(\n"
                                             "            mixed_precision_reduce=\"bfloat16\",\n        ),\n    )\n")
                   .empty());
  EXPECT_FALSE(CheckTorchtitanModule(frame + "        model_spec=model_registry(\"7B\"),\n    )\n").empty());
  EXPECT_TRUE(CheckTorchtitanModule(frame + "        model_spec=model_registry(\"8B\"),\n    )\n").empty());
}

}  // namespace
}  // namespace preflight::emit_table_test

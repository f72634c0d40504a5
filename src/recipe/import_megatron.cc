// Megatron-LM arguments -> recipe (issue 15).
//
// Defaults and derived values follow megatron/training/arguments.py
// (parse_args / validate_args) at the commit of the calibration data:
// ffn_hidden_size = 4h (or int(4h * 2/3 / 64) * 64 with --swiglu), kv_channels
// = h / heads, num_query_groups = heads without --group-query-attention,
// hidden/attention dropout 0.1, LayerNorm, learned absolute position
// embeddings, linear biases, tied embeddings, no recompute, DDP without
// --use-distributed-optimizer, and an expert tensor-parallel size equal to TP.
// Each GPT layer is two recipe sublayers (attention + MLP/MoE, "AD"/"AE"); a
// hybrid pattern maps letter for letter (megatron/core/ssm/mamba_hybrid_layer_allocation.py:
// M Mamba, * attention, - MLP, E MoE, | pipeline cut, / MTP part).
#include "preflight/recipe/import_megatron.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "recipe_bounds.h"

namespace preflight {
namespace {

// Arguments that change nothing the recipe prices: logging, paths, data,
// checkpointing, the learning-rate schedule, initialization, numerics of
// values (not of storage), determinism and process bookkeeping.
const std::set<std::string> kQuiet = {
    "--log-throughput",
    "--log-params-norm",
    "--log-num-zeros-in-grad",
    "--log-validation-ppl-to-tensorboard",
    "--log-timers-to-tensorboard",
    "--log-memory-to-tensorboard",
    "--log-interval",
    "--logging-level",
    "--tensorboard-dir",
    "--timing-log-level",
    "--train-iters",
    "--train-samples",
    "--exit-interval",
    "--exit-duration-in-mins",
    "--lr",
    "--min-lr",
    "--lr-decay-style",
    "--lr-decay-iters",
    "--lr-decay-samples",
    "--lr-warmup-fraction",
    "--lr-warmup-iters",
    "--lr-warmup-samples",
    "--lr-warmup-init",
    "--lr-wsd-decay-style",
    "--decoupled-lr",
    "--weight-decay",
    "--clip-grad",
    "--adam-beta1",
    "--adam-beta2",
    "--adam-eps",
    "--muon-momentum",
    "--muon-extra-scale-factor",
    "--muon-scale-mode",
    "--save",
    "--load",
    "--save-interval",
    "--eval-interval",
    "--eval-iters",
    "--split",
    "--data-path",
    "--data-cache-path",
    "--mock-data",
    "--merge-file",
    "--distributed-backend",
    "--distributed-timeout-minutes",
    "--ckpt-format",
    "--dist-ckpt-strictness",
    "--dist-ckpt-optim-fully-reshardable",
    "--ckpt-fully-parallel-load",
    "--ckpt-fully-parallel-save",
    "--no-ckpt-fully-parallel-save",
    "--ckpt-assume-constant-structure",
    "--ckpt-fully-parallel-load-per-rank-objects",
    "--no-ckpt-load-validate-sharding-integrity",
    "--ckpt-drop-redundant-extra-state",
    "--async-save",
    "--async-strategy",
    "--async-ckpt-use-cpu-shm",
    "--use-persistent-ckpt-worker",
    "--use-checkpoint-opt_param-scheduler",
    "--override-opt_param-scheduler",
    "--override-opt-param-scheduler",
    "--finetune",
    "--no-load-optim",
    "--no-load-rng",
    "--verify-integrity",
    "--deterministic-mode",
    "--use-mcore-models",
    "--init-method-std",
    "--seed",
    "--rotary-base",
    "--rotary-scaling-factor",
    "--rotary-percent",
    "--rotary-interleaved",
    "--no-rope-fusion",
    "--mscale",
    "--mscale-all-dim",
    "--norm-epsilon",
    "--manual-gc",
    "--manual-gc-interval",
    "--check-weight-hash-across-dp-replicas-interval",
    "--no-check-for-nan-in-loss-and-grad",
    "--test-mode",
    "--rerun-mode",
    "--no-mmap-bin-files",
    "--dataloader-type",
    "--num-workers",
    "--fim-data",
    "--fim-rate",
    "--fim-spm-rate",
    "--moe-aux-loss-coeff",
    "--moe-router-load-balancing-type",
    "--moe-router-topk-scaling-factor",
    "--moe-router-bias-update-rate",
    "--moe-router-pre-softmax",
    "--moe-router-num-groups",
    "--moe-router-group-topk",
    "--moe-token-drop-policy",
    "--moe-permute-fusion",
    "--moe-router-fusion",
    "--apply-query-key-layer-scaling",
    "--attention-softmax-in-fp32",
    "--calculate-per-token-loss",
    "--ddp-average-in-collective",
    "--no-create-attention-mask-in-dataloader",
    "--disable-gloo-process-groups",
    "--te-rng-tracker",
    "--use-fused-weighted-squared-relu",
    "--no-bias-gelu-fusion",
    "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion",
    "--no-masked-softmax-fusion",
    "--no-persist-layer-norm",
    "--export-default-te-spec",
    "--export-model-type",
    "--spec",
    "--is-hybrid-model",
    "--use-tp-pp-dp-mapping",
    "--max-position-embeddings",
    "--enable-experimental",
    "--vocab-file",
    "--tokenizer-type",
    "--tokenizer-model",
    "--cross-entropy-fusion-impl",
    "--main-grads-dtype",
    "--main-params-dtype",
    "--exp-avg-dtype",
    "--exp-avg-sq-dtype",
    // Flextron's budgets, router schedule and loss (elastification/arguments.py):
    // no activation or state the recipe prices (MapFlextron).
    "--binary-mask",
    "--slice",
    "--no-attn-skip",
    "--lr-mult-router",
    "--flex-strict",
    "--is-flex-eval",
    "--flex-hetero-ffn",
    "--flex-hetero-mamba",
    "--flex-hetero-moe-expert",
    "--router-std",
    "--normalize-router-logits",
    "--budget-list",
    "--budget-probs",
    "--budget-type",
    "--prefill-chunk-size",
    "--mem-infer-seq-len",
    "--mem-batch-size",
    "--original-model-sample-prob",
    "--force-router-skip",
    "--force-mlp",
    "--force-mamba",
    "--force-emb",
    "--skip-num-attn-layer-constraint",
    "--skip-total-layer-constraint",
    "--disable-budget",
    "--curr-iteration",
    "--hard-sample-th",
    "--router-beta",
    "--loss-alpha",
    "--tau-init",
    "--tau-decay",
    "--router-inter-dim",
    "--router-gbs",
    "--linear-scaler-start",
    "--linear-scaler-end",
    "--override-selected-budget",
    "--mlp-int-list",
    "--mlp-per-list",
    "--moe-expert-int-list",
    "--moe-expert-per-list",
    "--memory-profile",
    "--memory-profile-path",
    "--bpe-params",
    "--bpe-kv-cache",
    "--bpe-ssm-cache",
    "--bpe-max-buffer",
    "--param-budget-target",
    "--layer-ranking-list",
    "--log-budgets",
    "--basemodel-type",
    "--distill-coeff",
    "--distill-only",
};

// Arguments that change memory or time but have no recipe counterpart: what
// each would change. (New recipe keys come with the key-table rework.)
const std::map<std::string, std::string>& Unrepresentable() {
  static const std::map<std::string, std::string> kMap = {
      {"--fp8-format",
       "FP8 GEMMs: TE keeps FP8 copies / transposes of weights and FP8 activations for "
       "backward, and amax histories; the recipe prices bf16 compute"},
      {"--fp8-recipe",
       "FP8 scaling recipe (delayed / tensorwise / blockwise / mxfp8) changes the scale "
       "tensors and cached transposes"},
      {"--fp8-param-gather", "FP8 parameter all-gather: parameters stored in FP8 with a bf16/fp32 master"},
      {"--first-last-layers-bf16", "first/last layers kept in bf16 under FP8"},
      {"--activation-offload-fraction", "only part of the eligible offload groups offloaded"},
      {"--delta-offload-bytes-across-pp-ranks", "offload bytes balanced across pipeline ranks"},
      {"--overlap-cpu-optimizer-d2h-h2d", "overlap of the offloaded optimizer's host transfers (time)"},
      {"--cuda-graph-impl", "CUDA graphs keep static input/output buffers and a private memory pool"},
      {"--cuda-graph-modules", "CUDA graph capture scope"},
      {"--use-megatron-fsdp", "Megatron-FSDP buffers (per-bucket all-gather/reduce-scatter staging)"},
      {"--megatron-fsdp-main-params-dtype", "Megatron-FSDP main-parameter dtype"},
      {"--megatron-fsdp-main-grads-dtype", "Megatron-FSDP main-gradient dtype"},
      {"--megatron-fsdp-grad-comm-dtype", "Megatron-FSDP gradient communication dtype"},
      {"--outer-dp-sharding-strategy", "hierarchical (HSDP) sharding across an outer DP group"},
      {"--moe-router-dtype", "router logits and probabilities in fp32 (small per-token buffers)"},
      {"--moe-shared-expert-overlap", "shared-expert compute overlapped with dispatch"},
      {"--delay-wgrad-compute", "weight gradients computed later (their inputs live longer)"},
      {"--overlap-p2p-communication-warmup-flush", "pipeline P2P overlap in warm-up/flush (time)"},
      {"--overlap-param-gather-with-optimizer-step", "parameter all-gather overlapped with the optimizer step"},
      {"--no-gradient-accumulation-fusion",
       "without the fused wgrad kernel each linear allocates a bf16 "
       "weight gradient before adding it to main_grad (a transient)"},
      {"--cross-entropy-loss-fusion", "fused cross entropy does not materialize the fp32 logits"},
      {"--hybrid-attention-ratio", "hybrid layer allocation by ratio; give --hybrid-layer-pattern"},
      {"--hybrid-mlp-ratio", "hybrid layer allocation by ratio; give --hybrid-layer-pattern"},
      {"--moe-layer-recompute", "recompute of the MoE layer"},
  };
  return kMap;
}

// Arguments the mapping below reads (so they are neither unknown nor quiet).
const std::set<std::string> kMapped = {
    "--flextron",
    "--enable-router",
    "--freeze-router",
    "--soft-mask",
    "--emb-int-list",
    "--emb-per-list",
    "--mamba-int-list",
    "--mamba-per-list",
    "--distillation",
    "--freeze-model",
    "--add-skipping",
    "--flextron-config-file",
    "--overlap-grad-reduce",
    "--moe-token-dispatcher-type",
    "--overlap-param-gather",
    "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm",
    "--optimizer-cpu-offload",
    "--optimizer-offload-fraction",
    "--pipeline-model-parallel-layout",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--group-query-attention",
    "--num-query-groups",
    "--kv-channels",
    "--swiglu",
    "--squared-relu",
    "--untie-embeddings-and-output-weights",
    "--qk-layernorm",
    "--normalization",
    "--position-embedding-type",
    "--disable-bias-linear",
    "--moe-grouped-gemm",
    "--mtp-num-layers",
    "--mtp-loss-scaling-factor",
    "--mtp-use-repeated-layer",
    "--mtp-hybrid-override-pattern",
    "--num-distributed-optimizer-instances",
    "--defer-embedding-wgrad-compute",
    "--wgrad-deferral-limit",
    "--add-bias-linear",
    "--vocab-size",
    "--make-vocab-size-divisible-by",
    "--num-experts",
    "--moe-layer-freq",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--moe-expert-capacity-factor",
    "--moe-pad-expert-input-to-capacity",
    "--moe-router-score-function",
    "--moe-router-enable-expert-bias",
    "--multi-latent-attention",
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--hybrid-layer-pattern",
    "--hybrid-override-pattern",
    "--mamba-num-heads",
    "--mamba-head-dim",
    "--mamba-state-dim",
    "--mamba-num-groups",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--virtual-pipeline-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--microbatch-group-size-per-virtual-pipeline-stage",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--no-use-layer-wise-param-layout",
    "--data-parallel-sharding-strategy",
    "--bf16",
    "--fp16",
    "--grad-reduce-in-bf16",
    "--accumulate-allreduce-grads-in-fp32",
    "--fp4-format",
    "--fp4-recipe",
    "--fp4-param-gather",
    "--optimizer",
    "--recompute-granularity",
    "--recompute-modules",
    "--recompute-method",
    "--recompute-num-layers",
    "--fine-grained-activation-offloading",
    "--offload-modules",
    "--min-offloaded-tensor-size",
    "--recompute-activations",
    "--micro-batch-size",
    "--global-batch-size",
    "--seq-length",
    "--attention-dropout",
    "--hidden-dropout",
    "--attention-backend",
    "--transformer-impl",
};

constexpr int64_t kGpt2BpeVocab = 50257;  // GPT-2 encoder.json / vocab.json entries

// ---- Reading the input -------------------------------------------------------

bool IsBlank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

Diagnostic Error(const std::string& file, int line, const std::string& flag, const std::string& value,
                 const std::string& message) {
  return {Severity::kError, file, {line, line > 0 ? 1 : 0}, flag, value, message, ""};
}
Diagnostic Warning(const std::string& file, int line, const std::string& flag, const std::string& value,
                   const std::string& message) {
  return {Severity::kWarning, file, {line, line > 0 ? 1 : 0}, flag, value, message, ""};
}

/// True when a line of the text starts a MODEL_ARGS mapping.
bool IsYamlForm(const std::string& text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (Trim(text.substr(start, end - start)).rfind("MODEL_ARGS:", 0) == 0) return true;
    start = end + 1;
  }
  return false;
}

/// A YAML scalar or flow sequence as Megatron receives it on its command line.
std::string ValueText(const YAML::Node& node) {
  if (node.IsNull()) return "true";
  if (node.IsScalar()) return node.Scalar();
  std::string out;
  if (node.IsSequence()) {
    for (const auto& item : node) out += (out.empty() ? "" : " ") + ValueText(item);
  }
  return out;
}

void ReadYamlForm(const std::string& text, const std::string& file, MegatronImport* out) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    out->diagnostics.push_back(Error(file, e.mark.line + 1, "", "", "malformed YAML: " + e.msg));
    return;
  }
  const YAML::Node args = root.IsMap() ? root["MODEL_ARGS"] : YAML::Node();
  if (!args || !args.IsMap()) {
    out->diagnostics.push_back(Error(file, 1, "MODEL_ARGS", "", "MODEL_ARGS must be a mapping of --flag: value"));
    return;
  }
  for (const auto& kv : args) {
    const int line = kv.first.Mark().line + 1;
    const std::string flag = kv.first.IsScalar() ? kv.first.Scalar() : "";
    if (flag.rfind("--", 0) != 0 || flag.size() < 3) {
      out->diagnostics.push_back(Error(file, line, flag, "", "a MODEL_ARGS key must be a --flag"));
      continue;
    }
    if (kv.second.IsMap()) {
      out->diagnostics.push_back(Error(file, line, flag, "", "the value must be a scalar or a list"));
      continue;
    }
    out->args.push_back({flag, ValueText(kv.second), line});
  }
}

struct Token {
  std::string text;
  int line = 0;
  bool quoted = false;
};

/// Shell-like words of a command line: `\` continuations, `#` comments,
/// single and double quotes; `${VAR}` stays as written.
bool Tokenize(const std::string& text, const std::string& file, std::vector<Token>* tokens,
              std::vector<Diagnostic>* diagnostics) {
  int line = 1;
  Token current;
  bool in_word = false;
  char quote = 0;
  int quote_line = 0;
  const auto flush = [&] {
    if (in_word) tokens->push_back(current);
    current = Token{};
    in_word = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        if (c == '\n') ++line;
        current.text += c;
      }
      continue;
    }
    if (c == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {  // continuation
      ++i;
      ++line;
      flush();
      continue;
    }
    if (c == '\\' && i + 2 < text.size() && text[i + 1] == '\r' && text[i + 2] == '\n') {
      i += 2;
      ++line;
      flush();
      continue;
    }
    if (c == '#' && !in_word) {
      while (i < text.size() && text[i] != '\n') ++i;
      --i;
      continue;
    }
    if (c == '\n' || c == ';') {
      flush();
      if (c == '\n') ++line;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      flush();
      continue;
    }
    if (!in_word) {
      in_word = true;
      current.line = line;
    }
    if (c == '"' || c == '\'') {
      quote = c;
      quote_line = line;
      current.quoted = true;
      continue;
    }
    current.text += c;
  }
  if (quote != 0) {
    diagnostics->push_back(Error(file, quote_line, current.text.rfind("--", 0) == 0 ? current.text : "", "",
                                 fmt::format("unterminated {} quote", quote == '"' ? "double" : "single")));
    return false;
  }
  flush();
  return true;
}

/// The launcher's own flags that give the cluster shape (torchrun).
void ReadLauncher(const std::vector<Token>& tokens, size_t end, MegatronImport* out) {
  for (size_t i = 0; i + 1 < end; ++i) {
    std::string flag = tokens[i].text;
    std::string value = tokens[i + 1].text;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (flag == "--nproc-per-node")
      out->layout.push_back({"cluster.gpus_per_node", value, "torchrun --nproc-per-node"});
    if (flag == "--nnodes") out->layout.push_back({"cluster.nodes", value, "torchrun --nnodes"});
  }
}

void ReadCommandLine(const std::string& text, const std::string& file, MegatronImport* out) {
  std::vector<Token> tokens;
  if (!Tokenize(text, file, &tokens, &out->diagnostics)) return;
  // Megatron's arguments follow the training script; the launcher's precede it.
  size_t start = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i].text;
    if (t.size() > 3 && t.compare(t.size() - 3, 3, ".py") == 0) start = i + 1;
  }
  if (start > 0) ReadLauncher(tokens, start, out);
  for (size_t i = start; i < tokens.size(); ++i) {
    const Token& t = tokens[i];
    if (t.text.rfind("--", 0) != 0 || t.text.size() < 3 || t.quoted) {
      if (t.text.empty() || (start == 0 && out->args.empty())) continue;  // a launcher word before the flags
      out->diagnostics.push_back(Error(file, t.line, out->args.empty() ? "" : out->args.back().flag, t.text,
                                       "a value with no --flag before it"));
      return;
    }
    MegatronArg arg{t.text, "", t.line};
    const size_t eq = arg.flag.find('=');
    if (eq != std::string::npos) {
      arg.value = arg.flag.substr(eq + 1);
      arg.flag = arg.flag.substr(0, eq);
    } else {
      // Every word up to the next flag is a value (nargs='+' flags take several).
      while (i + 1 < tokens.size() && (tokens[i + 1].quoted || tokens[i + 1].text.rfind("--", 0) != 0)) {
        arg.value += (arg.value.empty() ? "" : " ") + tokens[++i].text;
      }
      if (arg.value.empty()) arg.value = "true";
    }
    out->args.push_back(arg);
  }
  if (out->args.empty()) {
    out->diagnostics.push_back(Error(file, 1, "", "", "no --flag found: give MODEL_ARGS YAML or a command line"));
  }
}

// ---- Typed access -------------------------------------------------------------

class Args {
 public:
  Args(const MegatronImport& in, std::string file, std::vector<Diagnostic>* diagnostics)
      : file_(std::move(file)), diagnostics_(diagnostics) {
    for (const MegatronArg& a : in.args) by_flag_[a.flag] = a;  // the last one wins, as in argparse
  }
  bool Has(const std::string& flag) const { return by_flag_.count(flag) != 0; }
  /// A store flag: present and not written as false.
  bool Flag(const std::string& flag) const {
    const auto it = by_flag_.find(flag);
    return it != by_flag_.end() && it->second.value != "false" && it->second.value != "False";
  }
  int Line(const std::string& flag) const {
    const auto it = by_flag_.find(flag);
    return it == by_flag_.end() ? 0 : it->second.line;
  }
  std::string Str(const std::string& flag, const std::string& fallback) const {
    const auto it = by_flag_.find(flag);
    return it == by_flag_.end() ? fallback : it->second.value;
  }
  /// An integer in [minimum, maximum] (or `fallback` when absent); an error
  /// names the flag. Values have at most 15 digits; a flag whose value is
  /// multiplied by another's has the recipe's bound of its key as `maximum`,
  /// so the product stays within int64.
  int64_t Int(const std::string& flag, int64_t fallback, int64_t minimum = 1,
              int64_t maximum = std::numeric_limits<int64_t>::max()) {
    const auto it = by_flag_.find(flag);
    if (it == by_flag_.end()) return fallback;
    const std::string& v = it->second.value;
    int64_t parsed = 0;
    bool ok = !v.empty() && v.size() <= 15;
    for (char c : v) ok = ok && std::isdigit(static_cast<unsigned char>(c)) != 0;
    if (ok) parsed = std::stoll(v);
    if (!ok || parsed < minimum) {
      diagnostics_->push_back(Error(file_, it->second.line, flag, v,
                                    v.find("${") != std::string::npos
                                        ? "an unexpanded variable where an integer is needed; give the value"
                                        : fmt::format("must be an integer >= {}", minimum)));
      return fallback;
    }
    if (parsed > maximum) {
      diagnostics_->push_back(
          Error(file_, it->second.line, flag, v, fmt::format("must be at most {} (the recipe's bound)", maximum)));
      return fallback;
    }
    return parsed;
  }
  /// A required positive integer.
  int64_t Require(const std::string& flag) {
    if (!Has(flag)) {
      diagnostics_->push_back(Error(file_, 0, flag, "", "missing: the model shape needs it"));
      return 1;
    }
    return Int(flag, 1);
  }
  double Real(const std::string& flag, double fallback, double lo, double hi) {
    const auto it = by_flag_.find(flag);
    if (it == by_flag_.end()) return fallback;
    const std::string& v = it->second.value;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(d >= lo && d <= hi)) {
      diagnostics_->push_back(
          Error(file_, it->second.line, flag, v, fmt::format("must be a number in [{}, {}]", lo, hi)));
      return fallback;
    }
    return d;
  }
  /// A list value, as the command line ("a b") or the test YAML ("[a b]",
  /// "[a, b]") writes it: the words without brackets, commas or quotes.
  std::vector<std::string> Words(const std::string& flag) const {
    std::string v = Str(flag, "");
    for (char& c : v) {
      if (c == '[' || c == ']' || c == ',' || c == '\'' || c == '"') c = ' ';
    }
    std::vector<std::string> out;
    std::istringstream in(v);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
  }
  void Warn(const std::string& flag, const std::string& message) {
    diagnostics_->push_back(Warning(file_, Line(flag), flag, Str(flag, ""), message));
  }
  void Fail(const std::string& flag, const std::string& message) {
    diagnostics_->push_back(Error(file_, Line(flag), flag, Str(flag, ""), message));
  }

 private:
  std::string file_;
  std::vector<Diagnostic>* diagnostics_;
  std::map<std::string, MegatronArg> by_flag_;
};

// ---- --moe-layer-freq expressions ------------------------------------------------

/// A recursive-descent reader of Python list arithmetic: expr := term ('+' term)*,
/// term := atom ('*' int)*, atom := int | '[' int (',' int)* ']' | '(' expr ')'.
class ListExpr {
 public:
  explicit ListExpr(const std::string& s) : s_(s) {}
  /// The value: a list, or an integer (is_int) when the whole text is one.
  bool Parse(std::vector<int>* list, int64_t* integer, bool* is_int) {
    Value v;
    if (!Expr(&v)) return false;
    Skip();
    if (pos_ != s_.size()) return false;
    *is_int = v.is_int;
    *integer = v.integer;
    *list = v.list;
    return true;
  }

 private:
  struct Value {
    bool is_int = false;
    int64_t integer = 0;
    std::vector<int> list;
  };
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Int(int64_t* v) {
    Skip();
    const size_t begin = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_])) && pos_ - begin < 9) ++pos_;
    if (pos_ == begin) return false;
    *v = std::stoll(s_.substr(begin, pos_ - begin));
    return true;
  }
  bool Atom(Value* v) {
    if (Eat('(')) return ++depth_ < 32 && Expr(v) && Eat(')') && (--depth_, true);
    if (Eat('[')) {
      v->is_int = false;
      if (Eat(']')) return true;
      do {
        int64_t x = 0;
        if (!Int(&x)) return false;
        v->list.push_back(static_cast<int>(x));
      } while (Eat(','));
      return Eat(']');
    }
    v->is_int = true;
    return Int(&v->integer);
  }
  bool Term(Value* v) {
    if (!Atom(v)) return false;
    while (Eat('*')) {
      int64_t n = 0;
      if (!Int(&n) || v->is_int) return false;
      if (static_cast<int64_t>(v->list.size()) * n > recipe_internal::kMaxLayers) return false;
      std::vector<int> repeated;
      for (int64_t k = 0; k < n; ++k) repeated.insert(repeated.end(), v->list.begin(), v->list.end());
      v->list = std::move(repeated);
    }
    return true;
  }
  bool Expr(Value* v) {
    if (!Term(v)) return false;
    while (Eat('+')) {
      Value rhs;
      if (!Term(&rhs) || v->is_int || rhs.is_int) return false;
      v->list.insert(v->list.end(), rhs.list.begin(), rhs.list.end());
      if (static_cast<int64_t>(v->list.size()) > recipe_internal::kMaxLayers) return false;
    }
    return true;
  }
  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// ---- Mapping --------------------------------------------------------------------

void Add(std::vector<YamlEntry>* out, const std::string& key, const std::string& value,
         const std::string& comment = "") {
  out->push_back({key, value, comment});
}
void Add(std::vector<YamlEntry>* out, const std::string& key, int64_t value, const std::string& comment = "") {
  Add(out, key, std::to_string(value), comment);
}
std::string BoolText(bool b) { return b ? "true" : "false"; }

/// Hybrid-pattern letters (with '|' cuts) -> recipe letters and cut positions;
/// the MTP part after the first '/' is returned as written.
bool MapHybrid(const std::string& pattern, std::string* letters, std::vector<int64_t>* cuts, std::string* mtp,
               char* bad) {
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '/') {  // the MTP part follows (hybrid_layer_allocation.py parse_hybrid_pattern)
      *mtp = pattern.substr(i + 1);
      break;
    }
    switch (c) {
      case 'M': *letters += 'M'; break;
      case '*': *letters += 'A'; break;
      case '-': *letters += 'D'; break;
      case 'E': *letters += 'E'; break;
      case '|': cuts->push_back(static_cast<int64_t>(letters->size())); break;
      default:
        if (std::isspace(static_cast<unsigned char>(c))) break;
        *bad = c;
        return false;
    }
  }
  return true;
}

std::string JoinInts(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

/// The layer stack: the hybrid pattern (and its '|' cuts), or --num-layers
/// attention + MLP/MoE pairs with --moe-layer-freq. False when it cannot be read.
struct Stack {
  std::string flag;  // the hybrid pattern's flag; empty for GPT
  std::string letters;
  std::vector<int64_t> cuts;
  std::string mtp;  // a hybrid pattern's MTP part: one pattern a depth, '/' between
  int64_t layers = 0;
  bool hybrid() const { return !flag.empty(); }
  bool Has(char letter) const { return letters.find(letter) != std::string::npos; }
};

bool MapStack(Args& a, int64_t experts, Stack* st) {
  st->flag = a.Has("--hybrid-layer-pattern")      ? "--hybrid-layer-pattern"
             : a.Has("--hybrid-override-pattern") ? "--hybrid-override-pattern"
                                                  : "";
  const std::string& hybrid_flag = st->flag;
  std::string& letters = st->letters;
  int64_t& layers = st->layers;
  if (st->hybrid()) {
    char bad = 0;
    if (!MapHybrid(a.Str(hybrid_flag, ""), &letters, &st->cuts, &st->mtp, &bad)) {
      a.Fail(hybrid_flag, fmt::format("letter '{}' is not one of M (Mamba), * (attention), - (MLP), E (MoE), "
                                      "| (pipeline cut), / (MTP part)",
                                      bad));
      return false;
    }
    layers = static_cast<int64_t>(letters.size());
    if (letters.empty()) {
      a.Fail(hybrid_flag, "no layers in the pattern");
      return false;
    }
    if (a.Has("--num-layers") && a.Int("--num-layers", layers) != layers) {
      // The pattern builds the stack (mamba_hybrid_layer_allocation.py); the count is only checked there.
      a.Warn("--num-layers", fmt::format("the hybrid pattern has {} layers; the pattern is imported", layers));
    }
  } else {
    layers = a.Require("--num-layers");
    if (layers > recipe_internal::kMaxLayers / 2) {
      a.Fail("--num-layers", fmt::format("at most {} layers", recipe_internal::kMaxLayers / 2));
      return false;
    }
    std::vector<int> is_moe(static_cast<size_t>(layers), experts > 0 ? 1 : 0);
    if (experts > 0 && a.Has("--moe-layer-freq")) {
      std::vector<int> list;
      int64_t period = 1;
      if (!ParseMoeLayerFreq(a.Str("--moe-layer-freq", ""), &list, &period)) {
        a.Fail("--moe-layer-freq", "must be an integer or a Python list expression such as ([0]*3+[1]*9)");
        return false;
      }
      if (!list.empty() && static_cast<int64_t>(list.size()) != layers) {
        a.Fail("--moe-layer-freq", fmt::format("the list has {} entries but --num-layers is {}", list.size(), layers));
        return false;
      }
      for (int64_t i = 0; i < layers; ++i) {
        // megatron/core/models/gpt/moe_module_specs / transformer_block: int k -> layer i is MoE iff i % k == 0.
        is_moe[static_cast<size_t>(i)] = list.empty() ? (i % period == 0 ? 1 : 0) : (list[static_cast<size_t>(i)] != 0);
      }
    }
    for (int64_t i = 0; i < layers; ++i) letters += is_moe[static_cast<size_t>(i)] ? "AE" : "AD";
  }
  return true;
}

/// Vocabulary, embeddings, norms and biases.
void MapEmbeddings(Args& a, int64_t seq, std::vector<YamlEntry>& m) {
  // Vocabulary: GPT-2 BPE, or NullTokenizer(vocab_size) whose vocab_size property is vocab_size + 1 (EOD).
  int64_t vocab = 0;
  const std::string tokenizer = a.Str("--tokenizer-type", a.Has("--vocab-file") ? "GPT2BPETokenizer" : "");
  if (tokenizer == "NullTokenizer") {
    vocab = a.Require("--vocab-size") + 1;
  } else if (tokenizer == "GPT2BPETokenizer") {
    vocab = kGpt2BpeVocab;
  } else if (a.Has("--vocab-size")) {
    vocab = a.Int("--vocab-size", 1);
  } else {
    a.Fail(tokenizer.empty() ? "--vocab-file" : "--tokenizer-type",
           "the vocabulary size is unknown: give --vocab-size (NullTokenizer) or a GPT-2 --vocab-file");
    vocab = 1;
  }
  Add(&m, "model.vocab", vocab,
      tokenizer == "NullTokenizer"      ? "NullTokenizer: --vocab-size + 1 (EOD)"
      : tokenizer == "GPT2BPETokenizer" ? "GPT-2 BPE vocab.json"
                                        : "");
  Add(&m, "model.vocab_pad_multiple", a.Int("--make-vocab-size-divisible-by", 128), "times TP (Megatron)");
  Add(&m, "model.tie_embeddings", BoolText(!a.Flag("--untie-embeddings-and-output-weights")));
  const std::string norm = a.Str("--normalization", "LayerNorm");
  if (norm != "LayerNorm" && norm != "RMSNorm") a.Warn("--normalization", "not LayerNorm/RMSNorm; priced as RMSNorm");
  Add(&m, "model.norm", norm == "LayerNorm" ? "layernorm" : "rmsnorm");
  // add_bias_linear defaults to True; --disable-bias-linear stores False into it.
  Add(&m, "model.linear_bias", BoolText(!a.Flag("--disable-bias-linear")),
      "Megatron adds biases unless --disable-bias-linear");
  // LanguageModelEmbedding builds nn.Embedding(max_sequence_length, hidden) for learned_absolute,
  // max_sequence_length being --max-position-embeddings (validate_args defaults it to --seq-length).
  const std::string pos = a.Str("--position-embedding-type", "learned_absolute");
  Add(&m, "model.learned_positions", pos == "learned_absolute" ? a.Int("--max-position-embeddings", seq) : 0,
      "--position-embedding-type " + pos);
}

/// The blocks' shapes: attention or MLA, the dense MLP, MoE, Mamba. False
/// when a needed argument is missing.
bool MapBlocks(Args& a, const Stack& st, int64_t hidden, int64_t experts, std::vector<YamlEntry>& m) {
  const int64_t heads = a.Require("--num-attention-heads");
  const bool swiglu = a.Flag("--swiglu");
  const int64_t ffn = a.Int("--ffn-hidden-size", swiglu ? (4 * hidden * 2 / 3) / 64 * 64 : 4 * hidden);
  const bool has_attention = st.Has('A');
  if (has_attention && a.Flag("--multi-latent-attention")) {
    // megatron/core/transformer/transformer_config.py MLATransformerConfig defaults.
    Add(&m, "model.mla.heads", heads);
    Add(&m, "model.mla.q_lora_rank", a.Int("--q-lora-rank", 0, 0), "0 = no query compression");
    Add(&m, "model.mla.kv_lora_rank", a.Int("--kv-lora-rank", 32));
    Add(&m, "model.mla.qk_rope_head_dim", a.Int("--qk-pos-emb-head-dim", 64));
    Add(&m, "model.mla.qk_nope_head_dim", a.Int("--qk-head-dim", 128));
    Add(&m, "model.mla.v_head_dim", a.Int("--v-head-dim", 128));
    if (a.Flag("--qk-layernorm")) a.Warn("--qk-layernorm", "MLA's q/kv latent norms are counted by the MLA block");
  } else if (has_attention) {
    const int64_t groups = a.Flag("--group-query-attention") ? a.Int("--num-query-groups", 1) : heads;
    Add(&m, "model.attention.heads", heads);
    Add(&m, "model.attention.kv_heads", groups);
    Add(&m, "model.attention.head_dim", a.Int("--kv-channels", hidden / heads));
    Add(&m, "model.attention.qk_norm", BoolText(a.Flag("--qk-layernorm")));
  }
  // One activation for the dense MLP and the experts (TransformerConfig's
  // gated_linear_unit / activation_func serve both).
  const char* activation = swiglu ? "swiglu" : a.Flag("--squared-relu") ? "relu2" : "gelu";
  if (st.Has('D') || st.Has('E')) {
    Add(&m, "model.mlp.ffn_hidden", ffn);
    Add(&m, "model.mlp.activation", activation);
  }
  if (st.Has('E')) {
    if (experts <= 0) {
      a.Fail("--num-experts", "MoE layers (E) need --num-experts");
      return false;
    }
    Add(&m, "model.moe.experts", experts);
    Add(&m, "model.moe.top_k", a.Int("--moe-router-topk", 2));
    Add(&m, "model.moe.ffn_hidden", a.Int("--moe-ffn-hidden-size", ffn), "per routed expert");
    const int64_t shared = a.Int("--moe-shared-expert-intermediate-size", 0, 0);
    Add(&m, "model.moe.shared_experts", shared > 0 ? 1 : 0);
    Add(&m, "model.moe.shared_ffn_hidden", shared);
    const bool dropless = !a.Has("--moe-expert-capacity-factor");
    if (!dropless) Add(&m, "model.moe.capacity_factor", a.Str("--moe-expert-capacity-factor", "1.0"));
    (void)a.Real("--moe-expert-capacity-factor", 1.0, 0.01, 1024);
    Add(&m, "model.moe.dropless", BoolText(dropless));
    Add(&m, "model.moe.pad_to_capacity", BoolText(a.Flag("--moe-pad-expert-input-to-capacity")));
    Add(&m, "model.moe.router", a.Str("--moe-router-score-function", "softmax") == "sigmoid" ? "sigmoid" : "softmax");
    Add(&m, "model.moe.router_bias", BoolText(a.Flag("--moe-router-enable-expert-bias")));
    Add(&m, "model.moe.activation", activation);
    Add(&m, "model.moe.grouped_gemm", BoolText(a.Flag("--moe-grouped-gemm")));
    // TransformerConfig.moe_token_dispatcher_type defaults to "allgather"
    // (megatron/core/transformer/transformer_config.py, d98e8a6).
    const std::string dispatcher = a.Str("--moe-token-dispatcher-type", "allgather");
    if (dispatcher != "allgather" && dispatcher != "alltoall" && dispatcher != "flex") {
      a.Fail("--moe-token-dispatcher-type",
             fmt::format("{}: not a Megatron-LM token dispatcher (allgather, alltoall, flex)", dispatcher));
    }
    Add(&m, "model.moe.dispatcher", dispatcher,
        a.Has("--moe-token-dispatcher-type") ? "" : "Megatron's default without --moe-token-dispatcher-type");
  }
  if (st.Has('M')) {
    const int64_t head_dim = a.Int("--mamba-head-dim", 64, 1, recipe_internal::kMaxHeadDim);
    // megatron/core/ssm/mamba_mixer.py: d_inner = expand (2) * hidden; nheads = d_inner / headdim.
    const int64_t mheads = a.Int("--mamba-num-heads", 2 * hidden / head_dim, 1, recipe_internal::kMaxHeads);
    Add(&m, "model.mamba.d_state", a.Int("--mamba-state-dim", 128));
    Add(&m, "model.mamba.d_conv", 4);
    // An inner width that is a whole multiple of hidden is written as expand,
    // any other (Nemotron 3's 16 x 64 on hidden 768) as the head count.
    if ((mheads * head_dim) % hidden == 0) {
      Add(&m, "model.mamba.expand", std::max<int64_t>(1, mheads * head_dim / hidden));
    } else {
      Add(&m, "model.mamba.heads", mheads, "--mamba-num-heads: heads x head_dim is not a multiple of hidden");
    }
    Add(&m, "model.mamba.head_dim", head_dim);
    Add(&m, "model.mamba.groups", a.Int("--mamba-num-groups", 8));
    Add(&m, "model.mamba.chunk", 128, "mamba_mixer.py chunk_size");
  }
  return true;
}

/// A list flag's words as a recipe list "[a, b]": the names of `all` in
/// the order given, once each; `warned` are Megatron's names of what
/// preflight does not model (a warning saying so), anything else an error
/// listing the valid names.
template <class E, size_t N>
std::string WordsOf(Args& a, const std::string& flag, const E (&all)[N], const std::set<std::string>& warned,
                    const char* what) {
  std::vector<std::string> kept, valid;
  for (E e : all) valid.push_back(Name(e));
  for (const std::string& w : a.Words(flag)) {
    if (std::find(valid.begin(), valid.end(), w) != valid.end()) {
      if (std::find(kept.begin(), kept.end(), w) == kept.end()) kept.push_back(w);
    } else if (warned.count(w) != 0) {
      a.Warn(flag, fmt::format("{}: a Megatron-LM {} preflight does not model; not priced", w, what));
    } else {
      a.Fail(flag, fmt::format("{}: not a Megatron-LM {} ({})", w, what, fmt::join(valid, ", ")));
    }
  }
  return fmt::format("[{}]", fmt::join(kept, ", "));
}

/// --recompute-modules (read by Megatron under selective granularity only).
void MapRecomputeModules(Args& a, const std::string& recompute, std::vector<YamlEntry>* l) {
  const std::string flag = "--recompute-modules";
  if (recompute != "selective") {
    a.Warn(flag, "ignored: Megatron-LM reads it under --recompute-granularity selective only");
    return;
  }
  Add(l, "training.recompute_modules",
      WordsOf(a, flag, kAllRecomputeModules, {"gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"}, "recompute module"));
}

/// --fine-grained-activation-offloading with its --offload-modules and
/// --min-offloaded-tensor-size (transformer_config.py).
void MapActivationOffload(Args& a, std::vector<YamlEntry>* l) {
  Add(l, "training.activation_offload",
      WordsOf(a, "--offload-modules", kAllOffloadModules, {"fused_group_mlp", "gdp_qkv"}, "offload module"));
  if (a.Has("--min-offloaded-tensor-size")) {
    Add(l, "training.activation_offload_min_elements", a.Int("--min-offloaded-tensor-size", 1 << 20, 0));
  }
}

/// FP4 GEMMs (transformer_config.py @ d98e8a6: fp4 "e2m1" as --fp4-format,
/// fp4_recipe nvfp4 (the default) or custom, fp4_param as --fp4-param-gather).
void MapFp4(Args& a, std::vector<YamlEntry>* l) {
  if (!a.Has("--fp4-format")) {
    for (const char* flag : {"--fp4-recipe", "--fp4-param-gather"}) {
      if (a.Has(flag)) a.Fail(flag, "needs --fp4-format e2m1 (Megatron-LM raises without it)");
    }
    return;
  }
  if (a.Str("--fp4-format", "e2m1") != "e2m1") a.Fail("--fp4-format", "must be e2m1 (the only FP4 format)");
  const std::string recipe = a.Str("--fp4-recipe", "nvfp4");
  if (recipe != "nvfp4") {
    a.Fail("--fp4-recipe", "only nvfp4 is priced (custom names a user quantizer factory of unknown storage)");
    return;
  }
  Add(l, "training.precision.fp4", "nvfp4", "--fp4-format e2m1 --fp4-recipe nvfp4");
  if (a.Flag("--fp4-param-gather")) Add(l, "training.precision.fp4_params", "true", "--fp4-param-gather");
}

/// Batch, recompute, precision, optimizer and kernels.
void MapTraining(Args& a, int64_t seq, MegatronImport* out) {
  std::vector<YamlEntry>& l = out->layout;
  const int64_t micro = a.Int("--micro-batch-size", 1);
  Add(&l, "training.seq_len", seq);
  Add(&l, "training.micro_batch", micro);
  if (a.Has("--global-batch-size")) Add(&l, "training.global_batch", a.Int("--global-batch-size", micro));
  std::string recompute = "none";
  if (a.Flag("--recompute-activations")) recompute = "selective";
  if (a.Has("--recompute-granularity")) {
    recompute = a.Str("--recompute-granularity", "");
    if (recompute != "full" && recompute != "selective") {
      a.Fail("--recompute-granularity", "must be full or selective");
      recompute = "none";
    }
  }
  Add(&l, "training.recompute", recompute);
  if (a.Has("--recompute-modules")) MapRecomputeModules(a, recompute, &l);
  if (recompute == "full") {
    // Megatron requires a method under full granularity; uniform 1 is every layer.
    const std::string method = a.Str("--recompute-method", "uniform");
    if (method != "uniform" && method != "block") a.Fail("--recompute-method", "must be uniform or block");
    if (method == "block") Add(&l, "training.recompute_method", method);
    const int64_t n = a.Int("--recompute-num-layers", 1);
    if (n != 1) Add(&l, "training.recompute_layers", n);
  } else {
    for (const char* flag : {"--recompute-method", "--recompute-num-layers"}) {
      if (a.Has(flag)) a.Warn(flag, "ignored: Megatron-LM reads it under --recompute-granularity full only");
    }
  }
  if (a.Flag("--fine-grained-activation-offloading")) MapActivationOffload(a, &l);
  const bool bf16 = a.Flag("--bf16");
  const bool fp16 = a.Flag("--fp16");
  Add(&l, "training.precision.params", bf16 ? "bf16" : fp16 ? "fp16" : "fp32");
  // The main_grad buffer is fp32 when gradients accumulate in fp32, else the
  // parameters' dtype (param_and_grad_buffer.py group_params_for_buffers);
  // arguments.py turns fp32 accumulation on under --bf16 unless
  // --grad-reduce-in-bf16, and leaves it off under --fp16 unless asked.
  const bool fp32_grads =
      a.Flag("--accumulate-allreduce-grads-in-fp32") || (bf16 && !a.Flag("--grad-reduce-in-bf16")) || (!bf16 && !fp16);
  Add(&l, "training.precision.grads", fp32_grads ? "fp32" : bf16 ? "bf16" : "fp16", "main_grad buffer");
  Add(&l, "training.precision.master", bf16 || fp16 ? "fp32" : "none");
  MapFp4(a, &l);
  const std::string optimizer = a.Str("--optimizer", "adam");
  if (optimizer != "adam" && optimizer != "muon") {
    a.Warn("--optimizer", "only adam and muon are represented; priced as adam");
    out->unrepresented.push_back("--optimizer");
  }
  Add(&l, "training.optimizer.matrices", optimizer == "muon" ? "muon" : "adamw");
  Add(&l, "training.optimizer.other", "adamw");
  // Muon takes every 2-D parameter but the embeddings and output layer, the
  // router included (emerging_optimizers.py _is_muon_excluded).
  if (optimizer == "muon") Add(&l, "training.optimizer.router", "muon", "a 2-D matrix: Megatron's Muon owns it");
  if (a.Flag("--optimizer-cpu-offload")) {
    Add(&l, "training.optimizer.offload_fraction", a.Str("--optimizer-offload-fraction", "1.0"),
        "--optimizer-cpu-offload (Megatron's default fraction 1.0)");
    (void)a.Real("--optimizer-offload-fraction", 1.0, 0.0, 1.0);
  }
  Add(&l, "training.dropout", a.Str("--hidden-dropout", "0.1"), "--hidden-dropout");
  (void)a.Real("--hidden-dropout", 0.1, 0.0, 0.999);
  // --transformer-impl local builds megatron/core/transformer/dot_product_attention.py (unfused:
  // scores, softmax and dropout mask of s x s per head kept for backward); TE picks flash or fused
  // attention unless --attention-backend forces the unfused path.
  const std::string backend = a.Str("--attention-backend", "auto");
  const std::string impl = a.Str("--transformer-impl", "transformer_engine");
  const bool flash = backend != "unfused" && backend != "local" && impl != "local";
  Add(&l, "training.flash_attention", BoolText(flash),
      impl == "local" ? "--transformer-impl local" : "--attention-backend " + backend);
  Add(&l, "training.transformer_engine", BoolText(impl == "transformer_engine"), "--transformer-impl " + impl);
  if (a.Flag("--defer-embedding-wgrad-compute")) {
    Add(&l, "training.defer_head_wgrad", "true", "--defer-embedding-wgrad-compute");
    Add(&l, "training.head_wgrad_deferral_limit", a.Int("--wgrad-deferral-limit", 0, 0), "0 = every micro-batch");
  }
  if (bf16 && fp16) a.Fail("--fp16", "--bf16 and --fp16 are exclusive");
}

/// Decoder layers per chunk of a --pipeline-model-parallel-layout string
/// (pipeline_parallel_layer_layout.py parse_str_to_list: ',' cosmetic,
/// "(..)*n" then "x*n" unrolled, '|' between chunks, E embedding, t layer,
/// m MTP, L loss), or an error. Unrolled text is capped: the string is input.
std::optional<std::vector<int64_t>> ParseMegatronLayout(std::string text, std::string* error) {
  constexpr size_t kMaxUnrolled = 1'000'000;
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  auto unroll = [&](bool groups) {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      size_t body_begin = i, body_end = i + 1, after = i + 1;
      if (groups && text[i] == '(') {
        const size_t close = text.find(')', i);
        if (close == std::string::npos) return false;
        body_begin = i + 1;
        body_end = close;
        after = close + 1;
      }
      int64_t n = 1;
      const bool repeated = after < text.size() && text[after] == '*' && (groups ? text[i] == '(' : true);
      if (repeated) {
        size_t digits = after + 1;
        while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) ++digits;
        if (digits == after + 1 || digits - after > 8) return false;
        n = std::stoll(text.substr(after + 1, digits - after - 1));
        after = digits;
      } else if (groups && text[i] == '(') {
        return false;  // a group without its count
      }
      for (int64_t k = 0; k < n; ++k) {
        out.append(text, body_begin, body_end - body_begin);
        if (out.size() > kMaxUnrolled) return false;
      }
      i = repeated || (groups && text[i] == '(') ? after : i + 1;
    }
    text = out;
    return true;
  };
  if (!unroll(true) || !unroll(false)) {
    *error =
        "cannot unroll it: a '(...)' group needs '*n', an 'x*n' a count, and the unrolled layout at most 10^6 "
        "symbols";
    return std::nullopt;
  }
  std::vector<int64_t> layers{0};
  for (const char c : text) {
    if (c == '|') {
      layers.push_back(0);
    } else if (c == 't') {
      ++layers.back();
    } else if (c != 'E' && c != 'L' && c != 'm') {
      *error = fmt::format("'{}' is not a layer symbol (E embedding, t layer, m MTP, L loss, | between chunks)", c);
      return std::nullopt;
    }
  }
  if (text.empty() || text.front() != 'E' || text.back() != 'L') {
    *error = "must open with the embedding E and close with the loss L (Megatron asserts both)";
    return std::nullopt;
  }
  return layers;
}

/// Megatron's stage split: the hybrid pattern's '|' cuts, an explicit
/// --pipeline-model-parallel-layout, or its rule's keys (uneven first/last
/// stage, the embedding and loss accounted). `vpp` may come from the layout.
void MapStageSplit(Args& a, const Stack& st, int64_t pp, int64_t* vpp, std::vector<YamlEntry>& l) {
  const int64_t stages = pp * *vpp;
  std::vector<int64_t> boundaries;
  if (st.hybrid() && !st.cuts.empty()) {
    if (static_cast<int64_t>(st.cuts.size()) == stages - 1) {
      boundaries = st.cuts;
    } else {
      a.Warn(st.flag, fmt::format("{} '|' cuts for {} pipeline stages; the recipe splits as Megatron does without "
                                  "them",
                                  st.cuts.size(), stages));
    }
  } else if (a.Has("--pipeline-model-parallel-layout")) {
    const std::string flag = "--pipeline-model-parallel-layout";
    std::string error;
    const auto per_chunk = ParseMegatronLayout(a.Str(flag, ""), &error);
    int64_t total = 0;
    for (const int64_t n : per_chunk.value_or(std::vector<int64_t>{})) total += n;
    if (!per_chunk) {
      a.Fail(flag, error);
    } else if (static_cast<int64_t>(per_chunk->size()) % pp != 0) {
      a.Fail(flag,
             fmt::format("has {} chunks, not a multiple of --pipeline-model-parallel-size {}", per_chunk->size(), pp));
    } else if (total != st.layers) {
      a.Fail(flag, fmt::format("holds {} layers (t), --num-layers is {}", total, st.layers));
    } else {
      *vpp = static_cast<int64_t>(per_chunk->size()) / pp;
      for (size_t c = 0, at = 0; c + 1 < per_chunk->size(); ++c) {
        at += static_cast<size_t>((*per_chunk)[c]);
        boundaries.push_back(static_cast<int64_t>(at));
      }
    }
  } else {
    if (a.Has("--decoder-first-pipeline-num-layers")) {
      Add(&l, "parallel.first_stage_layers", a.Int("--decoder-first-pipeline-num-layers", 0, 1));
    }
    if (a.Has("--decoder-last-pipeline-num-layers")) {
      Add(&l, "parallel.last_stage_layers", a.Int("--decoder-last-pipeline-num-layers", 0, 1));
    }
    if (a.Flag("--account-for-embedding-in-pipeline-split")) Add(&l, "parallel.embedding_in_split", "true");
    if (a.Flag("--account-for-loss-in-pipeline-split")) Add(&l, "parallel.loss_in_split", "true");
  }
  if (!boundaries.empty()) Add(&l, "parallel.stage_boundaries", JoinInts(boundaries), "Megatron's stage split");
  // Communication overlap (time only).
  if (a.Flag("--overlap-grad-reduce")) Add(&l, "parallel.overlap_grad_reduce", "true");
  if (a.Flag("--overlap-param-gather")) Add(&l, "parallel.overlap_param_gather", "true");
  if (a.Flag("--tp-comm-overlap")) Add(&l, "parallel.tp_comm_overlap", "true");
  if (a.Flag("--overlap-moe-expert-parallel-comm")) Add(&l, "parallel.ep_comm_overlap", "true");
}

/// Whether the run is Megatron's legacy layer-wise optimizer: validate_args
/// (arguments.py) turns --use-distributed-optimizer with a non-Adam
/// optimizer into use_layer_wise_distributed_optimizer, and without the
/// shard-aligned param layout LayerWiseDistributedOptimizer deals whole
/// tensors by size (_shard_params_ping_pong). With the layout (Megatron's
/// default) Adam's tensors go to a flat distributed optimizer and Muon's to
/// shard-aligned buffers: priced as flat shards, with a warning.
bool MuonLayerWise(Args& a) {
  if (a.Str("--optimizer", "adam") != "muon" || !a.Flag("--use-distributed-optimizer")) return false;
  if (a.Flag("--no-use-layer-wise-param-layout")) return true;
  a.Warn("--use-distributed-optimizer",
         "with --optimizer muon: Megatron's layer-wise optimizer with its shard-aligned param layout, priced as "
         "flat ZeRO-1 shards (add --no-use-layer-wise-param-layout for the whole-tensor deal preflight prices)");
  return false;
}

/// Degrees, ZeRO, schedule, rank order, stage cuts and the cluster defaults.
void MapParallel(Args& a, const Stack& st, std::vector<YamlEntry>& l) {
  const int64_t tp = a.Int("--tensor-model-parallel-size", 1);
  const int64_t pp = a.Int("--pipeline-model-parallel-size", 1, 1, recipe_internal::kMaxDegree);
  int64_t vpp = 1;
  if (a.Has("--num-layers-per-virtual-pipeline-stage")) {
    const int64_t per = a.Int("--num-layers-per-virtual-pipeline-stage", 1, 1, recipe_internal::kMaxLayers);
    if (st.layers % (pp * per) != 0) {
      a.Fail("--num-layers-per-virtual-pipeline-stage",
             fmt::format("--num-layers {} is not a multiple of pp {} x this", st.layers, pp));
    } else {
      vpp = st.layers / (pp * per);
    }
  }
  // The recipe's bound of parallel.vpp.
  if (a.Has("--virtual-pipeline-model-parallel-size")) {
    vpp = a.Int("--virtual-pipeline-model-parallel-size", 1, 1, recipe_internal::kMaxLayers);
  }
  if (a.Has("--num-virtual-stages-per-pipeline-rank")) {
    vpp = a.Int("--num-virtual-stages-per-pipeline-rank", 1, 1, recipe_internal::kMaxLayers);
  }
  std::vector<YamlEntry> split;
  MapStageSplit(a, st, pp, &vpp, split);
  Add(&l, "parallel.tp", tp);
  Add(&l, "parallel.sp", BoolText(a.Flag("--sequence-parallel") && tp > 1));
  Add(&l, "parallel.cp", a.Int("--context-parallel-size", 1));
  Add(&l, "parallel.pp", pp);
  Add(&l, "parallel.vpp", vpp);
  // Expert degrees only where there are experts (the recipe warns about unused ones).
  if (st.Has('E') || a.Has("--expert-model-parallel-size")) {
    Add(&l, "parallel.ep", a.Int("--expert-model-parallel-size", 1));
  }
  if (st.Has('E') || a.Has("--expert-tensor-parallel-size")) {
    Add(&l, "parallel.expert_tp", a.Int("--expert-tensor-parallel-size", tp), "Megatron default: = tp");
  }
  int64_t zero = a.Flag("--use-distributed-optimizer") ? 1 : 0;
  // The strategy is read only under Megatron-FSDP (core/optimizer/__init__.py,
  // use_megatron_fsdp); beside the plain distributed optimizer it is inert.
  if (a.Has("--data-parallel-sharding-strategy") && a.Flag("--use-megatron-fsdp")) {
    const std::string s = a.Str("--data-parallel-sharding-strategy", "");
    zero = s == "optim_grads_params" ? 3 : s == "optim_grads" ? 2 : s == "optim" ? 1 : 0;
  }
  Add(&l, "parallel.zero", zero, zero == 1 ? "--use-distributed-optimizer" : "");
  if (MuonLayerWise(a)) {
    Add(&l, "parallel.optimizer_sharding", "layer_wise",
        "--optimizer muon --use-distributed-optimizer --no-use-layer-wise-param-layout");
  }
  if (a.Has("--num-distributed-optimizer-instances")) {
    Add(&l, "parallel.dp_replicate", a.Int("--num-distributed-optimizer-instances", 1),
        "--num-distributed-optimizer-instances: ZeRO shards inside each instance");
  }
  Add(&l, "parallel.schedule", vpp > 1 ? "interleaved" : "1f1b");
  // Read by the interleaved schedule only (ModelParallelConfig: pp when unset).
  if (vpp > 1 && a.Has("--microbatch-group-size-per-virtual-pipeline-stage")) {
    Add(&l, "parallel.microbatch_group",
        a.Int("--microbatch-group-size-per-virtual-pipeline-stage", 1, 1, recipe_internal::kMaxDegree));
  }
  if (a.Flag("--use-tp-pp-dp-mapping")) Add(&l, "parallel.order", "tp-cp-pp-dp", "--use-tp-pp-dp-mapping");
  l.insert(l.end(), split.begin(), split.end());
  Add(&l, "cluster.gpu", "h100", "DGX H100 unless --layout cluster.gpu=...");
  Add(&l, "cluster.nodes", 1);
  Add(&l, "cluster.gpus_per_node", 8);
}

/// What is left: a warning for each argument the recipe cannot represent, a
/// list of the unknown ones.
void WarnTheRest(Args& a, MegatronImport* out) {
  std::set<std::string> seen;
  for (const MegatronArg& arg : out->args) {
    if (!seen.insert(arg.flag).second) continue;
    if (kMapped.count(arg.flag) != 0 || kQuiet.count(arg.flag) != 0) continue;
    // Values that ask for what the recipe already prices change nothing.
    static const std::map<std::string, std::string> kNeutral = {{"--outer-dp-sharding-strategy", "no_shard"},
                                                                {"--moe-router-dtype", "None"}};
    const auto neutral = kNeutral.find(arg.flag);
    if (neutral != kNeutral.end() && neutral->second == a.Str(arg.flag, "")) continue;
    const auto it = Unrepresentable().find(arg.flag);
    if (it != Unrepresentable().end()) {
      a.Warn(arg.flag, "not represented: " + it->second);
      out->unrepresented.push_back(arg.flag);
      continue;
    }
    a.Warn(arg.flag, "unknown argument: not imported");
    out->unknown.push_back(arg.flag);
  }
}

/// A hybrid pattern's MTP part: its depths, each the same layers
/// (hybrid_layer_allocation.py raises otherwise); 0 when there is none.
/// --mtp-hybrid-override-pattern is the older spelling of one depth's layers
/// (arguments.py joins it --mtp-num-layers times after a '/').
int64_t HybridMtpDepths(Args& a, const Stack& st, std::string* depth) {
  // One depth's symbols, whitespace dropped as MapHybrid drops it.
  const auto symbols = [](std::string_view text) {
    std::string out;
    for (char c : text) {
      if (!std::isspace(static_cast<unsigned char>(c))) out += c;
    }
    return out;
  };
  if (st.mtp.empty()) {
    const int64_t asked = a.Int("--mtp-num-layers", 0, 0);
    *depth = symbols(a.Str("--mtp-hybrid-override-pattern", ""));
    return depth->empty() ? 0 : asked;
  }
  int64_t depths = 0;
  for (size_t start = 0;; ++depths) {
    const size_t end = std::min(st.mtp.find('/', start), st.mtp.size());
    const std::string one = symbols(std::string_view(st.mtp).substr(start, end - start));
    if (depths == 0) *depth = one;
    if (one != *depth) {
      a.Fail(st.flag,
             fmt::format("MTP depths differ ('{}' and '{}'): every depth after '/' has the same layers", *depth, one));
      return -1;
    }
    if (end == st.mtp.size()) return depths + 1;
    start = end + 1;
  }
}

/// MTP modules: GPT models build --mtp-num-layers of them on the last stage;
/// hybrid models one a depth of the pattern after '/' (which sets the count,
/// arguments.py). The recipe's MTP layer is attention and the model's last
/// FFN, so a hybrid depth is imported when it is "*" and that FFN's symbol.
void MapMtp(Args& a, const Stack& st, MegatronImport* out) {
  std::vector<YamlEntry>& m = out->model;
  int64_t depths = a.Int("--mtp-num-layers", 0, 0);
  if (st.hybrid()) {
    std::string depth;
    const int64_t in_pattern = HybridMtpDepths(a, st, &depth);
    if (in_pattern < 0) return;
    if (in_pattern == 0 && depths > 0) {
      a.Warn("--mtp-num-layers",
             "not represented: a hybrid model takes its MTP layers from the pattern after '/', "
             "and this pattern has none");
      out->unrepresented.push_back("--mtp-num-layers");
      return;
    }
    if (in_pattern > 0 && depths > 0 && depths != in_pattern) {
      a.Warn("--mtp-num-layers", fmt::format("the pattern has {} MTP depths; Megatron uses the pattern's count, and "
                                             "so does the recipe",
                                             in_pattern));
    }
    depths = in_pattern;
    const char last = st.letters.empty() ? ' ' : st.letters.back();
    const std::string expected = last == 'E' ? "*E" : last == 'D' ? "*-" : "";
    if (depths > 0 && depth != expected) {
      a.Warn(st.flag, fmt::format("the MTP part ('{}' a depth) is not counted: the recipe's MTP layer is attention and "
                                  "the model's last FFN ('*E' or '*-' after a stack ending in E or -)",
                                  depth));
      out->unrepresented.push_back(st.flag);
      return;
    }
  }
  if (depths == 0) return;
  Add(&m, "model.mtp_layers", depths, st.hybrid() ? "MTP depths after '/' in the pattern" : "--mtp-num-layers");
  if (a.Flag("--mtp-use-repeated-layer")) {
    Add(&m, "model.mtp_shared_layer", "true", "--mtp-use-repeated-layer: one module's weights at every depth");
  }
}

/// Flextron elastic-width training (pretrain_hybrid_flex.py --flextron,
/// megatron/elastification, d98e8a6). Only the router's soft masks keep
/// activation copies (flextron_elasticity_hooks.py, the soft_mask branches):
/// without --enable-router no mask fires (flextron_utils.py
/// flextron_forward), and a frozen router's outputs carry no gradient, so
/// nothing is kept for it. Budgets, the router's schedule and the loss terms
/// change no activation (the router's few parameters are not priced).
void MapFlextron(Args& a, std::vector<YamlEntry>* l) {
  if (!a.Flag("--flextron")) return;
  // Not traced: a teacher model, frozen base parameters, the layer-skip
  // router, and lists read from a config file.
  for (const char* flag : {"--distillation", "--freeze-model", "--add-skipping", "--flextron-config-file"}) {
    if (a.Flag(flag)) a.Fail(flag, "is not priced with --flextron; drop it to price the elastic model's training");
  }
  if (!a.Flag("--enable-router") || a.Flag("--freeze-router")) {
    Add(l, "training.flextron_emb_choices", 0,
        a.Flag("--enable-router") ? "--freeze-router: the masks carry no gradient" : "--flextron without a router");
    return;
  }
  if (!a.Flag("--soft-mask")) {
    a.Fail("--flextron", "binary width masks (without --soft-mask) are not priced; add --soft-mask or drop --flextron");
    return;
  }
  // The lists as integers or as fractions of the full width (arguments.py
  // convert_per_lists_to_int_lists): one mask a choice either way.
  const auto choices = [&a](const char* ints, const char* fractions) {
    return static_cast<int64_t>(a.Has(ints) ? a.Words(ints).size() : a.Words(fractions).size());
  };
  const int64_t emb = choices("--emb-int-list", "--emb-per-list");
  if (emb == 0) {
    a.Fail("--flextron", "needs --emb-int-list or --emb-per-list (the embedding widths its masks blend)");
    return;
  }
  Add(l, "training.flextron_emb_choices", emb, "--flextron --soft-mask: len(--emb-int-list)");
  const int64_t mamba = choices("--mamba-int-list", "--mamba-per-list");
  if (mamba > 0) Add(l, "training.flextron_mamba_choices", mamba, "len(--mamba-int-list)");
}

void MapArguments(const std::string& file, MegatronImport* out) {
  Args a(*out, file, &out->diagnostics);
  std::vector<YamlEntry>& m = out->model;
  Stack st;
  const int64_t experts = a.Int("--num-experts", 0, 0);
  if (!MapStack(a, experts, &st)) return;
  out->model_kind = st.hybrid() ? "HybridModel" : "GPTModel";
  Add(&m, "model.layers", "\"" + st.letters + "\"",
      st.hybrid() ? "hybrid pattern: M->M, *->A, -->D, E->E" : "per GPT layer: attention + MLP (D) or MoE (E)");
  const int64_t hidden = a.Require("--hidden-size");
  Add(&m, "model.hidden", hidden);
  MapMtp(a, st, out);
  // Read once: the learned position table defaults to it too.
  const int64_t seq = a.Require("--seq-length");
  MapEmbeddings(a, seq, m);
  if (!MapBlocks(a, st, hidden, experts, m)) return;
  MapTraining(a, seq, out);
  MapFlextron(a, &out->layout);
  MapParallel(a, st, out->layout);
  WarnTheRest(a, out);
}

/// Order of layout keys: LayoutKeyPaths() first, then the other keys the
/// importer sets, each inside its section so that EmitEntries writes one map
/// per section.
int SectionRank(const std::string& key) {
  if (key.rfind("training.", 0) == 0) return 0;
  if (key.rfind("parallel.", 0) == 0) return 1;
  return 2;
}

}  // namespace

bool ParseMoeLayerFreq(const std::string& text, std::vector<int>* list, int64_t* period) {
  ListExpr expr(text);
  bool is_int = false;
  int64_t integer = 0;
  std::vector<int> values;
  if (!expr.Parse(&values, &integer, &is_int)) return false;
  if (is_int) {
    if (integer < 1) return false;
    *period = integer;
    list->clear();
    return true;
  }
  if (values.empty()) return false;
  *list = std::move(values);
  return true;
}

MegatronImport ImportMegatronArgs(const std::string& text, const std::string& file) {
  MegatronImport out;
  if (IsBlank(text)) {
    out.diagnostics.push_back(Error(file, 1, "", "", "empty input: give MODEL_ARGS YAML or a command line"));
    return out;
  }
  if (IsYamlForm(text))
    ReadYamlForm(text, file, &out);
  else
    ReadCommandLine(text, file, &out);
  if (!out.ok()) return out;
  // Launcher entries (torchrun) go after the defaults so they win.
  std::vector<YamlEntry> launcher = std::move(out.layout);
  out.layout.clear();
  MapArguments(file, &out);
  for (YamlEntry& e : launcher) {
    for (YamlEntry& d : out.layout) {
      if (d.key_path == e.key_path) d = e;
    }
  }
  std::stable_sort(out.diagnostics.begin(), out.diagnostics.end(), [](const Diagnostic& x, const Diagnostic& y) {
    const int lx = x.mark.line == 0 ? 1 << 30 : x.mark.line;
    const int ly = y.mark.line == 0 ? 1 << 30 : y.mark.line;
    return lx < ly;
  });
  return out;
}

std::string EmitMegatronRecipe(const MegatronImport& imported, const std::vector<Override>& overrides,
                               const std::string& name, const std::string& source_file,
                               std::vector<Diagnostic>* diagnostics) {
  const std::vector<std::string> keys = LayoutKeyPaths();
  std::vector<YamlEntry> standard, extra;
  for (const YamlEntry& e : imported.layout) {
    (std::find(keys.begin(), keys.end(), e.key_path) != keys.end() ? standard : extra).push_back(e);
  }
  std::vector<YamlEntry> layout = MergeLayout(standard, overrides, diagnostics);
  for (YamlEntry& e : extra) {
    // Beside the keys of its own map ("training.precision.fp4" after
    // training.precision.master: a map written twice would be invalid YAML),
    // else after its section's standard keys, before the next section.
    const std::string parent = e.key_path.substr(0, e.key_path.rfind('.') + 1);
    auto at = layout.end();
    for (auto it = layout.begin(); it != layout.end(); ++it) {
      if (SectionRank(it->key_path) > SectionRank(e.key_path)) {
        at = it;
        break;
      }
    }
    for (auto it = layout.begin(); it != layout.end(); ++it) {
      if (parent.find('.') != parent.rfind('.') && it->key_path.rfind(parent, 0) == 0) at = it + 1;
    }
    layout.insert(at, e);
  }
  HfImport as_recipe;
  as_recipe.architecture = imported.model_kind;
  as_recipe.name = name;
  as_recipe.model = imported.model;
  as_recipe.diagnostics = imported.diagnostics;
  std::string yaml = EmitRecipeYaml(as_recipe, layout, source_file, "");
  // EmitRecipeYaml's first line names `import hf`; this one came from Megatron arguments.
  const size_t eol = yaml.find('\n');
  return fmt::format("# Imported by `preflight import megatron` from {} (Megatron-LM {}).", source_file,
                     imported.model_kind) +
         yaml.substr(eol);
}

}  // namespace preflight

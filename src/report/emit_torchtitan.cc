// A torchtitan config module for a planned layout (`preflight plan R --emit
// torchtitan`). Target: pytorch/torchtitan b5bcd76 (kTorchtitanUpstream),
// where a run is a Python function returning `Trainer.Config`
// (torchtitan/trainer.py), loaded by `torchtitan.train --module M --config F`
// (torchtitan/config/manager.py); TOML job files are gone. Fields and
// literals: torchtitan/config/configs.py (TrainingConfig, ParallelismConfig,
// CompileConfig), torchtitan/distributed/activation_checkpoint.py (SelectiveAC,
// FullAC), torchtitan/components/optimizer/optimizer.py (default_adamw). The
// model comes from an upstream model registry flavor (torchtitan/models/<family>
// /__init__.py model_registry); the mesh and the EP rule:
// torchtitan/distributed/parallel_dims.py; the stage split and module names:
// torchtitan/distributed/pipeline_parallel.py.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "emit_common.h"
#include "preflight/report/emit.h"
#include "preflight/report/report.h"

namespace preflight {
namespace {

using emit::Has;
using emit::Notes;

/// One upstream model flavor: the architecture its registry builds
/// (torchtitan/models/<family>/__init__.py @ b5bcd76), in the recipe's terms.
struct Flavor {
  const char* family;  // the module under torchtitan.models
  const char* name;    // model_registry's flavor key
  int64_t layers, hidden, vocab;
  bool tied;
  int64_t heads, kv_heads, head_dim;  // head_dim of GQA attention; 0 for MLA
  bool qk_norm;
  int64_t q_lora_rank, kv_lora_rank;  // MLA (qk dims 128 + 64, v 128 in every MLA flavor here)
  int64_t dense_ffn;                  // FFN width of the dense layers (0: none)
  int64_t dense_layers;               // leading dense layers of an MoE model
  int64_t experts, top_k, expert_ffn, shared_ffn;
  RouterScore router;
};

// clang-format off
const Flavor kFlavors[] = {
    {"llama3", "1B",   16,  2048, 128256, true,  32, 8, 64,  false, 0, 0, 8192,  16,  0, 0, 0, 0, RouterScore::kSoftmax},
    {"llama3", "3B",   28,  3072, 128256, true,  24, 8, 128, false, 0, 0, 8192,  28,  0, 0, 0, 0, RouterScore::kSoftmax},
    {"llama3", "8B",   32,  4096, 128256, false, 32, 8, 128, false, 0, 0, 14336, 32,  0, 0, 0, 0, RouterScore::kSoftmax},
    {"llama3", "70B",  80,  8192, 128256, false, 64, 8, 128, false, 0, 0, 28672, 80,  0, 0, 0, 0, RouterScore::kSoftmax},
    {"llama3", "405B", 126, 16384, 128256, false, 128, 8, 128, false, 0, 0, 53248, 126, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "0.6B", 28, 1024, 151936, true,  16, 8, 128, true, 0, 0, 3072,  28, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "1.7B", 28, 2048, 151936, true,  16, 8, 128, true, 0, 0, 6144,  28, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "4B",   36, 2560, 151936, true,  32, 8, 128, true, 0, 0, 9728,  36, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "8B",   36, 4096, 151936, false, 32, 8, 128, true, 0, 0, 12288, 36, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "14B",  40, 5120, 151936, false, 40, 8, 128, true, 0, 0, 17408, 40, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "32B",  64, 5120, 151936, false, 64, 8, 128, true, 0, 0, 25600, 64, 0, 0, 0, 0, RouterScore::kSoftmax},
    {"qwen3", "30B-A3B",   48, 2048, 151936, false, 32, 4, 128, true, 0, 0, 0, 0, 128, 8, 768,  0, RouterScore::kSoftmax},
    {"qwen3", "235B-A22B", 94, 4096, 151936, false, 64, 4, 128, true, 0, 0, 0, 0, 128, 8, 1536, 0, RouterScore::kSoftmax},
    {"deepseek_v3", "16B",  27, 2048, 102400, false, 16,  0, 0, false, 0,    512, 10944, 1, 64,  6, 1408, 2816, RouterScore::kSoftmax},
    {"deepseek_v3", "236B", 60, 5120, 102400, false, 128, 0, 0, false, 1536, 512, 12288, 1, 160, 6, 1536, 3072, RouterScore::kSoftmax},
    {"deepseek_v3", "671B", 61, 7168, 129280, false, 128, 0, 0, false, 1536, 512, 18432, 3, 256, 8, 2048, 2048, RouterScore::kSigmoid},
    {"gpt_oss", "20b",  24, 2880, 201088, false, 64, 8, 64, false, 0, 0, 0, 0, 32,  4, 2880, 0, RouterScore::kSoftmax},
    {"gpt_oss", "120b", 36, 2880, 201088, false, 64, 8, 64, false, 0, 0, 0, 0, 128, 4, 2880, 0, RouterScore::kSoftmax},
};
// clang-format on

int64_t CountOf(const Recipe& r, BlockKind kind) {
  return static_cast<int64_t>(std::count(r.model.layers.begin(), r.model.layers.end(), kind));
}

/// The recipe's architecture in a flavor's terms (nullopt for a stack that
/// is not (attention, FFN) pairs).
std::optional<Flavor> ShapeOf(const Recipe& r) {
  if (!IsTransformerStack(r.model.layers)) return std::nullopt;
  const ModelConfig& m = r.model;
  Flavor f{};
  f.layers = static_cast<int64_t>(m.layers.size() / 2);
  f.hidden = m.hidden;
  f.vocab = m.vocab;
  f.tied = m.tie_embeddings;
  if (m.mla) {
    f.heads = m.mla->heads;
    f.q_lora_rank = m.mla->q_lora_rank;
    f.kv_lora_rank = m.mla->kv_lora_rank;
  } else {
    f.heads = m.attention.heads;
    f.kv_heads = m.attention.kv_heads;
    f.head_dim = m.attention.head_dim;
    f.qk_norm = m.attention.qk_norm;
  }
  f.dense_layers = CountOf(r, BlockKind::kDenseMlp);
  f.dense_ffn = f.dense_layers > 0 ? m.mlp.ffn_hidden : 0;
  if (Has(r, BlockKind::kMoe)) {
    f.experts = m.moe.experts;
    f.top_k = m.moe.top_k;
    f.expert_ffn = m.moe.ffn_hidden;
    f.shared_ffn = m.moe.SharedWidth();
    f.router = m.moe.router;
  }
  return f;
}

/// What differs between a recipe's shape and a flavor, "" when nothing.
std::string Differences(const Flavor& want, const Flavor& f) {
  std::vector<std::string> out;
  auto cmp = [&](const char* what, int64_t a, int64_t b) {
    if (a != b) out.push_back(fmt::format("{} {} (recipe {})", what, b, a));
  };
  cmp("layers", want.layers, f.layers);
  cmp("hidden", want.hidden, f.hidden);
  cmp("vocab", want.vocab, f.vocab);
  cmp("tied embeddings", want.tied, f.tied);
  cmp("heads", want.heads, f.heads);
  cmp("KV heads", want.kv_heads, f.kv_heads);
  cmp("head dim", want.head_dim, f.head_dim);
  cmp("QK norm", want.qk_norm, f.qk_norm);
  cmp("q_lora_rank", want.q_lora_rank, f.q_lora_rank);
  cmp("kv_lora_rank", want.kv_lora_rank, f.kv_lora_rank);
  cmp("dense FFN", want.dense_ffn, f.dense_ffn);
  cmp("dense layers", want.dense_layers, f.dense_layers);
  cmp("experts", want.experts, f.experts);
  cmp("top-k", want.top_k, f.top_k);
  cmp("expert FFN", want.expert_ffn, f.expert_ffn);
  cmp("shared FFN", want.shared_ffn, f.shared_ffn);
  cmp("sigmoid router", want.router == RouterScore::kSigmoid, f.router == RouterScore::kSigmoid);
  return fmt::format("{}", fmt::join(out, ", "));
}

struct TorchtitanContext {
  const Recipe& r;
  const Plan& p;
  Notes& notes;
};

/// The keyword arguments of one config class, one a line, at the indent of
/// the fields inside `Trainer.Config(section=Class(...))`.
class Py {
 public:
  void Arg(const std::string& key, const std::string& value) {
    out_ += fmt::format("            {}={},\n", key, value);
  }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

std::string Quoted(const std::string& s) { return fmt::format("\"{}\"", s); }

void TorchtitanHeader(const TorchtitanContext& c) {
  const Layout& l = c.p.layout;
  c.notes.Note(fmt::format("torchtitan config module for {}: {} GPUs ({} nodes x {} {}), from `preflight plan`",
                           c.r.name, c.p.mesh.world, c.p.mesh.nodes, c.p.mesh.gpus_per_node, DeviceLabel(c.r.cluster)));
  c.notes.Note(
      fmt::format("target: {}; run: torchtitan.train --module <this module> --config preflight_config "
                  "(NGPU={})",
                  kTorchtitanUpstream, c.p.mesh.world));
  c.notes.Note(fmt::format("layout: {} · zero {} · {} · {} micro-batches of {} · recompute {}", LayoutSummary(l),
                           l.zero, Name(l.schedule), l.micro_batches, l.micro_batch, Name(l.recompute)));
  c.notes.Note(fmt::format(
      "stages ({}), layers first-last: {}",
      c.p.stages_pinned ? std::string("pinned in the recipe") : fmt::format("partitioned by {}", c.p.partition),
      emit::ChunkRanges(c.p.stages, c.r.model.layers)));
  c.notes.Note("not emitted: tokenizer and HF assets, data loader, learning rate (default_adamw's), checkpointing");
}

/// The model_registry call of the flavor that builds the recipe's model, or
/// a refusal naming the nearest flavor's differences.
std::optional<std::string> ModelSpec(const TorchtitanContext& c, const Flavor** picked) {
  if (Has(c.r, BlockKind::kMamba) || Has(c.r, BlockKind::kRecurrent)) {
    c.notes.Cannot("model.pattern", c.r.model.pattern,
                   "torchtitan has no Mamba-2 (M) or recurrent (R) model (torchtitan/models @ b5bcd76)");
    return std::nullopt;
  }
  const std::optional<Flavor> shape = ShapeOf(c.r);
  if (!shape) {
    c.notes.Cannot("model.pattern", c.r.model.pattern,
                   "torchtitan's decoders are (attention, FFN) pairs; this pattern has no upstream model");
    return std::nullopt;
  }
  const Flavor* nearest = nullptr;
  std::string nearest_diff;
  for (const Flavor& f : kFlavors) {
    const std::string diff = Differences(*shape, f);
    if (diff.empty()) {
      *picked = &f;
      std::string args = Quoted(f.name);
      if (c.r.model.mtp_layers > 0 && std::string(f.family) == "deepseek_v3") {
        args += fmt::format(", num_mtp_layers={}", c.r.model.mtp_layers);
      }
      c.notes.Note(fmt::format("model: torchtitan.models.{} flavor {}, the recipe's architecture", f.family, f.name));
      return fmt::format("model_registry({})", args);
    }
    const auto count = std::count(diff.begin(), diff.end(), ',');
    if (!nearest || count < std::count(nearest_diff.begin(), nearest_diff.end(), ',')) {
      nearest = &f;
      nearest_diff = diff;
    }
  }
  c.notes.Cannot("model.pattern", c.r.model.pattern,
                 fmt::format("no torchtitan model flavor has this architecture (the nearest, {} {}, differs in {}); "
                             "register the model in torchtitan/models first",
                             nearest->family, nearest->name, nearest_diff));
  return std::nullopt;
}

// What every upstream flavor builds alike (RMSNorm, SwiGLU, no dropout,
// dropless top-k routing, flash/flex attention, MLA heads of 128 + 64 / 128)
// and the MTP module and biases the flavor may build; the recipe's other
// values are not what torchtitan runs.
void ModelKeys(const TorchtitanContext& c, const Flavor* f) {
  if (f == nullptr) return;
  const ModelConfig& m = c.r.model;
  if (m.norm != NormKind::kRmsNorm) c.notes.Cannot("model.norm", "layernorm", "torchtitan's decoders use RMSNorm");
  const bool moe = Has(c.r, BlockKind::kMoe);
  if (Has(c.r, BlockKind::kDenseMlp) && m.mlp.activation != FfnActivation::kSwiglu) {
    c.notes.Cannot("model.mlp.activation", Name(m.mlp.activation), "torchtitan's FFNs are SwiGLU");
  }
  if (moe && m.moe.activation != FfnActivation::kSwiglu) {
    c.notes.Cannot("model.moe.activation", Name(m.moe.activation), "torchtitan's experts are SwiGLU");
  }
  if (moe && !m.moe.dropless) {
    c.notes.Cannot("model.moe.dropless", "false",
                   "torchtitan's token-choice routing drops no token (no capacity factor)");
  }
  if (moe && m.moe.dispatcher != MoeDispatcher::kAllToAll) {
    c.notes.Cannot("model.moe.dispatcher", Name(m.moe.dispatcher),
                   "torchtitan's expert parallelism dispatches tokens by all-to-all");
  }
  if (moe && m.moe.shared_gate) {
    c.notes.Cannot("model.moe.shared_gate", "true", "torchtitan's shared experts have no gate");
  }
  if (c.r.training.dropout > 0) {
    c.notes.Cannot("training.dropout", emit::Number(c.r.training.dropout), "torchtitan's decoders have no dropout");
  }
  if (!c.r.training.flash_attention) {
    c.notes.Cannot("training.flash_attention", "false",
                   "torchtitan's attention is fused (flex, SDPA or varlen): no s^2 score matrix is kept");
  }
  if (m.mla && (m.mla->qk_nope_head_dim != 128 || m.mla->qk_rope_head_dim != 64 || m.mla->v_head_dim != 128)) {
    c.notes.Cannot("model.mla.qk_nope_head_dim", std::to_string(m.mla->qk_nope_head_dim),
                   fmt::format("torchtitan's {} {} has MLA heads of 128 + 64 (v 128)", f->family, f->name));
  }
  if (c.r.model.mtp_layers > 0 && std::string(f->family) != "deepseek_v3") {
    c.notes.Cannot("model.mtp_layers", std::to_string(c.r.model.mtp_layers),
                   fmt::format("torchtitan's {} model has no MTP module", f->family));
  } else if (c.r.model.mtp_layers > 0 && c.p.layout.pp > 1) {
    c.notes.Cannot("model.mtp_layers", std::to_string(c.r.model.mtp_layers),
                   "torchtitan's MTP does not support pipeline parallelism (deepseek_v3/mtp.py raises "
                   "NotImplementedError)");
  }
  if (c.r.model.mtp_layers > 1 && c.r.model.mtp_shared_layer) {
    c.notes.Cannot("model.mtp_shared_layer", "true", "torchtitan builds one MTP module a depth (no shared layer)");
  }
  if (c.r.model.linear_bias != (std::string(f->family) == "gpt_oss")) {
    c.notes.Cannot("model.linear_bias", c.r.model.linear_bias ? "true" : "false",
                   fmt::format("torchtitan's {} {} {} linear biases", f->family, f->name,
                               std::string(f->family) == "gpt_oss" ? "has" : "has no"));
  }
  if (c.r.training.transformer_engine) {
    c.notes.Cannot("training.transformer_engine", "true",
                   "torchtitan runs plain PyTorch: no Transformer Engine, whose cuBLAS workspaces the plan prices "
                   "(set it to false to price torchtitan)");
  }
  if (c.r.training.cross_entropy == CrossEntropy::kVocabParallel) {
    c.notes.Cannot("training.cross_entropy", "vocab_parallel",
                   "torchtitan's loss is torch's cross_entropy over logits.float(), not Megatron's vocab-parallel "
                   "cross entropy: its backward holds 12 B a logit where the plan prices 6 (set "
                   "training.cross_entropy: fp32_upcast to price torchtitan)");
  }
}

// ZeRO on FSDP2: dp_shard shards parameters, gradients and optimizer state
// together (ZeRO 3); dp_replicate is DDP (ZeRO 0) or HSDP's outer group.
void DataParallelArgs(const TorchtitanContext& c, Py& py) {
  const Layout& l = c.p.layout;
  const int64_t replicate = l.zero == 0 ? l.dp : l.dp_replicate;
  const int64_t shard = l.zero == 0 ? 1 : l.dp / l.dp_replicate;
  py.Arg("data_parallel_replicate_degree", std::to_string(replicate));
  py.Arg("data_parallel_shard_degree", std::to_string(shard));
  if (l.zero == 0) c.notes.Note("zero 0: DDP (data_parallel_replicate_degree)");
  if (l.zero == 3 && shard > 1) {
    py.Arg("fsdp_reshard_after_forward", Quoted("always"));
    c.notes.Note("zero 3: FSDP2, parameters resharded after every forward (\"always\")");
  }
  if ((l.zero == 1 || l.zero == 2) && shard > 1) {
    py.Arg("fsdp_reshard_after_forward", Quoted("never"));
    c.notes.Cannot("parallel.zero", std::to_string(l.zero),
                   fmt::format("torchtitan has no ZeRO-{}: FSDP2 (data_parallel_shard_degree) also shards the "
                               "parameters, so a rank holds less and communicates more than planned; "
                               "fsdp_reshard_after_forward=\"never\" keeps them gathered from forward to backward",
                               l.zero));
  }
}

const char* ScheduleName(const Layout& l) {
  switch (l.schedule) {
    case Schedule::k1F1B: return l.vpp > 1 ? "Interleaved1F1B" : "1F1B";
    case Schedule::kInterleaved: return "Interleaved1F1B";
    case Schedule::kDualPipe: return "1F1B";
    case Schedule::kDualPipeV: return "DualPipeV";
  }
  return "1F1B";
}

// One list of module names per chunk, model order: torchtitan's decoders
// name them tok_embeddings, layers.N, norm, lm_head (pipeline_parallel.py).
std::string ModuleFqns(const std::vector<int64_t>& sizes) {
  std::string out = "[\n";
  int64_t layer = 0;
  for (size_t c = 0; c < sizes.size(); ++c) {
    std::vector<std::string> names;
    if (c == 0) names.push_back(Quoted("tok_embeddings"));
    for (int64_t i = 0; i < sizes[c]; ++i) names.push_back(Quoted(fmt::format("layers.{}", layer++)));
    if (c + 1 == sizes.size()) {
      names.push_back(Quoted("norm"));
      names.push_back(Quoted("lm_head"));
    }
    out += fmt::format("                [{}],\n", fmt::join(names, ", "));
  }
  out += "            ]";
  return out;
}

void PipelineArgs(const TorchtitanContext& c, Py& py) {
  const Layout& l = c.p.layout;
  if (l.pp <= 1) return;
  py.Arg("pipeline_parallel_degree", std::to_string(l.pp));
  py.Arg("pipeline_parallel_schedule", Quoted(ScheduleName(l)));
  py.Arg("num_pp_microbatches", std::to_string(l.micro_batches));
  if (l.schedule == Schedule::kDualPipe) {
    c.notes.Cannot("parallel.schedule", "dualpipe", "torchtitan has DualPipeV but not DualPipe; 1F1B emitted");
  }
  // Always the plan's chunks, named: torchtitan's own split would weigh the
  // embedding and the head as one layer each and take 2 chunks a rank for
  // every multi-stage schedule. A stack of other blocks has no upstream
  // model, so no module names (refused in ModelSpec).
  if (IsTransformerStack(c.r.model.layers)) {
    py.Arg("module_fqns_per_model_part", ModuleFqns(emit::ChunkLayers(c.p.stages, c.r.model.layers)));
  }
}

// torchtitan's EP borrows ranks from dp_shard x cp x tp (parallel_dims.py);
// expert tensor parallelism was removed upstream (2026-04-30).
void ExpertArgs(const TorchtitanContext& c, Py& py, int64_t dp_shard) {
  if (!Has(c.r, BlockKind::kMoe)) return;
  const Layout& l = c.p.layout;
  if (l.ep > 1) py.Arg("expert_parallel_degree", std::to_string(l.ep));
  const int64_t region = dp_shard * l.cp * l.tp;
  if (region % l.ep != 0) {
    c.notes.Cannot("parallel.ep", std::to_string(l.ep),
                   fmt::format("torchtitan's expert_parallel_degree must divide dp_shard x cp x tp = {} x {} x {} = {}",
                               dp_shard, l.cp, l.tp, region));
  }
  // parallel.expert_tp > 1 is refused through the field table (no torchtitan setting).
}

void ContextParallelArgs(const TorchtitanContext& c, Py& py) {
  const Layout& l = c.p.layout;
  if (l.cp <= 1) return;
  py.Arg("context_parallel_degree", std::to_string(l.cp));
  if (!c.r.parallel.cp_load_balance) py.Arg("context_parallel_load_balancer", "None");
  if (l.cp_comm != CpComm::kAllGather) {
    c.notes.Cannot("parallel.cp_comm", l.cp_comm == CpComm::kA2a ? "a2a" : "p2p",
                   "torchtitan's context parallelism has no setting for the K/V exchange: PyTorch's _ContextParallel "
                   "all-gathers K/V for flex attention (cp_comm all_gather)");
  }
}

std::string ParallelismArgs(const TorchtitanContext& c) {
  const Layout& l = c.p.layout;
  Py py;
  DataParallelArgs(c, py);
  if (l.tp > 1) {
    py.Arg("tensor_parallel_degree", std::to_string(l.tp));
    if (!l.sequence_parallel()) py.Arg("enable_sequence_parallel", "False");
  }
  ContextParallelArgs(c, py);
  PipelineArgs(c, py);
  ExpertArgs(c, py, l.zero == 0 ? 1 : l.dp / l.dp_replicate);
  if (l.order == AxisOrder::kTpCpPpDp) {
    c.notes.Cannot("parallel.order", "tp-cp-pp-dp",
                   "torchtitan's mesh is [pp, dp_replicate, dp_shard, cp, tp] (PP outermost); it has no DP-outermost "
                   "order");
  }
  return py.text();
}

// Tokens, not sequences (TrainingConfig @ b5bcd76): a DP rank's micro-batch
// and the step; with PP the micro-batches are num_pp_microbatches, without
// torchtitan accumulates step / (micro-batch tokens x dp) of them.
std::string TrainingArgs(const TorchtitanContext& c) {
  const Layout& l = c.p.layout;
  const TrainingConfig& t = c.r.training;
  const PrecisionConfig& pr = t.precision;
  Py py;
  py.Arg("num_tokens_per_microbatch_per_dp_rank", std::to_string(l.micro_batch * t.seq_len));
  py.Arg("num_tokens_per_train_step", std::to_string(t.global_batch * t.seq_len));
  py.Arg("max_context_length", std::to_string(t.seq_len));
  if (c.r.parallel.fsdp_cpu_offload) py.Arg("enable_cpu_offload", "True");
  if (pr.params == DType::kFp32) {
    py.Arg("mixed_precision_param", Quoted("float32"));
  } else if (pr.params != DType::kBf16) {
    c.notes.Cannot("training.precision.params", Name(pr.params),
                   "mixed_precision_param is bfloat16 or float32 (fp8 training is a model converter, not emitted)");
  }
  if (pr.grads != DType::kFp32) {
    c.notes.Cannot("training.precision.grads", Name(pr.grads),
                   "mixed_precision_reduce is float32 only (configs.py @ b5bcd76)");
  }
  if (pr.fp4 != Fp4Format::kNone) {
    c.notes.Cannot("training.precision.fp4", Name(pr.fp4),
                   "NVFP4 training is a model converter (NVFP4LinearConverter, components/quantization/nvfp4.py @ "
                   "b5bcd76), not emitted, and keeps no FP4 weight copies; there is no MXFP4 converter");
  }
  const DType compute = pr.params == DType::kFp32 ? DType::kFp32 : DType::kBf16;
  if (pr.activations != compute) {
    c.notes.Cannot("training.precision.activations", Name(pr.activations),
                   fmt::format("torchtitan keeps activations in the {} compute dtype", Name(compute)));
  }
  if (!pr.master) {
    if (pr.params == DType::kBf16) {
      py.Arg("dtype", Quoted("bfloat16"));
      c.notes.Note("master none: training dtype \"bfloat16\" keeps no fp32 copy");
    } else {
      c.notes.Cannot("training.precision.master", "none", "torchtitan drops the fp32 copy only for bf16 training");
    }
  }
  // Trainer.Config.__post_init__: CUDA graphs support neither PP nor the
  // standard EP token dispatcher; preflight prices none.
  if (l.pp > 1 || (Has(c.r, BlockKind::kMoe) && l.ep > 1)) py.Arg("disable_cuda_graphs", "True");
  const int64_t tokens = l.micro_batch * t.seq_len;
  const int64_t divisor = (l.tp > 1 && l.sequence_parallel() ? l.tp : 1) * (l.cp > 1 ? 2 * l.cp : 1);
  if (tokens % divisor != 0) {
    c.notes.Cannot("training.seq_len", std::to_string(t.seq_len),
                   fmt::format("torchtitan needs a micro-batch's {} tokens divisible by tp x 2cp = {} (trainer.py)",
                               tokens, divisor));
  }
  return py.text();
}

std::string ActivationCheckpoint(const TorchtitanContext& c) {
  switch (c.p.layout.recompute) {
    case Recompute::kNone: return "None";
    case Recompute::kSelective:
      c.notes.Cannot("training.recompute", "selective",
                     "torchtitan's SelectiveAC is a per-op policy (it saves matmul outputs and recomputes the rest), "
                     "not the plan's per-module recompute of training.recompute_modules");
      return "SelectiveAC.Config()";
    case Recompute::kFull: return "FullAC.Config()";
    // torchtitan/distributed/activation_checkpoint.py SelectiveAC: the
    // per-op policy training.recompute: selective_op prices.
    case Recompute::kSelectiveOp: return "SelectiveAC.Config()";
  }
  return "None";
}

std::string Optimizer(const TorchtitanContext& c) {
  if (c.r.training.optimizer.matrices == OptimizerKind::kMuon) {
    c.notes.Cannot("training.optimizer.matrices", "muon",
                   "torchtitan's DistMuon needs FlexShard compute-sharding metadata per parameter "
                   "(optimizer_factory_kwargs_by_name), which preflight does not emit; AdamW emitted");
  }
  return "default_adamw()";
}

std::string CompileArgs(const TorchtitanContext& c) {
  const Overlap o = OverlapOf(c.r, c.p.layout);
  const bool enable = c.r.training.fused_elementwise;
  if (!enable && !o.tp) return "";
  // The loss stays eager, as training.cross_entropy: fp32_upcast prices it
  // (torchtitan compiles it too by default: components ["model", "loss"]).
  std::string out = "CompileConfig(enable=True";
  if (o.tp) out += ", enable_async_tensor_parallel=True";
  return out + ", components=[\"model\"])";
}

std::string Module(const TorchtitanContext& c, const std::optional<std::string>& model, const Flavor* flavor) {
  const std::string parallelism = ParallelismArgs(c);
  const std::string training = TrainingArgs(c);
  const std::string ac = ActivationCheckpoint(c);
  const std::string optimizer = Optimizer(c);
  const std::string compile = CompileArgs(c);
  std::string out = "\n";
  out += "from torchtitan.components.optimizer import default_adamw\n";
  out += compile.empty() ? "from torchtitan.config import ParallelismConfig, TrainingConfig\n"
                         : "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig\n";
  if (ac != "None") {
    out += fmt::format("from torchtitan.distributed.activation_checkpoint import {}\n",
                       ac == "FullAC.Config()" ? "FullAC" : "SelectiveAC");
  }
  if (model) out += fmt::format("from torchtitan.models.{} import model_registry\n", flavor->family);
  out += "from torchtitan.trainer import Trainer\n\n\n";
  out += "def preflight_config() -> Trainer.Config:\n";
  out += "    return Trainer.Config(\n";
  out += model ? fmt::format("        model_spec={},\n", *model)
               : std::string("        model_spec=None,  # no upstream model: see the WARNING block\n");
  out += fmt::format("        optimizer={},\n", optimizer);
  out += fmt::format("        training=TrainingConfig(\n{}        ),\n", training);
  out += fmt::format("        parallelism=ParallelismConfig(\n{}        ),\n", parallelism);
  out += fmt::format("        activation_checkpoint={},\n", ac);
  if (!compile.empty()) out += fmt::format("        compile={},\n", compile);
  out += "    )\n";
  return out;
}

}  // namespace

Emission EmitTorchtitan(const Recipe& recipe, const Plan& plan) {
  Notes notes(recipe, "torchtitan");
  const TorchtitanContext c{recipe, plan, notes};
  emit::RefuseIfDoesNotFit(plan, notes);
  TorchtitanHeader(c);
  const Flavor* flavor = nullptr;
  const std::optional<std::string> model = ModelSpec(c, &flavor);
  ModelKeys(c, flavor);
  emit::NoteKeysWithoutCounterpart(recipe, emit::Framework::kTorchtitan, notes);
  return notes.Finish(Module(c, model, flavor));
}

}  // namespace preflight

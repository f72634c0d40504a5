// torchtitan TOML job-config sections for a planned layout (`preflight plan R
// --emit torchtitan`). Section and key names, literals and defaults:
// pytorch/torchtitan torchtitan/config/job_config.py (the versions with
// expert_tensor_parallel_degree and module_fqns_per_model_part). Mesh order
// [pp, dp_replicate, dp_shard, cp, tp] and the EP rules: docs/formulas.md §1.5, 7.3 [TT].
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

class Toml {
 public:
  void Section(const std::string& name) { out_ += fmt::format("{}[{}]\n", out_.empty() ? "" : "\n", name); }
  void Int(const std::string& key, int64_t v) { out_ += fmt::format("{} = {}\n", key, v); }
  void Str(const std::string& key, const std::string& v) { out_ += fmt::format("{} = \"{}\"\n", key, v); }
  void Raw(const std::string& key, const std::string& v) { out_ += fmt::format("{} = {}\n", key, v); }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

struct Context {
  const Recipe& r;
  const Plan& p;
  bool transformer;
  Notes& notes;
  Toml& toml;
};

// The architecture torchtitan must build (it lives in code: model.name and
// model.flavor), for the header.
std::string ShapeSummary(const Recipe& r, bool transformer) {
  const ModelConfig& m = r.model;
  std::string out = transformer ? fmt::format("{} layers (attention + FFN)", m.layers.size() / 2)
                                : fmt::format("{} sublayers {} x{}", m.layers.size(), m.pattern, m.repeat);
  out += fmt::format(", hidden {}", m.hidden);
  if (m.mla) {
    out += fmt::format(", MLA {} heads", m.mla->heads);
  } else if (Has(r, BlockKind::kAttention)) {
    out += fmt::format(", {} heads / {} KV heads of {}", m.attention.heads, m.attention.kv_heads, m.attention.head_dim);
  }
  if (Has(r, BlockKind::kDenseMlp)) out += fmt::format(", FFN {}", m.mlp.ffn_hidden);
  if (Has(r, BlockKind::kMoe)) {
    out += fmt::format(", {} experts top-{} of {}", m.moe.experts, m.moe.top_k, m.moe.ffn_hidden);
    if (m.moe.SharedWidth() > 0) out += fmt::format(" + shared {}", m.moe.SharedWidth());
  }
  out += fmt::format(", vocab {}, {}", m.vocab, m.tie_embeddings ? "tied" : "untied");
  return out;
}

void Header(const Context& c) {
  const Layout& l = c.p.layout;
  c.notes.Note(fmt::format("torchtitan job config for {}: {} GPUs ({} nodes x {} {}), from `preflight plan`", c.r.name,
                           c.p.mesh.world, c.p.mesh.nodes, c.p.mesh.gpus_per_node, DeviceLabel(c.r.cluster)));
  c.notes.Note(fmt::format("layout: {} · zero {} · {} · {} micro-batches of {} · recompute {}", LayoutSummary(l), l.zero,
                           Name(l.schedule), l.micro_batches, l.micro_batch, Name(l.recompute)));
  c.notes.Note(fmt::format(
      "stages ({}), layers [first,end): {}",
      c.p.stages_pinned ? std::string("pinned in the recipe") : fmt::format("partitioned by {}", c.p.partition),
      emit::ChunkRanges(c.p.stages, c.r.model.layers)));
  c.notes.Note("keys: pytorch/torchtitan torchtitan/config/job_config.py");
  c.notes.Note(fmt::format("[model] not emitted: torchtitan builds the architecture in code (model.name, "
                           "model.flavor); pick the flavor with {}",
                           ShapeSummary(c.r, c.transformer)));
  c.notes.Note("not emitted: [job], data, tokenizer, learning rate, checkpointing; MoE routing (top-k, capacity, "
               "router) is model args, not job config");
}

void ModelSupport(const Context& c) {
  if (Has(c.r, BlockKind::kMamba) || Has(c.r, BlockKind::kRecurrent)) {
    c.notes.Cannot("model.pattern", c.r.model.pattern,
                   "torchtitan has no Mamba-2 (M) or recurrent (R) model; the parallelism keys below need a custom "
                   "model that registers those blocks");
  } else if (!c.transformer) {
    c.notes.Cannot("model.pattern", c.r.model.pattern,
                   "torchtitan's decoders are (attention, FFN) pairs; this pattern needs a custom model");
  }
  if (c.r.training.transformer_engine) {
    c.notes.Note(
        "training.transformer_engine: the plan prices Transformer Engine's cuBLAS workspaces; torchtitan "
        "runs plain PyTorch (set it to false to price that)");
  }
}

// ZeRO on FSDP2: dp_shard shards parameters, gradients and optimizer state
// together; dp_replicate is DDP. ZeRO-1/2 (state, or state and gradients,
// only) have no torchtitan key: they map to FSDP2, which never holds more
// per rank than the plan priced, with parameters kept gathered from forward
// to backward.
void DataParallelKeys(const Context& c) {
  const Layout& l = c.p.layout;
  const int64_t zero = l.zero;
  // HSDP: dp_replicate replicas, FSDP inside each.
  c.toml.Int("data_parallel_replicate_degree", zero == 0 ? l.dp : l.dp_replicate);
  c.toml.Int("data_parallel_shard_degree", zero == 0 ? 1 : l.dp / l.dp_replicate);
  if (zero == 3 && l.dp > 1) c.toml.Str("fsdp_reshard_after_forward", "always");
  if ((zero == 1 || zero == 2) && l.dp > 1) {
    c.toml.Str("fsdp_reshard_after_forward", "never");
    c.notes.Cannot("parallel.zero", std::to_string(zero),
                   fmt::format("torchtitan has no ZeRO-{}: FSDP2 (data_parallel_shard_degree) also shards the "
                               "parameters, so a rank holds less than planned; fsdp_reshard_after_forward = \"never\" "
                               "keeps them gathered from forward to backward (one all-gather a micro-batch, not one a "
                               "step)",
                               zero));
  }
  if (zero == 0) c.notes.Note("zero 0: DDP (data_parallel_replicate_degree)");
  if (zero == 3) c.notes.Note("zero 3: FSDP2, parameters resharded after every forward (\"always\")");
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

// One list of module names per chunk, model order: torchtitan's decoders name
// them tok_embeddings, layers.N, norm, output.
std::string ModuleFqns(const std::vector<int64_t>& sizes) {
  std::string out = "[\n";
  int64_t layer = 0;
  for (size_t c = 0; c < sizes.size(); ++c) {
    std::vector<std::string> names;
    if (c == 0) names.push_back("\"tok_embeddings\"");
    for (int64_t i = 0; i < sizes[c]; ++i) names.push_back(fmt::format("\"layers.{}\"", layer++));
    if (c + 1 == sizes.size()) {
      names.push_back("\"norm\"");
      names.push_back("\"output\"");
    }
    out += fmt::format("    [{}],\n", fmt::join(names, ", "));
  }
  out += "]";
  return out;
}

void StageKeys(const Context& c) {
  const Layout& l = c.p.layout;
  if (l.schedule == Schedule::kDualPipe) {
    c.notes.Cannot("parallel.schedule", "dualpipe",
                   "torchtitan has DualPipeV but not DualPipe; the pp stages below run 1F1B");
  }
  if (!c.transformer) {
    c.notes.Note("stage cuts above have no torchtitan module names without a model; give them as "
                 "module_fqns_per_model_part of that model");
    return;
  }
  // torchtitan's own split needs no list (generate_llm_fqn_per_model_part).
  if (c.p.partition == Name(Partition::kTorchtitan)) return;
  c.toml.Raw("module_fqns_per_model_part", ModuleFqns(emit::ChunkLayers(c.p.stages, c.r.model.layers)));
}

void PipelineKeys(const Context& c) {
  const Layout& l = c.p.layout;
  c.toml.Int("pipeline_parallel_degree", l.pp);
  if (l.pp <= 1) return;
  c.toml.Str("pipeline_parallel_schedule", ScheduleName(l));
  c.toml.Int("pipeline_parallel_microbatch_size", l.micro_batch);
  StageKeys(c);
}

// torchtitan's EP borrows ranks from dp_shard x cp (etp = tp) or
// dp_shard x cp x tp (etp = 1) (job_config.py, expert_parallel_degree).
std::string ExpertRuleBroken(const Layout& l, int64_t dp_shard) {
  if (l.expert_tp != 1 && l.expert_tp != l.tp) return "expert_tensor_parallel_degree must be 1 or the TP degree";
  const int64_t unit = l.expert_tp == l.tp ? l.cp : l.cp * l.tp;
  const int64_t pool = dp_shard * unit;
  if (l.ep < unit || l.ep > pool || l.ep % unit != 0 || pool % l.ep != 0) {
    return fmt::format("expert_parallel_degree {} must be a multiple of {} that divides {} (dp_shard {} x {})", l.ep,
                       unit, pool, dp_shard, unit);
  }
  return "";
}

void ExpertKeys(const Context& c) {
  if (!Has(c.r, BlockKind::kMoe)) return;
  const Layout& l = c.p.layout;
  c.toml.Int("expert_parallel_degree", l.ep);
  c.toml.Int("expert_tensor_parallel_degree", l.expert_tp);
  if (l.ep <= 1) return;
  const std::string broken = ExpertRuleBroken(l, l.zero == 0 ? 1 : l.dp);
  if (!broken.empty()) c.notes.Cannot("parallel.ep", std::to_string(l.ep), fmt::format("torchtitan: {}", broken));
}

void ParallelismSection(const Context& c) {
  const Layout& l = c.p.layout;
  c.toml.Section("parallelism");
  DataParallelKeys(c);
  c.toml.Int("tensor_parallel_degree", l.tp);
  if (l.tp > 1 && !l.sequence_parallel()) {
    c.notes.Note("parallel.sp = false: torchtitan's TP plans always shard the norms along the sequence "
                 "(SequenceParallel); no key turns that off");
  }
  c.toml.Int("context_parallel_degree", l.cp);
  if (l.cp > 1 && l.cp_comm == CpComm::kA2a) {
    c.notes.Cannot("parallel.cp_comm", "a2a", "torchtitan's context parallel has no all-to-all (Ulysses) mode");
  } else if (l.cp > 1) {
    c.toml.Str("context_parallel_rotate_method", l.cp_comm == CpComm::kAllGather ? "allgather" : "alltoall");
    if (l.cp_comm == CpComm::kP2p) {
      c.notes.Note("cp_comm p2p: context_parallel_rotate_method \"alltoall\" passes the KV shards around the ring");
    }
  }
  PipelineKeys(c);
  ExpertKeys(c);
  if (l.order == AxisOrder::kTpCpPpDp) {
    c.notes.Cannot("parallel.order", "tp-cp-pp-dp",
                   "torchtitan's mesh is [pp, dp_replicate, dp_shard, cp, tp] (PP outermost, tp-cp-dp-pp); it has no "
                   "DP-outermost order");
  }
}

const char* TorchDtype(DType d) {
  switch (d) {
    case DType::kFp32: return "float32";
    case DType::kBf16: return "bfloat16";
    case DType::kFp16: return "float16";
    case DType::kFp8: return "float8";
  }
  return "?";
}

// local_batch_size is one DP rank's batch per step; with PP it is cut into
// micro-batches of pipeline_parallel_microbatch_size, without PP torchtitan
// accumulates global / (local x dp) micro-batches.
void TrainingSection(const Context& c) {
  const Layout& l = c.p.layout;
  const PrecisionConfig& pr = c.r.training.precision;
  c.toml.Section("training");
  c.toml.Int("local_batch_size", l.pp > 1 ? l.micro_batch * l.micro_batches : l.micro_batch);
  c.toml.Int("global_batch_size", c.r.training.global_batch);
  c.toml.Int("seq_len", c.r.training.seq_len);
  if (c.r.parallel.fsdp_cpu_offload) c.toml.Raw("enable_cpu_offload", "true");
  if (pr.params == DType::kBf16 || pr.params == DType::kFp32) {
    c.toml.Str("mixed_precision_param", TorchDtype(pr.params));
  } else {
    c.notes.Cannot("training.precision.params", Name(pr.params),
                   "mixed_precision_param is bfloat16 or float32 (fp8 training is a model converter, not emitted)");
  }
  if (pr.grads == DType::kFp32 || pr.grads == DType::kBf16) {
    c.toml.Str("mixed_precision_reduce", TorchDtype(pr.grads));
    if (pr.grads == DType::kBf16) c.notes.Note("mixed_precision_reduce \"bfloat16\": older job_config.py allows float32 only");
  } else {
    c.notes.Cannot("training.precision.grads", Name(pr.grads), "mixed_precision_reduce is float32 or bfloat16");
  }
  if (!pr.master && pr.params == DType::kBf16) {
    c.toml.Str("dtype", "bfloat16");
    c.notes.Note("master none: training.dtype \"bfloat16\" keeps no fp32 copy");
  }
}

void ActivationCheckpointSection(const Context& c) {
  c.toml.Section("activation_checkpoint");
  switch (c.p.layout.recompute) {
    case Recompute::kNone: c.toml.Str("mode", "none"); break;
    case Recompute::kSelective:
      c.toml.Str("mode", "selective");
      c.toml.Str("selective_ac_option", "op");
      c.notes.Note("recompute selective: torchtitan's per-op policy (\"op\") saves the attention output and recomputes "
                   "some matmuls, where the plan recomputes the attention core only; it keeps less, so no more "
                   "memory than planned, but recomputes more");
      break;
    case Recompute::kFull: c.toml.Str("mode", "full"); break;
  }
}

void OptimizerSection(const Context& c) {
  c.toml.Section("optimizer");
  if (c.r.training.optimizer.matrices == OptimizerKind::kMuon) {
    c.toml.Str("name", "Muon");
    c.notes.Cannot("training.optimizer.matrices", "muon",
                   "torchtitan's core optimizers are Adam and AdamW; name = \"Muon\" needs its experimental "
                   "torchtitan/experiments/dion_optimizer, where components/optimizer.py has it");
  } else {
    c.toml.Str("name", "AdamW");
  }
}

}  // namespace

Emission EmitTorchtitan(const Recipe& recipe, const Plan& plan) {
  Notes notes(recipe, "torchtitan");
  Toml toml;
  const Context c{recipe, plan, IsTransformerStack(recipe.model.layers), notes, toml};
  Header(c);
  ModelSupport(c);
  emit::NoteKeysWithoutCounterpart(c.r, emit::Framework::kTorchtitan, c.notes);
  ParallelismSection(c);
  TrainingSection(c);
  ActivationCheckpointSection(c);
  OptimizerSection(c);
  Emission out;
  out.text = notes.Render("# ") + "\n" + toml.text();
  out.warnings = notes.TakeWarnings();
  return out;
}

}  // namespace preflight

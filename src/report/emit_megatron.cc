// Megatron-LM arguments for a planned layout (`preflight plan R --emit
// megatron`). Flag names, choices and defaults: NVIDIA/Megatron-LM
// megatron/training/arguments.py (stored copy @ 000c4ac). The hybrid layer
// pattern, its symbols and its '|' stage separators: examples/mamba/README.md
// (@ 256f606), which deprecates --hybrid-override-pattern for
// --hybrid-layer-pattern. The pipeline layout grammar (E, t, L, |, (..)*n):
// megatron/core/transformer/pipeline_parallel_layer_layout.py.
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "emit_common.h"
#include "preflight/report/emit.h"
#include "preflight/inventory/inventory.h"
#include "preflight/report/report.h"

namespace preflight {
namespace {

using emit::Has;
using emit::Notes;
using emit::Number;

// The argument lines in order, rendered as a shell continuation.
class Args {
 public:
  void Flag(std::string_view name) { lines_.emplace_back(name); }
  template <class T>
  void Flag(std::string_view name, const T& value) {
    lines_.push_back(fmt::format("{} {}", name, value));
  }
  // Double quotes keep '*', '|', '(' and '[' away from the shell.
  void Quoted(std::string_view name, std::string_view value) { lines_.push_back(fmt::format("{} \"{}\"", name, value)); }
  std::string Render() const {
    std::string out;
    for (size_t i = 0; i < lines_.size(); ++i) out += lines_[i] + (i + 1 < lines_.size() ? " \\\n" : "\n");
    return out;
  }

 private:
  std::vector<std::string> lines_;
};

struct MegatronContext {
  const Recipe& r;
  const Plan& p;
  bool transformer;  // GPT model of (attention, FFN) pairs; otherwise a hybrid layer pattern
  Notes& notes;
  Args& args;
};

const char* CpCommType(CpComm c) {
  switch (c) {
    case CpComm::kP2p: return "p2p";
    // TransformerConfig.cp_comm_type's word, passed to Transformer Engine's
    // attention as is (arguments.py's help spells it "allgather").
    case CpComm::kAllGather: return "all_gather";
    case CpComm::kA2a: return "a2a";
  }
  return "p2p";
}

// Megatron's hybrid layer symbols (examples/mamba/README.md); R has none.
char HybridSymbol(BlockKind k) {
  switch (k) {
    case BlockKind::kAttention: return '*';
    case BlockKind::kMamba: return 'M';
    case BlockKind::kDenseMlp: return '-';
    case BlockKind::kMoe: return 'E';
    case BlockKind::kRecurrent: return 'R';  // not a Megatron symbol: only ever shown in a comment
  }
  return '?';
}

void MegatronHeader(const MegatronContext& c) {
  const Layout& l = c.p.layout;
  c.notes.Note(fmt::format("Megatron-LM arguments for {}: {} GPUs ({} nodes x {} {}), from `preflight plan`", c.r.name,
                           c.p.mesh.world, c.p.mesh.nodes, c.p.mesh.gpus_per_node, DeviceLabel(c.r.cluster)));
  c.notes.Note(c.transformer ? "entry point: pretrain_gpt.py; each attention + FFN pair of the pattern is one Megatron layer"
                             : "entry point: pretrain_hybrid.py (HybridModel); one pattern letter is one Megatron layer");
  c.notes.Note(fmt::format("layout: {} · zero {} · {} · {} micro-batches of {} · recompute {}", LayoutSummary(l), l.zero,
                           Name(l.schedule), l.micro_batches, l.micro_batch, Name(l.recompute)));
  c.notes.Note(fmt::format(
      "stages ({}), layers first-last: {}",
      c.p.stages_pinned ? std::string("pinned in the recipe") : fmt::format("partitioned by {}", c.p.partition),
      emit::ChunkRanges(c.p.stages, c.r.model.layers)));
  c.notes.Note(fmt::format("target: {}; flags: megatron/training/arguments.py, layer pattern: examples/mamba/README.md",
                           kMegatronUpstream));
  c.notes.Note(fmt::format(
      "not emitted: data, tokenizer, learning rate, checkpointing. Megatron takes the vocabulary from the tokenizer and "
      "pads it to a multiple of --make-vocab-size-divisible-by x tp: the recipe's {} pads to {}",
      c.r.model.vocab, PaddedVocab(c.r.model, l.tp)));
}

void ParallelFlags(const MegatronContext& c) {
  const Layout& l = c.p.layout;
  const bool moe = Has(c.r, BlockKind::kMoe);
  c.args.Flag("--tensor-model-parallel-size", l.tp);
  // Megatron rejects MoE with tp > 1 and SP off (docs/formulas.md §0); the plan priced SP on.
  const bool sp = l.sequence_parallel() || (moe && l.tp > 1);
  if (sp) c.args.Flag("--sequence-parallel");
  if (sp && !l.sequence_parallel()) {
    c.notes.Note("--sequence-parallel although parallel.sp is false: Megatron needs it for MoE with tp > 1, and the "
                 "plan priced it on");
  }
  c.args.Flag("--pipeline-model-parallel-size", l.pp);
  c.args.Flag("--context-parallel-size", l.cp);
  if (l.cp > 1) c.args.Flag("--cp-comm-type", CpCommType(l.cp_comm));
  if (moe) {
    c.args.Flag("--expert-model-parallel-size", l.ep);
    // Given always: Megatron's expert TP defaults to the dense TP, not to 1.
    c.args.Flag("--expert-tensor-parallel-size", l.expert_tp);
  }
  if (l.order == AxisOrder::kTpCpPpDp) {
    c.args.Flag("--use-tp-pp-dp-mapping");
    c.notes.Note("--use-tp-pp-dp-mapping: rank order tp-cp-ep-pp-dp, the recipe's tp-cp-pp-dp (DP outermost)");
  }
}

// "E" (embedding) opens the first stage, "L" (loss) closes the last, "t*n"
// is n layers, "m" an MTP module (on the last stage, before the loss; the
// layout must hold exactly --mtp-num-layers of them); runs of three or more
// equal middle stages are written "(t*n|)*k", which Megatron unrolls before
// parsing.
std::string PipelineLayout(const std::vector<int64_t>& sizes, int64_t mtp_layers) {
  auto body = [](int64_t n) { return n == 0 ? std::string() : n == 1 ? std::string("t") : fmt::format("t*{}", n); };
  std::string out = fmt::format("E{}|", body(sizes.front()));
  const size_t last = sizes.size() - 1;
  for (size_t i = 1; i < last;) {
    size_t run = 1;
    while (i + run < last && sizes[i + run] == sizes[i]) ++run;
    if (run >= 3) {
      out += fmt::format("({}|)*{}", body(sizes[i]), run);
    } else {
      for (size_t k = 0; k < run; ++k) out += fmt::format("{}|", body(sizes[i]));
    }
    i += run;
  }
  const std::string mtp = mtp_layers == 0 ? "" : mtp_layers == 1 ? "m" : fmt::format("m*{}", mtp_layers);
  return fmt::format("{}{}{}L", out, body(sizes.back()), mtp);
}

std::string JoinInts(const std::vector<int64_t>& v) {
  return fmt::format("{}", fmt::join(v, ", "));
}

// Transformer stacks: Megatron's even split, or --pipeline-model-parallel-layout.
// Hybrid stacks carry their cuts in the layer pattern (HybridPatternFlag).
void PipelineFlags(const MegatronContext& c) {
  const Layout& l = c.p.layout;
  // Megatron's group defaults to pp: emitted only when the recipe sets one.
  if (l.schedule == Schedule::kInterleaved && l.microbatch_group > 0) {
    c.args.Flag("--microbatch-group-size-per-virtual-pipeline-stage", l.microbatch_group);
  }
  if (l.schedule == Schedule::kDualPipe) {
    c.notes.Cannot("parallel.schedule", "dualpipe",
                   "Megatron-LM has no DualPipe schedule; the pp stages below run its 1F1B "
                   "(--overlap-moe-expert-parallel-comm overlaps the EP all-to-alls inside 1F1B; not emitted)");
  }
  if (l.schedule == Schedule::kDualPipeV) {
    c.notes.Cannot("parallel.schedule", "dualpipev",
                   "Megatron-LM has no DualPipeV: it puts chunk c on pipeline rank c mod pp, not in a V; no stage "
                   "layout emitted");
    return;
  }
  if (c.p.stages.chunks.size() <= 1 || !c.transformer) return;
  const std::vector<int64_t> sizes = emit::ChunkLayers(c.p.stages, c.r.model.layers);
  const bool even = std::all_of(sizes.begin(), sizes.end(), [&](int64_t n) { return n == sizes.front(); });
  if (even && c.p.partition != Name(Partition::kMegatron)) {
    if (l.vpp > 1) c.args.Flag("--num-virtual-stages-per-pipeline-rank", l.vpp);
    c.notes.Note(fmt::format("stages: {} layers a chunk, Megatron's even split{}", sizes.front(),
                             l.vpp > 1 ? " (older Megatron: --num-layers-per-virtual-pipeline-stage)" : ""));
    return;
  }
  if (c.p.partition == Name(Partition::kMegatron)) {
    // Megatron's own split: the same flags reproduce it.
    const ParallelConfig& p = c.r.parallel;
    if (l.vpp > 1) c.args.Flag("--num-virtual-stages-per-pipeline-rank", l.vpp);
    if (p.first_stage_layers > 0) c.args.Flag("--decoder-first-pipeline-num-layers", p.first_stage_layers);
    if (p.last_stage_layers > 0) c.args.Flag("--decoder-last-pipeline-num-layers", p.last_stage_layers);
    if (p.embedding_in_split) c.args.Flag("--account-for-embedding-in-pipeline-split");
    if (p.loss_in_split) c.args.Flag("--account-for-loss-in-pipeline-split");
    c.notes.Note(fmt::format("stages: Megatron's own split, {} layers per chunk{}", JoinInts(sizes),
                             l.vpp > 1 ? " (older Megatron: --num-layers-per-virtual-pipeline-stage)" : ""));
    return;
  }
  c.args.Quoted("--pipeline-model-parallel-layout", PipelineLayout(sizes, c.r.model.mtp_layers));
  c.notes.Note(fmt::format(
      "--pipeline-model-parallel-layout pins the plan's stages (E embedding, t layer, L loss, | between chunks; chunk "
      "c runs on pipeline rank c mod pp){}",
      l.vpp > 1 ? fmt::format("; its {} chunks give {} virtual stages a rank, so no "
                              "--num-virtual-stages-per-pipeline-rank (arguments.py accepts only one of the two)",
                              sizes.size(), l.vpp)
                : ""));
}

void BatchFlags(const MegatronContext& c) {
  c.args.Flag("--micro-batch-size", c.p.layout.micro_batch);
  c.args.Flag("--global-batch-size", c.r.training.global_batch);
  c.args.Flag("--seq-length", c.r.training.seq_len);
  // A learned table has learned_positions rows; otherwise the sequence length.
  const int64_t positions = c.r.model.learned_positions;
  c.args.Flag("--max-position-embeddings", positions > 0 ? positions : c.r.training.seq_len);
}

void MlaFlags(const MegatronContext& c, const MlaConfig& a) {
  c.args.Flag("--multi-latent-attention");
  c.args.Flag("--num-attention-heads", a.heads);
  if (a.q_lora_rank > 0) {
    c.args.Flag("--q-lora-rank", a.q_lora_rank);
  } else {
    c.notes.Note("no --q-lora-rank: queries are not compressed (Megatron's default)");
  }
  c.args.Flag("--kv-lora-rank", a.kv_lora_rank);
  c.args.Flag("--qk-head-dim", a.qk_nope_head_dim);
  c.args.Flag("--qk-pos-emb-head-dim", a.qk_rope_head_dim);
  c.args.Flag("--v-head-dim", a.v_head_dim);
}

void AttentionFlags(const MegatronContext& c) {
  const ModelConfig& m = c.r.model;
  const bool attention = Has(c.r, BlockKind::kAttention);
  if (attention && m.mla) {
    MlaFlags(c, *m.mla);
  } else {
    c.args.Flag("--num-attention-heads", m.attention.heads);
    if (!attention) c.notes.Note("--num-attention-heads: required by arguments.py; the model has no attention layer");
  }
  if (attention && !m.mla) {
    if (m.attention.kv_heads < m.attention.heads) {
      c.args.Flag("--group-query-attention");
      c.args.Flag("--num-query-groups", m.attention.kv_heads);
    }
    c.args.Flag("--kv-channels", m.attention.head_dim);
    if (m.attention.qk_norm) c.args.Flag("--qk-layernorm");
  }
  if (m.learned_positions > 0) {
    c.args.Flag("--position-embedding-type", "learned_absolute");
  } else if (c.transformer) {
    c.args.Flag("--position-embedding-type", "rope");
    c.notes.Note(
        "--position-embedding-type rope: preflight's attention applies RoPE (docs/formulas.md §8.1); the recipe has no "
        "key for its base or scaling (--rotary-base, --use-rope-scaling)");
  } else {
    c.args.Flag("--position-embedding-type", "none");
    c.notes.Note("--position-embedding-type none: as Megatron's hybrid examples (examples/mamba/train.sh) and "
                 "Nemotron-H's config; the recipe has no key for it");
  }
  if (attention) c.args.Flag("--attention-backend", c.r.training.flash_attention ? "flash" : "unfused");
}

// Megatron has one activation for dense and expert FFNs (--swiglu /
// --squared-relu; GeLU is its default); the experts' wins when they differ.
void ActivationFlags(const MegatronContext& c) {
  const bool moe = Has(c.r, BlockKind::kMoe);
  const bool dense = Has(c.r, BlockKind::kDenseMlp);
  const FfnActivation dense_act = c.r.model.mlp.activation;
  const FfnActivation act = moe ? c.r.model.moe.activation : dense_act;
  if (moe && dense && dense_act != act) {
    c.notes.Cannot("model.mlp.activation", Name(dense_act),
                   fmt::format("Megatron uses one activation for dense and expert FFNs; the experts are {}, the "
                               "dense MLP {}: the experts' emitted",
                               Name(act), Name(dense_act)));
  }
  if (!moe && !dense) return;
  if (act == FfnActivation::kSwiglu) {
    c.args.Flag("--swiglu");
  } else if (act == FfnActivation::kRelu2) {
    c.args.Flag("--squared-relu");
  }
}

void ModelFlags(const MegatronContext& c) {
  const ModelConfig& m = c.r.model;
  if (c.transformer) c.args.Flag("--num-layers", m.layers.size() / 2);
  c.args.Flag("--hidden-size", m.hidden);
  if (Has(c.r, BlockKind::kDenseMlp)) c.args.Flag("--ffn-hidden-size", m.mlp.ffn_hidden);
  AttentionFlags(c);
  ActivationFlags(c);
  c.args.Flag("--normalization", m.norm == NormKind::kRmsNorm ? "RMSNorm" : "LayerNorm");
  // Megatron adds biases by default (add_bias_linear).
  if (!m.linear_bias) c.args.Flag("--disable-bias-linear");
  if (!c.r.training.transformer_engine) c.args.Flag("--transformer-impl", "local");
  // Megatron's dropouts default to 0.1; the recipe's is training.dropout.
  c.args.Flag("--attention-dropout", Number(c.r.training.dropout));
  c.args.Flag("--hidden-dropout", Number(c.r.training.dropout));
  if (!m.tie_embeddings) c.args.Flag("--untie-embeddings-and-output-weights");
  if (m.mtp_layers > 0) c.args.Flag("--mtp-num-layers", m.mtp_layers);
  if (m.mtp_layers > 0 && m.mtp_shared_layer) c.args.Flag("--mtp-use-repeated-layer");
  c.args.Flag("--make-vocab-size-divisible-by", m.vocab_pad_multiple);
}

// "([0]*3+[1]*58)": 1 for a MoE layer, 0 for a dense one, per transformer
// layer (arguments.py moe_freq_type); empty when every layer is MoE.
std::string MoeLayerFreq(const std::vector<BlockKind>& layers) {
  std::vector<int> is_moe;
  for (size_t i = 1; i < layers.size(); i += 2) is_moe.push_back(layers[i] == BlockKind::kMoe ? 1 : 0);
  std::string out;
  for (size_t i = 0; i < is_moe.size();) {
    size_t run = 1;
    while (i + run < is_moe.size() && is_moe[i + run] == is_moe[i]) ++run;
    if (i == 0 && run == is_moe.size() && is_moe[0] == 1) return "";
    out += fmt::format("{}[{}]*{}", out.empty() ? "" : "+", is_moe[i], run);
    i += run;
  }
  return fmt::format("({})", out);
}

void MoeFlags(const MegatronContext& c) {
  if (!Has(c.r, BlockKind::kMoe)) return;
  const MoeConfig& e = c.r.model.moe;
  c.args.Flag("--num-experts", e.experts);
  c.args.Flag("--moe-router-topk", e.top_k);
  c.args.Flag("--moe-ffn-hidden-size", e.ffn_hidden);
  if (e.SharedWidth() > 0) c.args.Flag("--moe-shared-expert-intermediate-size", e.SharedWidth());
  if (e.shared_gate) c.args.Flag("--moe-shared-expert-gate");
  c.args.Flag("--moe-router-score-function", e.router == RouterScore::kSigmoid ? "sigmoid" : "softmax");
  if (e.router_bias) c.args.Flag("--moe-router-enable-expert-bias");
  if (e.grouped_gemm) c.args.Flag("--moe-grouped-gemm");
  c.args.Flag("--moe-token-dispatcher-type", Name(e.dispatcher));
  if (e.dropless) {
    c.notes.Note("dropless MoE: no --moe-expert-capacity-factor (None drops no token)");
  } else {
    c.args.Flag("--moe-expert-capacity-factor", Number(e.capacity_factor));
    if (e.pad_to_capacity) c.args.Flag("--moe-pad-expert-input-to-capacity");
  }
  if (c.transformer) {
    const std::string freq = MoeLayerFreq(c.r.model.layers);
    if (!freq.empty()) c.args.Quoted("--moe-layer-freq", freq);
  }
}

void MambaFlags(const MegatronContext& c) {
  if (!Has(c.r, BlockKind::kMamba)) return;
  const MambaConfig& mb = c.r.model.mamba;
  c.args.Flag("--mamba-state-dim", mb.d_state);
  c.args.Flag("--mamba-head-dim", mb.head_dim);
  c.args.Flag("--mamba-num-groups", mb.groups);
  c.args.Flag("--mamba-num-heads", mb.Heads(c.r.model.hidden));
  // arguments.py has neither flag; MambaMixer's defaults are K = 4, chunk 128 (docs/formulas.md §0).
  if (mb.d_conv != 4) {
    c.notes.Cannot("model.mamba.d_conv", std::to_string(mb.d_conv),
                   "arguments.py has no flag for the Mamba conv width (Megatron uses 4)");
  }
  if (mb.chunk != 128) {
    c.notes.Cannot("model.mamba.chunk", std::to_string(mb.chunk),
                   "arguments.py has no flag for the SSD chunk size (Megatron uses 128)");
  }
}

// One symbol a layer; '|' at every chunk cut gives Megatron the plan's
// stages (README: segments must be a multiple of pp).
std::string HybridPattern(const MegatronContext& c) {
  std::vector<bool> cut_before(c.r.model.layers.size(), false);
  if (c.p.layout.schedule != Schedule::kDualPipeV) {
    for (int64_t cut : emit::ChunkCuts(c.p.stages)) cut_before[static_cast<size_t>(cut)] = true;
  }
  std::string out;
  for (size_t i = 0; i < c.r.model.layers.size(); ++i) {
    if (cut_before[i]) out += '|';
    out += HybridSymbol(c.r.model.layers[i]);
  }
  // MTP depths after '/': attention and the last FFN (recipe validation).
  const std::string depth = {'*', HybridSymbol(c.r.model.layers.back())};
  for (int64_t k = 0; k < c.r.model.mtp_layers; ++k) out += "/" + depth;
  return out;
}

void HybridPatternFlag(const MegatronContext& c) {
  if (c.transformer) return;
  if (Has(c.r, BlockKind::kRecurrent)) {
    c.notes.Cannot("model.pattern", c.r.model.pattern,
                   "R (recurrent) blocks have no Megatron-LM layer (layer symbols M * - E); no "
                   "--hybrid-layer-pattern emitted, so these arguments do not build the model");
    c.notes.Note(fmt::format("the layers and stage cuts the plan needs, R left as R: {}", HybridPattern(c)));
    return;
  }
  c.args.Quoted("--hybrid-layer-pattern", HybridPattern(c));
  c.notes.Note(
      "--hybrid-layer-pattern: A -> *, M -> M, D -> -, E -> E, one symbol a layer, '|' at each stage cut; it sets the "
      "layer count (no --num-layers). Older Megatron: --hybrid-override-pattern with --num-layers and no '|'");
}

/// FP4 GEMMs: Megatron-LM d98e8a6 has one FP4 recipe, TE's NVFP4BlockScaling
/// (transformer_config.py: fp4 "e2m1", fp4_recipe nvfp4 | custom).
void Fp4Flags(const MegatronContext& c) {
  const PrecisionConfig& pr = c.r.training.precision;
  if (pr.fp4 == Fp4Format::kNone) return;
  if (pr.fp4 == Fp4Format::kMxfp4) {
    c.notes.Cannot("training.precision.fp4", Name(pr.fp4),
                   "Megatron-LM's --fp4-recipe is nvfp4 or custom (a user quantizer factory); it has no MXFP4 recipe");
    return;
  }
  c.args.Flag("--fp4-format", "e2m1");
  c.args.Flag("--fp4-recipe", "nvfp4");
  if (pr.fp4_params) c.args.Flag("--fp4-param-gather");
}

void PrecisionFlags(const MegatronContext& c) {
  const PrecisionConfig& pr = c.r.training.precision;
  switch (pr.params) {
    case DType::kBf16: c.args.Flag("--bf16"); break;
    case DType::kFp16: c.args.Flag("--fp16"); break;
    case DType::kFp8:
      c.args.Flag("--bf16");
      c.args.Flag("--fp8-format", "hybrid");
      c.args.Flag("--fp8-param-gather");
      c.notes.Note("fp8 params: --fp8-format hybrid and --fp8-param-gather keep the weights in fp8; the recipe does not "
                   "choose the fp8 format or scaling (--fp8-recipe)");
      break;
    case DType::kFp32: c.notes.Note("fp32 params: neither --bf16 nor --fp16"); break;
  }
  if (pr.grads == DType::kBf16) {
    c.args.Flag("--grad-reduce-in-bf16");
  } else if (pr.grads != DType::kFp32) {
    c.notes.Cannot("training.precision.grads", Name(pr.grads),
                   "Megatron keeps gradients in fp32 or, with --grad-reduce-in-bf16, bf16");
  }
  // Megatron's activations follow the autocast dtype: bf16 with --bf16 and
  // with fp8 weights (TE's FP8 GEMMs cast on the fly), fp16 with --fp16.
  const DType runs = pr.params == DType::kFp8 ? DType::kBf16 : pr.params;
  if (pr.activations != runs) {
    c.notes.Cannot("training.precision.activations", Name(pr.activations),
                   fmt::format("Megatron keeps activations in the {} compute dtype; the plan prices them in {}",
                               Name(runs), Name(pr.activations)));
  }
  if (!pr.master && pr.params != DType::kFp32) {
    c.notes.Cannot("training.precision.master", "none",
                   "Megatron keeps fp32 main parameters beside low-precision weights; no flag drops them");
  }
  Fp4Flags(c);
}

void ZeroFlags(const MegatronContext& c, bool muon) {
  switch (c.p.layout.zero) {
    case 0: c.notes.Note("zero 0: plain data parallel, no --use-distributed-optimizer"); break;
    case 1:
      c.args.Flag("--use-distributed-optimizer");
      if (muon && c.r.parallel.optimizer_sharding == OptimizerSharding::kLayerWise) {
        // Without the shard-aligned layout LayerWiseDistributedOptimizer deals
        // whole tensors by size, as the plan prices (parallel.optimizer_sharding).
        c.args.Flag("--no-use-layer-wise-param-layout");
        c.notes.Note(
            "--optimizer muon --use-distributed-optimizer --no-use-layer-wise-param-layout: Megatron's layer-wise "
            "distributed optimizer dealing whole tensors by size, as priced (parallel.optimizer_sharding: "
            "layer_wise)");
      } else if (muon) {
        c.notes.Note(
            "--optimizer muon --use-distributed-optimizer: validate_args turns it into Megatron's layer-wise "
            "distributed optimizer (use_layer_wise_distributed_optimizer; --optimizer dist_muon is its "
            "deprecated spelling), whole matrices spread over the DP ranks where the plan prices ZeRO-1 "
            "shards: about the same optimizer state a rank");
      }
      break;
    default:
      c.args.Flag("--use-megatron-fsdp");
      c.args.Flag("--data-parallel-sharding-strategy", c.p.layout.zero == 2 ? "optim_grads" : "optim_grads_params");
      c.args.Flag("--ckpt-format", "fsdp_dtensor");
      c.notes.Note(fmt::format("zero {}: Megatron-FSDP (the distributed optimizer shards optimizer state only); "
                               "arguments.py requires --ckpt-format fsdp_dtensor with it",
                               c.p.layout.zero));
      if (muon) {
        c.notes.Cannot("parallel.zero", std::to_string(c.p.layout.zero),
                       "validate_args asserts \"Emerging optimizer does not support Megatron-FSDP\": Muon runs "
                       "with ZeRO 0 or 1 (--use-distributed-optimizer) only");
      }
      break;
  }
  // HSDP: the distributed optimizer (and Megatron-FSDP, whose outer DP group
  // replicates by default: --outer-dp-sharding-strategy no_shard) per instance.
  if (c.p.layout.dp_replicate > 1) c.args.Flag("--num-distributed-optimizer-instances", c.p.layout.dp_replicate);
}

// The overlap the plan priced, as Megatron's flags (all off by default
// there); what the recipe asks for but Megatron would refuse on this layout
// is said, not emitted (the plan priced it without).
void OverlapFlags(const MegatronContext& c) {
  const ParallelConfig& p = c.r.parallel;
  const Layout& l = c.p.layout;
  const Overlap o = OverlapOf(c.r, l);
  if (o.grad_reduce) c.args.Flag("--overlap-grad-reduce");
  if (o.param_gather && l.zero >= 1) c.args.Flag("--overlap-param-gather");
  if (o.tp) c.args.Flag("--tp-comm-overlap");
  if (p.tp_comm_overlap && !o.tp) {
    c.notes.Note(
        "parallel.tp_comm_overlap: not emitted, Megatron overlaps TP communication only under sequence "
        "parallelism (tp > 1, sp)");
  }
  const bool dual = l.schedule == Schedule::kDualPipe || l.schedule == Schedule::kDualPipeV;
  if (p.ep_comm_overlap && o.ep && !dual && l.ep > 1) c.args.Flag("--overlap-moe-expert-parallel-comm");
  if (p.ep_comm_overlap && !o.ep) {
    c.notes.Note(
        "parallel.ep_comm_overlap: not emitted, Megatron's EP overlap needs no full recompute and, with "
        "pp > 1, an interleaved schedule");
  }
}

void OptimizerFlags(const MegatronContext& c) {
  const OptimizerConfig& o = c.r.training.optimizer;
  const Layout& l = c.p.layout;
  const bool muon = o.matrices == OptimizerKind::kMuon;
  const bool moe = Has(c.r, BlockKind::kMoe);
  c.args.Flag("--optimizer", muon ? "muon" : "adam");
  if (!muon) c.notes.Note("AdamW: --optimizer adam (Megatron's Adam applies decoupled weight decay)");
  if (o.offload_fraction > 0) {
    c.args.Flag("--optimizer-cpu-offload");
    c.args.Flag("--optimizer-offload-fraction", emit::Number(o.offload_fraction));
    c.args.Flag("--use-precision-aware-optimizer");
    c.notes.Note(
        "optimizer CPU offload: Megatron runs it on the precision-aware optimizer path (arguments.py "
        "asserts --use-precision-aware-optimizer)");
  }
  if (muon) {
    c.notes.Note("Muon: Megatron gives every 2-D weight except embedding and output to Muon and the rest to Adam "
                 "(emerging_optimizers.py), as the recipe's optimizer.other = adamw");
    if (l.tp > 1 || (moe && l.expert_tp > 1)) {
      c.args.Flag("--muon-tp-mode", "duplicated");
      c.notes.Note("--muon-tp-mode duplicated: a TP-sharded matrix is gathered and orthogonalised whole, as the plan "
                   "prices it (arguments.py's default is blockwise)");
    }
    if (moe && o.router == OptimizerKind::kAdamW) {
      c.notes.Cannot(
          "training.optimizer.router", "adamw",
          "Megatron's Muon also takes the 2-D router weight; no flag gives it to Adam (docs/formulas.md §9.4)");
    }
  }
  ZeroFlags(c, muon);
  OverlapFlags(c);
}

// Fine-grained activation offloading (transformer_config.py); TE >= 2.10
// needs NVTE_CPU_OFFLOAD_V1=1 so that it offloads no weights (arguments.py).
void ActivationOffloadFlags(const MegatronContext& c) {
  const TrainingConfig& t = c.r.training;
  if (t.activation_offload.empty() || c.p.layout.recompute == Recompute::kFull) return;
  std::vector<std::string> on;
  for (OffloadModule m : kAllOffloadModules) {
    if (t.activation_offload.has(m)) on.push_back(Name(m));
  }
  if (!t.transformer_engine) {
    c.notes.Cannot("training.activation_offload", OffloadModulesText(t.activation_offload),
                   "validate_args allows fine-grained activation offloading only with --transformer-impl "
                   "transformer_engine (training.transformer_engine: true)");
  }
  c.args.Flag("--fine-grained-activation-offloading");
  c.args.Flag("--offload-modules", fmt::format("{}", fmt::join(on, " ")));
  if (t.activation_offload_min_elements != int64_t{1} << 20) {
    c.args.Flag("--min-offloaded-tensor-size", t.activation_offload_min_elements);
  }
  c.notes.Note(
      "environment: export NVTE_CPU_OFFLOAD_V1=1 before launching (with Transformer Engine >= 2.10 validate_args "
      "asserts it for activation offloading)");
}

void HeadWgradFlags(const MegatronContext& c) {
  if (!c.r.training.defer_head_wgrad) return;
  c.args.Flag("--defer-embedding-wgrad-compute");
  c.args.Flag("--wgrad-deferral-limit", c.r.training.head_wgrad_deferral_limit);
}

void RecomputeFlags(const MegatronContext& c) {
  switch (c.p.layout.recompute) {
    case Recompute::kNone: break;
    case Recompute::kSelective: {
      // nargs='+': one argument a module. No module recomputes nothing, which
      // is no recompute flag at all.
      std::vector<std::string> on;
      for (RecomputeModule m : kAllRecomputeModules) {
        if (c.r.training.recompute_modules.has(m)) on.push_back(Name(m));
      }
      if (on.empty()) break;
      c.args.Flag("--recompute-granularity", "selective");
      c.args.Flag("--recompute-modules", fmt::format("{}", fmt::join(on, " ")));
      break;
    }
    case Recompute::kFull:
      c.args.Flag("--recompute-granularity", "full");
      c.args.Flag("--recompute-method", Name(c.r.training.recompute_method));
      c.args.Flag("--recompute-num-layers", c.r.training.recompute_layers);
      break;
    case Recompute::kSelectiveOp:
      c.notes.Cannot("training.recompute", "selective_op",
                     "Megatron-LM has no per-op checkpoint policy (its selective recompute reruns whole modules: "
                     "--recompute-modules); no recompute flag emitted");
      break;
  }
}

}  // namespace

Emission EmitMegatron(const Recipe& recipe, const Plan& plan) {
  Notes notes(recipe, "megatron");
  Args args;
  const MegatronContext c{recipe, plan, IsTransformerStack(recipe.model.layers), notes, args};
  emit::RefuseIfDoesNotFit(plan, notes);
  MegatronHeader(c);
  emit::NoteKeysWithoutCounterpart(recipe, emit::Framework::kMegatron, notes);
  ParallelFlags(c);
  PipelineFlags(c);
  BatchFlags(c);
  ModelFlags(c);
  MoeFlags(c);
  MambaFlags(c);
  HybridPatternFlag(c);
  PrecisionFlags(c);
  OptimizerFlags(c);
  RecomputeFlags(c);
  ActivationOffloadFlags(c);
  HeadWgradFlags(c);
  return notes.Finish(args.Render());
}

}  // namespace preflight

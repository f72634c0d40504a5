// The verifier: runs one training step of a (scaled) recipe on the layout's
// simulated ranks -- pipeline schedule over the micro-batches of every
// data-parallel replica, gradient synchronisation, one optimizer step -- and
// the same step on one unsharded rank, then compares (docs/formulas.md §8.3,
// "Equivalence tests"): per micro-batch loss, final hidden states, every
// parameter gradient (assembled from the shards before any reduction) and
// every parameter update (assembled per data-parallel replica after the step).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <type_traits>

#include "blocks.h"
#include "dist_optimizer.h"
#include "preflight/recipe/partition.h"
#include "preflight/simulator/sim.h"
#include "recompute.h"
#include "schedule.h"
#include "topology.h"

namespace preflight {
namespace sim {
namespace {

/// Threads the in-process runtime starts at most (one per simulated rank);
/// the MPI runtime has no limit of its own. DeepSeek-V3's scaled layout (pp 16
/// x dp 64 = 1,024 ranks, DualPipe, MTP, full recompute) ran on a 2-core
/// 24 GiB machine in 323 s user, peak RSS 9.0 GiB (bench/README.md).
constexpr int kMaxRanks = 1024;

std::vector<char> LayerLetters(const Recipe& r) {
  std::vector<char> out;
  for (BlockKind k : r.model.layers) out.push_back(Letter(k));
  if (out.empty()) {
    for (int64_t i = 0; i < r.model.repeat; ++i) {
      for (char c : r.model.pattern) out.push_back(c);
    }
  }
  return out;
}

void Require(bool ok, const std::string& why) {
  if (!ok) throw SimUnsupported(why);
}

/// The recompute policies the executor runs: none, full (uniform or block),
/// selective with every module (mla_up_proj under Ulysses CP only with
/// core_attn), and torchtitan's per-op selective_op where validation admits it.
void CheckRecompute(const Recipe& r, const std::vector<char>& letters) {
  const TrainingConfig& t = r.training;
  const auto has = [&](char c) { return std::find(letters.begin(), letters.end(), c) != letters.end(); };
  if (t.recompute == Recompute::kFull) {
    Require(r.parallel.cp == 1 || r.parallel.cp_recurrent != CpRecurrent::kHandoff || (!has('M') && !has('R')),
            "full recompute with the CP state hand-off (parallel.cp_recurrent: handoff) is not in the executor");
    return;
  }
  if (t.recompute != Recompute::kSelective) return;
  // Ulysses keeps its own head-split q, k, v, which discarding the
  // up-projection's outputs does not free (the estimator prices them as freed).
  Require(!t.recompute_modules.has(RecomputeModule::kMlaUpProj) || r.parallel.cp == 1 ||
              r.parallel.cp_comm != CpComm::kA2a || t.recompute_modules.has(RecomputeModule::kCoreAttn),
          "training.recompute_modules: mla_up_proj is not in the executor under parallel.cp_comm: a2a without "
          "core_attn (the core keeps its head-split q, k, v); add core_attn or use cp_comm p2p or all_gather");
}

/// What the executor runs. Block-specific rules (Mamba heads, R blocks, CP
/// modes) are checked by the blocks themselves when they are built.
void CheckSupported(const Recipe& r, const std::vector<char>& letters, bool in_process) {
  const ParallelConfig& p = r.parallel;
  Require(!in_process || r.world() <= kMaxRanks, "the executor runs at most " + std::to_string(kMaxRanks) +
                                                     " simulated ranks in one process; the scaled layout has " +
                                                     std::to_string(r.world()) +
                                                     " (run it under mpirun: docs/simulate.md)");
  // Under ZeRO 2/3 the copies on the first and last stage are each reduce-
  // scattered with their unit and the embedding group sums the shares
  // (DistOptimizer::AllReduceTiedShares). One rank holding both the embedding
  // and the head (or MTP) that reads it is another matter: the weight's
  // gradient stays live from the head's backward to the embedding's, and
  // under ZeRO 3 the head needs the embedding's unit gathered. DeepSpeed's
  // mechanism (autograd holds the head's part to the embedding's backward;
  // register_external_parameter gathers the weight for the head) priced so
  // moved the Megatron-FSDP fidelity case gpt3_mcore_te_tp2_zp_z3 (tied,
  // pp 1) away from its measurement: what Megatron-FSDP does is not modeled.
  Require(!r.model.embedding_on_last_stage() || p.zero <= 1 ||
              (p.pp > 1 && p.schedule != Schedule::kDualPipe && p.schedule != Schedule::kDualPipeV),
          "tied embeddings and MTP under ZeRO 2/3 are in the executor when the embedding and the head are on "
          "different pipeline ranks only (the head reading the same rank's embedding keeps its gradient live across "
          "the backward, which fit does not price); set parallel.pp > 1 without DualPipe(V), or parallel.zero: 1");
  // FSDP2 keeps the gradient shares on the host; Megatron's FSDP2 path
  // requires --untie-embeddings-and-output-weights and no pipeline
  // (arguments.py validate_args, use_torch_fsdp2).
  Require(!r.model.embedding_on_last_stage() || p.pp == 1 || !p.fsdp_cpu_offload,
          "parallel.fsdp_cpu_offload with tied embeddings or MTP over pipeline stages is not in the executor "
          "(Megatron's FSDP2 requires untied embeddings and pp 1); set parallel.fsdp_cpu_offload: false");
  if (r.training.dropout > 0) {
    // Transformer Engine's fused attention (and flash-attn) drop the
    // probabilities inside the kernel, keeping only the RNG state.
    Require(!r.training.flash_attention,
            "dropout inside flash attention is not in the executor (its core has no dropout): set "
            "training.flash_attention: false (Megatron's unfused core) or training.dropout: 0");
    Require(r.model.mtp_layers == 0,
            "dropout is in the executor without MTP only (set model.mtp_layers: 0 or training.dropout: 0)");
    // Megatron checkpoints only the MLP module (transformer_layer.py
    // _forward_mlp): its bias-dropout-add and mask stay outside, where the
    // executor's checkpoint of the whole D sublayer (recompute.h) would rerun them.
    const TrainingConfig& t = r.training;
    Require(t.recompute != Recompute::kSelective || !t.recompute_modules.has(RecomputeModule::kMlp) ||
                !t.transformer_engine || std::find(letters.begin(), letters.end(), 'D') == letters.end(),
            "dropout with the selective mlp rerun under Transformer Engine is not in the executor (leave mlp out of "
            "training.recompute_modules, or set training.transformer_engine: false or training.dropout: 0)");
  }
  if (!r.training.flash_attention) {
    Require(p.cp == 1,
            "training.flash_attention: false runs Megatron's unfused DotProductAttention, which asserts "
            "context_parallel_size == 1; set parallel.cp: 1 or training.flash_attention: true");
    const ModuleSet& mods = r.training.recompute_modules;
    Require(r.training.recompute != Recompute::kSelective ||
                (!mods.has(RecomputeModule::kCoreAttn) && !mods.has(RecomputeModule::kMlaUpProj)),
            "the core_attn and mla_up_proj reruns around the unfused attention core are not in the executor (set "
            "training.flash_attention: true or leave both out of training.recompute_modules)");
  }
  if (r.model.mtp_layers > 0) {
    Require(p.cp == 1,
            "MTP modules are in the executor with parallel.cp: 1 only (the shifted ids cross the CP ranks' chunks)");
    const TrainingConfig& t = r.training;
    // Selective modules rerun inside the module's blocks, as in Megatron's
    // MTP transformer layer (the same TransformerLayer); "mlp" with
    // Transformer Engine checkpoints the whole D sublayer, which only the
    // chunk's layers place (CheckpointGroups).
    Require(t.recompute != Recompute::kSelective || !t.recompute_modules.has(RecomputeModule::kMlp) ||
                !t.transformer_engine || letters.back() != 'D',
            "MTP modules with a dense MLP are in the executor under selective recompute without mlp (with "
            "Transformer Engine); set training.recompute_modules without mlp, or training.recompute none or full");
    Require(
        t.recompute != Recompute::kFull || t.recompute_method != RecomputeMethod::kUniform || t.recompute_layers == 1,
        "MTP under uniform full recompute needs training.recompute_layers: 1 (Megatron asserts "
        "recompute_num_layers == 1 for MTP recompute)");
  }
  Require(r.model.moe.dispatcher == MoeDispatcher::kAllToAll,
          "the executor dispatches MoE tokens by all-to-all only (set model.moe.dispatcher: alltoall)");
  if (!r.training.activation_offload.empty()) {
    // Virtual and DualPipe chunks reorder the offload groups
    // (PipelineOffloadManager.flush); the MTP layers are not priced.
    Require(p.vpp == 1 && p.schedule != Schedule::kDualPipe && p.schedule != Schedule::kDualPipeV &&
                r.model.mtp_layers == 0,
            "training.activation_offload is in the executor without virtual pipeline stages, DualPipe(V) or MTP "
            "(set parallel.vpp: 1, model.mtp_layers: 0, or activation_offload: [])");
  }
  Require(r.training.precision.fp4 == Fp4Format::kNone,
          "FP4 GEMMs are not in the executor (set training.precision.fp4: none)");
  Require(!r.training.flextron(),
          "Flextron's soft width masks are not in the executor (set training.flextron_emb_choices: 0)");
  if (r.training.defer_head_wgrad) {
    Require(p.zero <= 1 && p.schedule != Schedule::kDualPipe && p.schedule != Schedule::kDualPipeV &&
                r.model.mtp_layers == 0,
            "deferred head weight gradients (training.defer_head_wgrad) are in the executor with ZeRO 0 and 1, "
            "without DualPipe(V) and without MTP (the MTP heads share the output layer's buffers); set "
            "training.defer_head_wgrad: false");
  }
  Require(r.model.learned_positions == 0 || r.model.mtp_layers == 0,
          "learned position embeddings are in the executor without MTP only (Megatron's MTP rolls the position ids "
          "with the tokens; set model.mtp_layers: 0 or model.learned_positions: 0)");
  bool has_moe = false;
  for (char c : letters) {
    Require(c == 'A' || c == 'D' || c == 'E' || c == 'M' || c == 'R', std::string("block '") + c + "' is not in the executor");
    has_moe = has_moe || c == 'E';
  }
  CheckRecompute(r, letters);
  const ModelConfig& m = r.model;
  if (m.mla) {
    Require(m.mla->heads % p.tp == 0, "mla.heads must be divisible by parallel.tp");
    Require(m.mla->qk_rope_head_dim % 2 == 0, "mla.qk_rope_head_dim must be even (RoPE rotates halves)");
  } else {
    Require(m.attention.heads % p.tp == 0 && m.attention.kv_heads % p.tp == 0,
            "attention heads and kv_heads must be divisible by parallel.tp");
    Require(m.attention.heads % m.attention.kv_heads == 0, "attention.heads must be a multiple of kv_heads");
    Require(m.attention.head_dim % 2 == 0, "attention.head_dim must be even (RoPE rotates halves)");
  }
  Require(m.mlp.ffn_hidden % p.tp == 0, "mlp.ffn_hidden must be divisible by parallel.tp");
  const bool sp = p.sp && p.tp > 1;
  if (has_moe) {
    Require(!m.moe.router_bias || m.moe.router == RouterScore::kSigmoid,
            "moe.router_bias steers the sigmoid router (Megatron adds the expert bias to sigmoid scores); "
            "set moe.router: sigmoid");
    Require(p.tp == 1 || sp, "MoE with tp > 1 needs sequence parallel (Megatron requires it)");
    Require(m.moe.experts % p.ep == 0, "moe.experts must be divisible by parallel.ep");
    Require(m.moe.ffn_hidden % p.expert_tp == 0, "moe.ffn_hidden must be divisible by parallel.expert_tp");
    Require(m.moe.SharedWidth() % p.tp == 0, "the shared expert width must be divisible by parallel.tp");
    Require(m.moe.top_k >= 1 && m.moe.top_k <= m.moe.experts, "moe.top_k must be in 1..experts");
    Require(!m.linear_bias || p.expert_tp == 1,
            "expert biases are in the executor with parallel.expert_tp: 1 only (model.linear_bias)");
  }
  const int64_t chunks = p.cp_load_balance && p.cp > 1 ? 2 * p.cp : p.cp;
  Require(r.training.seq_len % chunks == 0, "seq_len must divide into the context-parallel chunks");
  if (sp) Require(r.training.seq_len / p.cp * r.training.micro_batch % p.tp == 0,
                  "each CP rank's tokens must divide by parallel.tp with SP");
}

Dims DimsOf(const Recipe& r, int64_t tp) {
  const ModelConfig& m = r.model;
  Dims d;
  d.hidden = m.hidden;
  d.heads = m.attention.heads;
  d.kv_heads = m.attention.kv_heads;
  d.head_dim = m.attention.head_dim;
  if (m.mla) {  // every query head has its own key head, of d_nope + d_rope
    d.mla = true;
    d.heads = d.kv_heads = m.mla->heads;
    d.head_dim = m.mla->qk_nope_head_dim + m.mla->qk_rope_head_dim;
    d.mla_q_lora = m.mla->q_lora_rank;
    d.mla_kv_lora = m.mla->kv_lora_rank;
    d.mla_rope = m.mla->qk_rope_head_dim;
    d.mla_nope = m.mla->qk_nope_head_dim;
    d.mla_v = m.mla->v_head_dim;
  }
  d.ffn = m.mlp.ffn_hidden;
  d.mlp_activation = m.mlp.activation;
  d.moe_activation = m.moe.activation;
  d.qk_norm = m.attention.qk_norm;
  d.experts = m.moe.experts;
  d.top_k = m.moe.top_k;
  d.expert_ffn = m.moe.ffn_hidden;
  d.shared_ffn = m.moe.SharedWidth();
  d.shared_gate = m.moe.shared_gate && d.shared_ffn > 0;
  d.capacity_factor = m.moe.capacity_factor;
  d.dropless = m.moe.dropless;
  d.pad_to_capacity = m.moe.pad_to_capacity;
  d.router_sigmoid = m.moe.router == RouterScore::kSigmoid;
  d.router_bias = m.moe.router_bias;
  // Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by x TP (docs/formulas.md §0).
  d.vocab = RoundUp(m.vocab, m.vocab_pad_multiple * tp);
  d.vocab_logical = m.vocab;
  const MambaConfig& mc = m.mamba;
  d.mamba_inner = mc.Inner(m.hidden);
  d.mamba_head_dim = mc.head_dim;
  d.mamba_heads = mc.head_dim > 0 ? d.mamba_inner / mc.head_dim : 0;
  d.mamba_groups = mc.groups;
  d.mamba_d_state = mc.d_state;
  d.mamba_d_conv = mc.d_conv;
  d.mamba_chunk = mc.chunk;
  d.mamba_fused_norm_out_proj = mc.fused_norm_out_proj;
  d.recurrent_width = m.recurrent.width;
  d.recurrent_heads = m.recurrent.heads;
  d.recurrent_d_conv = m.recurrent.d_conv;
  d.seq = r.training.seq_len;
  d.batch = r.training.micro_batch;
  d.tie_embeddings = m.tie_embeddings;
  d.norm = m.norm;
  d.linear_bias = m.linear_bias;
  d.learned_positions = m.learned_positions;
  d.flash_attention = r.training.flash_attention;
  if (r.training.defer_head_wgrad) d.head_wgrad_deferred = r.training.head_wgrad_deferral_limit;
  d.replicated_embedding = r.parallel.embedding == EmbeddingSplit::kReplicated;
  d.cross_entropy = r.training.cross_entropy;
  return d;
}

ModeledBytes BytesOf(const Recipe& r) {
  ModeledBytes b;
  b.activation = SizeOf(r.training.precision.activations);
  b.param = SizeOf(r.training.precision.params);
  b.grad = SizeOf(r.training.precision.grads);
  return b;
}

/// Token ids and targets of every micro-batch of the step: entry i*m + j is
/// micro-batch j of data-parallel replica i, global rows (position * batch + b).
struct Data {
  std::vector<std::vector<int64_t>> ids, targets;
};

Data MakeData(const Recipe& r, int64_t sequences_batches, uint64_t seed) {
  std::mt19937_64 gen(seed ^ 0xda7aull);
  std::uniform_int_distribution<int64_t> u(0, r.model.vocab - 1);
  const int64_t tokens = r.training.seq_len * r.training.micro_batch;
  Data d;
  for (int64_t k = 0; k < sequences_batches; ++k) {
    std::vector<int64_t> ids, targets;
    for (int64_t t = 0; t < tokens; ++t) ids.push_back(u(gen));
    for (int64_t t = 0; t < tokens; ++t) targets.push_back(u(gen));
    d.ids.push_back(std::move(ids));
    d.targets.push_back(std::move(targets));
  }
  return d;
}

/// What every rank program of one run reads.
struct Spec {
  const Recipe* recipe = nullptr;
  Topology topo;
  Dims dims;
  std::vector<char> letters;
  std::vector<BlockKind> kinds;  // the same layers as kinds
  StagePlan stages;          // chunk c lives on pipeline rank stages.chunks[c].pipeline_rank
  int64_t vpp = 1;           // chunks per pipeline rank (DualPipeV: 2)
  int64_t microbatches = 1;  // per pipeline per step
  bool sp = false;
  bool load_balance = true;
  const Data* data = nullptr;
  SimOptions opt;
  OptimizerSettings optim;
  /// The unsharded reference routes each micro-batch's tokens in the groups
  /// the sharded ranks route them in (docs/formulas.md §8.3 (3)): the group of each row.
  std::vector<int64_t> router_group_of_row;
  int64_t router_groups = 1;
};

/// One parameter on one rank, as the verifier needs it.
/// Every field travels to rank 0 under MPI: a new one goes into CodeResult too
/// (mpi_parity_test fails otherwise).
struct ParamRecord {
  std::string name;
  ShardKind shard = ShardKind::kReplicated;
  std::vector<int64_t> segments;
  int64_t rows = 0, cols = 0, expert = -1;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  bool tp_partial = false;
  bool tp_whole = false;
  Mat<double> grad;    // summed over this rank's micro-batches, before any reduction
  Mat<double> update;  // value after the step - value before
};

struct RankResult {
  Topology::Coord coord;
  std::map<int64_t, double> losses;          // data index -> mean loss over this rank's tokens (last stage)
  std::map<int64_t, Mat<double>> outputs;    // data index -> final hidden state, this rank's rows (last stage)
  std::vector<ParamRecord> params;
  int64_t dropped = 0;
  int64_t peak_in_flight = 0;
  double flops = 0;
  int64_t allocated_static = 0, allocated_peak = 0;  // RankMeasurement's, taken after the optimizer step
};

/// A model chunk a pipeline rank holds (docs/formulas.md §4.3): its layers, and the
/// embedding (first chunk) or the head (last chunk).
template <class T>
struct ModelChunk {
  int64_t index = 0;
  std::vector<size_t> units;  // the optimizer's unit of each part, in forward order
  std::vector<char> letters;
  std::vector<std::unique_ptr<Block<T>>> blocks;
  /// Recompute checkpoints over `blocks`, and each one's kept input per
  /// micro-batch in flight (keyed by the group's first block).
  std::vector<CheckpointGroup> groups;
  std::map<std::pair<int64_t, int64_t>, Tensor<T>> checkpoints;
  std::unique_ptr<Embedding<T>> embedding;
  std::unique_ptr<Head<T>> head;
  /// The last chunk: the MTP modules, the embedding they look up (this rank's
  /// own, or `embedding_copy`), and the last stage's copy of the embedding a
  /// tied head or MTP needs when the first stage is another rank (Megatron's).
  std::vector<std::unique_ptr<MtpModule<T>>> mtp;
  Embedding<T>* lookup = nullptr;
  std::unique_ptr<Embedding<T>> embedding_copy;
  /// Activation offload: the module names whose last group in the chunk
  /// each block runs (the groups a kept chunk leaves on the device).
  std::vector<OffloadSet> last_groups;
};

/// The rows a rank holds of a global per-token list: its CP positions, every
/// batch row (the embedding and the loss work on all of them; SP slices the
/// residual stream in between).
std::vector<int64_t> LocalTokens(const std::vector<int64_t>& global, const SeqLayout& seq, int64_t batch) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < seq.local_len(); ++p) {
    for (int64_t b = 0; b < batch; ++b) out.push_back(global[static_cast<size_t>(seq.Position(p) * batch + b)]);
  }
  return out;
}

/// p2p tag of the message entering chunk `chunk` for micro-batch `mb`:
/// forward activations (dir 0) or backward gradients (dir 1).
int64_t PipeTag(int64_t chunk, int64_t mb, int64_t m, int dir) { return ((chunk * m + mb) << 1) | dir; }

template <class T>
class RankProgram {
 public:
  RankProgram(Rank& rank, const Spec& spec, const RankGroups& groups) : spec_(spec), groups_(groups) {
    const Topology& topo = spec.topo;
    coord_ = topo.CoordOf(rank.id());
    Ctx& c = ctx_;
    c.rank = &rank;
    c.tp = groups.tp;
    c.cp = groups.cp;
    c.ep = groups.ep;
    c.etp = groups.etp;
    c.edp = groups.edp;
    c.tp_rank = coord_.tp;
    c.tp_size = topo.tp;
    c.cp_rank = coord_.cp;
    c.cp_size = topo.cp;
    c.ep_rank = coord_.ep;
    c.ep_size = topo.ep;
    c.etp_rank = coord_.etp;
    c.etp_size = topo.etp;
    c.sp = spec.sp;
    c.cp_comm = spec.recipe->parallel.cp_comm;
    c.cp_recurrent = spec.recipe->parallel.cp_recurrent;
    c.seq = SeqLayout::Make(spec.dims.seq, topo.cp, coord_.cp, spec.load_balance);
    c.router_groups = spec.router_groups;
    c.router_group_of_row = spec.router_group_of_row;
    c.bytes = BytesOf(*spec.recipe);
    c.dropout = spec.recipe->training.dropout;
    c.dropout_seed = spec.opt.seed;
    c.optimizer = spec.recipe->training.optimizer;
    const TrainingConfig& training = spec.recipe->training;
    if (training.recompute == Recompute::kSelective) c.rerun = training.recompute_modules;
    c.transformer_engine = training.transformer_engine;
    if (!training.activation_offload.empty()) {
      offload_ = std::make_unique<ActivationOffload>(&rank, training.activation_offload,
                                                     training.activation_offload_min_elements);
      c.offload = offload_.get();
    }
    BuildChunks();
  }

  RankResult Run() {
    RankResult out;
    out.coord = coord_;
    const std::vector<std::vector<Param<T>*>> units = Units();
    for (const auto& unit : units) {
      for (Param<T>* p : unit) before_[p->name] = p->value.m.template cast<double>();
    }
    DistGroups dg{groups_.tp, groups_.dp_cp, groups_.etp, groups_.edp, spec_.sp};
    if (CopiesEmbedding()) dg.embedding = groups_.embedding;
    dg.mirror = groups_.mirror;
    dg.dp_replica = groups_.dp_replica;
    dg.edp_replica = groups_.edp_replica;
    optimizer_ = std::make_unique<DistOptimizer<T>>(ctx_, dg, units, spec_.optim);
    // Blocks build full parameters and gradients that ZeRO 2/3 shard at once
    // (DeepSpeed zero.Init / FSDP's meta-device init never hold them): the
    // step's peaks start from the sharded state.
    ctx_.rank->memory().ResetPeaks();
    ctx_.rank->host_memory().ResetPeaks();

    const std::vector<PipeOp> ops =
        PipelineSchedule(spec_.recipe->parallel.schedule, spec_.topo.pp, spec_.vpp, spec_.microbatches, coord_.pp,
                         spec_.recipe->parallel.microbatch_group);
    int64_t live = 0;
    for (size_t j = 0; j < ops.size(); ++j) {
      const PipeOp& op = ops[j];
      ModelChunk<T>& chunk = chunks_[static_cast<size_t>(op.chunk)];
      ctx_.microbatch = op.microbatch;
      ctx_.data_index = DataIndex(op.microbatch);
      if (op.forward) {
        keeps_last_groups_ = KeepsLastGroups(ops, j);
        Forward(chunk, op.microbatch, &out);
        out.peak_in_flight = std::max(out.peak_in_flight, ++live);
      } else {
        Backward(chunk, op.microbatch);
        --live;
      }
    }
    // Megatron's finish_embedding_wgrad_compute: the deferred output-layer
    // weight gradients, after the schedule's last backward and before the
    // gradients are finalized (counted in the backward pass, as plan does).
    for (ModelChunk<T>& chunk : chunks_) {
      if (!chunk.head) continue;
      ctx_.rank->set_pass(Pass::kBackward);
      chunk.head->DrainDeferred(ctx_);
    }
    const std::map<std::string, Mat<double>> biases_before = ExpertBiases();
    UpdateExpertBiases();
    optimizer_->Step(ctx_);
    // The allocator's figures, before the verifier's gathers (not the step's).
    out.allocated_static = ctx_.rank->memory().live_total();
    out.allocated_peak = ctx_.rank->memory().peak_total();
    optimizer_->GatherForVerification(ctx_);
    for (const auto& unit : units) {
      for (Param<T>* p : unit) Record(*p, &out);
    }
    for (const auto& [name, after] : ExpertBiases()) {  // a buffer: no gradient, its sign-rule move
      ParamRecord rec;
      rec.name = name;
      rec.rows = after.rows();
      rec.cols = after.cols();
      rec.grad = Mat<double>::Zero(after.rows(), after.cols());
      rec.update = after - biases_before.at(name);
      out.params.push_back(std::move(rec));
    }
    out.dropped = ctx_.dropped_pairs;
    out.flops = ctx_.rank->flops();
    return out;
  }

 private:
  void BuildChunks() {
    const Spec& s = spec_;
    const int64_t n_chunks = static_cast<int64_t>(s.stages.chunks.size());
    for (int64_t v = 0; v < s.vpp; ++v) {
      ModelChunk<T> chunk;
      chunk.index = DualPipe() ? (v == 0 ? coord_.pp : s.topo.pp - 1 - coord_.pp) : ChunkAt(coord_.pp, v);
      const StageChunk& sc = s.stages.chunks.at(static_cast<size_t>(chunk.index));
      const size_t parts = static_cast<size_t>(sc.end_layer - sc.first_layer) + (chunk.index == 0 ? 1 : 0) +
                           (chunk.index == n_chunks - 1 ? 1 : 0);
      for (size_t i = 0; i < parts; ++i) chunk.units.push_back(next_unit_++);
      if (chunk.index == 0) {
        chunk.embedding = std::make_unique<Embedding<T>>(ctx_, s.dims, s.opt.seed, s.opt.init_scale);
        // The first stage's copy of an embedding the last stage (tied head or MTP) also holds.
        chunk.embedding->weight().tied = CopiesEmbedding();
      }
      for (int64_t l = sc.first_layer; l < sc.end_layer; ++l) {
        const char letter = s.letters[static_cast<size_t>(l)];
        chunk.letters.push_back(letter);
        chunk.blocks.push_back(MakeBlock<T>(letter, ctx_, s.dims, l, s.opt.seed, s.opt.init_scale));
      }
      chunk.groups = CheckpointGroups(s.kinds, sc.first_layer, sc.end_layer, s.recipe->training);
      chunk.last_groups = LastGroups(chunk.letters);
      chunks_.push_back(std::move(chunk));
    }
    // The ends last: a tied head or MTP reads the embedding of any chunk of
    // this rank (DualPipe's rank p-1 builds its stage-0 copy after the head).
    for (ModelChunk<T>& chunk : chunks_) {
      if (chunk.index == n_chunks - 1) BuildEnds(chunk);
    }
  }

  /// Every router expert bias this rank holds, by name.
  std::map<std::string, Mat<double>> ExpertBiases() {
    std::map<std::string, Mat<double>> out;
    for (ModelChunk<T>& c : chunks_) {
      for (ExpertBias<T>* e : ExpertBiasesOf(c)) out[e->name] = e->bias.m.template cast<double>();
    }
    return out;
  }

  /// The routers' expert biases of a chunk: its layers', then its MTP modules'.
  static std::vector<ExpertBias<T>*> ExpertBiasesOf(ModelChunk<T>& c) {
    std::vector<ExpertBias<T>*> out;
    for (auto& b : c.blocks) {
      if (ExpertBias<T>* e = b->expert_bias()) out.push_back(e);
    }
    for (auto& m : c.mtp) {
      if (ExpertBias<T>* e = m->expert_bias()) out.push_back(e);
    }
    return out;
  }

  /// The expert-bias update after the step's backwards (Megatron
  /// finalize_model_grads.py _update_router_expert_bias): every MoE layer's
  /// counts, stacked, summed over the ranks that route different tokens:
  /// Megatron all-reduces over TP x DP x CP at once; the executor, as the
  /// planner prices it (AddRouterBias), over DP x CP and then over TP. Then
  /// each bias moves by the sign rule.
  void UpdateExpertBiases() {
    std::vector<ExpertBias<T>*> all;
    for (ModelChunk<T>& c : chunks_) {
      for (ExpertBias<T>* e : ExpertBiasesOf(c)) all.push_back(e);
    }
    if (all.empty()) return;
    // DualPipe: the mirror rank holds the same layers in the other chunk
    // order; both stack them by name.
    if (groups_.mirror != nullptr) {
      std::sort(all.begin(), all.end(),
                [](const ExpertBias<T>* a, const ExpertBias<T>* b) { return a->name < b->name; });
    }
    Mat<T> stacked(static_cast<int64_t>(all.size()), all.front()->counts.m.cols());
    for (size_t i = 0; i < all.size(); ++i) stacked.row(static_cast<int64_t>(i)) = all[i]->counts.m;
    Rank& r = *ctx_.rank;
    r.set_pass(Pass::kOptimizer);
    r.set_what(CommWhat::kRouterBias);
    // DualPipe: each copy of a layer routed one direction's micro-batches;
    // the mirror pair sums them first.
    // HSDP: over one replica's d x c, then across the replicas.
    for (const Group* g : {groups_.mirror, groups_.dp_cp, groups_.dp_replica, groups_.tp}) {
      if (g != nullptr && g->size() > 1) r.AllReduce(*g, stacked.data(), stacked.size(), 4);
    }
    for (size_t i = 0; i < all.size(); ++i) UpdateExpertBias<T>(stacked.row(static_cast<int64_t>(i)), all[i]);
  }

  /// Megatron checkpoints each MTP module under full uniform recompute
  /// (MultiTokenPredictionLayer.forward: recompute_granularity full); under
  /// block it warns and skips the recompute.
  static bool MtpCheckpointed(const TrainingConfig& t) {
    return t.recompute == Recompute::kFull && t.recompute_method == RecomputeMethod::kUniform;
  }
  bool EmbeddingOnLastStage() const { return spec_.recipe->model.embedding_on_last_stage(); }
  /// DualPipe: this rank holds stage r (chunk 0) and a copy of stage p-1-r
  /// (chunk 1); ranks 0 and p-1 hold both ends, so a tied head or MTP reads
  /// the rank's own embedding, and the copies' gradients are summed over the
  /// mirror pair (DistOptimizer::AllReduceMirror), the embedding's with them.
  bool DualPipe() const { return spec_.recipe->parallel.schedule == Schedule::kDualPipe; }
  /// The last stage keeps its own copy of the embedding a tied head or MTP
  /// reads: pp > 1, unless one rank holds both ends (DualPipe's ranks 0 and
  /// p-1, DualPipeV's rank 0 with the first and the last chunk).
  bool CopiesEmbedding() const {
    const Schedule s = spec_.recipe->parallel.schedule;
    return EmbeddingOnLastStage() && spec_.topo.pp > 1 && s != Schedule::kDualPipe && s != Schedule::kDualPipeV;
  }

  /// The last chunk's head and MTP modules. A tied head and the MTP modules
  /// read the embedding this rank holds (in any of its chunks), else the last
  /// stage's copy (same name and value, Param::tied), which Megatron builds
  /// on the last stage for both.
  void BuildEnds(ModelChunk<T>& chunk) {
    const Spec& s = spec_;
    for (ModelChunk<T>& c : chunks_) {
      if (c.embedding) chunk.lookup = c.embedding.get();
    }
    if (chunk.lookup == nullptr && EmbeddingOnLastStage()) {
      chunk.embedding_copy = std::make_unique<Embedding<T>>(ctx_, s.dims, s.opt.seed, s.opt.init_scale, false);
      chunk.embedding_copy->weight().tied = true;
      chunk.lookup = chunk.embedding_copy.get();
    }
    Param<T>* tied = s.dims.tie_embeddings && chunk.lookup != nullptr ? &chunk.lookup->weight() : nullptr;
    chunk.head = std::make_unique<Head<T>>(ctx_, s.dims, s.opt.seed, s.opt.init_scale, tied);
    // Each module's layer ids follow the model's: attention, then its FFN of
    // the model's last kind (inventory: mtp_ffn).
    const int64_t layers = static_cast<int64_t>(s.letters.size());
    // model.mtp_shared_layer (Megatron --mtp-use-repeated-layer,
    // MultiTokenPredictionBlock: "only 1 layer is created and applied
    // mtp_num_layers times"): one module, run at every depth (MtpAt).
    const int64_t modules = s.recipe->model.mtp_shared_layer ? 1 : s.recipe->model.mtp_layers;
    for (int64_t k = 1; k <= modules; ++k) {
      chunk.mtp.push_back(std::make_unique<MtpModule<T>>(ctx_, s.dims, k, s.letters.back(), layers + 2 * (k - 1),
                                                         s.opt.seed, s.opt.init_scale, chunk.head->weight(),
                                                         MtpCheckpointed(s.recipe->training)));
    }
  }

  /// The optimizer's units in execution order: embedding, each layer, head.
  std::vector<std::vector<Param<T>*>> Units() {
    std::vector<std::vector<Param<T>*>> units;
    for (ModelChunk<T>& c : chunks_) {
      if (c.embedding) units.push_back(c.embedding->params());
      for (auto& b : c.blocks) units.push_back(b->params());
      if (c.head) {
        // One unit, as the planner's: the head, the last stage's embedding
        // copy, the MTP modules.
        std::vector<Param<T>*> ends = c.head->params();
        if (c.embedding_copy) ends.push_back(&c.embedding_copy->weight());
        for (auto& m : c.mtp) {
          for (Param<T>* p : m->params()) ends.push_back(p);
        }
        units.push_back(std::move(ends));
      }
    }
    return units;
  }

  void Record(const Param<T>& p, RankResult* out) const {
    ParamRecord rec;
    rec.name = p.name;
    rec.shard = p.shard;
    rec.segments = p.segments;
    rec.rows = p.rows;
    rec.cols = p.cols;
    rec.expert = p.expert;
    rec.optimizer = p.optimizer;
    rec.tp_partial = p.tp_partial;
    rec.tp_whole = p.tp_whole;
    const auto& observed = optimizer_->local_gradients();
    const auto it = observed.find(p.name);
    rec.grad = it == observed.end() ? Mat<double>::Zero(p.grad.m.rows(), p.grad.m.cols()) : it->second;
    rec.update = p.value.m.template cast<double>() - before_.at(p.name);
    out->params.push_back(std::move(rec));
  }

  /// Runs `part` (index i of the chunk's units, forward order) with its
  /// parameters gathered under ZeRO 3 and the next unit prefetched.
  template <class F>
  void ForwardUnit(const ModelChunk<T>& chunk, size_t i, F&& part) {
    optimizer_->GatherUnit(ctx_, chunk.units[i]);
    if (i + 1 < chunk.units.size()) optimizer_->GatherUnit(ctx_, chunk.units[i + 1]);
    part();
    optimizer_->ReleaseUnit(chunk.units[i]);
  }

  /// The backward of unit i: gathered (and the one before prefetched), its
  /// unsharded gradients live until they are reduce-scattered (ZeRO 2/3).
  template <class F>
  void BackwardUnit(const ModelChunk<T>& chunk, size_t i, F&& part) {
    optimizer_->GatherUnit(ctx_, chunk.units[i]);
    if (i > 0) optimizer_->GatherUnit(ctx_, chunk.units[i - 1]);
    optimizer_->BeginUnitBackward(ctx_, chunk.units[i]);
    part();
    optimizer_->ReduceUnitGradients(ctx_, chunk.units[i]);
    optimizer_->ReleaseUnit(chunk.units[i]);
  }

  /// Global rank holding chunk `chunk` for micro-batch `mb` in this rank's
  /// (tp, cp, dp) pipeline (DualPipe: the second half of the micro-batches
  /// runs stage c on pipeline rank p-1-c).
  int RankOfChunk(int64_t chunk, int64_t mb) const {
    const StageChunk& c = spec_.stages.chunks.at(static_cast<size_t>(chunk));
    int64_t pp = c.pipeline_rank;
    if (DualPipe()) pp = mb < spec_.microbatches / 2 ? chunk : spec_.topo.pp - 1 - chunk;
    return spec_.topo.RankOf(coord_.tp, coord_.cp, coord_.dp, static_cast<int>(pp));
  }

  /// The chunk at virtual index `v` of pipeline rank `pp` (c mod pp; DualPipeV's V).
  int64_t ChunkAt(int64_t pp, int64_t v) const {
    const std::vector<StageChunk>& all = spec_.stages.chunks;
    for (size_t c = 0; c < all.size(); ++c) {
      if (all[c].pipeline_rank == pp && all[c].virtual_index == v) return static_cast<int64_t>(c);
    }
    throw SimUnsupported("no pipeline chunk at rank " + std::to_string(pp) + ", virtual index " + std::to_string(v));
  }

  int64_t DataIndex(int64_t mb) const { return coord_.dp * spec_.microbatches + mb; }

  void Pass(int64_t chunk, int64_t mb, int dir, int peer, Mat<T>* x, bool send) {
    const int64_t tag = PipeTag(chunk, mb, spec_.microbatches, dir);
    Rank& r = *ctx_.rank;
    if (peer == r.id()) {  // pp = 1 with virtual chunks: the neighbour chunk is on this rank
      if (send) {
        local_[tag] = *x;
      } else {
        *x = std::move(local_.at(tag));
        local_.erase(tag);
      }
      return;
    }
    r.set_what(dir == 0 ? CommWhat::kActivations : CommWhat::kActivationGrads);
    if (send) {
      r.Send(Axis::kPp, peer, x->data(), x->size(), ctx_.bytes.activation, tag);
    } else {
      r.Recv(Axis::kPp, peer, x->data(), x->size(), ctx_.bytes.activation, tag);
    }
  }

  /// What the MTP module of depth k reads for data index `key`, this rank's
  /// rows: the ids and targets shifted by k along the sequence, 0 past its
  /// end (Megatron roll_tensor: torch.roll, the wrapped positions zeroed),
  /// and each row's loss weight: mtp_loss_scaling_factor / D over the rows
  /// the shift kept (the rolled loss mask's sum), 0 for the others.
  struct MtpTokens {
    std::vector<int64_t> ids, targets;
    std::vector<T> weights;
  };
  MtpTokens ShiftedTokens(int64_t key, int64_t k) const {
    const Dims& d = spec_.dims;
    const std::vector<int64_t>& ids = spec_.data->ids[static_cast<size_t>(key)];
    const std::vector<int64_t>& targets = spec_.data->targets[static_cast<size_t>(key)];
    std::vector<int64_t> shifted_ids(ids.size(), 0), shifted_targets(targets.size(), 0), kept(ids.size(), 0);
    for (int64_t pos = 0; pos + k < d.seq; ++pos) {
      for (int64_t b = 0; b < d.batch; ++b) {
        const size_t at = static_cast<size_t>(pos * d.batch + b), from = static_cast<size_t>((pos + k) * d.batch + b);
        shifted_ids[at] = ids[from];
        shifted_targets[at] = targets[from];
        kept[at] = 1;
      }
    }
    const double weight = kMtpLossScale / static_cast<double>(spec_.recipe->model.mtp_layers) /
                          static_cast<double>((d.seq - k) * d.batch);
    MtpTokens out{LocalTokens(shifted_ids, ctx_.seq, d.batch), LocalTokens(shifted_targets, ctx_.seq, d.batch), {}};
    for (int64_t m : LocalTokens(kept, ctx_.seq, d.batch)) out.weights.push_back(m != 0 ? T(weight) : T(0));
    return out;
  }

  /// The MTP depths the last chunk runs (model.mtp_layers; 0 elsewhere).
  size_t MtpDepths(const ModelChunk<T>& chunk) const {
    return chunk.mtp.empty() ? 0 : static_cast<size_t>(spec_.recipe->model.mtp_layers);
  }

  /// Runs `f` on the module of depth k for micro-batch mb. A shared module
  /// keeps each depth's saved tensors apart: its blocks key them by
  /// ctx.microbatch, set to (mb, depth) while it runs (its gradients sum over
  /// the depths, as autograd sums a module's uses).
  template <class F>
  auto MtpAt(ModelChunk<T>& chunk, size_t k, int64_t mb, F&& f) {
    if (chunk.mtp.size() > 1) return f(*chunk.mtp[k - 1]);
    ctx_.microbatch = mb * spec_.recipe->model.mtp_layers + static_cast<int64_t>(k - 1);
    auto out = f(*chunk.mtp.front());
    ctx_.microbatch = mb;
    return out;
  }

  int64_t LocalRows() const {
    const int64_t rows = ctx_.seq.local_len() * spec_.dims.batch;
    return spec_.sp ? rows / spec_.topo.tp : rows;
  }

  void Forward(ModelChunk<T>& chunk, int64_t mb, RankResult* out) {
    Rank& r = *ctx_.rank;
    r.set_pass(Pass::kForward);
    const int64_t key = DataIndex(mb);
    Mat<T> x(LocalRows(), spec_.dims.hidden);
    size_t unit = 0;
    if (chunk.embedding) {
      ForwardUnit(chunk, unit++, [&] {
        r.memory().set_owner("ends");
        x = chunk.embedding->Forward(ctx_, LocalTokens(spec_.data->ids[static_cast<size_t>(key)], ctx_.seq, spec_.dims.batch));
      });
    } else {
      Pass(chunk.index, mb, 0, RankOfChunk(chunk.index - 1, mb), &x, false);
    }
    for (size_t i = 0; i < chunk.blocks.size(); ++i) {
      ForwardUnit(chunk, unit++, [&] {
        r.memory().set_owner(std::string(1, chunk.letters[i]));
        if (offload_ && keeps_last_groups_) offload_->set_kept(chunk.last_groups[i]);
        const CheckpointGroup* g = GroupOf(chunk, static_cast<int64_t>(i));
        if (g == nullptr) {
          x = chunk.blocks[i]->Forward(ctx_, x);
          return;
        }
        if (g->first == static_cast<int64_t>(i)) {
          chunk.checkpoints[{g->first, mb}] =
              Tensor<T>(ctx_.mem(), SimCategory::kActivations, ctx_.bytes.activation, x);
        }
        // Under torch.no_grad: the block's saved set lives only while it runs
        // (under the per-op policy, but for the op outputs it keeps).
        NoGradForward no_grad;
        r.memory().set_saved_category(SimCategory::kTemporaries);
        EnterOpPolicy(*g, static_cast<int64_t>(i), OpPass::kForward);
        if (offload_) offload_->set_checkpointed(true);
        x = chunk.blocks[i]->Forward(ctx_, x);
        if (offload_) offload_->set_checkpointed(false);
        ctx_.op.pass = OpPass::kOff;
        r.memory().set_saved_category(SimCategory::kActivations);
      });
    }
    if (chunk.head) {
      out->outputs[key] = x.template cast<double>();
      ForwardUnit(chunk, unit++, [&] {
        r.memory().set_owner("ends");
        Mat<T> normed;
        double loss = chunk.head->Forward(
            ctx_, x, LocalTokens(spec_.data->targets[static_cast<size_t>(key)], ctx_.seq, spec_.dims.batch), nullptr,
            chunk.mtp.empty() ? nullptr : &normed);
        for (size_t k = 1; k <= MtpDepths(chunk); ++k) {
          const MtpTokens in = ShiftedTokens(key, static_cast<int64_t>(k));
          const Mat<T> e = chunk.lookup->Forward(ctx_, in.ids, static_cast<int64_t>(k));
          Mat<T> next;
          loss += MtpAt(chunk, k, mb,
                        [&](MtpModule<T>& m) { return m.Forward(ctx_, normed, e, in.targets, in.weights, &next); });
          normed = std::move(next);
        }
        out->losses[key] = loss;
      });
    } else {
      Pass(chunk.index + 1, mb, 0, RankOfChunk(chunk.index + 1, mb), &x, true);
    }
  }

  void Backward(ModelChunk<T>& chunk, int64_t mb) {
    Rank& r = *ctx_.rank;
    r.set_pass(Pass::kBackward);
    Mat<T> dy(LocalRows(), spec_.dims.hidden);
    size_t unit = chunk.units.size();
    if (chunk.head) {
      BackwardUnit(chunk, --unit, [&] {
        Mat<T> dnormed;  // the gradient of the final norm's output from the MTP modules
        for (size_t k = MtpDepths(chunk); k >= 1; --k) {
          Mat<T> de;
          Mat<T> dh = MtpAt(chunk, k, mb, [&](MtpModule<T>& m) {
            return m.Backward(ctx_, k == MtpDepths(chunk) ? nullptr : &dnormed, &de);
          });
          chunk.lookup->Backward(ctx_, de, static_cast<int64_t>(k));
          dnormed = std::move(dh);
        }
        dy = chunk.head->Backward(ctx_, chunk.mtp.empty() ? nullptr : &dnormed);
      });
    } else {
      Pass(chunk.index, mb, 1, RankOfChunk(chunk.index + 1, mb), &dy, false);
    }
    for (size_t i = chunk.blocks.size(); i-- > 0;) {
      BackwardUnit(chunk, --unit, [&] {
        const CheckpointGroup* g = GroupOf(chunk, static_cast<int64_t>(i));
        if (g != nullptr && g->end == static_cast<int64_t>(i) + 1) Rerun(chunk, *g, mb);
        dy = chunk.blocks[i]->Backward(ctx_, dy);
        if (g != nullptr && g->first == static_cast<int64_t>(i)) chunk.checkpoints.erase({g->first, mb});
      });
    }
    if (chunk.embedding) {
      BackwardUnit(chunk, --unit, [&] { chunk.embedding->Backward(ctx_, dy); });
    } else {
      Pass(chunk.index - 1, mb, 1, RankOfChunk(chunk.index - 1, mb), &dy, true);
    }
  }

  /// Whether the forward at ops[j] keeps the last offload group of each
  /// module name on the device: its chunk is the first to run backward
  /// (Megatron's post_warmup_callback), or the next backward is its own
  /// (should_bulk_offload: every micro-batch of the last pipeline stage).
  static bool KeepsLastGroups(const std::vector<PipeOp>& ops, size_t j) {
    const auto same = [&](const PipeOp& b) { return b.chunk == ops[j].chunk && b.microbatch == ops[j].microbatch; };
    const auto first = std::find_if(ops.begin(), ops.end(), [](const PipeOp& o) { return !o.forward; });
    const auto next = std::find_if(ops.begin() + static_cast<std::ptrdiff_t>(j), ops.end(),
                                   [](const PipeOp& o) { return !o.forward; });
    return (first != ops.end() && same(*first)) || (next != ops.end() && same(*next));
  }

  /// For each block of a chunk, the offload modules whose last group in the
  /// chunk it runs (Megatron keeps groups by module name).
  std::vector<OffloadSet> LastGroups(const std::vector<char>& letters) const {
    std::vector<OffloadSet> out(letters.size());
    OffloadSet later;
    for (size_t i = letters.size(); i-- > 0;) {
      const OffloadSet mine =
          OffloadModulesOf(letters[i], spec_.dims.mla, spec_.recipe->training.transformer_engine, ctx_.rerun);
      out[i].bits = mine.bits & ~later.bits;
      later.bits |= mine.bits;
    }
    return out;
  }

  static const CheckpointGroup* GroupOf(const ModelChunk<T>& chunk, int64_t block) {
    for (const CheckpointGroup& g : chunk.groups) {
      if (block >= g.first && block < g.end) return &g;
    }
    return nullptr;
  }

  /// Recompute in backward, before the backward of the group's last block:
  /// the group's forward again from its kept input (parameters gathered
  /// under ZeRO 3), every collective and FLOP counted in the backward pass.
  /// What it keeps is charged as rerun memory until each block's backward
  /// frees it; the first block's input is the checkpoint itself.
  void Rerun(ModelChunk<T>& chunk, const CheckpointGroup& g, int64_t mb) {
    MemoryTracker& mem = ctx_.rank->memory();
    const Tensor<T>& kept = chunk.checkpoints.at({g.first, mb});
    Mat<T> x = kept.m;
    mem.set_saved_category(SimCategory::kRecomputed);
    mem.ExpectAlias(kept.alloc.bytes());
    if (offload_) offload_->set_checkpointed(true);
    for (int64_t j = g.first; j < g.end; ++j) {
      optimizer_->GatherUnit(ctx_, chunk.units[UnitOfBlock(chunk, j)]);
      mem.set_owner(std::string(1, chunk.letters[static_cast<size_t>(j)]));
      EnterOpPolicy(g, j, OpPass::kRerun);
      x = chunk.blocks[static_cast<size_t>(j)]->Forward(ctx_, x);
    }
    ctx_.op.pass = OpPass::kOff;
    if (offload_) offload_->set_checkpointed(false);
    mem.set_saved_category(SimCategory::kActivations);
  }

  /// Under torchtitan's per-op policy (recompute: selective_op), block `j` of
  /// checkpoint `g` runs in `pass`; the policy's mm count restarts with the
  /// checkpoint (one meta per checkpoint context and pass). A no-op otherwise.
  void EnterOpPolicy(const CheckpointGroup& g, int64_t j, OpPass pass) {
    if (spec_.recipe->training.recompute != Recompute::kSelectiveOp) return;
    if (j == g.first) ctx_.op.matmuls = 0;
    ctx_.op.pass = pass;
  }

  /// The optimizer unit of block `j` of a chunk (the embedding comes first).
  static size_t UnitOfBlock(const ModelChunk<T>& chunk, int64_t j) {
    return static_cast<size_t>(j) + (chunk.embedding ? 1 : 0);
  }

  const Spec& spec_;
  const RankGroups& groups_;
  Topology::Coord coord_;
  Ctx ctx_;
  std::vector<ModelChunk<T>> chunks_;
  size_t next_unit_ = 0;
  std::unique_ptr<DistOptimizer<T>> optimizer_;
  std::map<std::string, Mat<double>> before_;
  std::map<int64_t, Mat<T>> local_;
  std::unique_ptr<ActivationOffload> offload_;  // training.activation_offload; null without
  bool keeps_last_groups_ = false;              // the running forward's (KeepsLastGroups)
};

struct RunOutput {
  std::vector<RankResult> ranks;
  std::vector<RankMeasurement> measured;
};

/// A rank's results as bytes, for the transport runtime's gather (the values
/// are copied bit for bit: the verdict must not depend on the runtime).
class Encoder {
 public:
  template <class V>
  void Put(const V& v) {
    static_assert(std::is_trivially_copyable_v<V>);
    const char* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
  }
  void Put(const std::string& v) {
    Put(static_cast<uint64_t>(v.size()));
    bytes_.insert(bytes_.end(), v.begin(), v.end());
  }
  void Put(const Mat<double>& m) {
    Put(static_cast<int64_t>(m.rows()));
    Put(static_cast<int64_t>(m.cols()));
    const char* p = reinterpret_cast<const char*>(m.data());
    bytes_.insert(bytes_.end(), p, p + static_cast<size_t>(m.size()) * sizeof(double));
  }
  template <class V>
  void Put(const std::vector<V>& v) {
    Put(static_cast<uint64_t>(v.size()));
    for (const V& x : v) Put(x);
  }
  template <class K, class V>
  void Put(const std::map<K, V>& m) {
    Put(static_cast<uint64_t>(m.size()));
    for (const auto& [k, v] : m) Put(k), Put(v);
  }
  std::vector<char> Take() { return std::move(bytes_); }

 private:
  std::vector<char> bytes_;
};

class Decoder {
 public:
  explicit Decoder(const std::vector<char>& bytes) : bytes_(bytes) {}
  template <class V>
  void Get(V* v) {
    static_assert(std::is_trivially_copyable_v<V>);
    Need(sizeof *v);
    std::memcpy(v, bytes_.data() + at_, sizeof *v);
    at_ += sizeof *v;
  }
  void Get(std::string* v) {
    const size_t n = Size();
    Need(n);
    v->assign(bytes_.data() + at_, n);
    at_ += n;
  }
  void Get(Mat<double>* m) {
    int64_t rows = 0, cols = 0;
    Get(&rows);
    Get(&cols);
    Need(static_cast<size_t>(rows * cols) * sizeof(double));
    m->resize(rows, cols);
    std::memcpy(m->data(), bytes_.data() + at_, static_cast<size_t>(rows * cols) * sizeof(double));
    at_ += static_cast<size_t>(rows * cols) * sizeof(double);
  }
  template <class V>
  void Get(std::vector<V>* v) {
    v->resize(Size());
    for (V& x : *v) Get(&x);
  }
  template <class K, class V>
  void Get(std::map<K, V>* m) {
    for (size_t n = Size(); n > 0; --n) {
      K k{};
      Get(&k);
      Get(&(*m)[k]);
    }
  }

 private:
  size_t Size() {
    uint64_t n = 0;
    Get(&n);
    return static_cast<size_t>(n);
  }
  void Need(size_t n) const {
    if (at_ + n > bytes_.size()) throw SimError("a rank's results arrived truncated");
  }
  const std::vector<char>& bytes_;
  size_t at_ = 0;
};

template <class Coder, class Result, class Param, class Measurement>
void CodeResult(Coder& c, Result& r, Measurement& m) {
  const auto each = [&](auto&... v) {
    if constexpr (std::is_same_v<Coder, Encoder>) {
      (c.Put(v), ...);
    } else {
      (c.Get(&v), ...);
    }
  };
  each(r.coord, r.losses, r.outputs, r.dropped, r.peak_in_flight, r.flops);
  uint64_t params = r.params.size();
  each(params);
  if constexpr (!std::is_const_v<Result>) r.params.resize(static_cast<size_t>(params));
  for (Param& p : r.params) {
    each(p.name, p.shard, p.segments, p.rows, p.cols, p.expert, p.optimizer, p.tp_partial, p.tp_whole, p.grad,
         p.update);
  }
  each(m.rank, m.pipeline_rank, m.peak_in_flight, m.comm, m.peak_bytes, m.final_bytes, m.peak_total_bytes,
       m.activations_at_peak, m.host_peak_bytes, m.bytes_to_host, m.bytes_to_device, m.allocated_static_bytes,
       m.allocated_peak_bytes);
}

std::vector<char> EncodeResult(const RankResult& result, const RankMeasurement& measured) {
  Encoder e;
  CodeResult<Encoder, const RankResult, const ParamRecord, const RankMeasurement>(e, result, measured);
  return e.Take();
}

void DecodeResult(const std::vector<char>& bytes, RankResult* result, RankMeasurement* measured) {
  Decoder d(bytes);
  CodeResult<Decoder, RankResult, ParamRecord, RankMeasurement>(d, *result, *measured);
}

RankMeasurement Measure(const Rank& rank, const RankResult& result) {
  RankMeasurement m;
  m.rank = rank.id();
  m.pipeline_rank = result.coord.pp;
  m.peak_in_flight = result.peak_in_flight;
  m.comm = rank.Counts();
  for (int c = 0; c < kNumSimCategories; ++c) {
    m.peak_bytes[static_cast<size_t>(c)] = rank.memory().peak(static_cast<SimCategory>(c));
    m.final_bytes[static_cast<size_t>(c)] = rank.memory().live(static_cast<SimCategory>(c));
  }
  m.peak_total_bytes = rank.memory().peak_total();
  m.activations_at_peak = rank.memory().activations_at_peak();
  m.host_peak_bytes = rank.host_memory().peak_total();
  m.bytes_to_host = rank.bytes_to_host();
  m.bytes_to_device = rank.bytes_to_device();
  m.allocated_static_bytes = result.allocated_static;
  m.allocated_peak_bytes = result.allocated_peak;
  return m;
}

/// Under a transport every rank sends what it measured to rank 0, which
/// verifies as the in-process runtime does; the other ranks' outputs stay empty.
template <class T>
RunOutput RunWorld(const Spec& spec, Transport* transport) {
  const int n = spec.topo.world();
  World world(n, transport);
  const std::vector<RankGroups> groups =
      MakeGroups(world, spec.topo, spec.recipe->parallel.schedule == Schedule::kDualPipe);
  RunOutput out;
  out.ranks.resize(static_cast<size_t>(n));
  world.Run([&](Rank& rank) {
    const size_t i = static_cast<size_t>(rank.id());
    RankProgram<T> program(rank, spec, groups[i]);
    out.ranks[i] = program.Run();
  });
  if (transport != nullptr) {
    const int me = transport->rank();
    RankMeasurement mine = Measure(world.rank(me), out.ranks[static_cast<size_t>(me)]);
    if (me != 0) {
      transport->Send(nullptr, 0, Transport::kResultsTag, EncodeResult(out.ranks[static_cast<size_t>(me)], mine));
      return RunOutput{};
    }
    out.measured.push_back(std::move(mine));
    for (int i = 1; i < n; ++i) {
      out.measured.emplace_back();
      DecodeResult(transport->Recv(nullptr, i, Transport::kResultsTag, ""), &out.ranks[static_cast<size_t>(i)],
                   &out.measured.back());
    }
    return out;
  }
  for (int i = 0; i < n; ++i) out.measured.push_back(Measure(world.rank(i), out.ranks[static_cast<size_t>(i)]));
  return out;
}

/// The largest difference of `got` from `ref`, less `slack` per element where
/// given (what an AdamW update's gradient rounding explains,
/// AdamWFirstStepSlack): what remains is the error of the step itself.
ErrorStat Compare(const std::string& name, const Mat<double>& got, const Mat<double>& ref,
                  const Mat<double>& slack = Mat<double>()) {
  ErrorStat e;
  e.name = name;
  e.elements = ref.size();
  if (got.rows() != ref.rows() || got.cols() != ref.cols()) {
    e.max_abs = e.max_rel = std::numeric_limits<double>::infinity();
    return e;
  }
  Mat<double> error = (got - ref).cwiseAbs();
  if (slack.rows() == ref.rows() && slack.cols() == ref.cols()) error = (error - slack).cwiseMax(0.0);
  e.max_abs = ref.size() == 0 ? 0.0 : error.maxCoeff();
  const double scale = ref.size() == 0 ? 0.0 : ref.cwiseAbs().maxCoeff();
  e.max_rel = e.max_abs / std::max(scale, 1e-300);
  if (e.max_abs == 0.0) e.max_rel = 0.0;
  return e;
}

/// Which shard of a parameter a rank holds, and over how many parts.
std::pair<int, int> ShardOf(const ParamRecord& p, const Topology& topo, const Topology::Coord& c) {
  switch (p.shard) {
    case ShardKind::kReplicated: return {0, 1};
    case ShardKind::kColumns:
    case ShardKind::kRows: return {c.tp, topo.tp};
    case ShardKind::kExpertColumns:
    case ShardKind::kExpertRows: return {c.etp, topo.etp};
  }
  return {0, 1};
}

/// Assembles one global tensor per parameter from the ranks' records. The
/// gradient: every rank's contribution to a shard is summed (replicas over
/// data and context parallelism; with SP the replicated parameters' partial
/// sums over TP too), then the shards are placed and the sum divided by
/// `grad_divisor`. Updates: one tensor per replica, each compared.
struct Assembled {
  std::map<std::string, Mat<double>> grads;
  std::map<std::string, std::vector<Mat<double>>> updates;  // one per replica
  std::set<std::string> adamw;                              // the parameters AdamW steps
};

Assembled Assemble(const RunOutput& run, const Spec& spec, double grad_divisor) {
  struct Parts {
    const ParamRecord* any = nullptr;
    std::map<int, Mat<double>> grad_shards;
    std::map<std::vector<int>, std::map<int, const Mat<double>*>> update_replicas;
  };
  std::map<std::string, Parts> by_name;
  for (const RankResult& r : run.ranks) {
    for (const ParamRecord& p : r.params) {
      Parts& parts = by_name[p.name];
      parts.any = &p;
      const auto [index, count] = ShardOf(p, spec.topo, r.coord);
      (void)count;
      const bool partial =
          p.shard != ShardKind::kReplicated || (spec.sp && !p.tp_whole) || p.tp_partial || r.coord.tp == 0;
      if (partial) {
        auto [it, fresh] = parts.grad_shards.try_emplace(index, p.grad);
        if (!fresh) it->second += p.grad;
      }
      // A replica: every coordinate but the shard's own axis.
      // A tied embedding's copies on the first and last stage are replicas too.
      const std::vector<int> replica =
          p.expert >= 0 ? std::vector<int>{r.coord.edp}
                        : std::vector<int>{r.coord.cp, r.coord.dp, p.shard == ShardKind::kReplicated ? r.coord.tp : 0,
                                           r.coord.pp};
      parts.update_replicas[replica][index] = &p.update;
    }
  }
  Assembled out;
  for (const auto& [name, parts] : by_name) {
    const ParamRecord& p = *parts.any;
    std::vector<const Mat<double>*> shards;
    for (const auto& [i, m] : parts.grad_shards) shards.push_back(&m);
    out.grads[name] = AssembleShards(p.shard, p.rows, p.cols, p.segments, shards) / grad_divisor;
    if (p.optimizer == OptimizerKind::kAdamW) out.adamw.insert(name);
    for (const auto& [key, pieces] : parts.update_replicas) {
      std::vector<const Mat<double>*> u;
      for (const auto& [i, m] : pieces) u.push_back(m);
      out.updates[name].push_back(AssembleShards(p.shard, p.rows, p.cols, p.segments, u));
    }
  }
  return out;
}

/// The final hidden states and losses of every micro-batch, in data order,
/// assembled from the last pipeline stage's ranks.
struct StepOutputs {
  std::vector<double> losses;
  Mat<double> hidden;  // micro-batches stacked, global rows each
};

StepOutputs Outputs(const RunOutput& run, const Spec& spec, int64_t batches) {
  const Topology& topo = spec.topo;
  const int64_t rows = spec.dims.seq * spec.dims.batch;
  StepOutputs out;
  out.losses.assign(static_cast<size_t>(batches), 0.0);
  out.hidden = Mat<double>::Zero(batches * rows, spec.dims.hidden);
  for (const RankResult& r : run.ranks) {
    if (r.outputs.empty()) continue;
    const SeqLayout seq = SeqLayout::Make(spec.dims.seq, topo.cp, r.coord.cp, spec.load_balance);
    const int64_t cp_rows = seq.local_len() * spec.dims.batch;
    const int64_t per_rank = spec.sp ? cp_rows / topo.tp : cp_rows;
    for (const auto& [key, h] : r.outputs) {
      for (int64_t i = 0; i < h.rows(); ++i) {
        const int64_t local = (spec.sp ? r.coord.tp * per_rank : 0) + i;
        const int64_t global = seq.Position(local / spec.dims.batch) * spec.dims.batch + local % spec.dims.batch;
        out.hidden.row(key * rows + global) = h.row(i);
      }
      // Each CP rank's loss is the mean over its (equal share of) tokens.
      if (r.coord.tp == 0) out.losses[static_cast<size_t>(key)] += r.losses.at(key) / topo.cp;
    }
  }
  return out;
}

/// Router group of each global row of a micro-batch: the (CP rank, SP slice)
/// of the sharded rank that routes it.
std::vector<int64_t> RouterGroupsOfRows(const Spec& sharded) {
  const Topology& topo = sharded.topo;
  const int64_t batch = sharded.dims.batch;
  std::vector<int64_t> out(static_cast<size_t>(sharded.dims.seq * batch), 0);
  for (int c = 0; c < topo.cp; ++c) {
    const SeqLayout seq = SeqLayout::Make(sharded.dims.seq, topo.cp, c, sharded.load_balance);
    const int64_t cp_rows = seq.local_len() * batch;
    const int64_t slices = sharded.sp ? topo.tp : 1;
    for (int64_t i = 0; i < cp_rows; ++i) {
      const int64_t global = seq.Position(i / batch) * batch + i % batch;
      out[static_cast<size_t>(global)] = c * slices + i / (cp_rows / slices);
    }
  }
  return out;
}

OptimizerSettings SettingsOf(const Recipe& r, const SimOptions& opt, int zero, double grad_divisor) {
  const PrecisionConfig& prec = r.training.precision;
  OptimizerSettings s;
  s.adamw.lr = opt.adamw_lr;
  s.muon.lr = opt.muon_lr;
  s.zero = zero;
  // Megatron's layer-wise optimizer (validation: ZeRO 1) runs DDP's ZeRO-0
  // gradient all-reduce and keeps every parameter; it deals only the state.
  s.layer_wise = zero == 1 && r.parallel.optimizer_sharding == OptimizerSharding::kLayerWise;
  if (s.layer_wise) s.zero = 0;
  // fp32 master copies exist only when the parameters are kept in lower precision (as the estimator).
  s.master_bytes = prec.master && prec.params != DType::kFp32 ? SizeOf(*prec.master) : 0;
  s.momentum_bytes = SizeOf(r.training.optimizer.muon_momentum);
  s.dense_grad_scale = 1.0 / grad_divisor;
  s.expert_grad_scale = 1.0 / grad_divisor;
  // The offloads act on the distributed optimizer's shards (validation:
  // offload_fraction at ZeRO >= 1, fsdp_cpu_offload at ZeRO 3); the
  // unsharded reference keeps everything on its device.
  if (zero >= 1) s.offload_fraction = r.training.optimizer.offload_fraction;
  s.fsdp_cpu_offload = zero >= 3 && r.parallel.fsdp_cpu_offload;
  return s;
}

template <class T>
SimulationReport SimulateAs(const Recipe& recipe, const StagePlan& stages, const SimOptions& opt) {
  const std::vector<char> letters = LayerLetters(recipe);
  CheckSupported(recipe, letters, opt.transport == nullptr);

  Spec sharded;
  sharded.recipe = &recipe;
  sharded.topo = TopologyOf(recipe);
  sharded.dims = DimsOf(recipe, recipe.parallel.tp);
  sharded.letters = letters;
  for (char c : letters) sharded.kinds.push_back(static_cast<BlockKind>(c));
  sharded.stages = stages;
  // DualPipe's p stages run on every rank twice: chunk 0 its own, chunk 1 the mirror's copy.
  sharded.vpp =
      recipe.parallel.schedule == Schedule::kDualPipe
          ? 2
          : ChunkCountOf(recipe.parallel.schedule, recipe.parallel.pp, recipe.parallel.vpp) / recipe.parallel.pp;
  sharded.microbatches = recipe.micro_batches();
  sharded.sp = recipe.parallel.sp && recipe.parallel.tp > 1;
  sharded.load_balance = recipe.parallel.cp_load_balance;
  sharded.opt = opt;
  const Topology& topo = sharded.topo;
  const int64_t batches = topo.dp * sharded.microbatches;
  const Data data = MakeData(recipe, batches, opt.seed);
  sharded.data = &data;
  const double replicas = static_cast<double>(topo.dp) * topo.cp;
  sharded.optim = SettingsOf(recipe, opt, static_cast<int>(recipe.parallel.zero),
                             replicas * static_cast<double>(sharded.microbatches));

  // The unsharded reference: one rank, every layer, all micro-batches of all replicas.
  Spec reference = sharded;
  reference.topo = Topology();
  reference.stages = EqualStagePlan(static_cast<int64_t>(letters.size()), 1, 1);
  reference.vpp = 1;
  reference.microbatches = batches;
  reference.sp = false;
  reference.optim = SettingsOf(recipe, opt, 0, static_cast<double>(batches));
  reference.router_group_of_row = RouterGroupsOfRows(sharded);
  reference.router_groups = topo.cp * (sharded.sp ? topo.tp : 1);
  Recipe one_rank = recipe;
  one_rank.parallel.schedule = Schedule::k1F1B;
  // The reference keeps every activation: a rerun must give the values a
  // run without recompute gives.
  one_rank.training.recompute = Recompute::kNone;
  reference.recipe = &one_rank;

  const RunOutput run = RunWorld<T>(sharded, opt.transport);
  if (opt.transport != nullptr && opt.transport->rank() != 0) return SimulationReport{};
  const RunOutput ref = RunWorld<T>(reference, nullptr);  // one rank: in this process

  SimulationReport rep;
  rep.recipe_name = recipe.name;
  rep.ranks = topo.world();
  rep.microbatches = sharded.microbatches;
  const StepOutputs got = Outputs(run, sharded, batches);
  const StepOutputs want = Outputs(ref, reference, batches);
  for (int64_t k = 0; k < batches; ++k) {
    rep.loss_sharded += got.losses[static_cast<size_t>(k)] / static_cast<double>(batches);
    rep.loss_reference += want.losses[static_cast<size_t>(k)] / static_cast<double>(batches);
  }
  const auto as_mat = [](const std::vector<double>& v) {
    return Mat<double>(Eigen::Map<const Mat<double>>(v.data(), 1, static_cast<int64_t>(v.size())));
  };
  rep.loss = Compare("loss", as_mat(got.losses), as_mat(want.losses));
  rep.output = Compare("output", got.hidden, want.hidden);
  const Assembled a = Assemble(run, sharded, replicas * static_cast<double>(sharded.microbatches));
  const Assembled b = Assemble(ref, reference, static_cast<double>(batches));
  for (const auto& [name, g] : b.grads) {
    const auto it = a.grads.find(name);
    rep.gradients.push_back(Compare(name, it == a.grads.end() ? Mat<double>() : it->second, g));
    if (rep.gradients.back().max_rel >= rep.worst_gradient.max_rel) rep.worst_gradient = rep.gradients.back();
    const Mat<double>& want_update = b.updates.at(name).at(0);
    ErrorStat worst = Compare(name, Mat<double>(), want_update);
    const auto ut = a.updates.find(name);
    if (ut != a.updates.end()) {
      worst = ErrorStat{name, want_update.size(), 0.0, 0.0};
      const Mat<double> slack = a.adamw.count(name) != 0 && it != a.grads.end() && sharded.optim.step == 1
                                    ? AdamWFirstStepSlack(sharded.optim.adamw, it->second, g)
                                    : Mat<double>();
      for (const Mat<double>& u : ut->second) {
        const ErrorStat e = Compare(name, u, want_update, slack);
        if (e.max_rel >= worst.max_rel) worst = e;
      }
    }
    rep.updates.push_back(worst);
    if (worst.max_rel >= rep.worst_update.max_rel) rep.worst_update = worst;
  }
  for (const RankResult& rr : run.ranks) {
    rep.dropped_pairs += rr.dropped;
    rep.flops += rr.flops;
  }
  rep.dropped_pairs_reference = ref.ranks[0].dropped;
  rep.per_rank = run.measured;
  return rep;
}

}  // namespace
}  // namespace sim

void CheckExecutorSupports(const Recipe& recipe, bool in_process) {
  sim::CheckSupported(recipe, sim::LayerLetters(recipe), in_process);
}

SimulationReport RunExecutor(const Recipe& recipe, const StagePlan& stages, const SimOptions& options) {
  if (options.precision == SimPrecision::kFp32) return sim::SimulateAs<float>(recipe, stages, options);
  return sim::SimulateAs<double>(recipe, stages, options);
}

}  // namespace preflight

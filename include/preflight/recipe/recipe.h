// The recipe: a validated, typed copy of the recipe YAML (docs/architecture.md).
// Plain structs only; yaml-cpp stays inside preflight_recipe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// One letter of the layer pattern. Each letter is one pre-norm residual
/// sublayer x <- x + F(RMSNorm(x)) (docs/formulas.md §0).
enum class BlockKind : char {
  kAttention = 'A',  // GQA/MQA/MHA or MLA self-attention
  kMamba = 'M',      // Mamba-2 mixer
  kMoe = 'E',        // mixture-of-experts FFN
  kRecurrent = 'R',  // RG-LRU recurrent block (Griffin)
  kDenseMlp = 'D',   // dense FFN
};
inline constexpr BlockKind kAllBlockKinds[] = {BlockKind::kAttention, BlockKind::kMamba, BlockKind::kMoe,
                                                 BlockKind::kRecurrent, BlockKind::kDenseMlp};
inline char Letter(BlockKind k) { return static_cast<char>(k); }

enum class DType { kFp32, kBf16, kFp16, kFp8 };
/// Bytes of one element.
inline int64_t SizeOf(DType d) {
  switch (d) {
    case DType::kFp32: return 4;
    case DType::kBf16: return 2;
    case DType::kFp16: return 2;
    case DType::kFp8: return 1;
  }
  return 4;
}
const char* Name(DType d);
/// The 4-bit GEMM formats (training.precision.fp4): E2M1 values, two a byte,
/// with NVFP4's E4M3 scale per 16 values and fp32 scale per tensor
/// (Transformer Engine's NVFP4BlockScaling) or MXFP4's E8M0 scale per 32 (OCP
/// MX). docs/formulas.md §2.5.
enum class Fp4Format { kNone, kNvfp4, kMxfp4 };
const char* Name(Fp4Format f);

/// kSelectiveOp: torchtitan's per-op selective checkpointing (SelectiveAC,
/// selective_ac_option "op"): each transformer block is one checkpoint whose
/// policy saves the attention core's outputs and every other matmul output.
enum class Recompute { kNone, kSelective, kFull, kSelectiveOp };
const char* Name(Recompute r);
/// Which layers full recompute checkpoints, per model chunk (Megatron
/// --recompute-method, recompute.py): uniform, every group of N consecutive
/// layers as one checkpoint rerun together; block, the first N layers one
/// checkpoint each, the rest with every activation kept.
enum class RecomputeMethod { kUniform, kBlock };
const char* Name(RecomputeMethod m);
/// How the loss is computed over the head's logits: Megatron-LM's
/// vocab-parallel cross entropy (cross_entropy.py: one fp32 copy of the
/// logits turned into the softmax in place and saved), or
/// torch.nn.functional.cross_entropy on logits.float() (torchtitan's eager
/// loss: log_softmax's fp32 output saved; its backward holds three fp32
/// copies of the logits).
enum class CrossEntropy { kVocabParallel, kFp32Upcast };
const char* Name(CrossEntropy c);
/// What selective recompute reruns in backward, as Megatron-LM names its
/// --recompute-modules (transformer_config.py): the attention core, the routed
/// experts' activation, the separate norms, MLA's up-projections, the dense
/// MLP, the whole MoE layer, the shared experts.
enum class RecomputeModule { kCoreAttn, kMoeAct, kLayernorm, kMlaUpProj, kMlp, kMoe, kSharedExperts };
inline constexpr RecomputeModule kAllRecomputeModules[] = {
    RecomputeModule::kCoreAttn, RecomputeModule::kMoeAct, RecomputeModule::kLayernorm,    RecomputeModule::kMlaUpProj,
    RecomputeModule::kMlp,      RecomputeModule::kMoe,    RecomputeModule::kSharedExperts};
const char* Name(RecomputeModule m);
/// A set of enum values E, bit i for the value i.
template <class E>
struct EnumSet {
  uint32_t bits = 0;
  bool has(E e) const { return (bits >> static_cast<int>(e) & 1u) != 0; }
  bool empty() const { return bits == 0; }
  static EnumSet Of(E e) { return {1u << static_cast<int>(e)}; }
  bool operator==(const EnumSet&) const = default;
};
using ModuleSet = EnumSet<RecomputeModule>;
/// Megatron-LM's fine-grained activation offloading (--offload-modules,
/// fine_grained_activation_offload.py): the tensors a module saves for
/// backward inside its scope go to host memory after its forward and come
/// back before its backward. The input norm, the QKV projections (with
/// their norms), the attention core, the output projection, the pre-MLP
/// norm, the routed experts' fc1 and their activation.
enum class OffloadModule { kAttnNorm, kQkvLinear, kCoreAttn, kAttnProj, kMlpNorm, kExpertFc1, kMoeAct };
inline constexpr OffloadModule kAllOffloadModules[] = {
    OffloadModule::kAttnNorm, OffloadModule::kQkvLinear, OffloadModule::kCoreAttn, OffloadModule::kAttnProj,
    OffloadModule::kMlpNorm,  OffloadModule::kExpertFc1, OffloadModule::kMoeAct};
const char* Name(OffloadModule m);
using OffloadSet = EnumSet<OffloadModule>;
/// "[core_attn, mlp]", in RecomputeModule order.
std::string RecomputeModulesText(ModuleSet set);
/// "[attn_norm, core_attn]", in OffloadModule order.
std::string OffloadModulesText(OffloadSet set);
/// Dense-MLP activation: SwiGLU is gated (three matrices); GeLU and squared
/// ReLU (Nemotron-H's relu2) are not (two matrices: up, down).
enum class FfnActivation { kSwiglu, kGelu, kRelu2 };
const char* Name(FfnActivation a);
enum class NormKind { kRmsNorm, kLayerNorm };
const char* Name(NormKind n);
enum class OptimizerKind { kAdamW, kMuon };
const char* Name(OptimizerKind o);
enum class Schedule { k1F1B, kInterleaved, kDualPipe, kDualPipeV };
const char* Name(Schedule s);
/// Whose rule cuts the layers into pipeline stages when the recipe pins none:
/// Megatron-LM's even split (with its first/last-stage and account-for keys),
/// torchtitan's (embedding and output weighted as one layer each), or
/// preflight's time-balanced cut on layer boundaries.
enum class Partition { kMegatron, kTorchtitan, kBalanced };
const char* Name(Partition p);
/// How the word embedding sits on the TP ranks: vocab-parallel rows (Megatron
/// VocabParallelEmbedding, torchtitan's sharded tok_embeddings) or a whole
/// copy on each rank.
enum class EmbeddingSplit { kVocabParallel, kReplicated };
const char* Name(EmbeddingSplit e);
/// Rank order, innermost axis first (docs/formulas.md §7.3).
enum class AxisOrder { kTpCpDpPp, kTpCpPpDp };
const char* Name(AxisOrder o);
enum class CpComm { kP2p, kAllGather, kA2a };
const char* Name(CpComm c);
/// How ZeRO 1 spreads the optimizer state over the data-parallel ranks:
/// element shards of flat buffers (Megatron's distributed optimizer, FSDP), or
/// whole tensors dealt to ranks by size (Megatron's layer-wise distributed
/// optimizer: --optimizer muon --use-distributed-optimizer
/// --no-use-layer-wise-param-layout).
enum class OptimizerSharding { kFlat, kLayerWise };
/// "flat", "layer_wise" (the recipe's parallel.optimizer_sharding values).
const char* Name(OptimizerSharding s);
/// How M and R blocks run under context parallelism: Megatron's all-to-all
/// (sequence-split -> head-split around the mixer, docs/formulas.md §7.2) or a state
/// hand-off along the CP chain (conv tail + recurrent state, [OURS]).
enum class CpRecurrent { kAllToAll, kHandoff };
/// "all_to_all", "handoff" (the recipe's parallel.cp_recurrent values).
const char* Name(CpRecurrent c);
enum class RouterScore { kSoftmax, kSigmoid };
const char* Name(RouterScore r);
/// How MoE tokens reach their experts (Megatron --moe-token-dispatcher-type):
/// all-to-all over EP, all-gather over TP x EP (tokens gathered, each rank
/// keeps its experts' rows, reduce-scatter back), or DeepEP / HybridEP (flex).
enum class MoeDispatcher { kAllToAll, kAllGather, kFlex };
/// "alltoall", "allgather", "flex" (the recipe's model.moe.dispatcher values).
const char* Name(MoeDispatcher d);

struct AttentionConfig {  // GQA (kv_heads < heads), MQA (kv_heads 1), MHA (kv_heads == heads)
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  bool qk_norm = false;  // two d_h RMSNorm weights, replicated
};

struct MlaConfig {  // DeepSeek-V2/V3 multi-head latent attention (docs/formulas.md §1.3)
  int64_t heads = 128;
  int64_t q_lora_rank = 1536;  // 0 = no query compression (W_q is h x heads*(nope+rope))
  int64_t kv_lora_rank = 512;
  int64_t qk_rope_head_dim = 64;
  int64_t qk_nope_head_dim = 128;
  int64_t v_head_dim = 128;
};

struct MlpConfig {  // the D block
  int64_t ffn_hidden = 14336;
  FfnActivation activation = FfnActivation::kSwiglu;
};

struct MoeConfig {  // the E block (docs/formulas.md §1.5, 5)
  int64_t experts = 64;
  int64_t top_k = 2;
  int64_t ffn_hidden = 2048;          // per routed expert
  int64_t shared_experts = 0;         // count of shared experts
  int64_t shared_ffn_hidden = 0;      // total shared FFN width; 0 = shared_experts * ffn_hidden
  double capacity_factor = 1.25;      // used when !dropless
  bool dropless = false;
  bool pad_to_capacity = false;
  double dropless_skew = 1.25;        // gamma >= 1 applied to received tokens in dropless mode [OURS]
  RouterScore router = RouterScore::kSoftmax;
  bool router_bias = false;           // per-expert bias for aux-loss-free balancing (DSv3)
  bool shared_gate = false;           // sigmoid gate on the shared expert (Qwen2-MoE)
  int64_t first_k_dense = 0;          // the first k E slots become dense D blocks
  int64_t layer_freq = 1;             // E slot j (after first_k_dense) is MoE iff j % layer_freq == layer_offset
  int64_t layer_offset = 0;
  /// Routed experts' FFN: swiglu (gate + up, 3 matrices) or a non-gated gelu /
  /// relu2 (2 matrices); Megatron's --swiglu sets experts and dense MLP alike.
  FfnActivation activation = FfnActivation::kSwiglu;
  /// Experts run as one grouped GEMM (Megatron --moe-grouped-gemm; with
  /// Transformer Engine that is TE GroupedLinear, which keeps its own
  /// per-stream cuBLAS workspaces).
  bool grouped_gemm = true;
  MoeDispatcher dispatcher = MoeDispatcher::kAllToAll;
  /// Width of the shared expert FFN (0 = none).
  int64_t SharedWidth() const { return shared_ffn_hidden > 0 ? shared_ffn_hidden : shared_experts * ffn_hidden; }
};

struct MambaConfig {  // Mamba-2 mixer (docs/formulas.md §1.4)
  int64_t d_state = 128;
  int64_t d_conv = 4;
  int64_t expand = 2;
  int64_t head_dim = 64;
  int64_t groups = 8;
  int64_t chunk = 256;
  /// true: state-spaces/mamba's fused kernel (gated norm + out_proj inside, both
  /// recomputed in backward); false: Megatron's mamba_mixer path, which keeps
  /// the gated y and the norm output for backward (docs/formulas.md §3.2) [OURS: knob].
  bool fused_norm_out_proj = false;
  /// Megatron --mamba-num-heads, for inner widths that are not a whole
  /// multiple of hidden (Falcon-H1, Nemotron 3): 0 = expand x hidden / head_dim.
  int64_t heads = 0;

  /// The inner width d_inner: heads x head_dim, or expand x hidden when heads is 0.
  int64_t Inner(int64_t hidden) const { return heads > 0 ? heads * head_dim : expand * hidden; }
  /// The SSM head count H = d_inner / head_dim.
  int64_t Heads(int64_t hidden) const { return Inner(hidden) / head_dim; }
};

struct RecurrentConfig {  // RG-LRU block after Griffin (docs/formulas.md §1.6)
  int64_t width = 4096;  // d_r
  int64_t heads = 32;    // n_b, blocks of the block-diagonal gate matrices
  int64_t d_conv = 4;    // K_r
};

struct ModelConfig {
  std::string pattern = "AEMEAEMEAEMR";
  int64_t repeat = 4;
  /// The expanded per-layer list, after repeat, first_k_dense and layer_freq.
  std::vector<BlockKind> layers;
  int64_t hidden = 4096;
  int64_t vocab = 131072;
  int64_t vocab_pad_multiple = 128;  // padded to a multiple of this times TP (Megatron)
  bool tie_embeddings = false;
  /// Biases on every linear of A, D and E blocks (Megatron's default unless
  /// --disable-bias-linear); false for Llama-style models.
  bool linear_bias = false;
  /// Learned absolute position embeddings [positions, hidden] on the first
  /// stage (Megatron --position-embedding-type learned_absolute with
  /// --max-position-embeddings); 0 = none (RoPE).
  int64_t learned_positions = 0;
  /// Multi-token prediction modules on the last stage (Megatron
  /// --mtp-num-layers; DeepSeek-V3): each an embedding of the shifted tokens,
  /// two norms, a [2h, h] projection, one transformer layer like the model's
  /// last, a final norm and the shared output head with its own loss.
  int64_t mtp_layers = 0;
  /// One MTP module's weights applied at every depth (Megatron
  /// --mtp-use-repeated-layer): parameters once, activations per depth.
  bool mtp_shared_layer = false;
  NormKind norm = NormKind::kRmsNorm;
  AttentionConfig attention;
  std::optional<MlaConfig> mla;  // when set, A layers are MLA
  MlpConfig mlp;
  MoeConfig moe;
  MambaConfig mamba;
  RecurrentConfig recurrent;
  /// The last pipeline stage holds the word embedding too (tied head, or MTP),
  /// kept in step with the first stage's by the embedding group.
  bool embedding_on_last_stage() const { return tie_embeddings || mtp_layers > 0; }
};

struct PrecisionConfig {
  DType params = DType::kBf16;
  DType grads = DType::kFp32;
  std::optional<DType> master = DType::kFp32;  // nullopt = "none"
  DType activations = DType::kBf16;
  /// The linear layers' GEMMs in FP4 (Megatron --fp4-format e2m1 --fp4-recipe).
  Fp4Format fp4 = Fp4Format::kNone;
  /// The linear weights kept in FP4 only, without a params-dtype copy
  /// (Megatron --fp4-param-gather).
  bool fp4_params = false;
};

struct OptimizerConfig {
  OptimizerKind matrices = OptimizerKind::kAdamW;  // 2-D hidden matrices (what published models trained with)
  OptimizerKind other = OptimizerKind::kAdamW;     // everything else (fixed: AdamW)
  DType muon_momentum = DType::kFp32;
  OptimizerKind mamba_in_proj = OptimizerKind::kAdamW;  // Megatron excludes in_proj from Muon
  OptimizerKind router = OptimizerKind::kAdamW;         // the project's default (docs/formulas.md §9.4)
  /// Share of each rank's optimizer elements whose fp32 param, grad and Adam
  /// state live in host memory (Megatron --optimizer-cpu-offload
  /// --optimizer-offload-fraction); 0 = none.
  double offload_fraction = 0.0;
};

struct TrainingConfig {
  int64_t seq_len = 8192;
  int64_t micro_batch = 1;
  int64_t global_batch = 512;
  Recompute recompute = Recompute::kSelective;
  /// Under selective recompute, what is rerun (Megatron's default: the
  /// attention core alone). Ignored under none and full.
  ModuleSet recompute_modules = ModuleSet::Of(RecomputeModule::kCoreAttn);
  /// Under full recompute, which layers of each chunk are checkpointed, N =
  /// recompute_layers (Megatron --recompute-method --recompute-num-layers).
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;
  int64_t recompute_layers = 1;
  /// Modules whose saved tensors go to host memory between their forward and
  /// backward (Megatron --fine-grained-activation-offloading
  /// --offload-modules); empty = none.
  OffloadSet activation_offload;
  /// Smaller saved tensors stay on the device (Megatron
  /// --min-offloaded-tensor-size, elements).
  int64_t activation_offload_min_elements = int64_t{1} << 20;
  CrossEntropy cross_entropy = CrossEntropy::kVocabParallel;
  bool flash_attention = true;   // false adds the s^2 softmax terms of Korthikanti
  double dropout = 0.0;          // > 0 saves dropout masks (Korthikanti's assumption)
  /// Layers run on Transformer Engine (Megatron --transformer-impl
  /// transformer_engine, its default); TE keeps its own cuBLAS workspace.
  bool transformer_engine = true;
  /// Norms, RoPE, activations and residual adds run as fused kernels
  /// (Transformer Engine, Megatron's fusions, torch.compile); false: as eager
  /// PyTorch ops, one kernel each (torchtitan without compile). Time only.
  bool fused_elementwise = true;
  /// The output layer's weight gradient waits for the pipeline flush
  /// (Megatron --defer-embedding-wgrad-compute): the last stage keeps the
  /// layer's input and output gradient of the first deferred micro-batches.
  bool defer_head_wgrad = false;
  /// Micro-batches deferred (Megatron --wgrad-deferral-limit); 0 = all of them.
  int64_t head_wgrad_deferral_limit = 0;
  /// Flextron elastic-width training with soft masks and a trained router
  /// (Megatron-LM pretrain_hybrid_flex.py --flextron --enable-router
  /// --soft-mask): the embedding widths its masks blend (len(--emb-int-list));
  /// 0 = off. Each masked product keeps a copy of its input for the router's
  /// gradient (estimator/memory_terms.cc FlextronTokenBytes).
  int64_t flextron_emb_choices = 0;
  /// Its Mamba head-count choices (len(--mamba-int-list)).
  int64_t flextron_mamba_choices = 0;
  bool flextron() const { return flextron_emb_choices > 0; }
  PrecisionConfig precision;
  OptimizerConfig optimizer;
};

/// Whether backward reruns module `m` of a layer under `policy`: full
/// recompute reruns everything, selective what training.recompute_modules lists.
inline bool Reruns(const TrainingConfig& training, Recompute policy, RecomputeModule m) {
  return policy == Recompute::kFull || (policy == Recompute::kSelective && training.recompute_modules.has(m));
}

struct ParallelConfig {
  int64_t tp = 1;
  bool sp = true;  // sequence parallel (only meaningful with tp > 1)
  int64_t cp = 1;
  int64_t pp = 1;
  int64_t vpp = 1;
  int64_t ep = 1;
  int64_t expert_tp = 1;
  int64_t zero = 1;  // 0 DDP, 1 optimizer, 2 +grads, 3 +params (FSDP)
  /// HSDP: the d*c data-parallel ranks form this many replicas; ZeRO shards
  /// inside each replica (d*c / dp_replicate ranks, consecutive), replicas
  /// all-reduce their shards (Megatron --num-distributed-optimizer-instances,
  /// torchtitan data_parallel_replicate_degree).
  int64_t dp_replicate = 1;
  /// ZeRO 1's unit of ownership (OptimizerSharding); layer_wise needs zero 1.
  OptimizerSharding optimizer_sharding = OptimizerSharding::kFlat;
  /// FSDP2's CPU offload (torchtitan training.enable_cpu_offload,
  /// CPUOffloadPolicy): with ZeRO 3, the sharded fp32 params, their grads and
  /// the AdamW state live in host memory and the optimizer steps on the CPU;
  /// each all-gather first copies its shard up, each reduce-scatter's shard
  /// comes down.
  bool fsdp_cpu_offload = false;
  Schedule schedule = Schedule::k1F1B;
  /// The interleaved schedule's micro-batch group: each virtual stage runs
  /// this many micro-batches in a row before the next chunk (Megatron
  /// --microbatch-group-size-per-virtual-pipeline-stage); 0 = pp, Megatron's
  /// default. Ignored by the other schedules.
  int64_t microbatch_group = 0;
  AxisOrder order = AxisOrder::kTpCpDpPp;
  CpComm cp_comm = CpComm::kP2p;
  CpRecurrent cp_recurrent = CpRecurrent::kAllToAll;
  /// Causal load balancing: 2c chunks, rank r holds r and 2c-1-r (TE/Megatron).
  bool cp_load_balance = true;
  EmbeddingSplit embedding = EmbeddingSplit::kVocabParallel;
  /// Optional pinned stage boundaries: layer index where each stage after the first starts.
  std::vector<int64_t> stage_boundaries;
  Partition partition = Partition::kMegatron;
  /// Megatron's uneven first/last stage (--decoder-first/last-pipeline-num-layers); 0 = even.
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  /// Megatron's --account-for-embedding/loss-in-pipeline-split: each counts as a layer.
  bool embedding_in_split = false;
  bool loss_in_split = false;
  /// Communication overlap, each off as in Megatron-LM by default:
  /// --overlap-grad-reduce (ZeRO 0/1 gradient reduce in buckets during the
  /// last backward), --overlap-param-gather (the ZeRO 1 parameter gather in
  /// buckets during the next forward), --tp-comm-overlap (TE userbuffers: TP
  /// all-gathers and reduce-scatters under the GEMMs beside them),
  /// --overlap-moe-expert-parallel-comm (EP all-to-alls under another
  /// micro-batch's compute). ZeRO 2/3 unit-by-unit traffic always overlaps
  /// (FSDP, DeepSpeed overlap_comm).
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool tp_comm_overlap = false;
  bool ep_comm_overlap = false;
};

/// Achievable fractions of a device's peaks, per kernel class: what the
/// step-time model prices each operation at (docs/plan.md "Device rates").
/// Measured on the device (bench/device/), or fitted on published runs where
/// no device was at hand; every figure's origin is in names.cc.
struct KernelRates {
  double gemm = 0;              // large bf16/fp16 GEMMs, of the dense peak
  double gemm_fp8 = 0;          // fp8 GEMMs with tensorwise scales, of the fp8 peak
  double gemm_memory = 0;       // GEMMs bound by their operands' bytes, of HBM bandwidth
  double hbm = 0;               // elementwise kernels (copy, norm, activation), of HBM bandwidth
  double attention_fused = 0;   // cuDNN fused attention (TE's default), forward+backward, long sequences
  double attention_flash2 = 0;  // FlashAttention-2 (PyTorch SDPA's flash backend), the same
  /// Sequence length at which attention runs at half its long-sequence rate:
  /// rate(s) = rate * s / (s + attention_half_seq).
  double attention_half_seq = 0;
  /// A GEMM's output tile pays a fixed prologue and epilogue worth this many
  /// steps of its K loop: compute time x (1 + gemm_tile_k / K), so short-K
  /// GEMMs (TP-sliced row projections) run slower.
  double gemm_tile_k = 0;
};

/// Hardware preset values (docs/formulas.md §2.4: device capacity as CUDA reports it).
struct GpuSpec {
  std::string name;
  int64_t capacity_mib = 0;
  double bf16_dense_tflops = 0;      // peak dense bf16 (fp16 the same on every preset)
  double nvlink_gbps_per_dir = 0;    // GB/s per GPU per direction
  double ib_gbps_per_dir = 0;        // GB/s per GPU per direction
  double host_link_gbps_per_dir = 0;  // GPU <-> host (PCIe or C2C), GB/s per GPU per direction
  double host_memory_gib = 0;         // host memory per node
  double fp8_dense_tflops = 0;        // 0: no fp8 tensor cores
  double fp4_dense_tflops = 0;        // 0: no fp4 tensor cores
  double hbm_gbps = 0;                // HBM bandwidth, GB/s
  /// GPUs one NVLink domain joins: a node's 8 on HGX/DGX, 72 on GB200 NVL72,
  /// 2 on bridged H100 NVL pairs. Groups inside a domain talk over NVLink.
  int64_t nvlink_domain = 0;
  KernelRates rates;
};

/// A device the recipe describes (cluster.device) instead of naming a preset.
struct CustomDevice {
  /// The preset whose figures fill every key the recipe leaves out; "" = none
  /// (then every figure pricing needs is given).
  std::string based_on;
  GpuSpec spec;  // the recipe's figures, based_on's for the rest
};

struct ClusterConfig {
  std::string gpu = "h200";  // the preset; "" when `device` describes the device
  std::optional<CustomDevice> device;
  GpuSpec spec;  // what is priced: the preset's or the device's figures, with the overrides below
  int64_t nodes = 8;
  int64_t gpus_per_node = 8;
  double reserve_gib = 3.0;        // CUDA context + NCCL buffers (outside the caching allocator)
  double min_headroom_gib = 4.0;   // floor below which fit warns / check fails
  double allocator_overhead = 0.05;  // fraction of allocator-managed bytes lost to fragmentation
  int64_t capacity_mib = 0;        // device capacity override in MiB; 0 = the preset's (spec.capacity_mib)
  double host_memory_gib = 0;      // host memory per node override; 0 = the preset's (spec.host_memory_gib)
  /// One cuBLAS workspace in MiB: 32 on Hopper and later (cuBLAS's
  /// recommendation, TE's get_cublas_workspace_size_bytes, and
  /// CUBLAS_WORKSPACE_CONFIG=:4096:8), 4 before.
  int64_t cublas_workspace_mib = 32;
  int64_t world() const { return nodes * gpus_per_node; }
};

struct ServingConfig {
  int64_t batch = 64;
  int64_t context = 32768;
  DType kv_dtype = DType::kBf16;
  DType ssm_dtype = DType::kFp32;
};

/// Where each key came from, for diagnostics after parsing (key path -> mark).
struct SourceMap {
  std::string file;
  /// Mark of each key's value as written ("parallel.tp", "parallel.stage_boundaries[1]").
  std::map<std::string, SourceMark> marks;
  /// The recipe text split into lines (shared: recipes are copied freely by sweeps).
  std::shared_ptr<const std::vector<std::string>> lines;
  /// Keys set by `--set`, in command-line order: (key path, the override as typed,
  /// "--set parallel.tp=8"). A key under an overridden path came from the override.
  std::vector<std::pair<std::string, std::string>> overrides;

  /// The mark of `key_path`, or of its nearest present parent, or line 0.
  SourceMark Find(const std::string& key_path) const;
  /// The override that set `key_path` (or a parent of it), or nullptr.
  const std::string* OverrideFor(const std::string& key_path) const;
  /// A diagnostic about `key_path` located at Find(key_path), with its source
  /// line; when the key came from `--set`, it names the override instead of a
  /// file position. For checks outside the parser (planner, fit).
  Diagnostic At(const std::string& key_path, std::string value, std::string message,
                Severity severity = Severity::kError) const;
  /// As At, at an explicit mark (e.g. a key node rather than its value).
  Diagnostic AtMark(SourceMark mark, const std::string& key_path, std::string value, std::string message,
                    Severity severity = Severity::kError) const;
};

struct Recipe {
  std::string name = "unnamed";
  ModelConfig model;
  TrainingConfig training;
  ParallelConfig parallel;
  ClusterConfig cluster;
  std::optional<ServingConfig> serving;
  SourceMap source;

  int64_t world() const { return cluster.world(); }
  /// Data-parallel degree for dense layers: world / (tp * cp * pp).
  int64_t dp() const { return world() / (parallel.tp * parallel.cp * parallel.pp); }
  /// Expert-data-parallel degree: tp * cp * dp / (ep * expert_tp) (Megatron folding).
  int64_t expert_dp() const { return parallel.tp * parallel.cp * dp() / (parallel.ep * parallel.expert_tp); }
  /// Micro-batches per step per pipeline: global_batch / (micro_batch * dp).
  int64_t micro_batches() const { return training.global_batch / (training.micro_batch * dp()); }
};

/// Whether a layer's pre-norm is a module of its own, which the selective
/// "layernorm" module reruns: Transformer Engine fuses the attention and
/// dense-MLP norms into the next linear (TELayerNormColumnParallelLinear; the
/// layer's norm is an IdentityOp in Megatron's transformer_layer.py), while
/// the MoE pre-MLP norm (the router reads its output) and MLA's input norm
/// (two down-projections read it) stay separate TENorm modules. Without TE
/// every attention, MLP and MoE norm is separate. Mamba and R mixers keep
/// their norm inside the mixer.
inline bool NormIsOwnModule(const Recipe& recipe, BlockKind kind) {
  if (kind == BlockKind::kMamba || kind == BlockKind::kRecurrent) return false;
  if (!recipe.training.transformer_engine) return true;
  return kind == BlockKind::kMoe || (kind == BlockKind::kAttention && recipe.model.mla.has_value());
}

/// Result of loading: a recipe when there are no errors, else diagnostics.
struct LoadResult {
  std::optional<Recipe> recipe;
  std::vector<Diagnostic> diagnostics;  // errors and warnings, in file order
  bool ok() const { return recipe.has_value(); }
};

/// A `--set key.path=value` override.
struct Override {
  std::string key_path;
  std::string value;  // parsed as a YAML scalar or flow node
};

/// Parses and validates YAML text. `file` names the source in diagnostics.
LoadResult LoadRecipeFromString(const std::string& yaml, const std::string& file,
                                const std::vector<Override>& overrides = {});
/// Reads `path` and calls LoadRecipeFromString.
LoadResult LoadRecipeFile(const std::string& path, const std::vector<Override>& overrides = {});
/// Re-checks a typed recipe, e.g. one a sweep built by changing degrees: the
/// integer ranges of the schema, then every semantic check LoadRecipeFromString
/// runs (divisibility, mesh, batch, schedule, stage boundaries). Returns the
/// errors and warnings, located through recipe.source; the recipe is valid
/// when !HasErrors(result). Does not re-expand model.layers from the pattern.
std::vector<Diagnostic> ValidateRecipe(const Recipe& recipe);
/// Parses "a.b.c=value"; nullopt when there is no '=' or the path is empty
/// (or has an empty component, "a..b"), or the value spans lines.
std::optional<Override> ParseOverride(const std::string& text);

/// The preset for `name` ("h200", "h100"); nullopt when unknown.
std::optional<GpuSpec> GpuPreset(const std::string& name);
/// Names of all presets, for "what would be valid" messages.
std::vector<std::string> GpuPresetNames();
/// What was priced, for every output to name: the preset ("h200"), with the
/// recipe's overrides ("h200 (capacity_mib 81920 from the recipe)"), or a
/// custom device ("custom 'mygpu'", "custom 'mygpu' based on h100").
std::string DeviceLabel(const ClusterConfig& cluster);

}  // namespace preflight

// Blocks of the reference executor, forward and hand-written backward
// (docs/formulas.md §8), sharded as the inventory says (docs/formulas.md §8.3). One object per
// rank and layer; it keeps exactly the tensors its backward reads, tagged as
// activations, and frees them in backward.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"

#include "activation_offload.h"
#include "op_policy.h"
#include "tensor.h"
#include "world.h"

namespace preflight::sim {

/// Model sizes of the (scaled) recipe.
struct Dims {
  int64_t hidden = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  // MLA (docs/formulas.md §1.3): A layers are latent attention when `mla`;
  // q_lora 0 = no query down-projection.
  bool mla = false;
  int64_t mla_q_lora = 0, mla_kv_lora = 0, mla_rope = 0, mla_nope = 0, mla_v = 0;
  int64_t ffn = 0;                      // dense MLP
  FfnActivation mlp_activation = FfnActivation::kSwiglu;  // dense D blocks
  FfnActivation moe_activation = FfnActivation::kSwiglu;  // routed and shared experts
  bool qk_norm = false;                                   // per-head RMSNorm on q and k before RoPE
  bool flash_attention = true;  // false: Megatron's unfused core, which keeps the softmax output
  int64_t experts = 0, top_k = 0, expert_ffn = 0, shared_ffn = 0;
  bool shared_gate = false;  // sigmoid gate on the shared expert's output (moe.shared_gate)
  double capacity_factor = 1.0;
  bool dropless = true;
  bool pad_to_capacity = false;
  // Router: sigmoid scores (DeepSeek-V3) instead of softmax; an fp32 expert
  // bias added to the scores for selection only (ExpertBias).
  bool router_sigmoid = false;
  bool router_bias = false;
  int64_t vocab = 0;                    // padded
  int64_t vocab_logical = 0;            // unpadded (a replicated embedding's rows)
  // Mamba-2 (M, docs/formulas.md §1.4): heads H = d_inner / head_dim.
  int64_t mamba_inner = 0, mamba_heads = 0, mamba_head_dim = 0, mamba_groups = 0, mamba_d_state = 0;
  int64_t mamba_d_conv = 4, mamba_chunk = 0;
  bool mamba_fused_norm_out_proj = false;
  // RG-LRU (R, docs/formulas.md §1.6): width d_r, gate blocks n_b, conv width K_r.
  int64_t recurrent_width = 0, recurrent_heads = 0, recurrent_d_conv = 4;
  int64_t seq = 0, batch = 1;           // tokens = seq * batch, row = pos * batch + b
  double norm_eps = 1e-5;
  double rope_base = 10000.0;
  bool tie_embeddings = false;  // the head's weight is the embedding's
  NormKind norm = NormKind::kRmsNorm;  // pre-norms and the final norm (qk norms are RMSNorm)
  bool linear_bias = false;            // biases of the A, D and expert linears (model.linear_bias)
  int64_t learned_positions = 0;       // rows of a learned absolute position table (0: none)
  /// Output-layer weight gradients deferred to the pipeline flush
  /// (training.defer_head_wgrad): -1 none, 0 every micro-batch's, else the first k.
  int64_t head_wgrad_deferred = -1;
  bool replicated_embedding = false;  // parallel.embedding: replicated (each TP rank holds every row)
  CrossEntropy cross_entropy = CrossEntropy::kVocabParallel;  // the loss's memory (training.cross_entropy)
  int64_t tokens() const { return seq * batch; }
};

/// Modeled bytes per element (docs/formulas.md §0): activations, parameters, gradients.
struct ModeledBytes {
  int64_t activation = 2;
  int64_t param = 2;
  int64_t grad = 4;
};

/// The sequence positions a context-parallel rank holds (docs/formulas.md §3.4). The
/// sequence is cut into equal chunks: 2c with causal load balancing, where
/// rank r holds chunks r and 2c-1-r, else c, where rank r holds chunk r.
/// A rank's rows are its chunks in ascending position order, each position
/// `batch` rows (row = local_position * batch + b). cp = 1 is one chunk.
struct SeqLayout {
  int64_t seq = 0;        // global sequence length
  int64_t chunk_len = 0;  // positions per chunk
  int cp_size = 1, cp_rank = 0;
  bool load_balanced = false;
  std::vector<int64_t> chunks;  // chunk ids this rank holds, ascending

  static SeqLayout Make(int64_t seq, int cp_size, int cp_rank, bool load_balanced);
  int64_t num_chunks() const { return load_balanced ? 2 * cp_size : cp_size; }
  /// Positions this rank holds.
  int64_t local_len() const { return chunk_len * static_cast<int64_t>(chunks.size()); }
  /// Global position of local position `p` (the identity when unset: cp = 1).
  int64_t Position(int64_t p) const {
    if (chunks.empty()) return p;
    return chunks[static_cast<size_t>(p / chunk_len)] * chunk_len + p % chunk_len;
  }
  /// The CP rank holding chunk `c`.
  int OwnerOf(int64_t c) const;
};

/// A forward that keeps nothing for backward: a checkpointed layer's first
/// forward, which Megatron runs under torch.no_grad (CheckpointFunction.forward,
/// megatron/core/tensor_parallel/random.py). While one is open on this thread
/// (one simulated rank), each saved set a block opens is listed, and Drop()
/// discards them when the block returns. Nests nowhere: one at a time.
class NoGradForward {
 public:
  NoGradForward();
  ~NoGradForward();
  NoGradForward(const NoGradForward&) = delete;
  NoGradForward& operator=(const NoGradForward&) = delete;
  /// The one open on this thread, or null.
  static NoGradForward* Current();
  void Defer(std::function<void()> drop) { drops_.push_back(std::move(drop)); }
  void Drop();

 private:
  std::vector<std::function<void()>> drops_;
};

/// Tensors a block keeps for its backward, one set per micro-batch in flight
/// (a pipeline schedule runs several forwards before their backwards).
template <class S>
class SavedPerMicrobatch {
 public:
  S& Open(int64_t microbatch) {
    auto [it, fresh] = live_.try_emplace(microbatch);
    if (!fresh) throw std::logic_error("forward of micro-batch " + std::to_string(microbatch) + " ran twice");
    if (NoGradForward* no_grad = NoGradForward::Current()) {
      no_grad->Defer([this, microbatch] { live_.erase(microbatch); });
    }
    return it->second;
  }
  /// The set of `microbatch`, or null before its forward or after its backward.
  S* Find(int64_t microbatch) {
    auto it = live_.find(microbatch);
    return it == live_.end() ? nullptr : &it->second;
  }
  S Close(int64_t microbatch) {
    auto node = live_.extract(microbatch);
    if (node.empty()) throw std::logic_error("backward of micro-batch " + std::to_string(microbatch) + " before its forward");
    return std::move(node.mapped());
  }
  size_t live() const { return live_.size(); }

 private:
  std::map<int64_t, S> live_;
};

/// What a parameter is, for the optimizer that owns it (docs/formulas.md §9.4; the
/// recipe's training.optimizer knobs map roles to Muon or AdamW).
enum class ParamRole {
  kMatrix,       // 2-D hidden matrix: training.optimizer.matrices
  kMambaInProj,  // Mamba in_proj: optimizer.mamba_in_proj (Megatron: AdamW)
  kRouter,       // MoE router: optimizer.router
  kVector,       // embeddings, head, norms, biases, conv, SSM/RG-LRU vectors, R gate blocks: AdamW
};

/// What one rank knows about its place in the layout and its groups. Groups
/// of size 1 issue no collective.
struct Ctx {
  Rank* rank = nullptr;
  const Group* tp = nullptr;
  const Group* ep = nullptr;
  const Group* etp = nullptr;
  const Group* edp = nullptr;
  int tp_rank = 0, tp_size = 1;
  int ep_rank = 0, ep_size = 1;
  int etp_rank = 0, etp_size = 1;
  bool sp = false;           // sequence parallel in effect (tp > 1)
  // Context parallel: this rank's CP group and positions, and how A blocks
  // (cp_comm) and M/R blocks (cp_recurrent) exchange across it.
  const Group* cp = nullptr;
  int cp_rank = 0, cp_size = 1;
  CpComm cp_comm = CpComm::kP2p;
  CpRecurrent cp_recurrent = CpRecurrent::kAllToAll;
  SeqLayout seq;
  /// The micro-batch being run: blocks keep saved tensors per micro-batch.
  int64_t microbatch = 0;
  /// Modules selective recompute reruns in backward (training.recompute_modules;
  /// empty without selective recompute): a block keeps only their inputs.
  ModuleSet rerun;
  /// Transformer Engine (training.transformer_engine): the A (GQA) and D
  /// pre-norms are fused into their first linear (LayerNormLinear), so they
  /// are no module of their own for the "layernorm" and "mlp" reruns.
  bool transformer_engine = true;
  int64_t router_groups = 1;  // capacity groups among this rank's local tokens (docs/formulas.md §8.3 (3))
  /// When set, the capacity group of each local row (the unsharded reference
  /// groups tokens as the sharded ranks do, which with CP load balancing is
  /// not a contiguous split); else rows split into router_groups equal runs.
  std::vector<int64_t> router_group_of_row;
  int64_t RouterGroupOf(int64_t row, int64_t rows) const {
    return router_group_of_row.empty() ? row / (rows / router_groups) : router_group_of_row[static_cast<size_t>(row)];
  }
  ModeledBytes bytes;
  /// Megatron's hidden and attention dropout probability (training.dropout;
  /// 0: none), the seed its masks are drawn from, and the global micro-batch
  /// (data index) being run: each mask element is a function of these, the
  /// site and the element's global position (simulator/dropout.h).
  double dropout = 0.0;
  uint64_t dropout_seed = 0;
  int64_t data_index = 0;
  OptimizerConfig optimizer;  // which optimizer each ParamRole gets
  /// training.activation_offload: the rank's offloader, null without.
  ActivationOffload* offload = nullptr;
  /// training.recompute: selective_op: the pass of the checkpointed block
  /// running now (op_policy.h; off outside a checkpoint and for other policies).
  OpPolicy op;
  int64_t dropped_pairs = 0;
  MemoryTracker* mem() const { return &rank->memory(); }
};

/// How a parameter is split (global shape rows x cols).
enum class ShardKind {
  kReplicated,     // REP
  kColumns,        // TP column-parallel: cols / tp
  kRows,           // TP row-parallel or vocab rows: rows / tp
  kExpertColumns,  // routed expert, cols / expert_tp
  kExpertRows,     // routed expert, rows / expert_tp
};

/// Which dimension a shard kind splits: true = columns.
bool SplitsColumns(ShardKind k);

/// The memory category a parameter of shard kind `k` is charged to:
/// replicated, TP-sharded or EP-sharded parameters.
SimCategory ParamCategory(ShardKind k);

/// Ranges [offset, offset + length) of the split dimension that shard `index`
/// of `parts` holds, in local order. A packed tensor (Mamba in_proj =
/// [z, x, B, C, dt], conv channels = [x, B, C]) lists its `segments` (global
/// extents, summing to `extent`): each segment is split on its own (docs/formulas.md
/// 1.4), so a shard is not a contiguous slice. Empty `segments` = one segment.
std::vector<std::pair<int64_t, int64_t>> ShardRanges(int64_t extent, const std::vector<int64_t>& segments, int parts,
                                                     int index);

/// Writes shard `index` of `parts` (its ShardRanges of the dimension `kind`
/// splits, in local order) into `global`, which has the tensor's shape.
template <class T>
void PutShard(ShardKind kind, const std::vector<int64_t>& segments, int parts, int index, const Mat<T>& shard,
              Mat<T>* global);

/// The global tensor assembled from the shards of `parts` ranks, shard i
/// holding ShardRanges(..., i) of the split dimension.
Mat<double> AssembleShards(ShardKind kind, int64_t rows, int64_t cols, const std::vector<int64_t>& segments,
                           const std::vector<const Mat<double>*>& shards);

template <class T>
struct Param {
  std::string name;
  int64_t rows = 0, cols = 0;  // global shape
  ShardKind shard = ShardKind::kReplicated;
  std::vector<int64_t> segments;  // packed segments of the split dimension (ShardRanges)
  int64_t expert = -1;         // global expert id for routed experts
  ParamRole role = ParamRole::kVector;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  /// Replicated, but each TP rank's gradient is a partial sum even without
  /// SP (qk norms: a rank normalizes only its heads), so it is all-reduced over TP.
  bool tp_partial = false;
  /// One of a tied embedding's two copies (first and last pipeline stage),
  /// whose gradients are summed over the embedding group.
  bool tied = false;
  /// The framework tensor this parameter is part of where Megatron fuses
  /// several of the executor's (SwiGLU's gate and up are one linear_fc1);
  /// empty: its own. Megatron's layer-wise optimizer deals whole tensors.
  std::string fused_tensor;
  /// Each row is a framework tensor of its own (LayerNorm's [2, h] holds
  /// Megatron's weight and bias): the layer-wise optimizer deals them apart.
  bool row_tensors = false;
  /// Replicated, and every TP rank's gradient is already the whole sum even
  /// with SP (learned positions, added before the scatter to the sequence):
  /// not all-reduced over TP.
  bool tp_whole = false;
  Tensor<T> value;
  Tensor<T> grad;
};

enum class Init { kMatrix, kNormWeight };

/// Deterministic global value of a parameter: the same on every rank, so a
/// shard is a slice of the tensor the unsharded reference holds.
Mat<double> GlobalValue(const std::string& name, int64_t rows, int64_t cols, Init init, uint64_t seed,
                        double scale);

/// The optimizer that owns a parameter of `role` under `config` (docs/formulas.md §9.4:
/// with matrices = adamw there is no Muon anywhere).
OptimizerKind OptimizerFor(ParamRole role, const OptimizerConfig& config);

/// Sets a parameter's role (and so its optimizer); returns it for chaining.
template <class T>
Param<T>& WithRole(const Ctx& ctx, Param<T>& p, ParamRole role) {
  p.role = role;
  p.optimizer = OptimizerFor(role, ctx.optimizer);
  return p;
}

/// Creates this rank's shard of a parameter and its zeroed gradient.
template <class T>
std::unique_ptr<Param<T>> MakeParam(const Ctx& ctx, const std::string& name, int64_t rows, int64_t cols,
                                    ShardKind shard, Init init, uint64_t seed, double scale, int64_t expert = -1,
                                    std::vector<int64_t> segments = {});

/// 2 x m x n x k FLOPs of a matrix product, charged to the rank.
template <class T>
Mat<T> MatMul(Ctx& ctx, const Mat<T>& a, const Mat<T>& b);
template <class T>
Mat<T> MatMulTransB(Ctx& ctx, const Mat<T>& a, const Mat<T>& b);  // a * b^T
template <class T>
Mat<T> MatMulTransA(Ctx& ctx, const Mat<T>& a, const Mat<T>& b);  // a^T * b

// The conjugate TP operators (docs/formulas.md §8.3). `local` has this rank's rows under
// SP; `full` has every token.
template <class T>
Mat<T> CopyToTpForward(Ctx& ctx, const Mat<T>& local);      // f: identity, or AG with SP
template <class T>
Mat<T> CopyToTpBackward(Ctx& ctx, const Mat<T>& dfull);     // f': AR, or RS with SP
template <class T>
Mat<T> ReduceFromTpForward(Ctx& ctx, const Mat<T>& partial); // g: AR, or RS with SP
template <class T>
Mat<T> ReduceFromTpBackward(Ctx& ctx, const Mat<T>& dlocal); // g': identity, or AG with SP

/// RMSNorm y = x * rstd * w, rstd = (mean x^2 + eps)^-1/2 per row.
template <class T>
Mat<T> RmsNormForward(const Mat<T>& x, const Mat<T>& w, double eps, Mat<T>* rstd);
/// Returns dx; adds into dw.
template <class T>
Mat<T> RmsNormBackward(const Mat<T>& dy, const Mat<T>& x, const Mat<T>& rstd, const Mat<T>& w, Mat<T>* dw);

/// A pre-norm's parameter (model.norm): RMSNorm's weight "<prefix>.weight"
/// [1, h], or LayerNorm's weight and bias as the two rows of one tensor
/// "<prefix>.weight_and_bias" [2, h] (replicated, AdamW, 2h elements like the
/// inventory's weight + bias).
template <class T>
std::unique_ptr<Param<T>> MakeNorm(const Ctx& ctx, const Dims& d, const std::string& prefix, uint64_t seed,
                                   double scale);
/// The norm a MakeNorm parameter `w` says (two rows: LayerNorm): y and its
/// fp32 statistics per row, rstd (RMSNorm) or mean and rstd (LayerNorm).
template <class T>
Mat<T> NormForward(const Mat<T>& x, const Mat<T>& w, double eps, Mat<T>* stats);
/// Returns dx; adds into dw (both rows for LayerNorm).
template <class T>
Mat<T> NormBackward(const Mat<T>& dy, const Mat<T>& x, const Mat<T>& stats, const Mat<T>& w, Mat<T>* dw);

/// The pre-norm prologue of a block x <- x + F(Norm(x)): keeps x and n =
/// Norm(x) (ctx.bytes.activation per element) and the fp32 statistics (4 B
/// each: rstd, or LayerNorm's mean and rstd) as activations for the
/// backward, allocated in that order. `w` is a MakeNorm parameter.
/// `discarded` (a RerunsNorm block): n and the statistics are temporaries of
/// the forward, which DiscardPreNorm drops at its end.
template <class T>
void SavePreNorm(Ctx& ctx, const Mat<T>& x, const Mat<T>& w, double eps, Tensor<T>* saved_x, Tensor<T>* saved_n,
                 Tensor<T>* saved_rstd, bool discarded = false);

/// Selective "layernorm": the block's pre-norm is its own module (not
/// `fused` into the first linear) and backward reruns it. Megatron
/// (transformer_layer.py) runs input_layernorm / pre_mlp_layernorm under
/// CheckpointWithoutOutput (tensor_parallel/random.py) and discards its output
/// once the sublayer's forward returns (discard_output_and_register_recompute):
/// only the norm's input stays, and the output is recomputed when the
/// sublayer's output gradient arrives, before the sublayer's backward.
inline bool RerunsNorm(const Ctx& ctx, bool fused) { return ctx.rerun.has(RecomputeModule::kLayernorm) && !fused; }

/// The end of a RerunsNorm block's forward: the norm output and statistics go.
template <class T>
void DiscardPreNorm(Tensor<T>* n, Tensor<T>* stats) {
  n->Release();
  stats->Release();
}

/// The rerun before a RerunsNorm block's backward: the norm output and its
/// statistics again from the kept input, charged as recomputed activations.
template <class T>
void RerunPreNorm(Ctx& ctx, const Mat<T>& x, const Mat<T>& w, double eps, Tensor<T>* n, Tensor<T>* stats);

/// The input of a TP region, CopyToTpForward(local) (all rows under SP), held
/// as a temporary of ctx.bytes.activation per element.
template <class T>
Tensor<T> TpRegionInput(Ctx& ctx, const Mat<T>& local);

/// One column-parallel weight of a TP region and the gradient of its output.
template <class T>
struct ColumnGrad {
  Param<T>* weight;
  const Mat<T>* dout;
};

/// The backward of a TP region entered through column-parallel weights from
/// the saved (SP-local) norm output `n`: re-gathers `n` for the weight
/// gradients (Megatron's saved-sharded-input path, docs/formulas.md §7.2), adds each
/// weight's gradient, and returns the norm output's gradient
/// f'(sum of dout W^T), this rank's rows.
template <class T>
Mat<T> ColumnParallelBackward(Ctx& ctx, const Mat<T>& n, const std::vector<ColumnGrad<T>>& parts);

/// Adds a linear's bias row to every row of `m`; no-op without a bias.
template <class T>
void AddBias(Mat<T>* m, const Param<T>* bias) {
  if (bias != nullptr) m->rowwise() += bias->value.m.row(0);
}
/// A bias's gradient, the column sums of its output's gradient; no-op without.
template <class T>
void AddBiasGrad(const Mat<T>& dout, Param<T>* bias) {
  if (bias != nullptr) bias->grad.m.row(0) += dout.colwise().sum();
}

/// A framework tensor of scope `m` made of `parts` (released ones hold
/// nothing); `elements` < 0: their element count.
template <class T>
SavedTensor Scoped(OffloadModule m, std::initializer_list<Tensor<T>*> parts, int64_t elements = -1) {
  SavedTensor out;
  out.scope = m;
  int64_t sum = 0;
  for (Tensor<T>* t : parts) {
    sum += static_cast<int64_t>(t->m.size());
    out.parts.push_back(&t->alloc);
  }
  out.elements = elements < 0 ? sum : elements;
  return out;
}

/// A norm's input and its fp32 statistics (one entry per row as the
/// framework counts them: LayerNorm's mean and rstd are two such tensors,
/// which the estimator prices as one of 8 B per row) in scope `m`.
template <class T>
void ScopedNorm(OffloadModule m, Tensor<T>* x, Tensor<T>* stats, std::vector<SavedTensor>* out) {
  out->push_back(Scoped(m, {x}));
  out->push_back(Scoped(m, {stats}, stats->m.rows()));
}

/// An attention block's saved set `s` past its projections: the core's
/// ("core_attn": q, k, v and the LSE, or the unfused core's softmax output
/// with its dropout mask and dropped probabilities, one tensor of the
/// scores' elements) and the output projection's input o ("attn_proj").
/// Under a "core_attn" rerun (`core_rerun`) the checkpoint's q, k, v are
/// saved outside any scope and stay (attention.py: the core_attn manager is
/// not entered around _checkpointed_attention_forward).
template <class T, class S>
void ScopedCoreAndProjection(bool flash_attention, bool core_rerun, S& s, std::vector<SavedTensor>* out) {
  if (!core_rerun) {
    for (Tensor<T>* t : {&s.q, &s.k, &s.v}) out->push_back(Scoped(OffloadModule::kCoreAttn, {t}));
    out->push_back(flash_attention ? Scoped(OffloadModule::kCoreAttn, {&s.lse})
                                   : Scoped(OffloadModule::kCoreAttn, {&s.probs, &s.mask, &s.dropped},
                                            static_cast<int64_t>(s.probs.m.size())));
  }
  out->push_back(Scoped(OffloadModule::kAttnProj, {&s.o}));
}

/// The logistic function 1 / (1 + e^-a).
template <class T>
T Sigmoid(T a) {
  return T(1) / (T(1) + std::exp(-a));
}

/// Where RoPE acts in a row of per-head columns: `heads` heads of `stride`
/// columns, rotating `dim` of them from `offset` (GQA: the whole head; MLA:
/// the rope part after the nope part).
struct RopeSpan {
  int64_t heads = 0, stride = 0, offset = 0, dim = 0;
};

/// Rotate-half RoPE by +angle (sign = 1) or -angle (sign = -1, the
/// backward) at the global position of each row (docs/formulas.md §8.1; with
/// CP, `seq` maps rows to positions), theta_i = base^(-2i/dim).
template <class T>
void ApplyRope(Mat<T>* m, const RopeSpan& span, const Dims& d, const SeqLayout& seq, int sign);

/// SwiGLU z = silu(a) * u and its backward (docs/formulas.md §8.1).
template <class T>
Mat<T> SwiGlu(const Mat<T>& a, const Mat<T>& u);
template <class T>
void SwiGluBackward(const Mat<T>& dz, const Mat<T>& a, const Mat<T>& u, Mat<T>* da, Mat<T>* du);

/// Megatron's router expert bias for aux-loss-free balancing (router.py,
/// moe_router_enable_expert_bias): an fp32 buffer added to the sigmoid
/// scores to choose the experts, never to weigh them, with no gradient; and
/// the step's count of routed (token, expert) pairs per expert
/// (local_tokens_per_expert), which moves it after the step.
template <class T>
struct ExpertBias {
  std::string name;  // as a parameter's, for the verifier
  Tensor<T> bias;    // [1, E], fp32, charged with the replicated parameters
  Tensor<T> counts;  // [1, E], fp32, routing scratch
};

/// Megatron's update (moe_utils.py get_updated_expert_bias, rate 1e-3 =
/// --moe-router-bias-update-rate's default): bias += rate * sign(mean(c) - c)
/// for the counts `c` summed over every replica; then the counts restart.
template <class T>
void UpdateExpertBias(const Mat<T>& counts, ExpertBias<T>* b);

/// Whether an FFN activation is gated: fc1 has two outputs, a (activated)
/// and u (multiplied in), as SwiGLU; else one, a.
inline bool Gated(FfnActivation f) { return f == FfnActivation::kSwiglu; }

/// The FFN activation z of fc1's outputs: silu(a) * u (SwiGLU), GELU(a)
/// (exact, erf: Megatron's default F.gelu) or relu(a)^2 (Megatron's
/// squared_relu). `u` is read only when gated.
template <class T>
Mat<T> Activate(FfnActivation f, const Mat<T>& a, const Mat<T>& u);
/// da (and du when gated) from dz.
template <class T>
void ActivateBackward(FfnActivation f, const Mat<T>& dz, const Mat<T>& a, const Mat<T>& u, Mat<T>* da, Mat<T>* du);

/// A layer of the stack: x <- x + dropout(F(Norm(x))) on this rank's rows,
/// the branch F(Norm(x)) being the block's own. The dropout is Megatron's
/// bias-dropout-add (transformer_layer.py self_attn_bda / mlp_bda,
/// ssm/mamba_layer.py mamba_bda, hidden_dropout): without training.dropout
/// it is the plain residual add.
template <class T>
class Block {
 public:
  virtual ~Block() = default;
  Mat<T> Forward(Ctx& ctx, const Mat<T>& x) {
    Mat<T> y = BranchForward(ctx, x);
    if (ctx.dropout > 0) DropBranch(ctx, &y);
    // The norms' groups commit after the bias-dropout-add, which reads the
    // residual (transformer_layer.py: attn_norm_manager / mlp_norm_manager
    // group_offload after self_attn_bda / mlp_bda).
    if (ctx.offload != nullptr) ctx.offload->Commit(layer_, ctx.microbatch, OffloadScopes(ctx));
    return x + y;
  }
  Mat<T> Backward(Ctx& ctx, const Mat<T>& dy) {
    if (ctx.offload != nullptr) ctx.offload->Reload(layer_, ctx.microbatch);
    Mat<T> dx;
    if (ctx.dropout == 0) {
      dx = dy + BranchBackward(ctx, dy);
    } else {
      dx = dy + BranchBackward(ctx, DropBranchBackward(ctx, dy));
    }
    if (ctx.offload != nullptr) ctx.offload->Backwarded(layer_, ctx.microbatch);
    return dx;
  }
  /// The layer id the block's dropout masks are drawn for, and the batch
  /// rows per position (MakeBlock's).
  void set_dropout_key(int64_t layer, int64_t batch) {
    layer_ = layer;
    batch_ = batch;
  }
  /// The router's expert bias, when the block has one.
  virtual ExpertBias<T>* expert_bias() { return nullptr; }
  std::vector<Param<T>*> params() {
    std::vector<Param<T>*> out;
    for (auto& p : params_) out.push_back(p.get());
    return out;
  }

 protected:
  /// The layer the block's dropout masks are drawn for.
  int64_t layer() const { return layer_; }
  /// F(Norm(x)), this rank's rows; keeps what BranchBackward reads.
  virtual Mat<T> BranchForward(Ctx& ctx, const Mat<T>& x) = 0;
  /// The gradient of x through the branch from the branch output's gradient.
  virtual Mat<T> BranchBackward(Ctx& ctx, const Mat<T>& dy) = 0;
  /// What the forward of ctx.microbatch saved inside Megatron's offload
  /// scopes (docs/recipe.md "Activation offloading"); none by default.
  virtual std::vector<SavedTensor> OffloadScopes(Ctx& /*ctx*/) { return {}; }
  /// The forward reached the end of module `scope`: Megatron commits the
  /// module's offload group there (FineGrainedOffloadingGroupCommitFunction
  /// .forward -> ChunkOffloadHandler.bulk_offload_group), so its tensors
  /// leave before the next module saves its own. Scopes a block does not
  /// hand go when its forward ends.
  void HandOff(Ctx& ctx, OffloadModule scope) {
    if (ctx.offload != nullptr) ctx.offload->Hand(layer_, ctx.microbatch, scope, OffloadScopes(ctx));
  }
  Param<T>& Add(std::unique_ptr<Param<T>> p) {
    params_.push_back(std::move(p));
    return *params_.back();
  }
  std::vector<std::unique_ptr<Param<T>>> params_;

 private:
  /// Drops the branch output with the layer's hidden mask and keeps the mask
  /// (1 byte per element: torch's dropout saves a bool mask) for backward.
  void DropBranch(Ctx& ctx, Mat<T>* y);
  /// dy through the kept mask, which goes.
  Mat<T> DropBranchBackward(Ctx& ctx, const Mat<T>& dy);
  int64_t layer_ = 0, batch_ = 1;
  SavedPerMicrobatch<Tensor<T>> masks_;
};

/// Creates the block for pattern letter `letter` ('A', 'D', 'E', 'M', 'R') of layer `layer`.
template <class T>
std::unique_ptr<Block<T>> MakeBlock(char letter, Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed,
                                    double scale);

template <class T>
std::unique_ptr<Block<T>> MakeDenseBlock(char letter, Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed,
                                         double scale);
/// Multi-head latent attention (simulator/mla_block.cc). Throws
/// SimUnsupported for tp > 1 without sequence parallelism.
template <class T>
std::unique_ptr<Block<T>> MakeMlaBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale);
template <class T>
std::unique_ptr<Block<T>> MakeMoeBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale);
/// Mamba-2 mixer (simulator/mamba_block.cc). Throws SimUnsupported for sizes
/// Megatron rejects (heads % groups, heads or groups % tp, the CP rules).
template <class T>
std::unique_ptr<Block<T>> MakeMambaBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale);

/// Knobs of the R block that no recipe sets: tests use them to show what the
/// real computation needs.
struct RecurrentOptions {
  /// Under the CP hand-off (ctx.cp_recurrent = kHandoff, cp > 1), drop the
  /// hand-off: a chunk whose predecessor lives on another CP rank starts from
  /// a zero state, and no state (nor its gradient) is sent. Wrong on purpose:
  /// the naive split of a recurrence over the sequence.
  bool drop_handoff = false;
};

/// The RG-LRU block (docs/formulas.md §1.6, 8.2 "R"), simulator/recurrent_block.cc.
template <class T>
std::unique_ptr<Block<T>> MakeRecurrentBlock(Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed, double scale,
                                             const RecurrentOptions& options = {});

/// Vocab-parallel embedding (docs/formulas.md §8.3): lookup of own rows, then g;
/// or a replicated table (Dims::replicated_embedding) looked up for this
/// rank's rows with no collective. With learned positions (Megatron
/// LanguageModelEmbedding, `positions`) the lookup is all-reduced over the
/// whole sequence, the position rows are added, and SP scatters the sum.
template <class T>
class Embedding {
 public:
  /// `positions`: this copy holds the learned position table (the first
  /// stage's; the last stage's copy for a tied head or MTP holds words only).
  Embedding(Ctx& ctx, const Dims& d, uint64_t seed, double scale, bool positions = true);
  /// `slot` tells apart the lookups of one micro-batch: 0 the model's
  /// input, k the ids an MTP module of depth k embeds (shifted by k).
  Mat<T> Forward(Ctx& ctx, const std::vector<int64_t>& ids, int64_t slot = 0);
  void Backward(Ctx& ctx, const Mat<T>& dx, int64_t slot = 0);
  Param<T>& weight() { return *weight_; }
  /// The word table, then the position table when there is one.
  std::vector<Param<T>*> params() {
    if (!positions_) return {weight_.get()};
    return {weight_.get(), positions_.get()};
  }

 private:
  static constexpr int64_t kSlots = 65;  // model.mtp_layers is at most 64
  Dims d_;
  std::unique_ptr<Param<T>> weight_;     // [vocab, hidden], rows split (or replicated)
  std::unique_ptr<Param<T>> positions_;  // [learned_positions, hidden], replicated; null without
  /// Rows of `rows` this rank keeps (its SP slice), and where they start.
  static int64_t LocalRowCount(const Ctx& ctx, int64_t rows);
  static int64_t LocalRowOffset(const Ctx& ctx, int64_t local_rows);
  /// Adds (or, backward, accumulates the gradient of) the position rows of the
  /// rank's rows starting at row `first_row`.
  void AddPositions(const Ctx& ctx, int64_t first_row, Mat<T>* x) const;
  void AddPositionGrads(const Ctx& ctx, int64_t first_row, const Mat<T>& dx);
  /// The lookup (and its backward) without the embedding dropout.
  Mat<T> Lookup(Ctx& ctx, const std::vector<int64_t>& ids, int64_t slot);
  void LookupBackward(Ctx& ctx, const Mat<T>& dx, int64_t slot);
  SavedPerMicrobatch<IndexTensor> ids_;  // keyed by microbatch * kSlots + slot
  SavedPerMicrobatch<Tensor<T>> masks_;  // the dropout masks, keyed as ids_
};

/// Final RMSNorm, column-parallel head over the vocabulary, vocab-parallel
/// cross-entropy (mean over tokens). With tied embeddings the head reads the
/// embedding's weight: `tied` when this rank holds it, else its own copy
/// (same name and value, Param::tied) on the last pipeline stage.
template <class T>
class Head {
 public:
  /// `shared`: the output weight this head reads (a tied embedding, or the
  /// model's head for an MTP module's), else it builds its own. `norm` names
  /// its final norm (an MTP module's is "mtp.<k>.final_layernorm").
  Head(Ctx& ctx, const Dims& d, uint64_t seed, double scale, Param<T>* shared = nullptr,
       const std::string& norm = "final_norm");
  /// Returns the mean loss over all tokens (the same on every TP rank), or
  /// with `weights` (one per row) the weighted sum of the rows' losses (an
  /// MTP module's masked, scaled loss). `normed`, when given, gets the final
  /// norm's output (this rank's rows: what an MTP module reads). With
  /// `normed_input` the final norm ran elsewhere (inside an MTP module's
  /// checkpoint): `x` is its output, which the output layer keeps.
  double Forward(Ctx& ctx, const Mat<T>& x, const std::vector<int64_t>& targets,
                 const std::vector<T>* weights = nullptr, Mat<T>* normed = nullptr, bool normed_input = false);
  /// `dnormed`, when given, is a further gradient of the final norm's output
  /// (from the MTP modules that read it). After a `normed_input` forward it
  /// returns the gradient of the norm's output.
  Mat<T> Backward(Ctx& ctx, const Mat<T>* dnormed = nullptr);
  /// The deferred weight gradients (Dims::head_wgrad_deferred), at the
  /// pipeline flush: Megatron's drain_embedding_wgrad_compute gathers each
  /// kept input over TP (with SP) and adds input^T grad_output to the weight's
  /// gradient, in micro-batch order. A no-op when nothing was deferred.
  void DrainDeferred(Ctx& ctx);
  Param<T>& norm() { return *norm_; }
  /// The head's own parameters (a shared weight is its owner's).
  std::vector<Param<T>*> params() {
    if (!own_) return {norm_.get()};
    return {norm_.get(), own_.get()};
  }
  Param<T>* weight() { return weight_; }

 private:
  Dims d_;
  std::unique_ptr<Param<T>> norm_;  // [1, hidden] REP
  std::unique_ptr<Param<T>> own_;   // [vocab, hidden], rows split; null when the weight is shared
  Param<T>* weight_ = nullptr;      // own_ or the shared weight
  struct Saved {
    Tensor<T> x, n, rstd, softmax;
    std::vector<int64_t> targets;
    std::vector<T> weights;  // per row; empty: 1 / tokens each
    int64_t tokens = 0;  // tokens the loss is averaged over (all CP ranks')
  };
  SavedPerMicrobatch<Saved> saved_;
  /// Deferred pairs (the output layer's input on this rank's rows, the
  /// logits' gradient), and how many backwards of this step deferred theirs.
  std::vector<std::pair<Tensor<T>, Tensor<T>>> deferred_;
  int64_t deferred_count_ = 0;
};

/// Megatron's --mtp-loss-scaling-factor default: the MTP losses' weight
/// (the D modules' losses are averaged, then scaled by it).
inline constexpr double kMtpLossScale = 0.1;

/// One multi-token-prediction module of depth k (Megatron
/// multi_token_prediction.py MultiTokenPredictionLayer, on the last stage):
/// enorm on the embedding of the ids shifted by k, hnorm on the previous
/// depth's normed output (the main final norm's at depth 1: Megatron's
/// decoder applies its final norm before the MTP block), their concatenation
/// [enorm | hnorm] through eh_proj [2h -> h] (column-parallel, gather_output
/// false, then gathered over TP and, with SP, scattered back to the
/// sequence), one transformer layer of the model's last kind (attention +
/// its FFN), its final_layernorm and the shared output head.
template <class T>
class MtpModule {
 public:
  /// `layer`: the executor's layer id of its attention block (its FFN is
  /// layer + 1); `ffn`: the FFN letter ('D' or 'E'); `output`: the model's
  /// output weight, which the module's head shares.
  /// `checkpointed`: full recompute (Megatron MultiTokenPredictionLayer.
  /// _checkpointed_forward, uniform): enorm through the final norm run under
  /// one checkpoint on the embedding and the previous depth's output, rerun
  /// in backward; the output layer stays outside it.
  MtpModule(Ctx& ctx, const Dims& d, int64_t depth, char ffn, int64_t layer, uint64_t seed, double scale,
            Param<T>* output, bool checkpointed = false);
  /// `h`: the previous depth's normed output, `e`: the shifted ids'
  /// embedding (this rank's rows each); `weights`: each row's loss weight
  /// (0 where the shift ran past the sequence). Returns the weighted loss;
  /// `normed` gets this depth's final-norm output.
  double Forward(Ctx& ctx, const Mat<T>& h, const Mat<T>& e, const std::vector<int64_t>& targets,
                 const std::vector<T>& weights, Mat<T>* normed);
  /// `dnormed`: the next depth's gradient of this depth's normed output (null
  /// at the last depth). Returns the gradient of `h`; `de` gets that of `e`.
  Mat<T> Backward(Ctx& ctx, const Mat<T>* dnormed, Mat<T>* de);
  std::vector<Param<T>*> params();
  /// The router's expert bias of its MoE layer, when it has one.
  ExpertBias<T>* expert_bias() { return ffn_->expert_bias(); }

 private:
  Dims d_;
  std::unique_ptr<Param<T>> enorm_, hnorm_, eh_proj_;
  std::unique_ptr<Block<T>> attention_, ffn_;
  std::unique_ptr<Head<T>> head_;
  bool checkpointed_ = false;
  /// enorm through the FFN block: the forward (returns the final norm's
  /// input) and its backward (returns dh, sets de).
  Mat<T> Inner(Ctx& ctx, const Mat<T>& h, const Mat<T>& e);
  Mat<T> InnerBackward(Ctx& ctx, const Mat<T>& dx, Mat<T>* de);
  /// A checkpoint's inputs: the embedding (kept) and the previous depth's
  /// output (the previous head's saved tensor: one storage, not charged).
  struct Kept {
    Tensor<T> e;
    Mat<T> h;
  };
  SavedPerMicrobatch<Kept> kept_;
  struct Saved {
    // enorm's input and statistics, hnorm's statistics, eh_proj's input
    // [enorm | hnorm] (this rank's rows, ctx.bytes.activation / fp32).
    Tensor<T> e, e_stats, h_stats, cat;
    // hnorm's input: the previous head's saved final-norm output, one storage
    // in the framework (both save the same tensor), so not charged twice.
    Mat<T> h;
  };
  SavedPerMicrobatch<Saved> saved_;
};

}  // namespace preflight::sim

// The formulas behind the capacity model, one function a term (docs/formulas.md §3-6),
// public so that tests check each against its source and the planner can
// price a stage without building a full RankMemory. Everything is per rank,
// in checked int64 bytes; nothing here allocates.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <vector>

#include "preflight/estimator/geometry.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Bytes per token one layer saves for backward, with global (unsharded)
/// widths, split by how the tensor is divided over TP (docs/formulas.md §3.2).
struct TokenBytes {
  /// Residual-stream tensors (norm inputs/outputs, norm statistics, residual
  /// dropout masks): a full copy on every TP rank without SP, /t with SP.
  int64_t replicated = 0;
  /// Tensors with a TP-sharded width (heads, FFN columns, Mamba channels): always /t.
  int64_t sharded = 0;
  int64_t total() const { return CheckedAdd(replicated, sharded); }
};

/// What a layer keeps per token for its family, recompute policy and the
/// recipe's numerics (flash attention, dropout, norm kind, activation dtype).
/// MoE layers: only the per-router-token terms; the routed-expert terms depend
/// on the received token count (see MoeRouting). `cp` enters only through the
/// Mamba B/C repeat factor r_g (docs/formulas.md §1.4).
TokenBytes SavedBytesPerToken(const Recipe& recipe, BlockKind kind, Recompute recompute, int64_t tp, int64_t cp);

/// One matmul of a block, per token: input and output widths, and whether
/// the sublayer's own backward reads its output (else only the next op
/// consumes it: RoPE makes a new tensor of wq's and wk's, wo's and w2's go
/// into the residual sum).
struct SelectiveOpMatmul {
  int64_t in = 0, out = 0;
  bool read = true;
};

/// Under torchtitan's per-op policy (recompute: selective_op), the share of
/// an attention (A) or dense MLP (D) sublayer's matmul FLOPs that its
/// backward recomputes: the matmuls the policy does not save (wk and wo of
/// A: 1/2 for any GQA shape; w3 of a SwiGLU D: 1/3).
double SelectiveOpRecomputedMatmulShare(const Recipe& recipe, BlockKind kind);

/// Under torchtitan's per-op policy, the bytes per token of the outputs an
/// A or D sublayer's policy saves that its backward does not read (wq's
/// without qk norms, w2's): the backward's rerun takes them back and frees
/// them, so what the rerun allocates exceeds the block's unsaved activations
/// by them.
int64_t SelectiveOpUnreadBytesPerToken(const Recipe& recipe, BlockKind kind);

/// Mamba B/C repeat factor under context parallelism: c / (G/t) when c > G/t, else 1 (docs/formulas.md §1.4).
int64_t MambaGroupRepeat(const MambaConfig& mamba, int64_t tp, int64_t cp);

/// The cp that the Mamba B/C repeat sees: 1 under the CP hand-off
/// (cp_recurrent = handoff keeps the sequence split, nothing is repeated), else cp.
int64_t MambaRepeatCp(const Layout& layout);

/// CP hand-off for M blocks (cp_recurrent = handoff, cp > 1) [OURS]: what one
/// Mamba layer keeps per micro-batch on the worst CP rank beyond a_M, namely
/// the state each of its runs of chunks received from the previous CP rank
/// (conv tail (K-1) x b x (d_i + 2GN)/t in the activation dtype + SSM state
/// b x H/t x P x N fp32, per received edge: 2 edges with load balancing and
/// c >= 3, else 1). Zero otherwise. LayerActivations includes it.
Bytes MambaHandoffStateBytes(const Recipe& recipe, const Layout& layout);

/// Activation bytes one MoE layer saves for one micro-batch on one rank
/// (docs/formulas.md §3.2 table E): router-token terms on T, shared expert on s*b/c /t,
/// routed-expert terms on R.
Bytes MoeLayerActivations(const Recipe& recipe, const Layout& layout, Recompute recompute);

/// Activation bytes one layer of `kind` saves for one micro-batch on one rank
/// (R layers: with RecurrentHandoffStateBytes; with Flextron, FlextronLayerActivations).
Bytes LayerActivations(const Recipe& recipe, const Layout& layout, BlockKind kind);

/// Flextron's soft width masks (training.flextron_emb_choices > 0): the
/// copies one layer of `kind` keeps for one micro-batch beyond the plain
/// model, per token of its residual stream and width, and for an MoE layer
/// with grouped GEMM per row its experts process. Zero under full recompute
/// (the hooks rerun inside the checkpoint) and for D and R layers.
Bytes FlextronLayerActivations(const Recipe& recipe, const Layout& layout, BlockKind kind);

/// The same for the final norm (FlextronStackElasticityManager), on the
/// last stage for each micro-batch in flight there: n_e * s*b/c * h * beta_a
/// (/t under SP).
Bytes FlextronFinalNormActivations(const Recipe& recipe, const Layout& layout);

/// Of LayerActivations, what training.activation_offload moves to host
/// memory between the layer's forward and backward: each tensor saved inside
/// a listed module's scope with at least activation_offload_min_elements
/// elements (Megatron's saved-tensor hooks, fine_grained_activation_offload.py).
/// Zero under full recompute (Megatron offloads no checkpoint).
Bytes LayerOffloaded(const Recipe& recipe, const Layout& layout, BlockKind kind);

/// LayerOffloaded by module (indexed by OffloadModule).
using OffloadBytes = std::array<int64_t, std::size(kAllOffloadModules)>;
OffloadBytes LayerOffloadedByModule(const Recipe& recipe, const Layout& layout, BlockKind kind);

/// The listed modules whose offload groups a layer of `kind` runs, in
/// OffloadModule order (forward order): Megatron's
/// TransformerLayer._set_offload_modules; a norm Transformer Engine fuses into
/// the next linear is an IdentityOp with no group (NormIsOwnModule). Under
/// a "core_attn" rerun (`recompute`) the core runs none (attention.py calls
/// _checkpointed_attention_forward outside the core_attn scope).
OffloadSet OffloadGroupsOf(const Recipe& recipe, Recompute recompute, BlockKind kind);

/// Activation offload on one pipeline rank (Megatron-LM
/// fine_grained_activation_offload.py). Groups are kept by module NAME:
/// after the warmup iteration post_warmup_callback keeps the last group of
/// each name in the first chunk to run backward, and should_bulk_offload the
/// last group of each name of a chunk whose backward runs next.
struct OffloadOnRank {
  Bytes microbatch;  // what one micro-batch's layers on the rank offload when none is kept
  Bytes kept;        // the last group of each module name on the rank
  /// The most a chunk's last groups weigh, as many as the offload margin (the
  /// most module names a chunk on the rank runs): a chunk's backward runs
  /// that many reloads ahead (bulk_reload -> pre_reload_last_layer), so they
  /// are on the device when it starts.
  Bytes ahead;
  /// What the micro-batch filling the rank holds, at the most, above what it
  /// holds when its forward ends: a group is on the device when its module
  /// commits it, beside the earlier tensors that stay and the groups that
  /// commit later (the norms', after the bias-dropout-add; fc1's output at
  /// expert_fc1's commit), and leaves after (bulk_offload_group). An upper
  /// bound where a layer saves more after the commit than its data order
  /// shows (the shared expert).
  Bytes in_flight;
};
/// `checkpointed` (CheckpointedSublayers, empty: none): the sublayers whose
/// forward runs inside a full-recompute checkpoint; their groups run empty.
OffloadOnRank ActivationOffloadOnRank(const Recipe& recipe, const Layout& layout, const StagePlan& plan, int64_t rank,
                                      const std::vector<bool>& checkpointed = {});

/// Under full recompute, for each sublayer whether its forward runs inside a
/// checkpoint (every one under the uniform method, a chunk's first
/// recompute_layers framework layers under block): the checkpointed forward
/// runs under torch.no_grad and saves nothing in any offload scope, so its
/// groups commit empty (tensor_parallel/random.py CheckpointFunction.forward).
/// Empty under any other policy or without activation offload.
std::vector<bool> CheckpointedSublayers(const Inventory& inv, const Layout& layout, const StagePlan& plan);

/// Activation offload's bytes over pipeline rank `rank`'s host link in one
/// step, both ways (each offloaded byte goes down and comes back): m
/// micro-batches less the kept groups, once on earlier ranks and in every
/// micro-batch on the last (should_bulk_offload: its next backward is always
/// the micro-batch that just ran forward).
Bytes ActivationOffloadTransfer(const Recipe& recipe, const Layout& layout, const StagePlan& plan, int64_t rank,
                                const std::vector<bool>& checkpointed = {});

/// R layers under the CP state hand-off (cp_recurrent = handoff, cp > 1,
/// [OURS]): the states one micro-batch's chunks received from the previous CP
/// rank and keep for the backward, on the worst CP rank: n_in * b *
/// ((K_r-1)*beta_a + 4) * d_r/t, n_in = 1, or 2 with load balancing and cp >= 3.
/// Zero otherwise.
Bytes RecurrentHandoffStateBytes(const Recipe& recipe, const Layout& layout);

/// Transient workspace of one layer while it runs, not summed over layers or
/// micro-batches: Mamba SSD chunk states, CB and dA_cumsum (docs/formulas.md §3.2), CP
/// ring KV buffers for attention (docs/formulas.md §3.4). Zero for the other families.
Bytes LayerWorkspace(const Recipe& recipe, const Layout& layout, BlockKind kind);

/// Pipeline-end terms for one micro-batch (docs/formulas.md §3.4).
/// First stage: int64 token ids (+ embedding dropout mask when dropout > 0).
Bytes FirstStageActivations(const Recipe& recipe, const Layout& layout);
/// Last stage: final-norm input and statistics, head input, and the loss over
/// the padded vocabulary /t (training.cross_entropy): what it saves for the
/// backward (fp32, 4 B a logit) and its transient (LossTransientActivations);
/// with Flextron, FlextronFinalNormActivations.
Bytes LastStageActivations(const Recipe& recipe, const Layout& layout, int64_t padded_vocab);
/// Of those, the loss's transient, live only while the head and its loss run
/// (a pipeline replay adds it at that instant alone, pipeline_replay.h):
/// vocab_parallel, the logits (s*b/c * V_pad/t * beta); fp32_upcast, two fp32
/// gradients in its backward (8 B a logit).
Bytes LossTransientActivations(const Recipe& recipe, const Layout& layout, int64_t padded_vocab);

/// ceil(n * f) for n >= 0 and a recipe fraction f >= 0, with f taken to the
/// nearest millionth so that 5% of a multiple of 20 is exact (binary 0.05 is
/// not); ArithmeticOverflow past int64.
int64_t CeilFraction(int64_t n, double f);

// ---- pipeline schedule: micro-batches in flight (docs/formulas.md §4.1) ----

/// 1F1B: min(m, p - r) micro-batches live at rank r (Megatron warmup p - r - 1, plus the one in 1F1B).
int64_t OneFOneBInFlight(int64_t p, int64_t m, int64_t r);
/// Interleaved warmup in chunk-micro-batches: min(2(p-r-1) + (v-1)g, m*v) (Megatron get_pp_rank_microbatches).
int64_t InterleavedWarmup(int64_t p, int64_t v, int64_t m, int64_t r, int64_t g);
/// Live chunk-micro-batches at the peak: min(m*v, warmup + 1).
int64_t InterleavedLive(int64_t p, int64_t v, int64_t m, int64_t r, int64_t g);
/// Which chunks hold them at the activation peak: pipeline_replay.h.
/// DualPipe / DualPipeV: p + 1 stage-micro-batches per device [DS3 table], at most m.
int64_t DualPipeInFlight(int64_t p, int64_t m);

// ---- serving state (docs/formulas.md §6) ----

/// KV cache bytes per token per attention layer on one TP rank: GQA 2*(n_kv/t)*d_h*beta
/// (one head, replicated, when t > n_kv); MLA latent (d_c + d_rope)*beta, replicated per TP rank.
int64_t KvBytesPerToken(const ModelConfig& model, int64_t tp, DType kv);
/// Mamba state per sequence per M layer on one TP rank: conv (K-1)(d_i + 2GN)/t * beta_conv
/// + SSM (H/t)*P*N * beta_ssm.
int64_t MambaStateBytesPerSequence(const ModelConfig& model, int64_t tp, DType conv, DType ssm);
/// RG-LRU state per sequence per R layer on one TP rank: ((K_r-1)*beta_conv + 4) * d_r / t.
int64_t RecurrentStateBytesPerSequence(const ModelConfig& model, int64_t tp, DType conv);

/// One tensor as Megatron's layer-wise optimizer deals it: its local
/// elements and optimizer (OptimizerKind index); for the planner's traffic
/// also its element bytes and whether Muon gathers it over (expert) TP.
/// Routed-expert stacks are one tensor per local expert (TEGroupedMLP's
/// weight<i>, SequentialMLP's experts).
struct DealtTensor {
  int64_t elements = 0;
  int optimizer = static_cast<int>(OptimizerKind::kAdamW);
  int64_t element_bytes = 0;
  bool tp_gathered = false;
};

/// Megatron's deal order (LayerWiseDistributedOptimizer._shard_params_ping_pong,
/// megatron/core/optimizer/layer_wise_optimizer.py at d98e8a6): the params
/// sorted by numel, smallest first. Python's sort is stable over the
/// optimizers' param groups in order, and Megatron lists Muon's groups first
/// (optimizer/__init__.py: the linear weights carry no override and sort
/// ahead of the scalar optimizer's), so of equal sizes Muon's come first,
/// then the model's order. Sorts `tensors` in place.
void SortForDeal(std::vector<DealtTensor>& tensors);

/// The member of a d-rank group the i-th tensor of the deal order goes to:
/// loop[i mod 2d] of the loop 0, 1, ..., d-1, d-1, ..., 0.
int64_t DealMember(int64_t i, int64_t d);

}  // namespace preflight

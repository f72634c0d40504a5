// The causal GQA attention core of the A block (docs/formulas.md §8.1), on one rank,
// under each context-parallel mode of TransformerEngine's
// dot_product_attention/context_parallel.py (Megatron's cp_comm_type):
//   p2p        AttnFuncWithCPAndKVP2P: each rank keeps its queries; the K,V
//              blocks travel round the CP ring in c-1 steps, and the partial
//              outputs combine by the log-sum-exp rule. Backward: the K,V
//              blocks go round again and each block's dK,dV follows it home.
//   all_gather AttnFuncWithCPAndKVAllGather: K,V all-gathered; the backward
//              gathers them again (only the local K,V are saved) and
//              reduce-scatters dK,dV.
//   a2a        AttnFuncWithCPAndQKVOA2A (Ulysses): all-to-all Q,K,V from the
//              sequence split to a head split, attention over the whole
//              sequence on heads/c heads, all-to-all O back. Backward: O and
//              dO to the head split, dQ,dK,dV back.
// The causal mask compares GLOBAL positions (ctx.seq; with load balancing a
// rank holds chunks r and 2c-1-r). Labels are the planner's CommItem::what
// (planner/comm.cc): "attention_kv" (p2p, all_gather), "attention_qkvo" (a2a).
#pragma once

#include <cstdint>
#include <vector>

#include "blocks.h"

namespace preflight::sim {

/// Head geometry of one attention call: rows are position index x batch
/// (row = i * batch + b); head_dim columns per head of Q and K, vdim() of V
/// and O; query head h reads KV head h / rep (GQA).
struct AttnShape {
  int64_t batch = 1;
  int64_t head_dim = 0;
  int64_t rep = 1;         // query heads per KV head
  int64_t v_head_dim = 0;  // V and O columns per head (MLA's d_v); 0 = head_dim
  int64_t vdim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

/// What the core keeps for its backward besides the output O (which the A
/// block saves once, as the O-projection input). Local rows for cp 1, p2p
/// and all_gather; for a2a the head split over the whole sequence, as TE
/// saves them (the same element counts as the local split).
template <class T>
struct AttnState {
  Mat<T> q, k, v;
  Mat<T> lse;  // fp32 per query row and head
};

/// Causal attention of this rank's q (rows ctx.seq positions x batch; the
/// local query heads) over k, v (the local KV heads), after RoPE. Returns O
/// on the same rows; moves q, k, v into `state` in the mode's layout.
/// Throws SimUnsupported for a2a when the local heads do not split over cp.
template <class T>
Mat<T> AttentionCoreForward(Ctx& ctx, const AttnShape& shape, Mat<T> q, Mat<T> k, Mat<T> v, AttnState<T>* state);

/// The "core_attn" rerun (Megatron's _checkpointed_attention_forward keeps
/// only the core's inputs q, k, v), after the O-projection's backward: the
/// core's forward again on the kept q, k, v, its CP exchange included. Sets
/// `o` (the values of the O the projection's backward freed, so the saved
/// one's storage stands in) and, charged as recomputed activations, the fp32
/// `lse` and under a2a the head-split `qc`, `kc`, `vc` (elsewhere the core
/// keeps its inputs themselves, and they stay empty).
template <class T>
void RerunAttentionCore(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v, Mat<T>* o,
                        Tensor<T>* lse, Tensor<T>* qc, Tensor<T>* kc, Tensor<T>* vc);

/// dQ, dK, dV on this rank's rows from dO (this rank's rows) and what the
/// forward kept (q, k, v, lse as AttnState holds them); `o` is the saved
/// output on this rank's rows.
template <class T>
void AttentionCoreBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                           const Mat<T>& lse, const Mat<T>& o, const Mat<T>& dout, Mat<T>* dq, Mat<T>* dk, Mat<T>* dv);

/// The attention dropout of an unfused core call: its layer, and where the
/// call's heads sit among the layer's (the first one's global index, the
/// layer's head count): each mask element is keyed by (batch row x heads +
/// global head, query position, key position).
struct AttnDropout {
  int64_t layer = 0, first_head = 0, heads = 0;
};

/// Megatron's unfused core (transformer/dot_product_attention.py
/// DotProductAttention, training.flash_attention: false), cp 1 only: scores
/// by baddbmm, the causal softmax, O by bmm; `k`, `v` have one head per query
/// head (shape.rep 1: Megatron repeat_interleaves GQA's K and V first).
/// `probs` gets the softmax probabilities the bmm keeps for its backward,
/// one [len, len] block per (batch b, head h) at rows (b * heads + h) * len.
/// With `drop` the probabilities are dropped before the bmm (Megatron's
/// attention_dropout): `mask` gets the scaled keep mask and `dropped` the
/// dropped probabilities (what the bmm keeps), both in probs' layout.
template <class T>
Mat<T> UnfusedAttentionForward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                               Mat<T>* probs, const AttnDropout* drop = nullptr, Mat<T>* mask = nullptr,
                               Mat<T>* dropped = nullptr);

/// Its backward from the kept probabilities (autograd's: the softmax
/// backward dS = P (dP - rowsum(dP P)), no recomputed scores), through the
/// forward's dropout `mask` and `dropped` probabilities when not null.
template <class T>
void UnfusedAttentionBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                              const Mat<T>& probs, const Mat<T>* mask, const Mat<T>* dropped, const Mat<T>& dout,
                              Mat<T>* dq, Mat<T>* dk, Mat<T>* dv);

/// Throws SimUnsupported, with the reason, for an attention layout the
/// executor cannot run: a sequence that does not cut into the CP chunks
/// (2*cp with load balancing, else cp), or a2a (Ulysses) with heads/tp or
/// kv_heads/tp not divisible by cp (TE views the local heads as [cp, heads/cp]).
void CheckAttentionCp(const Dims& d, int tp, int cp, CpComm comm, bool load_balanced);

/// Global positions of the local positions of CP rank `cp_rank` (SeqLayout).
std::vector<int64_t> PositionsOf(int64_t seq, int cp_size, int cp_rank, bool load_balanced);

/// Partial attention over one block of keys (no communication): O and the
/// softmax log-sum-exp of q over the keys at `kpos` visible to each query
/// (kpos <= qpos). A row that sees no key gets O = 0, lse = -inf.
template <class T>
void AttendBlock(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const std::vector<int64_t>& qpos, const Mat<T>& k,
                 const Mat<T>& v, const std::vector<int64_t>& kpos, Mat<T>* o, Mat<T>* lse);

/// Folds a partial result into a running one by the log-sum-exp rule:
/// lse = log(e^lse + e^lse_i), o = o e^(lse_old - lse) + o_i e^(lse_i - lse).
template <class T>
void MergeAttention(const AttnShape& shape, const Mat<T>& o_i, const Mat<T>& lse_i, Mat<T>* o, Mat<T>* lse);

}  // namespace preflight::sim

// Communication per training step, per pipeline rank, per axis and
// collective (docs/formulas.md §7.2). Bytes are exact integers per call; the simulator
// compares its counted messages against these items.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "internal.h"
#include "preflight/estimator/geometry.h"
#include "preflight/estimator/memory_terms.h"

namespace preflight {

using planner_internal::BlockRecomputeEnd;
using planner_internal::ChunkCounts;
using planner_internal::DpBuffers;
using planner_internal::FamilyCounts;
using planner_internal::ParamsOf;
using planner_internal::RankBuffers;
using planner_internal::RankChunk;
using planner_internal::RankOptimizer;

Bytes StageComm::send_total() const {
  Bytes total;
  for (const CommItem& i : items) total += i.send;
  return total;
}

Bytes StageComm::send_on(Axis a) const {
  Bytes total;
  for (const CommItem& i : items) {
    if (i.axis == a) total += i.send;
  }
  return total;
}

Bytes StageComm::recv_on(Axis a) const {
  Bytes total;
  for (const CommItem& i : items) {
    if (i.axis == a) total += i.recv;
  }
  return total;
}

int64_t CpChunkOwner(int64_t cp, bool load_balance, int64_t chunk) {
  if (!load_balance) return chunk;
  return chunk < cp ? chunk : 2 * cp - 1 - chunk;
}

int64_t CpHandoffSends(int64_t cp, bool load_balance, int64_t cp_rank) {
  if (cp <= 1) return 0;
  const int64_t n = load_balance ? 2 * cp : cp;
  int64_t sends = 0;
  for (int64_t j = 0; j + 1 < n; ++j) {
    const int64_t from = CpChunkOwner(cp, load_balance, j);
    if (from == cp_rank && CpChunkOwner(cp, load_balance, j + 1) != from) ++sends;
  }
  return sends;
}

int64_t CpHandoffMaxSends(int64_t cp, bool load_balance) {
  // Forward: ranks 0 and c-1 are the ends (balanced: one edge each), the
  // interior ranks hold an edge in each half. Backward mirrors the chain, so
  // the busiest rank sends as many on the reverse edges.
  int64_t most = 0;
  for (int64_t r = 0; r < cp; ++r) most = std::max(most, CpHandoffSends(cp, load_balance, r));
  return most;
}

int64_t CpHandoffChainMessages(int64_t cp, bool load_balance) {
  int64_t messages = 0;
  for (int64_t r = 0; r < cp; ++r) messages += CpHandoffSends(cp, load_balance, r);
  return messages;
}

namespace {

/// One chain edge's hand-off message of one layer and micro-batch
/// (cp_recurrent: handoff, [OURS]): the conv tail (beta_a) and the state (fp32).
struct HandoffPayload {
  Bytes conv_tail;
  Bytes state;
  Bytes total() const { return conv_tail + state; }
};

/// M: (d_conv-1)*(d_i + 2GN)/t*b*beta_a + b*(H/t)*P*N*4.
HandoffPayload MambaHandoff(const MambaConfig& mc, int64_t hidden, int64_t tp, int64_t micro, int64_t act) {
  const int64_t d_inner = mc.Inner(hidden);
  const int64_t heads = d_inner / mc.head_dim;
  const int64_t conv_channels = CheckedAdd(d_inner, CheckedMul(2, CheckedMul(mc.groups, mc.d_state))) / tp;
  HandoffPayload p;
  p.conv_tail = Bytes(CheckedMul(CheckedMul(CheckedMul(mc.d_conv - 1, conv_channels), micro), act));
  p.state = Bytes(CheckedMul(CheckedMul(CheckedMul(CheckedMul(micro, heads / tp), mc.head_dim), mc.d_state), 4));
  return p;
}

/// R: (K_r-1)*(d_r/t)*b*beta_a + b*(d_r/t)*4.
HandoffPayload RecurrentHandoff(const RecurrentConfig& rc, int64_t tp, int64_t micro, int64_t act) {
  const int64_t channels = rc.width / tp;
  HandoffPayload p;
  p.conv_tail = Bytes(CheckedMul(CheckedMul(CheckedMul(rc.d_conv - 1, channels), micro), act));
  p.state = Bytes(CheckedMul(CheckedMul(micro, channels), 4));
  return p;
}

CommWhat FamilyWhat(size_t f) {
  static constexpr CommWhat kWhats[] = {CommWhat::kAttention, CommWhat::kMamba, CommWhat::kMoeSharedExpert,
                                        CommWhat::kRecurrent, CommWhat::kMlp};
  return kWhats[f];
}

// Collectives issued one per unit: how many, and their payloads' sum.
struct UnitCalls {
  Bytes payload;
  int64_t collectives = 0;
};

class ItemList {
 public:
  ItemList(const MeshLocality& locality, const Links& links, const CostModel& cost, std::vector<CommItem>* out)
      : locality_(locality), links_(links), cost_(cost), out_(out) {}

  // A symmetric collective: every rank of the group sends and receives the
  // same. Returns the item, or null when it moves nothing.
  CommItem* Add(Axis axis, Collective kind, Pass pass, CommWhat what, Bytes payload, int64_t calls) {
    const AxisLocality& loc = locality_[static_cast<size_t>(axis)];
    if (calls <= 0 || loc.size <= 1 || payload.count() <= 0) return nullptr;
    CommItem& item = out_->emplace_back();  // built in place: the sweep prices millions of items
    item.axis = axis;
    item.kind = kind;
    item.pass = pass;
    item.what = what;
    item.group_size = loc.size;
    item.payload = payload;
    item.calls = calls;
    item.send = SendBytes(kind, payload, loc.size) * calls;
    item.recv = item.send;
    item.seconds = static_cast<double>(calls) * CollectiveSeconds(kind, payload, loc, links_, cost_);
    item.exposed_seconds = item.seconds;
    return &item;
  }

  // Traffic of ZeRO 2/3 issued unit by unit: in each of `rounds` rounds
  // (micro-batches), `all.collectives` collectives whose payloads sum to
  // `all.payload`. The item shows one call of the summed payload per round
  // (the ring sends are linear in the payload and exact on padded buffers);
  // its seconds count every collective's latency. `edge` is the part of a
  // round no overlap can hide (CommItem::unhidden_seconds, docs/plan.md).
  void AddPerUnit(Axis axis, Collective kind, Pass pass, CommWhat what, const UnitCalls& all, const UnitCalls& edge,
                  int64_t rounds) {
    CommItem* item = Add(axis, kind, pass, what, all.payload, rounds);
    if (item == nullptr) return;
    const AxisLocality& loc = locality_[static_cast<size_t>(axis)];
    const double n = static_cast<double>(rounds);
    item->seconds += n * ExtraLatency(kind, all.collectives, loc);
    item->exposed_seconds = item->seconds;
    if (edge.collectives > 0 && edge.payload.count() > 0) {
      item->unhidden_seconds =
          n * (CollectiveSeconds(kind, edge.payload, loc, links_, cost_) + ExtraLatency(kind, edge.collectives, loc));
    }
  }

  // Point-to-point: `sends` messages out, `receives` in.
  void AddP2p(Axis axis, Pass pass, CommWhat what, Bytes payload, int64_t sends, int64_t receives) {
    const AxisLocality& loc = locality_[static_cast<size_t>(axis)];
    if ((sends <= 0 && receives <= 0) || payload.count() <= 0) return;
    CommItem& item = out_->emplace_back();
    item.axis = axis;
    item.kind = Collective::kSendRecv;
    item.pass = pass;
    item.what = what;
    item.group_size = 2;
    item.payload = payload;
    item.calls = sends;
    item.send = payload * sends;
    item.recv = payload * receives;
    item.seconds = static_cast<double>(sends) * CollectiveSeconds(Collective::kSendRecv, payload, loc, links_, cost_);
    item.exposed_seconds = item.seconds;
  }

  // The CP state hand-off of one family in one pass: `sends` messages of
  // payload.total() (receives as many). Time per layer per micro-batch, the
  // two-pass form a real implementation runs [OURS, docs/plan.md]: the conv
  // tails cross every chain edge at once (one p2p step), then the states
  // pass along the chain, `chain` sequential p2p steps of the state size,
  // all exposed; `layers` layer-micro-batches.
  void AddHandoff(Pass pass, CommWhat what, const HandoffPayload& payload, int64_t sends, int64_t chain,
                  int64_t layers) {
    const size_t before = out_->size();
    AddP2p(Axis::kCp, pass, what, payload.total(), sends, sends);
    if (out_->size() == before) return;
    const AxisLocality& loc = locality_[static_cast<size_t>(Axis::kCp)];
    const double tail_s = CollectiveSeconds(Collective::kSendRecv, payload.conv_tail, loc, links_, cost_);
    const double state_s = CollectiveSeconds(Collective::kSendRecv, payload.state, loc, links_, cost_);
    CommItem& item = out_->back();
    item.seconds = static_cast<double>(layers) * (tail_s + static_cast<double>(chain) * state_s);
    item.exposed_seconds = item.seconds;
  }

 private:
  // `collectives` collectives take one collective of their summed payload
  // (the wire time is linear in it) plus the ring latency of the others.
  double ExtraLatency(Collective kind, int64_t collectives, const AxisLocality& loc) const {
    return static_cast<double>(std::max<int64_t>(0, collectives - 1) * RingSteps(kind, loc.size)) * cost_.latency_s;
  }

  const MeshLocality& locality_;
  Links links_;
  const CostModel& cost_;
  std::vector<CommItem>* out_;
};

struct Sizes {
  int64_t seq = 0, micro = 0, hidden = 0, act = 2, grad = 4, param = 2, muon = 4;
  Bytes x;  // (s/c)*b*h*beta_a: one CP rank's full-hidden activation of one micro-batch
  /// Token copies a rank dispatches to the experts per MoE layer (RouteMoeOn:
  /// k*T, E*C when padded to capacity, at most E*C when tokens beyond
  /// capacity drop); 0 without MoE layers (main or MTP).
  int64_t moe_copies = 0;
  int64_t moe_tokens = 0;  // T: the router's tokens per MoE layer call (0 without MoE layers)
  /// What an attention layer's TP region gathers under SP, forward (and
  /// reduce-scatters as dgrad), and re-gathers backward for the weight
  /// gradients: x for GQA; MLA's up-projection inputs (MlaTpWidths).
  Bytes attn_gather, attn_regather;
};

/// MLA's TP region under SP (Megatron multi_latent_attention.py, d98e8a6): the
/// replicated ("duplicated") down-projections run on the SP rows; the
/// column-parallel up-projections gather their inputs, the normed query
/// latent d_cq (the norm output h without a query rank) and the normed KV
/// latent d_c, and k_pos_emb (d_rope) is gathered beside them
/// (gather_from_sequence_parallel_region). Backward re-gathers the two
/// latents for the weight gradients and reduce-scatters all three dgrads.
/// Returns {forward gather width, backward re-gather width}.
std::pair<int64_t, int64_t> MlaTpWidths(const ModelConfig& m) {
  const MlaConfig& a = *m.mla;
  const int64_t q_in = a.q_lora_rank > 0 ? a.q_lora_rank : m.hidden;
  return {q_in + a.kv_lora_rank + a.qk_rope_head_dim, q_in + a.kv_lora_rank};
}

Sizes SizesOf(const Inventory& inv, const PlanTables& t, const Layout& l) {
  const TrainingConfig& tr = inv.recipe.training;
  Sizes s;
  s.seq = tr.seq_len;
  s.micro = l.micro_batch;
  s.hidden = inv.recipe.model.hidden;
  s.act = SizeOf(tr.precision.activations);
  s.grad = SizeOf(tr.precision.grads);
  s.param = SizeOf(tr.precision.params);
  s.muon = SizeOf(tr.optimizer.muon_momentum);
  s.x = Bytes(CheckedMul(CheckedMul(TokensOf(inv.recipe, l).cp_rank, s.hidden), s.act));
  s.attn_gather = s.attn_regather = s.x;
  if (inv.recipe.model.mla) {
    const auto [gather, regather] = MlaTpWidths(inv.recipe.model);
    const int64_t tokens = TokensOf(inv.recipe, l).cp_rank;
    s.attn_gather = Bytes(CheckedMul(CheckedMul(tokens, gather), s.act));
    s.attn_regather = Bytes(CheckedMul(CheckedMul(tokens, regather), s.act));
  }
  const size_t moe = static_cast<size_t>(FamilyIndex(BlockKind::kMoe));
  if (t.family_count_prefix.back()[moe] + t.mtp_counts[moe] > 0) {
    const MoeRouting routing = RouteMoeOn(inv.recipe, l);
    s.moe_copies = routing.send_tokens;
    s.moe_tokens = routing.tokens;
  }
  return s;
}

// Layer-micro-batches per family whose forward backward runs again with its
// collectives (Megatron's checkpoints wrap the modules' TP, CP and EP
// exchanges; CheckpointFunction.backward reruns the forward): under full
// recompute every layer of the rank's chunks (the block method: those of each
// chunk's first recompute_layers framework layers), under selective the
// dense MLPs ("mlp") and the MoE layers ("moe"). The attention core's own
// rerun ("core_attn") is counted apart (CoreRerunMicrobatches).
std::array<int64_t, 5> RerunMicrobatches(const Inventory& inv, const PlanTables& t, const Layout& l,
                                         std::span<const RankChunk> chunks) {
  std::array<int64_t, 5> out{};
  const TrainingConfig& tr = inv.recipe.training;
  const bool block = tr.recompute_method == RecomputeMethod::kBlock;
  for (const RankChunk& c : chunks) {
    std::array<int64_t, 5> layers{};
    if (l.recompute == Recompute::kFull) {
      layers = ChunkCounts(t, c.range);
      if (block) {
        const auto rest = FamilyCounts(t, BlockRecomputeEnd(inv, c.range, tr.recompute_layers), c.range.end_layer);
        for (size_t f = 0; f < 5; ++f) layers[f] -= rest[f];
        // Megatron skips the MTP modules' recompute under block
        // (MultiTokenPredictionLayer._checkpointed_forward warns and runs them plainly).
        if (c.range.owns_head) {
          for (size_t f = 0; f < 5; ++f) layers[f] -= t.mtp_counts[f];
        }
      }
    } else if (l.recompute == Recompute::kSelective) {
      const auto counts = ChunkCounts(t, c.range);
      for (const auto& [kind, module] : {std::pair{BlockKind::kDenseMlp, RecomputeModule::kMlp},
                                         std::pair{BlockKind::kMoe, RecomputeModule::kMoe}}) {
        const size_t f = static_cast<size_t>(FamilyIndex(kind));
        if (tr.recompute_modules.has(module)) layers[f] = counts[f];
      }
    }
    for (size_t f = 0; f < 5; ++f) out[f] += layers[f] * c.microbatches;
  }
  return out;
}

// Layer-micro-batches per family whose TP regions rerun: RerunMicrobatches',
// and under the selective "shared_experts" module every MoE layer's once
// more (the shared expert, the MoE layer's one TP region, reruns under
// tensor_parallel.checkpoint: Megatron moe_layer.py shared_experts_compute;
// with "moe" too that checkpoint sits inside the layer's, and reruns again
// in the backward of the layer's rerun).
std::array<int64_t, 5> TpRerunMicrobatches(const Inventory& inv, const PlanTables& t, const Layout& l,
                                           std::span<const RankChunk> chunks, std::array<int64_t, 5> rerun) {
  if (l.recompute != Recompute::kSelective ||
      !inv.recipe.training.recompute_modules.has(RecomputeModule::kSharedExperts)) {
    return rerun;
  }
  const size_t e = static_cast<size_t>(FamilyIndex(BlockKind::kMoe));
  for (const RankChunk& c : chunks) rerun[e] += ChunkCounts(t, c.range)[e] * c.microbatches;
  return rerun;
}

// Selective "mla_up_proj": backward recomputes every MLA layer's q, k, v
// from the latents (multi_latent_attention.py qkv_up_checkpoint), gathering
// the up-projections' inputs and k_pe over TP again under SP: the forward's
// gathers once more in the backward pass, no reduce-scatter (the
// O-projection is not rerun).
void AddMlaUpProjRerun(const Inventory& inv, const PlanTables& t, const Layout& l, const Sizes& s,
                       std::span<const RankChunk> chunks, ItemList* items) {
  if (l.tp <= 1 || !l.sequence_parallel() || !inv.recipe.model.mla || l.recompute != Recompute::kSelective ||
      !inv.recipe.training.recompute_modules.has(RecomputeModule::kMlaUpProj)) {
    return;
  }
  const size_t a = static_cast<size_t>(FamilyIndex(BlockKind::kAttention));
  int64_t n = 0;
  for (const RankChunk& c : chunks) n += ChunkCounts(t, c.range)[a] * c.microbatches;
  items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kAttention, s.attn_gather, n);
}

// Attention layer-micro-batches whose core reruns with its CP exchange:
// every one under the selective "core_attn" module, else the rerun layers'.
int64_t CoreRerunMicrobatches(const Inventory& inv, const PlanTables& t, const Layout& l,
                              std::span<const RankChunk> chunks, const std::array<int64_t, 5>& rerun) {
  const size_t a = static_cast<size_t>(FamilyIndex(BlockKind::kAttention));
  if (l.recompute != Recompute::kSelective || !inv.recipe.training.recompute_modules.has(RecomputeModule::kCoreAttn)) {
    return rerun[a];
  }
  int64_t n = 0;
  for (const RankChunk& c : chunks) n += ChunkCounts(t, c.range)[a] * c.microbatches;
  return n;
}

// TP regions of the layer families, the embedding, head and loss (docs/formulas.md §7.2 "TP").
// A rerun region repeats its forward collectives in the backward pass.
void AddTp(const PlanTables& t, const Layout& l, const Sizes& s, std::span<const RankChunk> chunks,
           const std::array<int64_t, 5>& rerun, bool mtp_rerun, ItemList* items) {
  if (l.tp <= 1) return;
  const bool sp = l.sequence_parallel();
  std::array<int64_t, 5> regions{};
  int64_t emb_mb = 0, head_mb = 0;
  for (const RankChunk& c : chunks) {
    const auto counts = ChunkCounts(t, c.range);
    for (size_t f = 0; f < 5; ++f) regions[f] += counts[f] * t.family[f].tp_regions * c.microbatches;
    if (c.range.owns_embedding) emb_mb += c.microbatches;
    if (c.range.owns_head) head_mb += c.microbatches;
  }
  for (size_t f = 0; f < 5; ++f) {
    const CommWhat what = FamilyWhat(f);
    const int64_t reruns = rerun[f] * t.family[f].tp_regions;
    if (sp) {
      // SP (MG/TE): fwd AG + RS; bwd AG (grad of row-parallel output) + RS
      // (column-parallel dgrad) + AG (re-gather of the saved sharded input).
      const bool attention = f == static_cast<size_t>(FamilyIndex(BlockKind::kAttention));
      const Bytes gather = attention ? s.attn_gather : s.x, regather = attention ? s.attn_regather : s.x;
      items->Add(Axis::kTp, Collective::kAllGather, Pass::kForward, what, gather, regions[f]);
      items->Add(Axis::kTp, Collective::kReduceScatter, Pass::kForward, what, s.x, regions[f]);
      // A recompute rerun repeats the forward's gather and reduce-scatter in backward.
      if (regather == s.x && gather == s.x) {
        items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, what, s.x, 2 * regions[f] + reruns);
        items->Add(Axis::kTp, Collective::kReduceScatter, Pass::kBackward, what, s.x, regions[f] + reruns);
      } else {
        items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, what, s.x, regions[f]);
        items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, what, regather, regions[f]);
        items->Add(Axis::kTp, Collective::kReduceScatter, Pass::kBackward, what, gather, regions[f]);
        if (reruns > 0) {
          items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, what, gather, reruns);
          items->Add(Axis::kTp, Collective::kReduceScatter, Pass::kBackward, what, s.x, reruns);
        }
      }
    } else {
      items->Add(Axis::kTp, Collective::kAllReduce, Pass::kForward, what, s.x, regions[f]);
      items->Add(Axis::kTp, Collective::kAllReduce, Pass::kBackward, what, s.x, regions[f] + reruns);
    }
  }
  // Every MTP module predicts through the head again, with its own loss, and
  // embeds the shifted tokens. A replicated embedding looks up its own
  // tokens on every TP rank: no collective.
  const int64_t heads = head_mb * (1 + t.mtp_layers);
  const int64_t mtp = head_mb * t.mtp_layers;
  // Under full uniform recompute each MTP module's checkpoint (enorm through
  // its final norm) reruns in backward: eh_proj's forward gathers again.
  const int64_t mtp_reruns = mtp_rerun ? mtp : 0;
  const int64_t lookups = t.replicated_embedding ? 0 : emb_mb + mtp;
  if (sp) {
    // With learned positions Megatron's LanguageModelEmbedding turns off
    // reduce_scatter_embeddings: the lookup is all-reduced, the positions
    // added, then the sum split to the sequence (no communication forward).
    items->Add(Axis::kTp, t.learned_positions ? Collective::kAllReduce : Collective::kReduceScatter, Pass::kForward,
               CommWhat::kEmbedding, s.x, lookups);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kEmbedding, s.x, lookups);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kForward, CommWhat::kHead, s.x, heads);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kHead, s.x, heads);
    items->Add(Axis::kTp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kHead, s.x, heads);
    // eh_proj (column-parallel, 2h -> h, then gathered over TP and scattered
    // back to the sequence): forward AG of its 2h input and of its output;
    // backward AG (the scatter's), RS of the 2h dgrad, AG re-gathering the input.
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kForward, CommWhat::kMtpProjection, s.x * 2, mtp);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kForward, CommWhat::kMtpProjection, s.x, mtp);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kMtpProjection, s.x, mtp + mtp_reruns);
    items->Add(Axis::kTp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kMtpProjection, s.x * 2, mtp);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kMtpProjection, s.x * 2, mtp + mtp_reruns);
  } else {
    items->Add(Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kEmbedding, s.x, lookups);
    items->Add(Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kHead, s.x, heads);
    // eh_proj: its output gathered forward; its 2h dgrad all-reduced backward.
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kForward, CommWhat::kMtpProjection, s.x, mtp);
    items->Add(Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kMtpProjection, s.x, mtp_reruns);
    items->Add(Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kMtpProjection, s.x * 2, mtp);
  }
  // Vocab-parallel cross-entropy: AR of the max, the sum of exp and the
  // target logit, each fp32 per token (Megatron cross_entropy.py).
  const Bytes ce(CheckedMul(CheckedMul(s.seq / l.cp, s.micro), 4));
  items->Add(Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kLoss, ce, 3 * heads);
}

// Mamba all-to-all CP repeats B and C r_g = c/(G/t) times when c > G/t (docs/formulas.md §1.4).
int64_t MambaGroupRepeat(const MambaConfig& m, const Layout& l) {
  const int64_t local_groups = m.groups / l.tp;
  return (local_groups > 0 && l.cp > local_groups) ? l.cp / local_groups : 1;
}

// Attention under CP per TE's cp_comm_type (docs/formulas.md §7.2; TransformerEngine
// dot_product_attention/context_parallel.py).
// `n_rerun` of the n_a layer-micro-batches rerun the core's forward, and its
// exchange, in backward.
void AddCpAttention(const FamilyCost& a, int64_t n_a, int64_t n_rerun, const Layout& l,
                    const std::function<Bytes(int64_t)>& width_bytes, ItemList* items) {
  const int64_t c1 = l.cp - 1;
  switch (l.cp_comm) {
    case CpComm::kP2p: {
      // AttnFuncWithCPAndKVP2P: c-1 KV blocks forward; backward the KV blocks
      // go round again (c-1) and the dKV of each block follows it home (c-1).
      const Bytes kc = width_bytes(a.cp_kv_width);
      items->AddP2p(Axis::kCp, Pass::kForward, CommWhat::kAttentionKv, kc, c1 * n_a, c1 * n_a);
      const int64_t bwd = c1 * (2 * n_a + n_rerun);
      items->AddP2p(Axis::kCp, Pass::kBackward, CommWhat::kAttentionKv, kc, bwd, bwd);
      break;
    }
    case CpComm::kAllGather: {
      // AttnFuncWithCPAndKVAllGather saves the local K, V: its backward
      // all-gathers them again, then reduce-scatters dK, dV.
      const Bytes full = width_bytes(a.cp_kv_width) * l.cp;
      items->Add(Axis::kCp, Collective::kAllGather, Pass::kForward, CommWhat::kAttentionKv, full, n_a);
      items->Add(Axis::kCp, Collective::kAllGather, Pass::kBackward, CommWhat::kAttentionKv, full, n_a + n_rerun);
      items->Add(Axis::kCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kAttentionKv, full, n_a);
      break;
    }
    case CpComm::kA2a: {
      // Ulysses (AttnFuncWithCPAndQKVOA2A), each pass's all-to-alls as one
      // call of their total width: forward Q, K, V and O; backward O, dO,
      // dQ, dK and dV.
      items->Add(Axis::kCp, Collective::kAllToAll, Pass::kForward, CommWhat::kAttentionQkvo,
                 width_bytes(a.cp_a2a_width), n_a);
      items->Add(Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kAttentionQkvo,
                 width_bytes(a.cp_a2a_bwd_width), n_a);
      items->Add(Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kAttentionQkvo,
                 width_bytes(a.cp_a2a_width), n_rerun);
      break;
    }
  }
}

// M and R blocks under CP. all_to_all (Megatron, docs/formulas.md §7.2): the mixer
// input is re-split from sequence to heads and the output back. handoff
// [OURS]: per chain edge per layer per micro-batch one message of the conv
// tail (the last d_conv-1 conv inputs of the local channels, beta_a) and the
// recurrent state (fp32) in each pass; the busiest CP rank's count.
// `rerun` (layer-micro-batches per family, RerunMicrobatches) repeat their
// forward all-to-alls in backward; the hand-off's received state serves the
// rerun as it is (LayerActivations keeps it under every policy).
void AddCpRecurrent(const Inventory& inv, const PlanTables& t, const Layout& l, const Sizes& s, int64_t n_m,
                    int64_t n_r, const std::array<int64_t, 5>& rerun, const std::function<Bytes(int64_t)>& width_bytes,
                    ItemList* items) {
  const MambaConfig& mc = inv.recipe.model.mamba;
  const RecurrentConfig& rc = inv.recipe.model.recurrent;
  if (l.cp_recurrent == CpRecurrent::kAllToAll) {
    const FamilyCost& m = t.family[static_cast<size_t>(FamilyIndex(BlockKind::kMamba))];
    const int64_t repeat_extra = (MambaGroupRepeat(mc, l) - 1) * 2 * mc.groups * mc.d_state;
    items->Add(Axis::kCp, Collective::kAllToAll, Pass::kForward, CommWhat::kMamba,
               width_bytes(m.cp_a2a_width + repeat_extra), n_m);
    items->Add(Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kMamba,
               width_bytes(m.cp_a2a_bwd_width + repeat_extra), n_m);
    items->Add(Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kMamba,
               width_bytes(m.cp_a2a_width + repeat_extra), rerun[static_cast<size_t>(FamilyIndex(BlockKind::kMamba))]);
    const FamilyCost& r = t.family[static_cast<size_t>(FamilyIndex(BlockKind::kRecurrent))];
    items->Add(Axis::kCp, Collective::kAllToAll, Pass::kForward, CommWhat::kRecurrent, width_bytes(r.cp_a2a_width),
               n_r);
    items->Add(Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kRecurrent, width_bytes(r.cp_a2a_bwd_width),
               n_r);
    items->Add(Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kRecurrent, width_bytes(r.cp_a2a_width),
               rerun[static_cast<size_t>(FamilyIndex(BlockKind::kRecurrent))]);
    return;
  }
  const int64_t sends = CpHandoffMaxSends(l.cp, l.cp_load_balance);
  const int64_t chain = CpHandoffChainMessages(l.cp, l.cp_load_balance);
  const HandoffPayload m = MambaHandoff(mc, inv.recipe.model.hidden, l.tp, s.micro, s.act);
  const HandoffPayload r = RecurrentHandoff(rc, l.tp, s.micro, s.act);
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    items->AddHandoff(pass, CommWhat::kMambaState, m, sends * n_m, chain, n_m);
    items->AddHandoff(pass, CommWhat::kRecurrentState, r, sends * n_r, chain, n_r);
  }
}

void AddCp(const Inventory& inv, const PlanTables& t, const Layout& l, const Sizes& s,
           std::span<const RankChunk> chunks, const std::array<int64_t, 5>& rerun, ItemList* items) {
  if (l.cp <= 1) return;
  std::array<int64_t, 5> layers_mb{};
  for (const RankChunk& c : chunks) {
    const auto counts = ChunkCounts(t, c.range);
    for (size_t f = 0; f < 5; ++f) layers_mb[f] += counts[f] * c.microbatches;
  }
  const int64_t tokens = TokensOf(inv.recipe, l).cp_rank;
  const std::function<Bytes(int64_t)> width_bytes = [&](int64_t width) {
    return Bytes(CheckedMul(CheckedMul(tokens, width), s.act) / l.tp);
  };
  const auto n_of = [&](BlockKind k) { return layers_mb[static_cast<size_t>(FamilyIndex(k))]; };
  AddCpAttention(t.family[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))], n_of(BlockKind::kAttention),
                 CoreRerunMicrobatches(inv, t, l, chunks, rerun), l, width_bytes, items);
  AddCpRecurrent(inv, t, l, s, n_of(BlockKind::kMamba), n_of(BlockKind::kRecurrent), rerun, width_bytes, items);
}

// PP boundaries: a chunk sends activations forward unless it is the last
// chunk and gradients backward unless it is the first (docs/formulas.md §7.2 "PP").
void AddPp(const Layout& l, const Sizes& s, std::span<const RankChunk> chunks, int64_t n_chunks, ItemList* items) {
  if (l.pp <= 1) return;
  const int64_t t_sp = l.sequence_parallel() ? l.tp : 1;
  const Bytes msg = s.x / t_sp;
  // DualPipeV keeps chunks p-1 and p on one device: no message between them.
  const bool v_shape = l.schedule == Schedule::kDualPipeV;
  auto same_device = [&](int64_t a, int64_t b) {
    return v_shape && PipelineRankOfChunk(l, a, n_chunks) == PipelineRankOfChunk(l, b, n_chunks);
  };
  int64_t fwd_send = 0, fwd_recv = 0;
  for (const RankChunk& c : chunks) {
    if (c.chunk + 1 < n_chunks && !same_device(c.chunk, c.chunk + 1)) fwd_send += c.microbatches;
    if (c.chunk > 0 && !same_device(c.chunk, c.chunk - 1)) fwd_recv += c.microbatches;
  }
  items->AddP2p(Axis::kPp, Pass::kForward, CommWhat::kActivations, msg, fwd_send, fwd_recv);
  items->AddP2p(Axis::kPp, Pass::kBackward, CommWhat::kActivationGrads, msg, fwd_recv, fwd_send);
}

/// Megatron's all-gather dispatcher (token_dispatcher.py
/// MoEAllGatherTokenDispatcher, d98e8a6): token_dispatch all-gathers the T
/// local tokens over the ETP x EP group and token_combine reduce-scatters the
/// [T * t_e * e, h] expert outputs back; backward mirrors both
/// (mappings.py _GatherFromSequenceParallelRegion: AG forward, RS backward).
/// One collective over t_e * e ranks, priced as the ETP step then the EP
/// step: a ring moves (t_e - 1) T h + (e - 1) t_e T h = (t_e e - 1) T h
/// bytes either way, each step on its own axis's links. The routing map and
/// probabilities gathered beside the tokens ([T, E] each) are not priced.
void AddEpAllGather(const Layout& l, const Sizes& s, int64_t n_e, int64_t n_bwd, ItemList* items) {
  const Bytes etp = BytesOf(CheckedMul(CheckedMul(s.moe_tokens, s.hidden), l.expert_tp), s.act);
  const Bytes group = etp * l.ep;
  for (const auto& [pass, n] : {std::pair{Pass::kForward, n_e}, std::pair{Pass::kBackward, n_bwd}}) {
    items->Add(Axis::kExpertTp, Collective::kAllGather, pass, CommWhat::kMoeDispatch, etp, n);
    items->Add(Axis::kEp, Collective::kAllGather, pass, CommWhat::kMoeDispatch, group, n);
    items->Add(Axis::kEp, Collective::kReduceScatter, pass, CommWhat::kMoeCombine, group, n);
    items->Add(Axis::kExpertTp, Collective::kReduceScatter, pass, CommWhat::kMoeCombine, etp, n);
  }
}

void AddEp(const PlanTables& t, const Layout& l, const Sizes& s, std::span<const RankChunk> chunks,
           const std::array<int64_t, 5>& rerun, MoeDispatcher dispatcher, ItemList* items) {
  int64_t n_e = 0;
  for (const RankChunk& c : chunks) {
    n_e += ChunkCounts(t, c.range)[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))] * c.microbatches;
  }
  if (n_e == 0) return;
  // A rerun MoE layer (full recompute, or the selective "moe" module)
  // dispatches and combines its tokens once more in backward, before its
  // gradients flow (the checkpointed forward includes the collectives).
  const int64_t n_bwd = n_e + rerun[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))];
  if (dispatcher == MoeDispatcher::kAllGather) {
    AddEpAllGather(l, s, n_e, n_bwd, items);
    return;
  }
  const Bytes buf = BytesOf(CheckedMul(s.moe_copies, s.hidden), s.act);
  items->Add(Axis::kEp, Collective::kAllToAll, Pass::kForward, CommWhat::kMoeDispatch, buf, n_e);
  items->Add(Axis::kEp, Collective::kAllToAll, Pass::kForward, CommWhat::kMoeCombine, buf, n_e);
  items->Add(Axis::kEp, Collective::kAllToAll, Pass::kBackward, CommWhat::kMoeDispatch, buf, n_bwd);
  items->Add(Axis::kEp, Collective::kAllToAll, Pass::kBackward, CommWhat::kMoeCombine, buf, n_bwd);
  // Expert TP: AG of the received tokens after dispatch, RS before combine; mirrored in backward.
  const Bytes gathered = buf * l.expert_tp;
  items->Add(Axis::kExpertTp, Collective::kAllGather, Pass::kForward, CommWhat::kMoeExperts, gathered, n_e);
  items->Add(Axis::kExpertTp, Collective::kReduceScatter, Pass::kForward, CommWhat::kMoeExperts, gathered, n_e);
  items->Add(Axis::kExpertTp, Collective::kAllGather, Pass::kBackward, CommWhat::kMoeExperts, gathered, n_bwd);
  items->Add(Axis::kExpertTp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kMoeExperts, gathered, n_bwd);
}

// One ZeRO unit's parameters on this rank: elements [ShardClass][OptimizerKind]
// and, of them, those stored in fp32.
struct LocalUnit {
  std::array<std::array<int64_t, 2>, 3> elements{};
  std::array<std::array<int64_t, 2>, 3> fp32{};
  int64_t tp_partial = 0;  // REP elements whose gradients differ over TP even without SP
  int64_t tp_whole = 0;    // REP elements whose gradients are whole on each TP rank even with SP
};

int64_t ClassDivisor(int c, const Layout& l) {
  return c == static_cast<int>(ShardClass::kReplicated) ? 1
         : c == static_cast<int>(ShardClass::kTpSharded) ? l.tp
                                                         : CheckedMul(l.ep, l.expert_tp);
}

/// Replicated elements of a layer whose gradients each TP rank holds only a
/// part of even without SP: the per-head q and k norms (a rank normalizes its
/// own heads). Megatron all-reduces them over TP with or without SP
/// (finalize_model_grads.py: "config.sequence_parallel or config.qk_layernorm").
int64_t TpPartialElements(const ModelConfig& m, BlockKind kind) {
  if (kind != BlockKind::kAttention || m.mla || !m.attention.qk_norm) return 0;
  return CheckedMul(2, m.attention.head_dim);
}

LocalUnit LocalLayer(const ParamTotals& t, const Layout& l, int64_t tp_partial) {
  LocalUnit u;
  u.tp_partial = tp_partial;
  for (int c = 0; c < 3; ++c) {
    const int64_t d = ClassDivisor(c, l);
    for (int o = 0; o < 2; ++o) {
      u.elements[c][o] = CeilDiv(t.elements[c][o], d);
      u.fp32[c][o] = t.fp32_elements[c][o] == 0 ? 0 : CeilDiv(t.fp32_elements[c][o], d);
    }
  }
  return u;
}

// An end tensor (embedding, head, final norm): vocab-parallel rows are the
// padded vocabulary's V_pad/t.
void AddEndTensor(const ParamTensor& t, const Inventory& inv, const Layout& l, LocalUnit* u) {
  if (t.shape.empty() || !t.trained) return;  // a buffer has no gradient to reduce
  const int c = static_cast<int>(ClassOf(t.split));
  const int o = static_cast<int>(t.optimizer);
  int64_t n = 0;
  if (t.split == Split::kVocab) {
    int64_t rest = 1;
    for (size_t i = 1; i < t.shape.size(); ++i) rest = CheckedMul(rest, t.shape[i]);
    n = CheckedMul(PaddedVocab(inv.recipe.model, l.tp) / l.tp, rest);
  } else {
    n = CeilDiv(t.elements(), ClassDivisor(c, l));
  }
  u->elements[c][o] = CheckedAdd(u->elements[c][o], n);
  if (t.dtype == DType::kFp32) u->fp32[c][o] = CheckedAdd(u->fp32[c][o], n);
}

// The groups and element size the buffers of one layout are padded with.
struct DpGroups {
  std::array<int64_t, 2> size{};  // D: the ZeRO groups [dense d*c, expert d_e] (per HSDP replica)
  int64_t beta_p = 2;
  int64_t tp = 1;                 // the replicated gradients' all-reduce is padded to a multiple of t
  bool sp = false;                // every REP gradient is partial over TP, else only LocalUnit::tp_partial
};

// The ZeRO groups [dense, expert] the buffers are sharded over (per HSDP replica).
std::array<int64_t, 2> ZeroGroups(const Layout& l) {
  return {l.zero_group(), std::max<int64_t>(1, l.expert_zero_group())};
}

// The padded buffers of one unit.
DpBuffers UnitBuffers(const LocalUnit& u, const DpGroups& dg) {
  const int rep = static_cast<int>(ShardClass::kReplicated), tp = static_cast<int>(ShardClass::kTpSharded);
  const int ep = static_cast<int>(ShardClass::kEpSharded);
  DpBuffers b;
  if (!dg.sp && dg.tp > 1) b.replicated = u.tp_partial;
  if (dg.sp) b.replicated = -u.tp_whole;
  for (int o = 0; o < 2; ++o) {
    if (dg.sp) b.replicated = CheckedAdd(b.replicated, u.elements[rep][o]);
    const int64_t dense_fp32 = CheckedAdd(u.fp32[rep][o], u.fp32[tp][o]);
    const int64_t dense = CheckedSub(CheckedAdd(u.elements[rep][o], u.elements[tp][o]), dense_fp32);
    const int64_t expert_fp32 = u.fp32[ep][o];
    const int64_t expert = CheckedSub(u.elements[ep][o], expert_fp32);
    const std::array<std::array<int64_t, 2>, 2> n = {{{dense, dense_fp32}, {expert, expert_fp32}}};
    for (size_t g = 0; g < 2; ++g) {
      for (size_t wide = 0; wide < 2; ++wide) {
        if (n[g][wide] == 0) continue;
        const int64_t n_pad = RoundUp(n[g][wide], dg.size[g]);
        b.padded[g] = CheckedAdd(b.padded[g], n_pad);
        b.param_bytes[g] = CheckedAdd(b.param_bytes[g], CheckedMul(n_pad, wide ? 4 : dg.beta_p));
        b.units[g] = 1;
        if (o == static_cast<int>(OptimizerKind::kMuon)) b.muon[g] = CheckedAdd(b.muon[g], n_pad);
      }
    }
  }
  if (b.replicated > 0) {
    b.replicated_padded = RoundUp(b.replicated, dg.tp);
    b.replicated_units = 1;
  }
  return b;
}

// The embedding copy a tied head or MTP keeps on the last stage, and the
// first stage's embedding it mirrors: a buffer of their own, padded alone
// (Megatron's "shared_embedding" bucket, distrib_optimizer.py
// _compute_per_buffer_param_layout), so both stages shard it alike. Part of
// the embedding or head unit, whose collectives count once (UnitBuffers).
void AddSharedEmbedding(const Inventory& inv, const Layout& l, const DpGroups& dg, DpBuffers* unit) {
  LocalUnit u;
  AddEndTensor(inv.embedding, inv, l, &u);
  const DpBuffers b = UnitBuffers(u, dg);
  const std::array<int64_t, 2> units = unit->units;
  *unit += b;
  for (size_t g = 0; g < 2; ++g) unit->units[g] = std::max(units[g], b.units[g]);
}

// A family's per-layer buffers, worked out from the first of its layers that
// the walk meets (a uniform family's, from any of its layers).
struct FamilyMemo {
  const ParamTotals* totals = nullptr;
  DpBuffers buffers;
  int64_t pending = 0;  // layers of a uniform family (Inventory::family_uniform) not yet added
};

// The layers [first, end) of a chunk one by one: each family's last buffers
// are remembered, a uniform family's layers counted into `pending`.
void WalkLayers(const Inventory& inv, const Layout& l, const DpGroups& dg, const StageChunk& c,
                std::array<FamilyMemo, 5>& memo, bool edges, RankBuffers& rb) {
  const int64_t first = c.first_layer, end = c.end_layer;
  for (int64_t i = first; i < end; ++i) {
    const Layer& layer = inv.layers.at(static_cast<size_t>(i));
    const size_t f = static_cast<size_t>(FamilyIndex(layer.kind));
    FamilyMemo& last = memo[f];
    if (last.totals == nullptr || (!inv.family_uniform[f] && !(*last.totals == layer.totals))) {
      last.totals = &layer.totals;
      last.buffers = UnitBuffers(LocalLayer(layer.totals, l, TpPartialElements(inv.recipe.model, layer.kind)), dg);
    }
    if (inv.family_uniform[f]) {
      ++last.pending;
    } else {
      rb.all += last.buffers;
    }
    if (edges && i == first && !c.owns_embedding) rb.first += last.buffers;
    if (edges && i + 1 == end && !c.owns_head) rb.last += last.buffers;
  }
}

// The same for a chunk whose families are all uniform, from its per-family
// layer counts: O(families), not O(layers). The sums are integers, so the
// order of the additions changes nothing.
bool CountUniformLayers(const Inventory& inv, const PlanTables& t, const Layout& l, const DpGroups& dg,
                        const StageChunk& c, std::array<FamilyMemo, 5>& memo, bool edges, RankBuffers& rb) {
  const std::array<int64_t, 5> counts = FamilyCounts(t, c.first_layer, c.end_layer);
  for (size_t f = 0; f < 5; ++f) {
    if (counts[f] > 0 && !inv.family_uniform[f]) return false;
  }
  auto buffers_of = [&](size_t f) -> FamilyMemo& {
    FamilyMemo& m = memo[f];
    if (m.totals == nullptr) {
      const Layer& first = inv.layers.at(static_cast<size_t>(t.first_of_family[f]));
      m.totals = &first.totals;
      m.buffers = UnitBuffers(LocalLayer(*m.totals, l, TpPartialElements(inv.recipe.model, first.kind)), dg);
    }
    return m;
  };
  for (size_t f = 0; f < 5; ++f) {
    if (counts[f] > 0) buffers_of(f).pending += counts[f];
  }
  if (!edges || c.first_layer == c.end_layer) return true;
  const auto family = [&](int64_t i) { return static_cast<size_t>(FamilyIndex(t.kinds[static_cast<size_t>(i)])); };
  if (!c.owns_embedding) rb.first += buffers_of(family(c.first_layer)).buffers;
  if (!c.owns_head) rb.last += buffers_of(family(c.end_layer - 1)).buffers;
  return true;
}

// The units of a rank in the executor's order: per chunk the embedding, each
// layer, the head with the final norm. Layers of one family usually have equal
// totals: a uniform family's buffers are worked out once and multiplied by
// its layer count (the sweep prices every layout; divisions are its cost).
RankBuffers BuffersOf(const Inventory& inv, const PlanTables& t, const Layout& l, const Sizes& s,
                      std::span<const RankChunk> chunks) {
  RankBuffers rb;
  // The chunks' end units are summed under every ZeRO stage (only ZeRO 2/3
  // read them): a rank's buffers then serve all of an item's ZeRO stages.
  const bool edges = true;
  DpBuffers& b = rb.all;
  const ModelConfig& m = inv.recipe.model;
  const DpGroups dg{ZeroGroups(l), s.param, l.tp, l.sequence_parallel()};
  std::array<FamilyMemo, 5> memo{};
  const bool shared_copy = KeepsEmbeddingCopy(m, l);
  for (const RankChunk& c : chunks) {
    const int64_t first = c.range.first_layer, end = c.range.end_layer;
    DpBuffers embedding, head;
    if (c.range.owns_embedding) {
      LocalUnit u;
      if (!shared_copy) AddEndTensor(inv.embedding, inv, l, &u);
      for (const ParamTensor& p : inv.positions) {
        AddEndTensor(p, inv, l, &u);
        // Added to the all-reduced lookup of the whole sequence before SP
        // splits it (Megatron LanguageModelEmbedding): each TP rank holds the
        // whole gradient, which finalize_model_grads does not all-reduce.
        if (inv.embedding.split != Split::kReplicated) u.tp_whole = CheckedAdd(u.tp_whole, p.elements());
      }
      embedding = UnitBuffers(u, dg);
      if (shared_copy) AddSharedEmbedding(inv, l, dg, &embedding);
      b += embedding;
    }
    if (!CountUniformLayers(inv, t, l, dg, c.range, memo, edges, rb)) WalkLayers(inv, l, dg, c.range, memo, edges, rb);
    if (c.range.owns_head) {
      LocalUnit u;
      if (inv.final_norms.empty()) AddEndTensor(inv.final_norm, inv, l, &u);
      for (const ParamTensor& x : inv.final_norms) AddEndTensor(x, inv, l, &u);
      for (const ParamTensor& x : inv.head) AddEndTensor(x, inv, l, &u);
      for (const ParamTensor& x : inv.mtp) AddEndTensor(x, inv, l, &u);
      // A tied head (or MTP) on a single-stage pipeline shares the embedding
      // tensor; with pp > 1 the last stage keeps a second copy (docs/formulas.md §1.1).
      // DualPipe's ranks 0 and p-1 hold stage 0 beside stage p-1: no copy.
      head = UnitBuffers(u, dg);
      if (shared_copy) AddSharedEmbedding(inv, l, dg, &head);
      b += head;
    }
    if (!edges) continue;
    // A chunk of no layers: its ends are each other's neighbours.
    if (c.range.owns_embedding) rb.first += embedding;
    if (first == end && !c.range.owns_embedding) rb.first += head;
    if (c.range.owns_head) rb.last += head;
    if (first == end && !c.range.owns_head) rb.last += embedding;
  }
  for (const FamilyMemo& family : memo) {
    if (family.pending > 0) b += family.buffers.Times(family.pending);
  }
  return rb;
}

// Gradient synchronisation, parameter gathers and optimizer communication
// (docs/formulas.md §7.2 "DP", "Muon extra"; 2.2 for the groups), on the padded flat
// buffers of the distributed optimizer (DpBuffers), as the executor runs them
// (simulator/dist_optimizer.h):
// - ZeRO 0: all-reduce of the grads; ZeRO 1: reduce-scatter of the grads and
//   all-gather of the params once per step.
// - ZeRO 2 (DeepSpeed stage 2): each unit's grads are reduce-scattered right
//   after its backward in every micro-batch (with SP its replicated grads are
//   all-reduced over TP first); params gathered once per step as ZeRO 1.
// - ZeRO 3 (FSDP, reshard after forward): grads as ZeRO 2; each unit's params
//   are all-gathered before its forward and again before its backward in
//   every micro-batch, and not after the step.
// - HSDP (dp_replicate r > 1): all of the above runs inside each replica's
//   ZeRO group; every reduce-scatter is followed by an all-reduce of the
//   rank's shard (a 1/D slice of the same buffers) across the r replicas
//   (Megatron: the inter-instance all-reduce after the intra-instance
//   reduce-scatter; FSDP2 HSDP likewise).
RankOptimizer OptimizerOf(const Inventory& inv, const PlanTables& t, const Layout& l, const Sizes& s,
                          std::span<const RankChunk> chunks) {
  RankOptimizer o;
  for (const RankChunk& c : chunks) {
    o.params += ParamsOf(t, c.range.first_layer, c.range.end_layer);
    o.embedding = o.embedding || c.range.owns_embedding;
    o.head = o.head || c.range.owns_head;
  }
  // The MTP modules' matrices live with the head and are Muon's like the
  // layers' (their TP and expert-TP gathers below).
  if (o.head) o.params += inv.mtp_totals;
  o.buffers = BuffersOf(inv, t, l, s, chunks);
  return o;
}

// Megatron's layer-wise optimizer (parallel.optimizer_sharding: layer_wise,
// ZeRO 1; megatron/core/optimizer/layer_wise_optimizer.py on its ping-pong
// path): per group [dense d*c, expert d_e], what the busiest member sends in
// allgather_params and the most TP-sharded Muon elements one member steps
// (it alone gathers them over TP).
struct LayerWiseTraffic {
  std::array<Bytes, 2> param_send;
  std::array<int64_t, 2> muon_tp{};
};

// Appends `t` as the layer-wise optimizer deals it on this rank: routed
// expert stacks as one tensor per local expert, vocab rows padded.
void AppendDealt(const ParamTensor& t, const Inventory& inv, const Layout& l, const Sizes& s,
                 std::array<std::vector<DealtTensor>, 2>& out) {
  if (t.shape.empty() || !t.trained || t.elements() == 0) return;
  const bool muon = t.optimizer == OptimizerKind::kMuon;
  const int64_t bytes = t.dtype == DType::kFp32 ? 4 : s.param;
  if (t.split == Split::kExpert) {
    const int64_t experts = t.shape.front();
    const DealtTensor one{CeilDiv(t.elements() / experts, l.expert_tp), static_cast<int>(t.optimizer), bytes, muon};
    for (int64_t i = CeilDiv(experts, l.ep); i > 0; --i) out[1].push_back(one);
    return;
  }
  LocalUnit u;
  AddEndTensor(t, inv, l, &u);
  int64_t n = 0;
  for (const auto& c : u.elements) n = CheckedAdd(n, CheckedAdd(c[0], c[1]));
  const bool tp_sharded = ClassOf(t.split) == ShardClass::kTpSharded;
  out[0].push_back({n, static_cast<int>(t.optimizer), bytes, muon && tp_sharded});
}

LayerWiseTraffic LayerWiseTrafficOf(const Inventory& inv, const Layout& l, const Sizes& s,
                                    std::span<const RankChunk> chunks) {
  // The tensors in the executor's unit order: per chunk the embedding, the
  // layers, the head with the final norm, the last stage's embedding copy and MTP.
  std::array<std::vector<DealtTensor>, 2> tensors;
  const ModelConfig& m = inv.recipe.model;
  for (const RankChunk& c : chunks) {
    if (c.range.owns_embedding) AppendDealt(inv.embedding, inv, l, s, tensors);
    for (int64_t i = c.range.first_layer; i < c.range.end_layer; ++i) {
      for (const ParamTensor& t : inv.layers.at(static_cast<size_t>(i)).params) AppendDealt(t, inv, l, s, tensors);
    }
    if (!c.range.owns_head) continue;
    if (inv.final_norms.empty()) AppendDealt(inv.final_norm, inv, l, s, tensors);
    for (const ParamTensor& t : inv.final_norms) AppendDealt(t, inv, l, s, tensors);
    for (const ParamTensor& t : inv.head) AppendDealt(t, inv, l, s, tensors);
    if (KeepsEmbeddingCopy(m, l)) AppendDealt(inv.embedding, inv, l, s, tensors);
    for (const ParamTensor& t : inv.mtp) AppendDealt(t, inv, l, s, tensors);
  }
  LayerWiseTraffic out;
  const std::array<int64_t, 2> groups = ZeroGroups(l);
  for (size_t g = 0; g < 2; ++g) {
    const int64_t d = groups[g];
    SortForDeal(tensors[g]);
    // Bytes [member][element size] dealt, and each member's TP-gathered Muon elements.
    std::vector<std::map<int64_t, int64_t>> dealt(static_cast<size_t>(d));
    std::vector<int64_t> muon_tp(static_cast<size_t>(d), 0);
    std::map<int64_t, int64_t> total;
    for (size_t i = 0; i < tensors[g].size(); ++i) {
      const DealtTensor& t = tensors[g][i];
      const size_t k = static_cast<size_t>(DealMember(static_cast<int64_t>(i), d));
      const int64_t bytes = CheckedMul(t.elements, t.element_bytes);
      dealt[k][t.element_bytes] = CheckedAdd(dealt[k][t.element_bytes], bytes);
      total[t.element_bytes] = CheckedAdd(total[t.element_bytes], bytes);
      if (t.tp_gathered) muon_tp[k] = CheckedAdd(muon_tp[k], t.elements);
    }
    // One ring all-gather per element size: member k sends every chunk but
    // its successor's.
    for (int64_t k = 0; k < d; ++k) {
      int64_t sent = 0;
      for (const auto& [width, bytes] : total) {
        const auto& next = dealt[static_cast<size_t>((k + 1) % d)];
        const auto it = next.find(width);
        sent = CheckedAdd(sent, bytes - (it == next.end() ? 0 : it->second));
      }
      out.param_send[g] = std::max(out.param_send[g], Bytes(d > 1 ? sent : 0));
      out.muon_tp[g] = std::max(out.muon_tp[g], muon_tp[static_cast<size_t>(k)]);
    }
  }
  return out;
}

void AddOptimizer(const Inventory& inv, const Layout& l, const Sizes& s, const RankOptimizer& o,
                  std::span<const RankChunk> chunks, ItemList* items, Bytes* host_transfer) {
  const ParamTotals& p = o.params;
  const bool emb = o.embedding, head = o.head;
  const ModelConfig& m = inv.recipe.model;
  // The last stage's embedding copy: a replicated table holds every row.
  const int64_t vocab_local = inv.embedding.split == Split::kReplicated
                                  ? inv.embedding.elements()
                                  : CheckedMul(PaddedVocab(m, l.tp) / l.tp, m.hidden);
  const RankBuffers& rb = o.buffers;
  const DpBuffers& buffers = rb.all;
  // Per-unit traffic runs in every micro-batch of a chunk; FillRankChunks gives all
  // chunks of a rank the same count (m, DualPipe m/2).
  const int64_t rounds = chunks.empty() ? 0 : chunks.front().microbatches;
  const bool per_unit_grads = l.zero >= 2;

  struct Group {
    Axis axis;
    Axis replicas;
    size_t index;
    CommWhat grads;
    CommWhat params;
    CommWhat replica_grads;
  };
  const Group groups[] = {
      {Axis::kDpCp, Axis::kDpReplica, 0, CommWhat::kGrads, CommWhat::kParams, CommWhat::kReplicaGrads},
      {Axis::kExpertDp, Axis::kExpertDpReplica, 1, CommWhat::kExpertGrads, CommWhat::kExpertParams,
       CommWhat::kExpertReplicaGrads}};
  const bool hsdp = l.zero >= 1 && l.dp_replicate > 1;
  const std::array<int64_t, 2> zero_group = ZeroGroups(l);
  // The layer-wise optimizer: DDP's all-reduce of every gradient buffer, the
  // dealt tensors' all-gather, no Muon momentum gather (validation: ZeRO 1).
  const bool layer_wise = l.zero == 1 && inv.recipe.parallel.optimizer_sharding == OptimizerSharding::kLayerWise;
  const LayerWiseTraffic dealt = layer_wise ? LayerWiseTrafficOf(inv, l, s, chunks) : LayerWiseTraffic{};
  // Offloaded optimizer (validation: ZeRO >= 1, AdamW only): the offloaded
  // share of this rank's shard sends its fp32 grads D2H and takes its fp32
  // params back H2D each step (cpu_offloading/hybrid_optimizer.py).
  const double offload = inv.recipe.training.optimizer.offload_fraction;
  if (offload > 0 && l.zero >= 1) {
    for (size_t k = 0; k < 2; ++k) {
      const int64_t shard = (buffers.padded[k] - buffers.muon[k]) / zero_group[k];
      *host_transfer += Bytes(CheckedMul(CeilFraction(shard, offload), 8));
    }
  }
  // FSDP2 CPU offload (ZeRO 3): each all-gather first copies the rank's fp32
  // shard of the unit up (forward and backward of every micro-batch) and
  // each reduce-scatter's fp32 shard comes down (CPUOffloadPolicy).
  if (inv.recipe.parallel.fsdp_cpu_offload && l.zero >= 3) {
    for (size_t k = 0; k < 2; ++k) {
      *host_transfer += Bytes(CheckedMul(CheckedMul(buffers.padded[k] / zero_group[k], 12), rounds));
    }
  }
  for (const Group& g : groups) {
    const size_t k = g.index;
    const auto grads = [&](const DpBuffers& b) { return UnitCalls{BytesOf(b.padded[k], s.grad), b.units[k]}; };
    const auto params = [&](const DpBuffers& b) { return UnitCalls{Bytes(b.param_bytes[k]), b.units[k]}; };
    // The rank's shard of the same buffers (padded to a multiple of D, so exact).
    const auto shard = [&](const DpBuffers& b) {
      return UnitCalls{BytesOf(b.padded[k] / zero_group[k], s.grad), b.units[k]};
    };
    if (l.zero == 0 || layer_wise) {
      items->Add(g.axis, Collective::kAllReduce, Pass::kOptimizer, g.grads, grads(buffers).payload, 1);
    } else if (!per_unit_grads) {
      items->Add(g.axis, Collective::kReduceScatter, Pass::kOptimizer, g.grads, grads(buffers).payload, 1);
      if (hsdp) {
        items->Add(g.replicas, Collective::kAllReduce, Pass::kOptimizer, g.replica_grads, shard(buffers).payload, 1);
      }
    } else {
      // The chunk's first unit is reduced last, after the chunk's backward.
      items->AddPerUnit(g.axis, Collective::kReduceScatter, Pass::kBackward, g.grads, grads(buffers), grads(rb.first),
                        rounds);
      if (hsdp) {
        items->AddPerUnit(g.replicas, Collective::kAllReduce, Pass::kBackward, g.replica_grads, shard(buffers),
                          shard(rb.first), rounds);
      }
    }
    if (l.zero == 3) {
      // Prefetched one unit ahead: the first unit of each pass waits for its gather.
      items->AddPerUnit(g.axis, Collective::kAllGather, Pass::kForward, g.params, params(buffers), params(rb.first),
                        rounds);
      items->AddPerUnit(g.axis, Collective::kAllGather, Pass::kBackward, g.params, params(buffers), params(rb.last),
                        rounds);
    } else if (layer_wise) {
      // Uneven chunks: the busiest member's bytes (SendBytes assumes equal ones).
      CommItem* item = items->Add(g.axis, Collective::kAllGather, Pass::kOptimizer, g.params, dealt.param_send[k], 1);
      if (item != nullptr) item->send = item->recv = dealt.param_send[k];
    } else if (l.zero >= 1) {
      items->Add(g.axis, Collective::kAllGather, Pass::kOptimizer, g.params, params(buffers).payload, 1);
    }
  }

  // Muon, Moonshot "Distributed Muon" over the ZeRO group (docs/formulas.md §9.3): the
  // momentum-updated shards of each (padded) Muon buffer are gathered back to
  // the full local matrices. TP "duplicated" (Megatron default): each
  // TP-sharded Muon matrix is gathered over TP; expert matrices likewise over
  // expert TP (unpadded: whole matrices).
  // Layer-wise: only the member a tensor is dealt to gathers it over TP.
  const int64_t muon_tp_global =
      layer_wise ? CheckedMul(dealt.muon_tp[0], l.tp) : p.of(ShardClass::kTpSharded, OptimizerKind::kMuon);
  const int64_t muon_ep_local_full = layer_wise ? CheckedMul(dealt.muon_tp[1], l.expert_tp)
                                                : p.of(ShardClass::kEpSharded, OptimizerKind::kMuon) / l.ep;
  if (l.zero >= 1 && !layer_wise) {
    items->Add(Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonGather,
               BytesOf(buffers.muon[0], s.muon), 1);
    items->Add(Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonExpertGather,
               BytesOf(buffers.muon[1], s.muon), 1);
  }
  items->Add(Axis::kTp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonTpGather,
             BytesOf(muon_tp_global, s.muon), 1);
  items->Add(Axis::kExpertTp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonExpertTpGather,
             BytesOf(muon_ep_local_full, s.muon), 1);

  // With SP each TP rank holds partial gradients of replicated params
  // (norms, router), without SP those of the qk norms (TpPartialElements):
  // one coalesced all-reduce over TP (docs/formulas.md §7.2), padded
  // to a multiple of t like the DP buffers; ZeRO 2/3 all-reduce each unit's
  // before its reduce-scatter, in every micro-batch.
  const bool rep_partial = l.sequence_parallel() || (l.tp > 1 && buffers.replicated > 0);
  if (rep_partial && per_unit_grads) {
    const auto rep = [&](const DpBuffers& b) {
      return UnitCalls{BytesOf(b.replicated_padded, s.grad), b.replicated_units};
    };
    items->AddPerUnit(Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kReplicatedGrads, rep(buffers),
                      rep(rb.first), rounds);
  } else if (rep_partial) {
    items->Add(Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads,
               BytesOf(RoundUp(buffers.replicated, l.tp), s.grad), 1);
  }
  // Tied embedding (or MTP's copy): the first and last stage all-reduce the
  // embedding gradient (finalize_model_grads.py _allreduce_embedding_grad):
  // the whole main_grad, or under Megatron FSDP (ZeRO 2/3) the rank's shard
  // of the copy's own padded buffer (main_grad._local_tensor).
  // Under DualPipe the mirror sum below carries it (ranks 0 and p-1 hold both ends).
  if (KeepsEmbeddingCopy(m, l) && (emb || head)) {
    const int64_t summed = per_unit_grads ? RoundUp(vocab_local, zero_group[0]) / zero_group[0] : vocab_local;
    items->Add(Axis::kEmbedding, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kTiedEmbedding,
               BytesOf(summed, s.grad), 1);
  }
  // DualPipe: pipeline ranks r and p-1-r each hold a copy of stages r and
  // p-1-r, with the gradients of one direction's micro-batches; the copies'
  // gradients are summed (deepseek-ai/DualPipe examples/example_dualpipe.py),
  // one all-reduce of every gradient buffer over the mirror pair before the
  // data-parallel sync, as the reference executor runs it.
  // Under ZeRO 2/3 the copies' gradients are already reduce-scattered: the
  // pair sums the rank's shares (a 1/D slice of the same buffers).
  if (l.schedule == Schedule::kDualPipe && l.pp > 1) {
    const int64_t summed = per_unit_grads
                               ? CheckedAdd(buffers.padded[0] / zero_group[0], buffers.padded[1] / zero_group[1])
                               : CheckedAdd(buffers.padded[0], buffers.padded[1]);
    items->Add(Axis::kPpMirror, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kDualPipeCopyGrads,
               BytesOf(summed, s.grad), 1);
  }
}

}  // namespace

std::vector<StageComm> BuildStageComm(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                                      const MeshLocality& locality, const CostModel& cost) {
  std::vector<StageComm> out;
  BuildStageComm(inv, t, l, stages, locality, cost, &out);
  return out;
}

namespace {

// The expert-bias update (Megatron finalize_model_grads.py
// _update_router_expert_bias, moe_utils.py get_updated_expert_bias): once a
// step, every MoE layer's fp32 count of routed tokens per expert, stacked,
// is all-reduced so each replica moves its bias alike. Megatron reduces over
// the TP x DP x CP group in one collective; preflight prices (and the executor
// runs) it as an all-reduce over DP x CP, then one over TP.
void AddRouterBias(const Inventory& inv, const PlanTables& t, const Layout& l, std::span<const RankChunk> chunks,
                   ItemList* items) {
  const MoeConfig& moe = inv.recipe.model.moe;
  if (!moe.router_bias) return;
  int64_t layers = 0;
  for (const RankChunk& c : chunks)
    layers += ChunkCounts(t, c.range)[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))];
  const Bytes counts(CheckedMul(CheckedMul(layers, moe.experts), 4));
  // DualPipe: a layer's two copies each routed one direction's micro-batches;
  // the executor sums their counts over the mirror pair first.
  if (l.schedule == Schedule::kDualPipe && l.pp > 1) {
    items->Add(Axis::kPpMirror, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias, counts, 1);
  }
  items->Add(Axis::kDpCp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias, counts, 1);
  // HSDP: kDpCp is one replica's group; the counts are summed across the replicas next.
  items->Add(Axis::kDpReplica, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias, counts, 1);
  items->Add(Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias, counts, 1);
}

}  // namespace

void BuildStageComm(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                    const MeshLocality& locality, const CostModel& cost, std::vector<StageComm>* out) {
  thread_local std::vector<RankOptimizer> optimizer;  // per-thread, as below
  planner_internal::BuildStageComm(inv, t, l, stages, locality, cost, out, &optimizer);
}

namespace planner_internal {

namespace {

/// The items of a rank priced as an earlier one: a copy of that rank's, or
/// none when the caller reads only the earlier rank's (copy_alike false).
void AssignAlike(std::vector<CommItem>& items, const std::vector<CommItem>& alike, bool copy_alike) {
  if (copy_alike) {
    items = alike;
  } else {
    items.clear();  // keeps its storage
  }
}

}  // namespace

void BuildStageComm(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                    const MeshLocality& locality, const CostModel& cost, std::vector<StageComm>* out,
                    std::vector<RankOptimizer>* optimizer, bool copy_alike) {
  out->resize(static_cast<size_t>(l.pp));
  optimizer->resize(static_cast<size_t>(l.pp));
  const Sizes s = SizesOf(inv, t, l);
  const Links links = LinksOf(inv.recipe.cluster.spec);
  const int64_t n_chunks = static_cast<int64_t>(stages.chunks.size());
  // Per-thread buffers: a sweep builds the communication of millions of layouts.
  thread_local RankChunks by_rank;
  thread_local std::vector<int64_t> same_as;
  FillRankChunks(stages, l, &by_rank);
  SameRanks(inv, t, l, by_rank, n_chunks, &same_as);
  for (int64_t r = 0; r < l.pp; ++r) {
    StageComm& sc = (*out)[static_cast<size_t>(r)];
    sc.pipeline_rank = r;
    // Per rank: the last stage keeps more than a rank priced alike.
    sc.activation_offload = ActivationOffloadTransfer(inv.recipe, l, stages, r);
    const int64_t q = same_as[static_cast<size_t>(r)];
    sc.priced_as = q != r ? q : -1;
    if (q != r) {  // an earlier rank's chunks price alike: its items (assigned into this rank's storage)
      AssignAlike(sc.items, (*out)[static_cast<size_t>(q)].items, copy_alike);
      sc.host_transfer = (*out)[static_cast<size_t>(q)].host_transfer;
      continue;
    }
    sc.items.clear();  // keeps its storage
    sc.host_transfer = Bytes(0);
    ItemList items(locality, links, cost, &sc.items);
    const std::span<const RankChunk> chunks = by_rank.On(r);
    const std::array<int64_t, 5> rerun = RerunMicrobatches(inv, t, l, chunks);
    AddTp(t, l, s, chunks, TpRerunMicrobatches(inv, t, l, chunks, rerun),
          l.recompute == Recompute::kFull && inv.recipe.training.recompute_method == RecomputeMethod::kUniform, &items);
    AddMlaUpProjRerun(inv, t, l, s, chunks, &items);
    AddCp(inv, t, l, s, chunks, rerun, &items);
    AddPp(l, s, chunks, n_chunks, &items);
    AddEp(t, l, s, chunks, rerun, inv.recipe.model.moe.dispatcher, &items);
    sc.pipeline_items = sc.items.size();
    RankOptimizer& o = (*optimizer)[static_cast<size_t>(r)];
    o = OptimizerOf(inv, t, l, s, chunks);
    AddOptimizer(inv, l, s, o, chunks, &items, &sc.host_transfer);
    AddRouterBias(inv, t, l, chunks, &items);
  }
}

void BuildStageCommForZero(const Inventory& inv, const PlanTables& t, const Layout& l, const StagePlan& stages,
                           const MeshLocality& locality, const CostModel& cost, const std::vector<StageComm>& built,
                           const std::vector<RankOptimizer>& optimizer, std::vector<StageComm>* out, bool copy_alike) {
  out->resize(static_cast<size_t>(l.pp));
  const Sizes s = SizesOf(inv, t, l);
  const Links links = LinksOf(inv.recipe.cluster.spec);
  thread_local RankChunks by_rank;  // per-thread, as above
  FillRankChunks(stages, l, &by_rank);
  for (int64_t r = 0; r < l.pp; ++r) {
    const StageComm& from = built[static_cast<size_t>(r)];
    StageComm& sc = (*out)[static_cast<size_t>(r)];
    sc.pipeline_rank = r;
    sc.activation_offload = from.activation_offload;
    sc.priced_as = from.priced_as;  // the ranks alike do not depend on the ZeRO stage (SameRanks)
    sc.pipeline_items = from.pipeline_items;
    if (from.priced_as >= 0) {
      AssignAlike(sc.items, (*out)[static_cast<size_t>(from.priced_as)].items, copy_alike);
      sc.host_transfer = (*out)[static_cast<size_t>(from.priced_as)].host_transfer;
      continue;
    }
    const auto pipeline_end = from.items.begin() + static_cast<std::ptrdiff_t>(from.pipeline_items);
    sc.items.assign(from.items.begin(), pipeline_end);
    sc.host_transfer = Bytes(0);
    ItemList items(locality, links, cost, &sc.items);
    AddOptimizer(inv, l, s, optimizer[static_cast<size_t>(r)], by_rank.On(r), &items, &sc.host_transfer);
    AddRouterBias(inv, t, l, by_rank.On(r), &items);
  }
}

}  // namespace planner_internal

}  // namespace preflight

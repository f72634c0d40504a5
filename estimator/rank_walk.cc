// The walk over a rank's chunks: which layers and pipeline ends live on a
// pipeline rank, their local parameter tallies, and the ZeRO units.
#include <algorithm>

#include "internal.h"
#include "preflight/inventory/fp4_storage.h"

namespace preflight::estimator_detail {

bool TransformerStack(const Inventory& inv) {
  return !inv.layers.empty() && 2 * inv.layer_count() == static_cast<int64_t>(inv.layers.size());
}

namespace {

/// Divisor of a sharding class on this layout: 1, t, or e*t_e.
int64_t ClassDivisor(int c, const Layout& l) { return c == kRep ? 1 : c == kTp ? l.tp : Mul(l.ep, l.expert_tp); }

}  // namespace

int64_t TensorLocalElements(const ParamTensor& t, const Inventory& inv, const Layout& l) {
  if (t.shape.empty()) return 0;
  if (t.split == Split::kVocab) {
    int64_t rest = 1;
    for (size_t i = 1; i < t.shape.size(); ++i) rest = Mul(rest, t.shape[i]);
    return Mul(PaddedVocab(inv.recipe.model, l.tp) / l.tp, rest);
  }
  int64_t n = 1;
  for (int64_t d : t.shape) n = Mul(n, d);
  switch (ClassOf(t.split)) {
    case ShardClass::kReplicated: return n;
    case ShardClass::kTpSharded: return CeilDiv(n, l.tp);
    case ShardClass::kEpSharded: return CeilDiv(n, Mul(l.ep, l.expert_tp));
  }
  return n;
}

namespace {

void AddTensor(LocalParams& into, const ParamTensor& t, const Inventory& inv, const Layout& l) {
  const int c = static_cast<int>(ClassOf(t.split));
  const int o = static_cast<int>(t.optimizer);
  const int64_t n = TensorLocalElements(t, inv, l);
  into.bytes[c] = Add(into.bytes[c], Mul(n, SizeOf(t.dtype)));
  if (!t.trained) {  // a buffer: stored, never trained
    into.buffer_bytes[c] = Add(into.buffer_bytes[c], Mul(n, SizeOf(t.dtype)));
    return;
  }
  into.elements[c][o] = Add(into.elements[c][o], n);
  if (t.dtype == DType::kFp32) into.fp32[c][o] = Add(into.fp32[c][o], n);
}

/// Adds the FP4 copies of the linear weights among `params` to `into`.
void AddFp4(Fp4Copies& into, const std::vector<ParamTensor>& params, const Inventory& inv, const Layout& l,
            const Context& x) {
  if (x.fp4 == Fp4Format::kNone) return;
  for (const ParamTensor& t : params) {
    if (!t.linear) continue;
    const size_t c = static_cast<size_t>(ClassOf(t.split));
    into.copies[c] = Add(into.copies[c], Fp4LocalWeightBytes(t, x.fp4, l));
    if (x.fp4_params) into.replaced[c] = Add(into.replaced[c], Mul(TensorLocalElements(t, inv, l), SizeOf(t.dtype)));
  }
}

}  // namespace

LocalParams LocalOf(const ParamTotals& totals, const Layout& l) {
  LocalParams out;
  for (int c = 0; c < 3; ++c) {
    const int64_t d = ClassDivisor(c, l);
    for (int o = 0; o < 2; ++o) {
      out.elements[c][o] = CeilDiv(totals.elements[c][o], d);
      out.fp32[c][o] = totals.fp32_elements[c][o] == 0 ? 0 : CeilDiv(totals.fp32_elements[c][o], d);
    }
    out.bytes[c] = CeilDiv(totals.param_bytes[c], d);
  }
  return out;
}

void AddInto(LocalParams& into, const LocalParams& x) {
  for (int c = 0; c < 3; ++c) {
    for (int o = 0; o < 2; ++o) {
      into.elements[c][o] = Add(into.elements[c][o], x.elements[c][o]);
      into.fp32[c][o] = Add(into.fp32[c][o], x.fp32[c][o]);
    }
    into.bytes[c] = Add(into.bytes[c], x.bytes[c]);
    into.buffer_bytes[c] = Add(into.buffer_bytes[c], x.buffer_bytes[c]);
  }
}

UnitExtra UnitOf(const LocalParams& e, const Context& x, int64_t layer) {
  UnitExtra u;
  u.layer = layer;
  int64_t elements = 0;
  for (int c = 0; c < 3; ++c) elements = Add(elements, ClassSum(e, c));
  u.grads = Mul(elements, x.beta_g);
  return u;
}

void Offer(Walk& w, const UnitExtra& u) {
  if (u.grads > w.grad_unit.grads) w.grad_unit = u;
}

namespace {

/// ceil(n / D), skipping the division for an empty buffer (most are).
int64_t Share(int64_t n, int64_t group) { return n == 0 ? 0 : CeilDiv(n, group); }

/// One unit's owned shares: per optimizer, ceil(n / D) of each of its buffers
/// (the fp32 elements and the rest, dense and expert), and their parameter bytes.
Shares UnitShares(const LocalParams& unit, const Context& x) {
  Shares out;
  for (int o = 0; o < 2; ++o) {
    const int64_t dense_fp32 = Add(unit.fp32[kRep][o], unit.fp32[kTp][o]);
    const int64_t dense = Add(unit.elements[kRep][o], unit.elements[kTp][o]) - dense_fp32;
    const int64_t expert_fp32 = unit.fp32[kEp][o];
    const int64_t expert = unit.elements[kEp][o] - expert_fp32;
    const int64_t shares[2][2] = {{Share(dense, x.dense_group), Share(dense_fp32, x.dense_group)},
                                  {Share(expert, x.expert_group), Share(expert_fp32, x.expert_group)}};
    for (int e = 0; e < 2; ++e) {
      out.elements[o][e] = Add(shares[e][0], shares[e][1]);
      if (x.zero3) out.param_bytes[e] = Add(out.param_bytes[e], Add(Mul(shares[e][0], x.beta_p), Mul(shares[e][1], 4)));
    }
  }
  return out;
}

/// Adds `n` copies of `s` to the walk's shares.
void AddShares(Walk& w, const Shares& s, int64_t n) {
  for (int e = 0; e < 2; ++e) {
    for (int o = 0; o < 2; ++o) w.shares.elements[o][e] = Add(w.shares.elements[o][e], Mul(s.elements[o][e], n));
    w.shares.param_bytes[e] = Add(w.shares.param_bytes[e], Mul(s.param_bytes[e], n));
  }
}

/// The memo of `totals`, recomputed unless it holds equal totals (taken as
/// equal without comparing when the inventory says the family is uniform).
LayerMemo& Remember(LayerMemo& memo, const Layer& layer, bool uniform, const Inventory& inv, const Layout& l,
                    const Context& x) {
  const ParamTotals& totals = layer.totals;
  if (memo.totals == nullptr || (!uniform && !(*memo.totals == totals))) {
    memo.totals = &totals;
    memo.local = LocalOf(totals, l);
    for (const ParamTensor& t : layer.params) {
      if (t.trained) continue;
      const int c = static_cast<int>(ClassOf(t.split));
      memo.local.buffer_bytes[c] =
          Add(memo.local.buffer_bytes[c], Mul(TensorLocalElements(t, inv, l), SizeOf(t.dtype)));
    }
    memo.unit = UnitOf(memo.local, x, -1);
    memo.shares = UnitShares(memo.local, x);
    memo.fp4 = {};
    AddFp4(memo.fp4, layer.params, inv, l, x);
  }
  return memo;
}

/// Adds `n` copies of a memo's parameters and shares to the walk.
void AddTimes(Walk& w, const LayerMemo& m, int64_t n) {
  for (int c = 0; c < 3; ++c) {
    for (int o = 0; o < 2; ++o) {
      w.layers.elements[c][o] = Add(w.layers.elements[c][o], Mul(m.local.elements[c][o], n));
      w.layers.fp32[c][o] = Add(w.layers.fp32[c][o], Mul(m.local.fp32[c][o], n));
    }
    w.layers.bytes[c] = Add(w.layers.bytes[c], Mul(m.local.bytes[c], n));
    w.layers.buffer_bytes[c] = Add(w.layers.buffer_bytes[c], Mul(m.local.buffer_bytes[c], n));
    const size_t k = static_cast<size_t>(c);
    w.fp4.copies[k] = Add(w.fp4.copies[k], Mul(m.fp4.copies[k], n));
    w.fp4.replaced[k] = Add(w.fp4.replaced[k], Mul(m.fp4.replaced[k], n));
  }
  AddShares(w, m.shares, n);
}

/// Whether the inventory carries its per-family prefix counts (one built by
/// hand may not: its walks go layer by layer).
bool HasPrefixes(const Inventory& inv) {
  return inv.prefix_family_layers.size() == inv.layers.size() + 1 &&
         inv.prefix_layer_starts.size() == inv.layers.size() + 1;
}

/// Per family, the sublayers of [first, end) that start a framework layer
/// (Layer::starts_layer): recipe/partition.h LayerStarts starts one at every
/// sublayer of a stack of hybrid symbols and at the attention of each
/// attention + MLP pair of a transformer stack. False for any other layout of
/// the starts (checked against their count).
bool CountStarts(const Inventory& inv, int64_t first, int64_t end, std::array<int64_t, 5>* out) {
  *out = inv.RangeFamilyLayers(first, end);
  const int64_t sublayers = static_cast<int64_t>(inv.layers.size());
  if (2 * inv.layer_count() == sublayers) {  // a transformer stack: the attentions start the layers
    const size_t attention = static_cast<size_t>(FamilyIndex(BlockKind::kAttention));
    for (size_t f = 0; f < 5; ++f) {
      if (f != attention) (*out)[f] = 0;
    }
  } else if (inv.layer_count() != sublayers) {
    return false;
  }
  int64_t starts = 0;
  for (int64_t n : *out) starts += n;
  return starts == inv.RangeLayerStarts(first, end);
}

/// GatherPeak::Layer over the sublayers [first, end) of chunk c of a
/// transformer stack whose families there are uniform (their full local bytes
/// in `memo`), from the families present: the same pairs, by their sums.
void GatherByFamilies(GatherPeak& g, const Inventory& inv, const StageChunk& c, int64_t first, int64_t end,
                      const std::array<int64_t, 5>& counts, const LayerMemos& memo) {
  const auto bytes = [&](int64_t i) {
    return memo[static_cast<size_t>(FamilyIndex(inv.layers[static_cast<size_t>(i)].kind))].local.Gathered();
  };
  if (&c != g.chunk) {
    g.prev = {};
    g.chunk = &c;
  }
  const std::array<int64_t, 3> at_first = bytes(first);
  for (size_t k = 0; k < 3; ++k) g.pairs[k] = std::max(g.pairs[k], Add(g.prev[k], at_first[k]));
  if (end - first >= 2) {  // each MLP family present sits beside an attention of the range
    const size_t attention = static_cast<size_t>(FamilyIndex(BlockKind::kAttention));
    for (size_t f = 0; f < 5; ++f) {
      if (f == attention || counts[f] == 0) continue;
      for (size_t k = 0; k < 3; ++k) {
        g.pairs[k] = std::max(g.pairs[k], Add(memo[attention].local.Gathered()[k], memo[f].local.Gathered()[k]));
      }
    }
  }
  g.prev = bytes(end - 1);
  if (c.owns_embedding && first == c.first_layer) g.after_embedding = at_first;
  if (c.owns_head && end == c.end_layer) g.before_head = g.prev;
}

/// The layers [first, end) of a chunk from their per-family counts, O(families)
/// rather than O(layers), when that gives what the layer-by-layer visit gives:
/// every family on the chunk uniform and the kept activations countable
/// (CountKept). The tallies are integer sums, so adding a family's layers at
/// once is exact. Returns false, touching nothing, when it does not apply.
bool VisitByFamilies(const Inventory& inv, const Layout& l, const Context& x, const StageChunk& c, int64_t first,
                     int64_t end, int64_t in_flight, bool mirrored, LayerMemos& memo, std::array<int64_t, 5>& pending,
                     Walk& w, int64_t* layers_here) {
  if (first >= end || !HasPrefixes(inv)) return false;
  const std::array<int64_t, 5> counts = inv.RangeFamilyLayers(first, end);
  for (size_t f = 0; f < 5; ++f) {
    if (counts[f] > 0 && !inv.family_uniform[f]) return false;
  }
  KeptCounts kept;
  if (!CountKept(inv, c.first_layer, first, end, l.recompute, inv.recipe.training, &kept)) return false;
  int64_t most = -1;  // the largest unit on the chunk
  for (size_t f = 0; f < 5; ++f) {
    if (counts[f] == 0) continue;
    if (memo[f].totals == nullptr) {  // the family's first layer in the chunk sets the memo
      int64_t i = first;
      while (FamilyIndex(inv.layers[static_cast<size_t>(i)].kind) != static_cast<int>(f)) ++i;
      Remember(memo[f], inv.layers[static_cast<size_t>(i)], true, inv, l, x);
    }
    pending[f] += counts[f];
    w.layer_count[f] += counts[f];
    w.units[f] = Add(w.units[f], Mul(in_flight, Add(kept.policy[f], kept.all[f])));
    w.stored_units[f] = Add(w.stored_units[f], Mul(in_flight, kept.all[f]));
    if (!mirrored) w.own_layers[f] += counts[f];
    most = std::max(most, memo[f].unit.grads);
  }
  // The layer-by-layer visit keeps the first layer with the largest unit.
  if (most > w.grad_unit.grads) {
    int64_t i = first;
    while (memo[static_cast<size_t>(FamilyIndex(inv.layers[static_cast<size_t>(i)].kind))].unit.grads != most) ++i;
    w.grad_unit = {most, i};
  }
  // ZeRO 3's gathered pairs follow the layers' order: from the families
  // present in a transformer stack, else a pass without the rest of the
  // per-layer work.
  if (x.zero3 && TransformerStack(inv)) {
    GatherByFamilies(w.gather, inv, c, first, end, counts, memo);
  } else if (x.zero3) {
    for (int64_t i = first; i < end; ++i) {
      w.gather.Layer(c, i,
                     memo[static_cast<size_t>(FamilyIndex(inv.layers[static_cast<size_t>(i)].kind))].local.Gathered());
    }
  }
  *layers_here = inv.RangeLayerStarts(first, end);
  return true;
}

}  // namespace

void AddUnitShares(Walk& w, const LocalParams& unit, const Context& x) { AddShares(w, UnitShares(unit, x), 1); }

bool CountKept(const Inventory& inv, int64_t chunk_first, int64_t first, int64_t end, Recompute recompute,
               const TrainingConfig& t, KeptCounts* out) {
  *out = {};
  if (first >= end) return true;
  if (!HasPrefixes(inv)) return false;
  if (recompute != Recompute::kFull) {
    out->policy = inv.RangeFamilyLayers(first, end);
    return true;
  }
  const int64_t n = t.recompute_layers;
  if (t.recompute_method != RecomputeMethod::kBlock) return n == 1 && CountStarts(inv, first, end, &out->policy);
  // Block: a sublayer keeps everything from the n-th framework layer start
  // after the chunk's first sublayer on (LayerInChunk >= n), that start being
  // layer_starts[k] with k the starts in [0, chunk_first] plus n - 1.
  const int64_t k = inv.prefix_layer_starts[static_cast<size_t>(chunk_first + 1)] + n - 1;
  const int64_t whole = std::clamp(k < inv.layer_count() ? inv.layer_starts[static_cast<size_t>(k)] : end, first, end);
  out->all = inv.RangeFamilyLayers(whole, end);
  return CountStarts(inv, first, whole, &out->policy);
}

bool RegularPlan(const StagePlan& plan, int64_t p) {
  if (p <= 0 || plan.chunks.size() % static_cast<size_t>(p) != 0) return false;
  for (size_t at = 0; at < plan.chunks.size(); ++at) {
    const StageChunk& c = plan.chunks[at];
    if (c.pipeline_rank != static_cast<int64_t>(at) % p || c.virtual_index != static_cast<int64_t>(at) / p)
      return false;
  }
  return true;
}

bool RankVisits(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, bool regular,
                ActivationRates& rates, std::vector<VisitKey>* out, InFlight* in_flight) {
  out->clear();
  if (l.schedule == Schedule::kInterleaved || !HasPrefixes(inv)) return false;
  const bool gather = TransformerStack(inv);
  bool ok = true;
  const StageChunk* last_chunk = nullptr;
  *in_flight = ForEachChunk(plan, l, r, regular, rates,
                            [&](const StageChunk& c, int64_t first, int64_t end, int64_t in, bool mirrored, bool ends) {
                              VisitKey k;
                              if (gather && first < end) {  // what GatherByFamilies reads besides the counts
                                k.gather = {FamilyIndex(inv.layers[static_cast<size_t>(first)].kind),
                                            FamilyIndex(inv.layers[static_cast<size_t>(end - 1)].kind),
                                            &c == last_chunk, c.owns_embedding && first == c.first_layer,
                                            c.owns_head && end == c.end_layer};
                              }
                              last_chunk = &c;
                              k.counts = inv.RangeFamilyLayers(first, end);
                              for (size_t f = 0; f < 5; ++f) ok = ok && (k.counts[f] == 0 || inv.family_uniform[f]);
                              ok = ok &&
                                   CountKept(inv, c.first_layer, first, end, l.recompute, inv.recipe.training, &k.kept);
                              k.layers = inv.RangeLayerStarts(first, end);
                              k.in_flight = in;
                              k.mirrored = mirrored;
                              k.embedding = ends && c.owns_embedding;
                              k.head = ends && c.owns_head;
                              out->push_back(k);
                            });
  return ok;
}

Walk WalkRank(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, bool regular, const Context& x,
              ActivationRates& rates, LayerMemos& memo) {
  Walk w;
  std::array<int64_t, 5> pending{};  // layers of a uniform family not yet added to the walk's sums
  const InFlight k =
      ForEachChunk(plan, l, r, regular, rates,
                   [&](const StageChunk& c, int64_t first, int64_t end, int64_t in_flight, bool mirrored, bool ends) {
                     const bool full = l.recompute == Recompute::kFull;
                     int64_t layers_here = 0;
                     const bool counted =
                         VisitByFamilies(inv, l, x, c, first, end, in_flight, mirrored, memo, pending, w, &layers_here);
                     for (int64_t i = counted ? end : first; i < end; ++i) {
                       const Layer& layer = inv.layers.at(static_cast<size_t>(i));  // a plan of another model is a bug
                       const int f = FamilyIndex(layer.kind);
                       const bool uniform = inv.family_uniform[static_cast<size_t>(f)];
                       LayerMemo& e = Remember(memo[static_cast<size_t>(f)], layer, uniform, inv, l, x);
                       if (uniform) {
                         ++pending[static_cast<size_t>(f)];
                       } else {
                         AddTimes(w, e, 1);
                       }
                       w.layer_count[f] += 1;
                       layers_here += layer.starts_layer ? 1 : 0;
                       const Kept kept = KeptBy(layer, full ? LayerInChunk(inv, c.first_layer, i) : 0, l.recompute,
                                                inv.recipe.training);
                       if (kept != Kept::kNothing) w.units[f] = Add(w.units[f], in_flight);
                       if (kept == Kept::kAll) w.stored_units[f] = Add(w.stored_units[f], in_flight);
                       if (!mirrored) w.own_layers[f] += 1;
                       if (e.unit.grads > w.grad_unit.grads) w.grad_unit = {e.unit.grads, i};
                       if (x.zero3) w.gather.Layer(c, i, e.local.Gathered());
                     }
                     w.chunk_layers = std::max(w.chunk_layers, layers_here);
                     if (!ends) return;
                     if (x.zero3 && c.owns_embedding && c.owns_head && c.first_layer == c.end_layer)
                       w.gather.embedding_then_head = true;
                     if (c.owns_embedding) {
                       w.embedding = true;
                       w.embedding_units = Add(w.embedding_units, in_flight);
                     }
                     if (c.owns_head) w.head = true;
                   });
  for (size_t f = 0; f < 5; ++f) {
    if (pending[f] > 0) AddTimes(w, memo[f], pending[f]);
  }
  w.in_flight = k.units;
  if (w.head) {
    w.head_units = k.head_units;
    w.loss_transient_live = k.loss_transient_live;
  }
  return w;
}

Ends EndsOf(const Inventory& inv, const Layout& l, const Walk& w, const Context& x) {
  Ends e;
  ForEachEndTensor(inv, w, [&](const ParamTensor& t, EndPart part) {
    switch (part) {
      case EndPart::kEmbedding: AddTensor(e.embedding, t, inv, l); break;
      case EndPart::kFinalNorm: AddTensor(e.final_norm, t, inv, l); break;
      case EndPart::kHead: AddTensor(e.head, t, inv, l); break;
      case EndPart::kTiedCopy:
        AddTensor(e.head, t, inv, l);
        e.tied_copy = true;
        break;
    }
  });
  if (w.head) AddFp4(e.mtp_fp4, inv.mtp, inv, l, x);
  return e;
}

void AddEndShares(Walk& w, const Inventory& inv, const Layout& l, const Context& x) {
  // Megatron gives the tied (or MTP) copies on the first and last stage a
  // bucket of their own, so both stages shard them alike
  // (distrib_optimizer.py _compute_per_buffer_param_layout, megatron_fsdp
  // param_and_grad_buffer.py _does_param_require_new_bucket).
  const bool apart = KeepsEmbeddingCopy(inv.recipe.model, l);
  LocalParams embedding, head, shared;
  ForEachEndTensor(inv, w, [&](const ParamTensor& t, EndPart part) {
    LocalParams& unit = apart && &t == &inv.embedding ? shared : part == EndPart::kEmbedding ? embedding : head;
    AddTensor(unit, t, inv, l);
  });
  for (const LocalParams* unit : {&embedding, &head, &shared}) AddUnitShares(w, *unit, x);
}

}  // namespace preflight::estimator_detail

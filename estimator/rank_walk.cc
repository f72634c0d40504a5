// The walk over a rank's chunks: which layers and pipeline ends live on a
// pipeline rank, their local parameter tallies, and the ZeRO units.
#include <algorithm>

#include "internal.h"

namespace preflight::estimator_detail {
namespace {

/// Divisor of a sharding class on this layout: 1, t, or e*t_e.
int64_t ClassDivisor(int c, const Layout& l) { return c == kRep ? 1 : c == kTp ? l.tp : Mul(l.ep, l.expert_tp); }

/// Local elements of one non-layer tensor (embedding, head, final norm).
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

void AddTensor(LocalParams& into, const ParamTensor& t, const Inventory& inv, const Layout& l) {
  const int c = static_cast<int>(ClassOf(t.split));
  const int o = static_cast<int>(t.optimizer);
  const int64_t n = TensorLocalElements(t, inv, l);
  into.elements[c][o] = Add(into.elements[c][o], n);
  if (t.dtype == DType::kFp32) into.fp32[c][o] = Add(into.fp32[c][o], n);
  into.bytes[c] = Add(into.bytes[c], Mul(n, SizeOf(t.dtype)));
}

}  // namespace

LocalParams LocalOf(const ParamTotals& totals, const Layout& l) {
  LocalParams out;
  for (int c = 0; c < 3; ++c) {
    const int64_t d = ClassDivisor(c, l);
    for (int o = 0; o < 2; ++o) {
      out.elements[c][o] = CeilDiv(totals.elements[c][o], d);
      out.fp32[c][o] = CeilDiv(totals.fp32_elements[c][o], d);
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
  }
}

UnitExtra UnitOf(const LocalParams& e, const Context& x, int64_t layer) {
  UnitExtra u;
  u.layer = layer;
  int64_t dense = 0;
  for (int c = 0; c < 3; ++c) {
    const int64_t elems = ClassSum(e, c);
    u.params[c] = UnshardedExtra(e.bytes[c], x.group(c));
    u.params_total = Add(u.params_total, u.params[c]);
    if (c != kEp) dense = Add(dense, elems);
  }
  u.grads = Add(UnshardedExtra(Mul(dense, x.beta_g), x.dense_group),
                UnshardedExtra(Mul(ClassSum(e, kEp), x.beta_g), x.expert_group));
  return u;
}

void Offer(Walk& w, const UnitExtra& u) {
  if (u.params_total > w.top1.params_total) {
    w.top2 = w.top1;
    w.top1 = u;
  } else if (u.params_total > w.top2.params_total) {
    w.top2 = u;
  }
  if (u.grads > w.grad_unit.grads) w.grad_unit = u;
}

void AddUnitState(Walk& w, const LocalParams& unit, const Context& x) {
  for (int o = 0; o < 2; ++o) {
    // One buffer per element dtype: the fp32 elements and the rest.
    const int64_t dense_fp32 = Add(unit.fp32[kRep][o], unit.fp32[kTp][o]);
    const int64_t dense = Add(unit.elements[kRep][o], unit.elements[kTp][o]) - dense_fp32;
    const int64_t expert_fp32 = unit.fp32[kEp][o];
    const int64_t expert = unit.elements[kEp][o] - expert_fp32;
    w.state_shards[o][0] =
        Add(w.state_shards[o][0], Add(CeilDiv(dense, x.dense_group), CeilDiv(dense_fp32, x.dense_group)));
    w.state_shards[o][1] =
        Add(w.state_shards[o][1], Add(CeilDiv(expert, x.expert_group), CeilDiv(expert_fp32, x.expert_group)));
  }
}

Walk WalkRank(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, const Context& x,
              ActivationRates& rates) {
  Walk w;
  const InFlight k = ForEachChunk(plan, l, r, rates, [&](const StageChunk& c, int64_t first, int64_t end,
                                                         int64_t in_flight, bool mirrored, bool ends) {
    for (int64_t i = first; i < end; ++i) {
      const Layer& layer = inv.layers.at(static_cast<size_t>(i));  // a plan of another model is a bug
      const int f = FamilyIndex(layer.kind);
      const LocalParams e = LocalOf(layer.totals, l);
      AddInto(w.layers, e);
      AddUnitState(w, e, x);
      w.layer_count[f] += 1;
      w.units[f] = Add(w.units[f], in_flight);
      if (!mirrored) w.own_layers[f] += 1;
      Offer(w, UnitOf(e, x, i));
    }
    if (!ends) return;
    if (c.owns_embedding) {
      w.embedding = true;
      w.embedding_units = Add(w.embedding_units, in_flight);
    }
    if (c.owns_head) w.head = true;
  });
  w.in_flight = k.units;
  if (w.head) {
    w.head_units = k.head_units;
    w.head_logits = k.head_logits;
  }
  return w;
}

Ends EndsOf(const Inventory& inv, const Layout& l, const Walk& w) {
  Ends e;
  if (w.embedding) AddTensor(e.embedding, inv.embedding, inv, l);
  if (w.head) {
    if (inv.final_norms.empty()) AddTensor(e.final_norm, inv.final_norm, inv, l);
    for (const ParamTensor& t : inv.final_norms) AddTensor(e.final_norm, t, inv, l);
    for (const ParamTensor& t : inv.head) AddTensor(e.head, t, inv, l);
    // Tied weights with the ends on different ranks: Megatron keeps a second
    // V*h/t copy on the last stage and all-reduces its grad (MATH.md 1.1).
    if (inv.recipe.model.tie_embeddings && !w.embedding) {
      AddTensor(e.head, inv.embedding, inv, l);
      e.tied_copy = true;
    }
  }
  return e;
}

}  // namespace preflight::estimator_detail

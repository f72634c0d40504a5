// The capacity model: per-rank memory of one pipeline rank (DESIGN.md,
// "Memory geometry"; MATH.md 1-6). One walk computes every figure; the same
// walk, given a sink, also records each figure's formula and inputs for
// --explain, so the explanation can never drift from the number.
//
// Modelling choices where the sources leave room (each also named in the
// --explain line it affects):
// - Parameters of the layers on every chunk of the rank, each class divided by
//   1, t or e*t_e (rounded up: the worst rank). Parameter bytes come from each
//   tensor's dtype (Mamba A_log and D stay fp32); grads use precision.grads.
// - Tied embeddings with the ends on different ranks: the last stage keeps a
//   second V_pad*h/t copy, as Megatron does (MATH.md 1.1).
// - DualPipe: rank r also holds stage p-1-r, so its params, grads and
//   optimizer state double; DualPipeV holds only its own chunks (MATH.md 4.1).
//   In flight: see ForEachChunk.
// - ZeRO groups: dense state over d*c, expert state over d_e (MATH.md 2.2).
//   ZeRO-2/3 add one unit's unsharded grads (the largest layer) before its
//   reduce-scatter; ZeRO-3 adds the two largest units gathered (current +
//   prefetch, as FSDP), units being single layers, the embedding, and the head
//   with the final norm.
// - Activations: per family (memory_terms.h) x layers x micro-batches in flight:
//   1F1B min(m, p-r); interleaved by Megatron's warmup 2(p-r-1) + (v-1)p,
//   counted per chunk in its schedule-table order; DualPipe p+1
//   stage-micro-batches, ceil half on the own stage and the rest on the mirror;
//   DualPipeV 2p+1 V-stage-micro-batches, p+1 on the down and p on the up stage.
// - The largest one-layer transient is added once: under full recompute the
//   layer being recomputed holds its no-recompute activations; Mamba's SSD
//   workspace and the CP ring KV buffers are live while their layer runs.
// - MoE routing scratch is one layer's (the peak), never summed over layers.
// - Serving state (when the recipe has `serving`) is colocated with training on
//   the same layout: KV for A layers, conv + SSM state for M, RG-LRU state for R
//   of this rank's own stages, serving.batch sequences per model replica.
// - Allocator overhead: a fraction of every allocator-managed byte (all but the
//   runtime reserve).
#include "preflight/estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "preflight/memory_terms.h"

namespace preflight {
namespace {

using Sink = std::vector<Explanation>;
constexpr int kRep = static_cast<int>(ShardClass::kReplicated);
constexpr int kTp = static_cast<int>(ShardClass::kTpSharded);
constexpr int kEp = static_cast<int>(ShardClass::kEpSharded);
constexpr int kAdam = static_cast<int>(OptimizerKind::kAdamW);
constexpr int kMuon = static_cast<int>(OptimizerKind::kMuon);

int64_t Mul(int64_t a, int64_t b) { return CheckedMul(a, b); }
int64_t Add(int64_t a, int64_t b) { return CheckedAdd(a, b); }

// ---- slow-path text helpers (only called with a sink) ----

/// Concatenation by append (GCC 12 raises a false -Wrestrict on "literal" + std::string).
std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

std::string Inputs(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string out;
  for (const auto& [k, v] : kv) {
    if (!out.empty()) out += ' ';
    out += k;
    out += '=';
    out += std::to_string(v);
  }
  return out;
}

std::string Decimal(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

const char* FamilyName(int f) {
  static const char* const kNames[] = {"A", "M", "E", "R", "D"};
  return kNames[f];
}

const char* RecomputeText(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

const char* ScheduleText(Schedule s) {
  switch (s) {
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
    case Schedule::kDualPipe: return "dualpipe";
    case Schedule::kDualPipeV: return "dualpipev";
  }
  return "?";
}

void Note(Sink* sink, Category c, std::string item, std::string formula, std::string inputs, Bytes bytes) {
  sink->push_back(Explanation{c, std::move(item), std::move(formula), std::move(inputs), bytes});
}

// ---- the walk over the rank's chunks ----

/// Local (this rank's) parameters: element counts [ShardClass][OptimizerKind]
/// (for grads and optimizer state) and parameter-copy bytes [ShardClass] (from
/// each tensor's own dtype: Mamba's A_log and D stay fp32).
struct LocalParams {
  std::array<std::array<int64_t, 2>, 3> elements{};
  std::array<int64_t, 3> bytes{};
};

/// Divisor of a sharding class on this layout: 1, t, or e*t_e.
int64_t ClassDivisor(int c, const Layout& l) { return c == kRep ? 1 : c == kTp ? l.tp : Mul(l.ep, l.expert_tp); }

LocalParams LocalOf(const ParamTotals& totals, const Layout& l) {
  LocalParams out;
  for (int c = 0; c < 3; ++c) {
    const int64_t d = ClassDivisor(c, l);
    for (int o = 0; o < 2; ++o) out.elements[c][o] = CeilDiv(totals.elements[c][o], d);
    out.bytes[c] = CeilDiv(totals.param_bytes[c], d);
  }
  return out;
}

void AddInto(LocalParams& into, const LocalParams& x) {
  for (int c = 0; c < 3; ++c) {
    for (int o = 0; o < 2; ++o) into.elements[c][o] = Add(into.elements[c][o], x.elements[c][o]);
    into.bytes[c] = Add(into.bytes[c], x.bytes[c]);
  }
}

int64_t ClassSum(const LocalParams& e, int c) { return Add(e.elements[c][0], e.elements[c][1]); }

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
  into.bytes[c] = Add(into.bytes[c], Mul(n, SizeOf(t.dtype)));
}

/// The part of a unit's bytes that is not its own shard: what gathering (ZeRO-3
/// params) or producing unsharded (ZeRO-2/3 grads) the unit adds on top of the shards.
int64_t UnshardedExtra(int64_t bytes, int64_t group) { return bytes - CeilDiv(bytes, group); }

/// Pricing context: degrees and per-element sizes fixed for one EstimateRank call.
struct Context {
  int64_t dense_group = 1;   // D_dense = d * c: Megatron shards dense state over DP x CP (MATH.md 2.2)
  int64_t expert_group = 1;  // D_exp = d_e, the expert-data-parallel group
  int64_t beta_g = 4;
  int64_t group(int c) const { return c == kEp ? expert_group : dense_group; }
};

/// A ZeRO unit (one layer, the embedding, or the head with the final norm).
struct UnitExtra {
  std::array<int64_t, 3> params{};  // per class: ZeRO-3 gather on top of the shard
  int64_t params_total = 0;
  int64_t grads = 0;                // ZeRO-2/3: unsharded grads on top of their shard
  int64_t layer = -1;               // layer index, -1 = embedding/head unit
};

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

/// What one pass over the rank's chunks collects.
struct Walk {
  LocalParams layers;                    // every layer whose params live here
  std::array<int64_t, 5> layer_count{};  // per family, mirrored DualPipe stages included
  std::array<int64_t, 5> units{};        // per family: layers x micro-batches in flight
  std::array<int64_t, 5> own_layers{};   // per family, own stages only (serving state)
  bool embedding = false;
  bool head = false;
  int64_t embedding_units = 0;  // micro-batches in flight on the chunk owning the embedding
  int64_t in_flight = 0;
  UnitExtra top1, top2;   // the two largest ZeRO-3 gather units (current + prefetch)
  UnitExtra grad_unit;    // the largest unsharded-grad unit
};

void Offer(Walk& w, const UnitExtra& u) {
  if (u.params_total > w.top1.params_total) {
    w.top2 = w.top1;
    w.top1 = u;
  } else if (u.params_total > w.top2.params_total) {
    w.top2 = u;
  }
  if (u.grads > w.grad_unit.grads) w.grad_unit = u;
}

/// Calls visit(chunk, first_layer, end_layer, in_flight, mirrored, ends) for
/// each range of layers on pipeline rank r with the micro-batches in flight on
/// it (`ends`: the visit that handles the chunk's embedding/head ownership), and
/// returns the micro-batches in flight the schedule keeps on r.
/// - 1F1B: min(m, p-r) (Megatron warmup p-r-1, plus one).
/// - Interleaved (more than one chunk on r): Megatron's warmup, counted per chunk.
/// - DualPipe: rank r also holds a copy of stage p-1-r (2x params) [DS3]; the
///   p+1 stage-micro-batches [DualPipe README] are split ceil/floor between the two.
/// - DualPipeV: 2p V-stages on p ranks, rank r holding stages r and 2p-1-r; the
///   README's PP+1 with PP = 2p gives 2p+1 V-stage-micro-batches per rank: p+1 on
///   the down stage, p on the up stage [OURS: split]. A rank with two chunks is
///   taken as (down, up); a single chunk as its first ceil(n/2) layers and the rest.
template <class F>
int64_t ForEachChunk(const StagePlan& plan, const Layout& l, int64_t r, F&& visit) {
  const int64_t p = l.pp;
  const int64_t m = l.micro_batches;
  int64_t own = 0;
  for (const StageChunk& c : plan.chunks) own += c.pipeline_rank == r ? 1 : 0;
  if (l.schedule == Schedule::kDualPipe) {
    const int64_t n = DualPipeInFlight(p, m);
    const int64_t own_share = CeilDiv(n, 2);
    const int64_t mirror = p - 1 - r;
    for (const StageChunk& c : plan.chunks) {
      if (c.pipeline_rank == r) {
        visit(c, c.first_layer, c.end_layer, own_share, false, true);
      } else if (mirror != r && c.pipeline_rank == mirror) {
        visit(c, c.first_layer, c.end_layer, n - own_share, true, true);
      }
    }
    return n;
  }
  if (l.schedule == Schedule::kDualPipeV) {
    const int64_t down = DualPipeInFlight(p, m);
    const int64_t up = std::min(p, m);
    int64_t j = 0;
    for (const StageChunk& c : plan.chunks) {
      if (c.pipeline_rank != r) continue;
      if (own == 1) {
        const int64_t mid = c.first_layer + CeilDiv(c.end_layer - c.first_layer, 2);
        visit(c, c.first_layer, mid, down, false, true);
        visit(c, mid, c.end_layer, up, false, false);
      } else {
        visit(c, c.first_layer, c.end_layer, j == 0 ? down : up, false, true);
      }
      ++j;
    }
    return down;
  }
  if (own <= 1) {
    const int64_t k = OneFOneBInFlight(p, m, r);
    for (const StageChunk& c : plan.chunks) {
      if (c.pipeline_rank == r) visit(c, c.first_layer, c.end_layer, k, false, true);
    }
    return k;
  }
  for (const StageChunk& c : plan.chunks) {
    if (c.pipeline_rank != r) continue;
    visit(c, c.first_layer, c.end_layer, InterleavedChunkLive(p, own, m, r, p, c.virtual_index), false, true);
  }
  return InterleavedLive(p, own, m, r, p);
}

Walk WalkRank(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, const Context& x) {
  Walk w;
  w.in_flight = ForEachChunk(plan, l, r, [&](const StageChunk& c, int64_t first, int64_t end, int64_t in_flight,
                                             bool mirrored, bool ends) {
    for (int64_t i = first; i < end; ++i) {
      const Layer& layer = inv.layers[static_cast<size_t>(i)];
      const int f = FamilyIndex(layer.kind);
      const LocalParams e = LocalOf(layer.totals, l);
      AddInto(w.layers, e);
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
  return w;
}

/// Elements of the pipeline-end tensors on this rank, by item.
struct Ends {
  LocalParams embedding;
  LocalParams head;  // output head, or the tied copy on the last stage
  LocalParams final_norm;
  bool tied_copy = false;
};

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

// ---- the categories ----

void PriceParams(RankMemory& out, const Walk& w, const Ends& ends, const Layout& l, const Context& x, Sink* sink) {
  static constexpr Category kCat[] = {Category::kReplicatedParams, Category::kTpShardedParams,
                                      Category::kEpShardedParams};
  static const char* const kSplit[] = {"", "/t", "/(e*t_e)"};
  const bool zero3 = l.zero >= 3;
  struct Item {
    const char* name;
    const LocalParams* params;
  };
  const Item items[] = {{"layers", &w.layers},
                        {"embedding (vocab-parallel, padded V)", &ends.embedding},
                        {ends.tied_copy ? "tied head copy on the last stage (padded V)" : "output head (padded V)",
                         &ends.head},
                        {"final norm", &ends.final_norm}};
  for (int c = 0; c < 3; ++c) {
    Bytes sum;
    for (const Item& it : items) {
      const int64_t elems = ClassSum(*it.params, c);
      const int64_t raw = it.params->bytes[c];
      if (raw == 0) continue;
      const Bytes b(zero3 ? CeilDiv(raw, x.group(c)) : raw);
      sum += b;
      if (sink) {
        Note(sink, kCat[c], std::string(it.name),
             Cat({"sum of P_local * beta_p(tensor dtype)", zero3 ? " / D (ZeRO-3)" : "", "; P_local = P",
                  kSplit[c]}),
             Inputs({{"P_local", elems}, {"bytes_local", raw}, {"D", zero3 ? x.group(c) : 1}}), b);
      }
    }
    if (zero3) {
      // FSDP keeps two units unsharded: the one computing and the prefetched next (MATH.md 2.2).
      const Bytes gathered(Add(w.top1.params[c], w.top2.params[c]));
      sum += gathered;
      if (sink && gathered.count() > 0) {
        Note(sink, kCat[c], "ZeRO-3 gathered units (the two largest: current + prefetch)",
             "sum over 2 units of (U*beta_p - ceil(U*beta_p/D))",
             Inputs({{"unit1_layer", w.top1.layer}, {"unit2_layer", w.top2.layer}, {"D", x.group(c)}}), gathered);
      }
    }
    out.bytes[static_cast<int>(kCat[c])] = sum;
  }
}

/// Local elements of all params on the rank of one optimizer, dense (REP+TP) or expert.
int64_t StateElements(const Walk& w, const Ends& e, int o, bool expert) {
  const LocalParams* all[] = {&w.layers, &e.embedding, &e.head, &e.final_norm};
  int64_t n = 0;
  for (const LocalParams* p : all) {
    n = Add(n, expert ? p->elements[kEp][o] : Add(p->elements[kRep][o], p->elements[kTp][o]));
  }
  return n;
}

void PriceGradients(RankMemory& out, const Walk& w, const Ends& ends, const Layout& l, const Context& x, Sink* sink) {
  const bool sharded = l.zero >= 2;
  Bytes sum;
  for (int expert = 0; expert < 2; ++expert) {
    const int64_t elems = Add(StateElements(w, ends, kAdam, expert), StateElements(w, ends, kMuon, expert));
    if (elems == 0) continue;
    const int64_t group = expert ? x.expert_group : x.dense_group;
    const Bytes b(sharded ? CeilDiv(Mul(elems, x.beta_g), group) : Mul(elems, x.beta_g));
    sum += b;
    if (sink) {
      Note(sink, Category::kGradients, expert ? "expert grads" : "dense grads (REP + TP + ends)",
           sharded ? "P_local * beta_g / D (ZeRO-2/3)" : "P_local * beta_g (full buffer, ZeRO-0/1)",
           Inputs({{"P_local", elems}, {"beta_g", x.beta_g}, {"D", sharded ? group : 1}}), b);
    }
  }
  if (sharded && w.grad_unit.grads > 0) {
    const Bytes b(w.grad_unit.grads);
    sum += b;
    if (sink) {
      Note(sink, Category::kGradients, "unsharded grads of one unit before its reduce-scatter (largest)",
           "G_unit - ceil(G_unit/D)", Inputs({{"unit_layer", w.grad_unit.layer}}), b);
    }
  }
  out.bytes[static_cast<int>(Category::kGradients)] = sum;
}

void PriceOptimizer(RankMemory& out, const Walk& w, const Ends& ends, const Recipe& rc, const Layout& l,
                    const Context& x, Sink* sink) {
  const PrecisionConfig& prec = rc.training.precision;
  // fp32 master copies exist only when the parameters are kept in lower precision.
  const int64_t master = prec.master && prec.params != DType::kFp32 ? SizeOf(*prec.master) : 0;
  const int64_t momentum = SizeOf(rc.training.optimizer.muon_momentum);
  const bool sharded = l.zero >= 1;
  for (int o = 0; o < 2; ++o) {
    const bool muon = o == kMuon;
    const Category cat = muon ? Category::kOptimizerMuon : Category::kOptimizerAdamW;
    const int64_t per_elem = Add(muon ? momentum : 8, master);
    Bytes sum;
    for (int expert = 0; expert < 2; ++expert) {
      const int64_t elems = StateElements(w, ends, o, expert);
      if (elems == 0) continue;
      const int64_t group = expert ? x.expert_group : x.dense_group;
      const Bytes b(sharded ? CeilDiv(Mul(elems, per_elem), group) : Mul(elems, per_elem));
      sum += b;
      if (sink) {
        Note(sink, cat, Cat({muon ? "Muon" : "AdamW", expert ? " state, expert params" : " state, dense params"}),
             Cat({muon ? "P * (momentum + master)" : "P * (m + v (fp32) + master)", sharded ? " / D (ZeRO>=1)" : ""}),
             Inputs({{"P", elems}, {muon ? "momentum" : "m+v", muon ? momentum : 8}, {"master", master},
                     {"D", sharded ? group : 1}}),
             b);
      }
    }
    out.bytes[static_cast<int>(cat)] = sum;
  }
}

void PriceActivations(RankMemory& out, const Walk& w, const Inventory& inv, const Layout& l, Sink* sink) {
  const Recipe& rc = inv.recipe;
  Layout none = l;
  none.recompute = Recompute::kNone;
  Bytes sum;
  for (int f = 0; f < 5; ++f) {
    if (w.layer_count[f] == 0) continue;
    const BlockKind kind = kAllBlockKinds[f];
    const Bytes per_layer = LayerActivations(rc, l, kind);
    out.activations_by_family[static_cast<size_t>(f)] = per_layer * w.units[f];
    sum += out.activations_by_family[static_cast<size_t>(f)];
    // The transient of one layer at a time: under full recompute, the layer
    // being recomputed holds its whole no-recompute activation set during its
    // backward; Mamba and CP attention add their kernel workspaces.
    Bytes transient = LayerWorkspace(rc, l, kind);
    if (l.recompute == Recompute::kFull) transient += LayerActivations(rc, none, kind);
    out.activations_transient = std::max(out.activations_transient, transient);
    if (sink) {
      const TokenBytes tb = SavedBytesPerToken(rc, kind, l.recompute, l.tp, l.cp);
      std::string formula = "[ceil(s*b/c * rep / (SP ? t : 1)) + ceil(s*b/c * sharded / t)";
      if (kind == BlockKind::kMoe && l.recompute != Recompute::kFull) {
        formula += " + R*((2h + 3f_e/t_e)*beta + 4)";
      }
      formula += "] * layer-micro-batches";
      auto in = Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"c", l.cp}, {"t", l.tp},
                        {"SP", l.sequence_parallel() ? 1 : 0}, {"rep", tb.replicated}, {"sharded", tb.sharded},
                        {"per_layer", per_layer.count()}, {"layers", w.layer_count[f]},
                        {"layer-micro-batches", w.units[f]}});
      if (kind == BlockKind::kMoe && l.recompute != Recompute::kFull) {
        const MoeRouting mr = RouteMoe(rc.model, rc.training.precision.activations, ResidualTokens(rc, l), l.ep,
                                       l.expert_tp);
        in.append(" ").append(Inputs({{"R", mr.expert_tokens}, {"h", rc.model.hidden}, {"f_e", rc.model.moe.ffn_hidden},
                            {"t_e", l.expert_tp}}));
      }
      in.append(Cat({" recompute=", RecomputeText(l.recompute), " schedule=", ScheduleText(l.schedule)}));
      Note(sink, Category::kActivations,
           Cat({"activations ", FamilyName(f), " (x", std::to_string(w.layer_count[f]), " layers)"}),
           formula, in, out.activations_by_family[static_cast<size_t>(f)]);
    }
  }
  if (w.embedding) {
    const Bytes first = FirstStageActivations(rc, l) * w.embedding_units;
    out.activations_ends += first;
    if (sink) {
      Note(sink, Category::kActivations, "first stage: token ids (int64) [+ embedding dropout mask]",
           "(8*s*b/c [+ s*b/c*h/(SP ? t : 1)]) * micro-batches in flight",
           Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"c", l.cp},
                   {"in_flight", w.embedding_units}}),
           first);
    }
  }
  if (w.head) {
    const int64_t vocab = PaddedVocab(rc.model, l.tp);
    const Bytes last = LastStageActivations(rc, l, vocab);
    out.activations_ends += last;
    if (sink) {
      Note(sink, Category::kActivations,
           "last stage: final-norm and head inputs, fp32 CE softmax, transient logits (1 micro-batch)",
           "s*b/c * [(2h*beta + stats)/(SP ? t : 1) + V_pad/t*(4 + beta)]",
           Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"c", l.cp}, {"t", l.tp},
                   {"h", rc.model.hidden}, {"V_pad", vocab}}),
           last);
    }
  }
  sum += out.activations_ends;
  sum += out.activations_transient;
  if (sink && out.activations_transient.count() > 0) {
    Note(sink, Category::kActivations, "one-layer transient (largest on this rank)",
         l.recompute == Recompute::kFull ? "max over families of (no-recompute layer activations + workspace)"
                                         : "max over families of workspace (Mamba SSD states, CP ring KV)",
         Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"t", l.tp}, {"c", l.cp}}),
         out.activations_transient);
  }
  out.bytes[static_cast<int>(Category::kActivations)] = sum;
}

void PriceRoutingScratch(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, Sink* sink) {
  if (w.layer_count[FamilyIndex(BlockKind::kMoe)] == 0) return;
  const MoeRouting mr = RouteMoe(rc.model, rc.training.precision.activations, ResidualTokens(rc, l), l.ep,
                                 l.expert_tp);
  out.bytes[static_cast<int>(Category::kRoutingScratch)] = mr.peak();
  if (sink) {
    const MoeConfig& e = rc.model.moe;
    std::string mode = e.dropless ? "dropless: N_recv = min(ceil(skew*T*k), T*e*min(k,E/e))"
                       : e.pad_to_capacity ? "padded: N_send = N_recv = E*C"
                                           : "capacity: N_send = min(T*k, E*C), N_recv = min(T*e*min(k,E/e), E*C)";
    Note(sink, Category::kRoutingScratch, Cat({"MoE dispatch/combine buffers (one layer, the peak; ", mode, ")"}),
         "T*k*4 (top-k probs) + 8E(1 + t_e*e) (counts) + max(dispatch: (N_send + N_recv [+ t_e*N_recv ETP] "
         "[+ t_e*N_recv sort]) , combine: ([t_e*N_recv sort] + N_recv + N_send + T)) * h*beta",
         Cat({Inputs({{"T", mr.tokens}, {"k", e.top_k}, {"E", e.experts}, {"e", l.ep}, {"t_e", l.expert_tp},
                 {"C", mr.capacity}, {"N_send", mr.send_tokens}, {"N_recv", mr.recv_tokens},
                 {"N_recv_worst", mr.recv_worst}, {"h", rc.model.hidden}}),
              " cf=", Decimal(e.capacity_factor), " skew=", Decimal(e.dropless_skew)}),
         mr.peak());
  }
}

void PriceServing(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, Sink* sink) {
  if (!rc.serving) return;
  const ServingConfig& sv = *rc.serving;
  const DType conv = rc.training.precision.activations;
  const int64_t tokens = Mul(sv.batch, sv.context);
  const int64_t n_a = w.own_layers[FamilyIndex(BlockKind::kAttention)];
  const int64_t n_m = w.own_layers[FamilyIndex(BlockKind::kMamba)];
  const int64_t n_r = w.own_layers[FamilyIndex(BlockKind::kRecurrent)];
  const Bytes kv(Mul(Mul(n_a, tokens), KvBytesPerToken(rc.model, l.tp, sv.kv_dtype)));
  const Bytes mamba(Mul(Mul(n_m, sv.batch), MambaStateBytesPerSequence(rc.model, l.tp, conv, sv.ssm_dtype)));
  const Bytes recurrent(Mul(Mul(n_r, sv.batch), RecurrentStateBytesPerSequence(rc.model, l.tp, conv)));
  out.bytes[static_cast<int>(Category::kServingState)] = kv + mamba + recurrent;
  if (!sink) return;
  if (n_a > 0) {
    Note(sink, Category::kServingState, "KV cache (attention layers only)",
         rc.model.mla ? "n_A * batch * context * (d_c + d_rope) * beta_kv (latent, replicated per TP rank)"
                      : "n_A * batch * context * 2 * max(n_kv/t, 1) * d_h * beta_kv",
         Inputs({{"n_A", n_a}, {"batch", sv.batch}, {"context", sv.context}, {"t", l.tp},
                 {"per_token", KvBytesPerToken(rc.model, l.tp, sv.kv_dtype)}}),
         kv);
  }
  if (n_m > 0) {
    Note(sink, Category::kServingState, "Mamba conv + SSM state",
         "n_M * batch * [(K-1)*(d_i + 2GN)/t*beta_conv + (H/t)*P*N*beta_ssm]",
         Inputs({{"n_M", n_m}, {"batch", sv.batch}, {"t", l.tp},
                 {"per_sequence", MambaStateBytesPerSequence(rc.model, l.tp, conv, sv.ssm_dtype)}}),
         mamba);
  }
  if (n_r > 0) {
    Note(sink, Category::kServingState, "RG-LRU conv + recurrent state",
         "n_R * batch * ((K_r-1)*beta_conv + 4) * d_r/t",
         Inputs({{"n_R", n_r}, {"batch", sv.batch}, {"t", l.tp},
                 {"per_sequence", RecurrentStateBytesPerSequence(rc.model, l.tp, conv)}}),
         recurrent);
  }
}

/// Runtime reserve: memory outside the caching allocator. Default 3 GiB
/// (cluster.reserve_gib): the CUDA context takes ~0.5 GiB on Hopper (PyTorch
/// "CUDA semantics" notes, visible as the gap between nvidia-smi and
/// memory_allocated), NCCL keeps per-communicator channel buffers
/// (NCCL_BUFFSIZE 4 MiB per channel per peer; a rank sits in TP, CP, DP, EP,
/// PP and embedding groups), cuBLAS keeps 32 MiB workspaces per handle
/// (CUBLAS_WORKSPACE_CONFIG :4096:8) and TE its GEMM workspaces; MATH.md 2.4
/// puts the sum at 2-3 GiB, to be calibrated with torch.cuda.mem_get_info.
Bytes RuntimeReserve(const Recipe& rc) { return GiB(rc.cluster.reserve_gib); }

RankMemory Compute(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, Sink* sink) {
  const Recipe& rc = inv.recipe;
  Context x;
  x.dense_group = Mul(l.dp, l.cp);
  x.expert_group = std::max<int64_t>(1, l.expert_dp());
  x.beta_g = SizeOf(rc.training.precision.grads);

  Walk w = WalkRank(inv, l, plan, r, x);
  const Ends ends = EndsOf(inv, l, w);
  Offer(w, UnitOf(ends.embedding, x, -1));
  LocalParams head_unit = ends.head;
  AddInto(head_unit, ends.final_norm);
  Offer(w, UnitOf(head_unit, x, -1));

  RankMemory out;
  out.in_flight_microbatches = w.in_flight;
  PriceParams(out, w, ends, l, x, sink);
  PriceGradients(out, w, ends, l, x, sink);
  PriceOptimizer(out, w, ends, rc, l, x, sink);
  PriceActivations(out, w, inv, l, sink);
  PriceRoutingScratch(out, w, rc, l, sink);
  PriceServing(out, w, rc, l, sink);

  const Bytes managed = out.total();
  out.bytes[static_cast<int>(Category::kRuntimeReserve)] = RuntimeReserve(rc);
  // Fragmentation of the caching allocator, a fraction of what it manages
  // (Megatron's estimator multiplies activations by 1.05; MATH.md 2.4).
  out.bytes[static_cast<int>(Category::kAllocatorOverhead)] =
      Bytes(CeilFraction(managed.count(), rc.cluster.allocator_overhead));
  out.capacity = MiB(rc.cluster.capacity_mib > 0 ? rc.cluster.capacity_mib : rc.cluster.spec.capacity_mib);
  if (sink) {
    Note(sink, Category::kRuntimeReserve, "CUDA context + NCCL buffers + cuBLAS/TE workspaces",
         "cluster.reserve_gib * 2^30", Cat({"reserve_gib=", Decimal(rc.cluster.reserve_gib)}),
         out.of(Category::kRuntimeReserve));
    Note(sink, Category::kAllocatorOverhead, "caching-allocator fragmentation",
         "ceil(allocator_overhead * (params + grads + optimizer + activations + scratch + serving))",
         Cat({"allocator_overhead=", Decimal(rc.cluster.allocator_overhead), " ",
              Inputs({{"managed", managed.count()}})}),
         out.of(Category::kAllocatorOverhead));
  }
  return out;
}

std::string GiBText(Bytes b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b.gib());
  return buf;
}

}  // namespace

RankMemory EstimateRank(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                        int64_t pipeline_rank) {
  return Compute(inventory, layout, stages, pipeline_rank, nullptr);
}

std::vector<Explanation> ExplainRank(const Inventory& inventory, const Layout& layout, const StagePlan& stages,
                                     int64_t pipeline_rank) {
  std::vector<Explanation> out;
  Compute(inventory, layout, stages, pipeline_rank, &out);
  return out;
}

MemoryEstimate EstimateMemory(const Inventory& inventory, const Layout& layout, const StagePlan& stages) {
  MemoryEstimate est;
  est.stages.reserve(static_cast<size_t>(layout.pp));
  for (int64_t r = 0; r < layout.pp; ++r) {
    est.stages.push_back(EstimateRank(inventory, layout, stages, r));
    if (est.stages.back().total() > est.stages[static_cast<size_t>(est.worst_stage)].total()) est.worst_stage = r;
  }
  const RankMemory& worst = est.stages[static_cast<size_t>(est.worst_stage)];
  const Bytes floor = GiB(inventory.recipe.cluster.min_headroom_gib);
  est.verdict.headroom = worst.headroom();
  est.verdict.fits = worst.total() <= worst.capacity;
  est.verdict.headroom_ok = est.verdict.headroom >= floor;
  const std::string stage = Cat({"stage ", std::to_string(est.worst_stage)});
  if (!est.verdict.fits) {
    est.verdict.reason = Cat({stage, " over capacity by ", GiBText(Bytes(0) - est.verdict.headroom)});
  } else if (!est.verdict.headroom_ok) {
    est.verdict.reason = Cat({stage, " fits with ", GiBText(est.verdict.headroom), " headroom, below the ",
                              GiBText(floor), " floor"});
  } else {
    est.verdict.reason = Cat({"fits: worst ", stage, " leaves ", GiBText(est.verdict.headroom), " headroom"});
  }
  return est;
}

}  // namespace preflight

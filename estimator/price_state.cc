// Model-state categories: parameters by sharding class, gradients, and the
// Muon and AdamW optimizer states, each sharded by ZeRO over its own group.
#include <algorithm>

#include "internal.h"

namespace preflight::estimator_detail {
namespace {

/// Local elements of all params on the rank of one optimizer, dense (REP+TP) or expert.
int64_t StateElements(const Walk& w, const Ends& e, int o, bool expert) {
  const LocalParams* all[] = {&w.layers, &e.embedding, &e.head, &e.final_norm};
  int64_t n = 0;
  for (const LocalParams* p : all) {
    n = Add(n, expert ? p->elements[kEp][o] : Add(p->elements[kRep][o], p->elements[kTp][o]));
  }
  return n;
}

/// ZeRO 3 parameters: the owned shares of every unit's buffers plus the
/// gathered units (Walk::gathered, exact per class). A flat dense share mixes
/// replicated and TP-sharded elements, so its split between the two rows is
/// for display only (the executor's comparison takes the sum of the three
/// rows): ceil(REP bytes / D) of the dense shares are shown as replicated,
/// the rest as TP-sharded; expert shares are EP-sharded.
void PriceZero3Params(RankMemory& out, const Walk& w, const Ends& ends, const Context& x, Sink* sink) {
  LocalParams all = w.layers;
  for (const LocalParams* e : {&ends.embedding, &ends.head, &ends.final_norm}) AddInto(all, *e);
  const int64_t rep_bytes = all.Gathered()[kRep];
  const int64_t dense = w.shares.param_bytes[0];
  const int64_t rep_share = std::min(dense, rep_bytes == 0 ? 0 : CeilDiv(rep_bytes, x.dense_group));
  const int64_t share[3] = {rep_share, dense - rep_share, w.shares.param_bytes[1]};
  LocalParams head_unit = ends.head;
  AddInto(head_unit, ends.final_norm);
  const std::array<int64_t, 3> head_gathered = head_unit.Gathered();
  static constexpr Category kCat[] = {Category::kReplicatedParams, Category::kTpShardedParams,
                                      Category::kEpShardedParams};
  static const char* const kShareFormula[] = {
      "ceil(REP bytes / D) of the dense shares (display split of a flat share)",
      "dense shares - the replicated part (sum over units and dense buffers of ceil(n/D) * element bytes)",
      "sum over units and expert buffers of ceil(n/D) * element bytes"};
  // FSDP2 CPU offload: the owned shares live on the host (PriceOptimizer
  // counts them there); only the gathered units come to the device.
  const bool offloaded = x.fsdp_cpu_offload;
  for (int c = 0; c < 3; ++c) {
    const Bytes gathered(w.gathered[static_cast<size_t>(c)]);
    const Bytes whole(all.buffer_bytes[static_cast<size_t>(c)]);
    out.bytes[static_cast<int>(kCat[c])] = Bytes(offloaded ? 0 : share[c]) + gathered + whole;
    if (sink && whole.count() > 0) {
      Note(sink, kCat[c], "buffers kept whole (the router's expert bias: FSDP shards parameters only)",
           "sum of the rank's buffer elements * their dtype bytes", Inputs({}), whole);
    }
    if (!sink) continue;
    if (share[c] > 0 && !offloaded) {
      Note(sink, kCat[c], "ZeRO-3 owned shares (rank 0 of the group)", kShareFormula[c],
           Inputs({{"dense_shares", dense}, {"expert_shares", w.shares.param_bytes[1]}, {"REP_bytes", rep_bytes},
                   {"D", x.group(c)}}),
           Bytes(share[c]));
    }
    if (gathered.count() > 0) {
      const size_t k = static_cast<size_t>(c);
      Note(sink, kCat[c], "ZeRO-3 gathered units (current + prefetched next, forward and backward)",
           "max over the rank's chunks and adjacent unit pairs (u, u+1) of the pair's full local bytes",
           Inputs({{"layer_pairs", w.gather.pairs[k]},
                   {"embedding_and_next",
                    Add(ends.embedding.bytes[k],
                        w.gather.embedding_then_head ? head_gathered[k] : w.gather.after_embedding[k])},
                   {"previous_and_head", Add(w.gather.before_head[k], head_gathered[k])}}),
           gathered);
    }
  }
}

/// Class c's FP4 weight copies (training.precision.fp4) less, under
/// fp4_params, the parameter copies of those weights they replace.
Bytes PriceFp4Copies(const Walk& w, const Ends& ends, int c, Category cat, Sink* sink) {
  const size_t k = static_cast<size_t>(c);
  const int64_t copies = Add(w.fp4.copies[k], ends.mtp_fp4.copies[k]);
  const int64_t replaced = Add(w.fp4.replaced[k], ends.mtp_fp4.replaced[k]);
  if (copies == 0) return Bytes(0);
  if (sink) {
    Note(sink, cat, "FP4 weight copies of the linear layers, rowwise + columnwise (Transformer Engine)",
         "sum over local linear weights [out, in] of 2 usages x (out*in/2 packed values + block scales in 128x4 tiles "
         "+ amax); "
         "docs/formulas.md §2.5",
         Inputs({{"copies", copies}}), Bytes(copies));
    if (replaced > 0) {
      Note(sink, cat, "linear weights kept in FP4 only (fp4_params): their parameter copy is dropped",
           "- sum over local linear weights of P_local * beta_p", Inputs({{"replaced", replaced}}),
           Bytes(0) - Bytes(replaced));
    }
  }
  return Bytes(copies) - Bytes(replaced);
}

/// Whether the layer-wise deal prices this layout's optimizer state: the
/// recipe's optimizer_sharding, at ZeRO 1 (a sweep's other stages keep flat).
bool LayerWise(const Layout& l, const Context& x) { return x.layer_wise && l.zero == 1; }

}  // namespace

Bytes LayerWiseLastLess(const Walk& w, const Layout& l, const Context& x) {
  if (!LayerWise(l, x)) return Bytes(0);
  int64_t less = 0;
  for (int g = 0; g < 2; ++g) {
    for (int o = 0; o < 2; ++o) {
      less = Add(less, Mul(w.layer_wise.heaviest[o][g] - w.layer_wise.last[o][g], StateBytesPerElement(o, x)));
    }
  }
  return Bytes(less);
}

void PriceParams(RankMemory& out, const Walk& w, const Ends& ends, const Layout& l, const Context& x, Sink* sink) {
  static constexpr Category kCat[] = {Category::kReplicatedParams, Category::kTpShardedParams,
                                      Category::kEpShardedParams};
  static const char* const kSplit[] = {"", "/t", "/(e*t_e)"};
  struct Item {
    const char* name;
    const LocalParams* params;
  };
  const Item items[] = {{"layers", &w.layers},
                        {"embedding (vocab-parallel, padded V)", &ends.embedding},
                        {ends.tied_copy ? "tied head copy on the last stage (padded V)" : "output head (padded V)",
                         &ends.head},
                        {"final norm", &ends.final_norm}};
  if (l.zero >= 3) {
    PriceZero3Params(out, w, ends, x, sink);
    return;
  }
  for (int c = 0; c < 3; ++c) {
    Bytes sum;
    for (const Item& it : items) {
      const int64_t raw = it.params->bytes[c];
      if (raw == 0) continue;
      sum += Bytes(raw);
      if (sink) {
        Note(sink, kCat[c], std::string(it.name), Cat({"sum of P_local * beta_p(tensor dtype); P_local = P", kSplit[c]}),
             Inputs({{"P_local", ClassSum(*it.params, c)}, {"bytes_local", raw}, {"D", 1}}), Bytes(raw));
      }
    }
    sum += PriceFp4Copies(w, ends, c, kCat[c], sink);
    out.bytes[static_cast<int>(kCat[c])] = sum;
  }
}

void PriceGradients(RankMemory& out, const Walk& w, const Ends& ends, const Layout& l, const Context& x, Sink* sink) {
  const bool sharded = l.zero >= 2;
  Bytes sum;
  for (int expert = 0; expert < 2; ++expert) {
    const int64_t elems = Add(StateElements(w, ends, kAdam, expert), StateElements(w, ends, kMuon, expert));
    if (elems == 0) continue;
    const int64_t group = expert ? x.expert_group : x.dense_group;
    // ZeRO 2/3: the owned share of every unit's padded buffers (rank 0 of the group keeps ceil(n/D) of each).
    const int64_t kept = sharded ? Add(w.shares.elements[kAdam][expert], w.shares.elements[kMuon][expert]) : elems;
    // FSDP2 CPU offload: each reduce-scatter's shard goes to the host.
    const Bytes b(x.fsdp_cpu_offload ? 0 : Mul(kept, x.beta_g));
    sum += b;
    if (sink) {
      Note(sink, Category::kGradients, expert ? "expert grads" : "dense grads (REP + TP + ends)",
           sharded ? "sum over units and buffers of ceil(n/D) * beta_g (ZeRO-2/3: owned shares, rank 0 of the group)"
                   : "P_local * beta_g (full buffer, ZeRO-0/1)",
           sharded ? Inputs({{"P_local", elems}, {"kept", kept}, {"beta_g", x.beta_g}, {"D", group}})
                   : Inputs({{"P_local", elems}, {"beta_g", x.beta_g}, {"D", 1}}),
           b);
    }
  }
  if (sharded && w.grad_unit.grads > 0) {
    const Bytes b(w.grad_unit.grads);
    sum += b;
    if (sink) {
      Note(sink, Category::kGradients,
           "unsharded grads of one unit, live from its backward to its reduce-scatter (the largest unit)",
           "U_local * beta_g (every buffer of the unit)", Inputs({{"unit_layer", w.grad_unit.layer}}), b);
    }
  }
  out.bytes[static_cast<int>(Category::kGradients)] = sum;
}

namespace {

/// Optimizer state elements of optimizer o (dense or expert params) the rank
/// keeps: its ZeRO >= 1 shares or every local element; `host` of them are
/// offloaded. Megatron's HybridDeviceOptimizer moves whole params to the host
/// until the offloaded elements reach fraction x the rank's (per optimizer:
/// dense and expert); each keeps an fp32 param, grad, m and v there
/// (cpu_offloading/hybrid_optimizer.py _get_sub_optimizer_param_groups).
struct KeptState {
  int64_t local = 0, kept = 0, host = 0;
};
KeptState KeptStateOf(const Walk& w, const Ends& ends, const Layout& l, const Context& x, double offload, int o,
                      int expert) {
  KeptState k;
  k.local = StateElements(w, ends, o, expert);
  k.kept = LayerWise(l, x) ? w.layer_wise.heaviest[o][expert] : l.zero >= 1 ? w.shares.elements[o][expert] : k.local;
  k.host = o == kMuon || offload <= 0 ? 0 : std::min(k.kept, CeilFraction(k.kept, offload));
  return k;
}

/// Megatron's mixed-precision optimizers (ZeRO 0 and 1) hand each fp32 main
/// param the fp32 copy of its share of a lower-precision gradient buffer
/// (optimizer.py and distrib_optimizer.py _copy_model_grads_to_main_grads:
/// `model_grad.float()`), and free it at the next step's zero_grad
/// (set_to_none): it stays allocated between steps, not at the activation
/// peak. With fp32 gradients `.float()` is the buffer itself; Megatron-FSDP
/// (ZeRO 2/3) returns before copying.
bool CopiesMainGrads(const Recipe& rc, const Layout& l) {
  const PrecisionConfig& p = rc.training.precision;
  return l.zero <= 1 && p.params != DType::kFp32 && p.master == DType::kFp32 && p.grads != DType::kFp32;
}

}  // namespace

Bytes MainGradCopies(const Walk& w, const Ends& ends, const Recipe& rc, const Layout& l, const Context& x) {
  if (!CopiesMainGrads(rc, l)) return Bytes(0);
  int64_t elems = 0;
  for (int o = 0; o < 2; ++o) {
    for (int expert = 0; expert < 2; ++expert) {
      const KeptState k = KeptStateOf(w, ends, l, x, rc.training.optimizer.offload_fraction, o, expert);
      elems = Add(elems, k.kept - k.host);
    }
  }
  return Bytes(Mul(elems, SizeOf(DType::kFp32)));
}

void PriceOptimizer(RankMemory& out, const Walk& w, const Ends& ends, const Recipe& rc, const Layout& l,
                    const Context& x, Sink* sink) {
  const int64_t master = x.master;
  const int64_t momentum = x.momentum;
  const bool sharded = l.zero >= 1;
  const bool layer_wise = LayerWise(l, x);
  // FSDP2 CPU offload moves every shard's state (validation: AdamW, ZeRO 3).
  const double offload = x.fsdp_cpu_offload ? 1.0 : rc.training.optimizer.offload_fraction;
  for (int o = 0; o < 2; ++o) {
    const bool muon = o == kMuon;
    const Category cat = muon ? Category::kOptimizerMuon : Category::kOptimizerAdamW;
    const int64_t per_elem = StateBytesPerElement(o, x);
    Bytes sum;
    for (int expert = 0; expert < 2; ++expert) {
      // ZeRO >= 1: each unit's buffer of n elements is padded to a multiple
      // of D and the busiest rank keeps ceil(n/D) of it (Walk::shares).
      // Layer-wise: the whole tensors dealt to the heaviest rank (LayerWiseOf).
      const auto [elems, kept, host] = KeptStateOf(w, ends, l, x, offload, o, expert);
      if (elems == 0) continue;
      const int64_t group = expert ? x.expert_group : x.dense_group;
      const Bytes b(Mul(kept - host, per_elem));
      sum += b;
      if (host > 0) {
        const Bytes h(Mul(host, 16));
        out.host += h;
        if (sink) {
          Note(sink, cat, Cat({"AdamW state offloaded to host memory", expert ? ", expert params" : ", dense params"}),
               "ceil(offload_fraction * kept) elements leave the device; on the host 16 B each (fp32 param, grad, "
               "m, v); shown here as 0 device bytes",
               Inputs({{"kept", kept}, {"offloaded", host}, {"host_bytes", h.count()}}), Bytes(0));
        }
      }
      if (sink && layer_wise) {
        Note(sink, cat, Cat({muon ? "Muon" : "AdamW", expert ? " state, expert params" : " state, dense params"}),
             Cat({"whole tensors dealt by size over D ranks (Megatron's layer-wise optimizer, ping-pong), the "
                  "heaviest rank's",
                  muon ? " * (momentum + master)" : " * (m + v (fp32) + master)"}),
             Inputs({{"P", elems},
                     {"kept", kept},
                     {"kept_last_rank", w.layer_wise.last[o][expert]},
                     {muon ? "momentum" : "m+v", muon ? momentum : 8},
                     {"master", master},
                     {"D", group}}),
             b);
      } else if (sink) {
        Note(sink, cat, Cat({muon ? "Muon" : "AdamW", expert ? " state, expert params" : " state, dense params"}),
             Cat({host > 0 ? "(" : "", sharded ? "sum over units and buffers of ceil(n/D)" : "P",
                  host > 0 ? " - offloaded)" : "", muon ? " * (momentum + master)" : " * (m + v (fp32) + master)",
                  sharded ? " (ZeRO>=1: buffers padded to a multiple of D, rank 0 of the group)" : ""}),
             Cat({Inputs({{"P", elems},
                          {"kept", kept},
                          {muon ? "momentum" : "m+v", muon ? momentum : 8},
                          {"master", master},
                          {"D", sharded ? group : 1}}),
                  host > 0 ? Cat({" offloaded=", std::to_string(host)}) : std::string()}),
             b);
      }
    }
    out.bytes[static_cast<int>(cat)] = sum;
  }
}

}  // namespace preflight::estimator_detail

// Model-state categories: parameters by sharding class, gradients, and the
// Muon and AdamW optimizer states, each sharded by ZeRO over its own group.
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

}  // namespace

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
      // ZeRO >= 1: each unit's buffer of n elements is padded to a multiple
      // of D and the busiest rank keeps ceil(n/D) of it (Walk::state_shards).
      const int64_t kept = sharded ? w.state_shards[o][expert] : elems;
      const Bytes b(Mul(kept, per_elem));
      sum += b;
      if (sink) {
        Note(sink, cat, Cat({muon ? "Muon" : "AdamW", expert ? " state, expert params" : " state, dense params"}),
             Cat({sharded ? "sum over units and buffers of ceil(n/D)" : "P",
                  muon ? " * (momentum + master)" : " * (m + v (fp32) + master)",
                  sharded ? " (ZeRO>=1: buffers padded to a multiple of D, rank 0 of the group)" : ""}),
             Inputs({{"P", elems}, {"kept", kept}, {muon ? "momentum" : "m+v", muon ? momentum : 8},
                     {"master", master}, {"D", sharded ? group : 1}}),
             b);
      }
    }
    out.bytes[static_cast<int>(cat)] = sum;
  }
}

}  // namespace preflight::estimator_detail

// Hand-built recipes and inventories for the estimator tests: element counts
// are set directly, so each test knows its parameter counts exactly without
// depending on BuildInventory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"

namespace preflight::testing {

/// A recipe with every size explicit: 8 x H200 world by default.
inline Recipe SmallRecipe() {
  Recipe r;
  r.name = "test";
  r.model.hidden = 1024;
  r.model.vocab = 32768;
  r.model.attention = {16, 4, 64, false};
  r.model.mlp = {4096, FfnActivation::kSwiglu};
  r.model.moe.experts = 16;
  r.model.moe.top_k = 2;
  r.model.moe.ffn_hidden = 512;
  r.model.moe.shared_experts = 1;
  r.model.mamba = {64, 4, 2, 64, 4, 128, false};
  r.model.recurrent = {1024, 16, 4};
  r.training.seq_len = 4096;
  r.training.micro_batch = 1;
  r.training.global_batch = 64;
  r.cluster.spec = *GpuPreset("h200");
  return r;
}

/// An empty layer of `kind`; fill it with SetElements.
inline Layer MakeLayer(int64_t index, BlockKind kind) {
  Layer l;
  l.index = index;
  l.kind = kind;
  return l;
}
/// Sets the element count of (class, optimizer) and keeps the class's bf16
/// parameter bytes (2 B/element) in step, as ParamTotals::Add would.
inline void SetElements(Layer& l, ShardClass c, OptimizerKind o, int64_t n) {
  const int ci = static_cast<int>(c);
  const int64_t old = l.totals.elements[ci][static_cast<int>(o)];
  l.totals.elements[ci][static_cast<int>(o)] = n;
  l.totals.param_bytes[ci] += 2 * (n - old);
}

inline ParamTensor Tensor(const std::string& name, std::vector<int64_t> shape, Split split, OptimizerKind o) {
  ParamTensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.split = split;
  t.optimizer = o;
  return t;
}

/// Pipeline-end tensors of `r`: embedding [V, h] vocab-parallel, final norm [h],
/// untied head [V, h] unless tied; all AdamW.
inline void AddEnds(Inventory& inv) {
  const ModelConfig& m = inv.recipe.model;
  inv.embedding = Tensor("embedding.word_embeddings.weight", {m.vocab, m.hidden}, Split::kVocab, OptimizerKind::kAdamW);
  inv.final_norm = Tensor("final_norm.weight", {m.hidden}, Split::kReplicated, OptimizerKind::kAdamW);
  inv.head.clear();
  if (!m.tie_embeddings) {
    inv.head.push_back(Tensor("output_layer.weight", {m.vocab, m.hidden}, Split::kVocab, OptimizerKind::kAdamW));
  }
}

/// A hybrid stack following `pattern` x `repeat`, with fixed illustrative
/// per-family element counts in every sharding class (REP norms and router,
/// TP matrices split between Muon and AdamW, EP experts).
inline Inventory HybridInventory(Recipe r, const std::string& pattern, int64_t repeat) {
  Inventory inv;
  r.model.pattern = pattern;
  r.model.repeat = repeat;
  r.model.layers.clear();
  for (int64_t k = 0; k < repeat; ++k) {
    for (char c : pattern) r.model.layers.push_back(static_cast<BlockKind>(c));
  }
  inv.recipe = r;
  int64_t i = 0;
  for (BlockKind kind : r.model.layers) {
    Layer l = MakeLayer(i++, kind);
    SetElements(l, ShardClass::kReplicated, OptimizerKind::kAdamW, 1024);
    switch (kind) {
      case BlockKind::kMoe:
        SetElements(l, ShardClass::kReplicated, OptimizerKind::kAdamW, 1024 + 16 * 1024);
        SetElements(l, ShardClass::kTpSharded, OptimizerKind::kMuon, 3 * 1024 * 512);
        SetElements(l, ShardClass::kEpSharded, OptimizerKind::kMuon, 16 * 3 * 1024 * 512);
        break;
      case BlockKind::kMamba:
        SetElements(l, ShardClass::kTpSharded, OptimizerKind::kAdamW, 1024 * 4616 + 2560 * 5 + 3 * 32);
        SetElements(l, ShardClass::kTpSharded, OptimizerKind::kMuon, 2048 * 1024);
        break;
      default:
        SetElements(l, ShardClass::kTpSharded, OptimizerKind::kMuon, 4 * 1024 * 1024);
        break;
    }
    inv.layers.push_back(l);
  }
  AddEnds(inv);
  return inv;
}

/// Layout of `r` with the given degrees filled in consistently with `world`.
inline Layout LayoutFor(const Recipe& r, int64_t world, int64_t tp, int64_t pp, int64_t ep) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.ep = ep;
  l.dp = world / (tp * pp);
  l.micro_batch = r.training.micro_batch;
  l.micro_batches = r.training.global_batch / (l.micro_batch * l.dp);
  return l;
}

}  // namespace preflight::testing

// The model inventory: one source of truth, built once per recipe and
// independent of the layout, so a sweep prices millions of layouts from it
// with plain arithmetic (DESIGN.md, "The data flow").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "preflight/recipe.h"

namespace preflight {

/// How a parameter tensor is split across ranks (MATH.md 1).
enum class Split {
  kReplicated,  // REP: full copy on every TP rank
  kTpColumn,    // split on the output dimension over TP
  kTpRow,       // split on the input dimension over TP
  kTpChannel,   // 1-D / per-channel or per-head split over TP (conv, A_log, gated norm, R gates)
  kVocab,       // vocab-parallel over TP, vocabulary padded (embedding rows, head columns)
  kExpert,      // routed experts: experts/ep per EP rank, each expert split 1/expert_tp
};
const char* Name(Split s);

/// The three sharding classes the memory geometry reports.
enum class ShardClass { kReplicated = 0, kTpSharded = 1, kEpSharded = 2 };
inline ShardClass ClassOf(Split s) {
  switch (s) {
    case Split::kReplicated: return ShardClass::kReplicated;
    case Split::kExpert: return ShardClass::kEpSharded;
    default: return ShardClass::kTpSharded;
  }
}

struct ParamTensor {
  std::string name;             // "layers.3.mixer.in_proj.weight"
  std::vector<int64_t> shape;   // global, unsharded; routed experts lead with the expert count
  Split split = Split::kReplicated;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  DType dtype = DType::kBf16;   // storage dtype of the parameter copy
  int64_t elements() const;     // product of shape, checked
};

/// Element counts of one layer (or a range) by sharding class and optimizer,
/// global (unsharded). Summed once at build time so pricing never walks tensors.
struct ParamTotals {
  // [ShardClass][OptimizerKind]
  std::array<std::array<int64_t, 2>, 3> elements{};
  int64_t total() const;
  int64_t of(ShardClass c) const { return elements[static_cast<int>(c)][0] + elements[static_cast<int>(c)][1]; }
  int64_t of(ShardClass c, OptimizerKind o) const { return elements[static_cast<int>(c)][static_cast<int>(o)]; }
  void Add(const ParamTensor& t);
  ParamTotals& operator+=(const ParamTotals& o);
};

struct Layer {
  int64_t index = 0;  // position in the expanded layer list
  BlockKind kind = BlockKind::kAttention;
  std::vector<ParamTensor> params;
  ParamTotals totals;
  /// Parameters one token touches in this layer (routed experts: top_k of them).
  int64_t active_elements = 0;
};

struct Inventory {
  Recipe recipe;                   // the recipe the inventory was built from
  std::vector<Layer> layers;       // in model order
  ParamTensor embedding;           // [vocab, hidden], Split::kVocab (logical, unpadded vocab)
  ParamTensor final_norm;          // [hidden], REP
  std::vector<ParamTensor> head;   // [vocab, hidden] output projection; empty when tied
  int64_t total_params = 0;        // logical (unpadded) parameter count of the whole model
  int64_t active_params = 0;       // parameters used per token (embedding, head included)
  /// Total element count per block family, indexed by the BlockKind letter order of kAllBlockKinds.
  std::array<int64_t, 5> family_params{};
  std::array<int64_t, 5> family_layers{};
};

/// Index of `k` in kAllBlockKinds (A=0, M=1, E=2, R=3, D=4).
int FamilyIndex(BlockKind k);

/// Builds the inventory of a validated recipe. Pure; throws ArithmeticOverflow
/// only when a count leaves int64.
Inventory BuildInventory(const Recipe& recipe);

/// Padded vocabulary for TP degree `tp`: vocab rounded up to vocab_pad_multiple * tp (Megatron).
int64_t PaddedVocab(const ModelConfig& m, int64_t tp);

}  // namespace preflight

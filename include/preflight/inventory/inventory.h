// The model inventory: one source of truth, built once per recipe and
// independent of the layout, so a sweep prices millions of layouts from it
// with plain arithmetic (docs/architecture.md).
//
// Conventions (src/inventory/build.cc):
// - Linear weights are written input x output (docs/formulas.md §8.1, Y = X W), so TP
//   column splits the last dimension and TP row the first. Routed experts are
//   stacks [E, h, 2 f_e] (gate+up) and [E, f_e, h].
// - Names: "layers.<i>.norm.weight" (pre-norm), "layers.<i>.mixer.*" (A, M, R),
//   "layers.<i>.mlp.*" (E, D), "embedding.word_embeddings.weight",
//   "final_norm.weight", "output_layer.weight".
// - Optimizers (docs/formulas.md §9.4): 2-D hidden matrices -> training.optimizer.matrices
//   (Muon by default), Mamba in_proj -> optimizer.mamba_in_proj, router ->
//   optimizer.router (both fall back to AdamW when matrices is AdamW);
//   everything else AdamW, including the R block's block-diagonal gate stacks
//   W_a, W_x (small per-head maps, not hidden matrices).
// - model.norm (rmsnorm | layernorm) governs the block pre-norms and the final
//   norm; qk-norm, MLA latent norms and the Mamba gated norm are RMSNorm weights.
// - Counts use the logical vocab; PaddedVocab gives the per-rank padded rows.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight {

/// How a parameter tensor is split across ranks (docs/formulas.md §1).
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
  /// A linear layer's weight (a "*_proj" matrix of a layer or MTP module):
  /// Transformer Engine runs it as a GEMM and quantizes it for FP4
  /// (training.precision.fp4). Not the embedding, head, router or convs.
  bool linear = false;
  /// false for a buffer the framework keeps beside the parameters but never
  /// trains (Megatron's fp32 router expert_bias, a register_buffer updated
  /// outside the gradient): it is stored and counted, with no gradient, no
  /// optimizer state and no data-parallel traffic.
  bool trained = true;
  int64_t elements() const;     // product of shape, checked; 0 for an empty (absent) tensor
};

/// Element counts of one layer (or a range) by sharding class and optimizer,
/// global (unsharded). Summed once at build time so pricing never walks tensors.
struct ParamTotals {
  // [ShardClass][OptimizerKind]
  std::array<std::array<int64_t, 2>, 3> elements{};
  /// Bytes of the parameter copies per ShardClass (elements x SizeOf(dtype));
  /// differs from elements x precision.params only by the fp32 A_log and D of Mamba.
  std::array<int64_t, 3> param_bytes{};
  /// Of `elements`, those stored in fp32 [ShardClass][OptimizerKind] (Mamba's
  /// A_log and D; every element when precision.params is fp32). The
  /// distributed optimizer keeps one flat buffer per element dtype, so these
  /// are padded and sharded apart from the rest (estimator ZeRO state, planner
  /// DP traffic; simulator/dist_optimizer.h).
  std::array<std::array<int64_t, 2>, 3> fp32_elements{};
  /// Elements of untrained buffers per ShardClass (ParamTensor::trained):
  /// in total() and param_bytes, not in `elements`.
  std::array<int64_t, 3> buffer_elements{};
  int64_t total() const;
  int64_t of(ShardClass c) const { return elements[static_cast<int>(c)][0] + elements[static_cast<int>(c)][1]; }
  int64_t of(ShardClass c, OptimizerKind o) const { return elements[static_cast<int>(c)][static_cast<int>(o)]; }
  void Add(const ParamTensor& t);
  ParamTotals& operator+=(const ParamTotals& o);
  /// Difference of two prefix sums (checked); used for layer ranges.
  ParamTotals& operator-=(const ParamTotals& o);
  friend ParamTotals operator+(ParamTotals a, const ParamTotals& b) { return a += b; }
  friend ParamTotals operator-(ParamTotals a, const ParamTotals& b) { return a -= b; }
  /// Elements owned by `o` across all classes.
  int64_t of(OptimizerKind o) const {
    return elements[0][static_cast<int>(o)] + elements[1][static_cast<int>(o)] + elements[2][static_cast<int>(o)];
  }
  friend bool operator==(const ParamTotals&, const ParamTotals&) = default;
};

struct Layer {
  int64_t index = 0;  // position in the expanded layer list
  BlockKind kind = BlockKind::kAttention;
  std::vector<ParamTensor> params;
  ParamTotals totals;
  /// Parameters one token touches in this layer (routed experts: top_k of them).
  int64_t active_elements = 0;
  /// Elements of this layer's largest single Muon matrix (one expert's, for a
  /// routed-expert stack), global; 0 when Muon owns nothing here.
  int64_t max_muon_matrix_elements = 0;
  /// First sublayer of a framework layer (a transformer layer's attention, or
  /// any hybrid symbol): full recompute keeps one checkpoint per layer, here.
  bool starts_layer = true;
};

struct Inventory {
  Recipe recipe;                   // the recipe the inventory was built from
  std::vector<Layer> layers;       // in model order (sublayers: one per pattern symbol)
  /// Framework layers (recipe/partition.h LayerStarts): index of the sublayer
  /// each starts at, then layers.size().
  std::vector<int64_t> layer_starts;
  int64_t layer_count() const { return layer_starts.empty() ? 0 : static_cast<int64_t>(layer_starts.size()) - 1; }
  ParamTensor embedding;           // [vocab, hidden], Split::kVocab (logical, unpadded vocab)
  /// Learned absolute position embeddings [positions, hidden], REP, on the
  /// first stage with the word embedding; empty without (RoPE).
  std::vector<ParamTensor> positions;
  ParamTensor final_norm;          // [hidden], REP
  std::vector<ParamTensor> head;   // [vocab, hidden] output projection; empty when tied
  /// MTP modules' tensors (model.mtp_layers), on the last stage with the head.
  std::vector<ParamTensor> mtp;
  BlockKind mtp_ffn = BlockKind::kDenseMlp;  // the FFN kind of an MTP layer (the model's last)
  int64_t mtp_inactive = 0;                  // routed-expert elements of the MTP layers a token does not touch
  int64_t total_params = 0;        // logical (unpadded) parameter count of the whole model
  int64_t active_params = 0;       // parameters used per token (embedding, head included)
  /// Total element count per block family, indexed by the BlockKind letter order of kAllBlockKinds.
  std::array<int64_t, 5> family_params{};
  std::array<int64_t, 5> family_layers{};
  /// family_uniform[f]: every layer of family f has the same totals, so a
  /// pricing loop may work out one and multiply (false when not known, as in
  /// hand-built inventories: the loops then compare totals layer by layer).
  std::array<bool, 5> family_uniform{};

  // ---- Precomputed for cheap pricing (all global, unsharded element counts) ----
  /// All final-norm tensors: the weight (== final_norm), plus a bias with LayerNorm.
  std::vector<ParamTensor> final_norms;
  /// Totals of the non-layer tensors, each by class x optimizer.
  ParamTotals embedding_totals;   // the embedding (kVocab -> kTpSharded, logical vocab) + positions
  ParamTotals final_norm_totals;  // every final-norm tensor
  ParamTotals head_totals;        // the untied head; zero when tied
  ParamTotals mtp_totals;         // every MTP tensor
  /// Sum of everything in `layers` by class x optimizer.
  ParamTotals layer_totals;
  /// Per family (FamilyIndex), by class x optimizer.
  std::array<ParamTotals, 5> family_totals{};
  /// prefix_totals[i] = sum of layers[0..i) totals; size layers.size() + 1.
  std::vector<ParamTotals> prefix_totals;
  /// prefix_active[i] = sum of layers[0..i) active_elements; size layers.size() + 1.
  std::vector<int64_t> prefix_active;
  /// prefix_family_layers[i][f] = count of family-f layers in layers[0..i); size layers.size() + 1.
  std::vector<std::array<int64_t, 5>> prefix_family_layers;
  /// prefix_layer_starts[i] = framework layers starting in layers[0..i) (Layer::starts_layer); size layers.size() + 1.
  std::vector<int64_t> prefix_layer_starts;
  /// Elements of the largest single Muon-managed matrix (routed experts: one
  /// expert's matrix, never the stack; docs/formulas.md §9.4), global. 0 when no Muon.
  /// Sets the Muon Newton-Schulz transient (docs/formulas.md §2.2).
  int64_t max_muon_matrix_elements = 0;

  /// Totals of layers [first, end) in O(1).
  ParamTotals RangeTotals(int64_t first, int64_t end) const;
  /// Active (per-token) elements of layers [first, end) in O(1).
  int64_t RangeActive(int64_t first, int64_t end) const;
  /// Layers of each family in [first, end) in O(1), indexed by FamilyIndex.
  std::array<int64_t, 5> RangeFamilyLayers(int64_t first, int64_t end) const;
  /// Framework layers starting in [first, end): O(1), or a search of
  /// layer_starts in an inventory built by hand without the prefix.
  int64_t RangeLayerStarts(int64_t first, int64_t end) const;
};

/// Index of `k` in kAllBlockKinds (A=0, M=1, E=2, R=3, D=4).
int FamilyIndex(BlockKind k);

/// Builds the inventory of a validated recipe. Pure; throws ArithmeticOverflow
/// only when a count leaves int64.
Inventory BuildInventory(const Recipe& recipe);

/// Recomputes every derived field of `inv` (embedding/final-norm/head totals,
/// layer_totals, family_totals/params/layers, the prefix sums, total_params,
/// active_params, max_muon_matrix_elements) from layers[i].totals,
/// active_elements, max_muon_matrix_elements and the end tensors
/// (final_norms, or final_norm alone when final_norms is empty).
/// BuildInventory calls it; test fixtures that edit layers by hand call it too.
void RecomputeDerived(Inventory& inv);
/// Inventory::layer_starts and Layer::starts_layer from the layers' kinds
/// (part of RecomputeDerived; hand-built inventories call it alone).
void SetLayerStarts(Inventory& inv);

/// Padded vocabulary for TP degree `tp`: vocab rounded up to vocab_pad_multiple * tp (Megatron).
int64_t PaddedVocab(const ModelConfig& m, int64_t tp);

/// The expanded layer list of `m`: m.layers when the parser filled it, else
/// pattern x repeat with the parser's E-slot rule applied (E slot j stays MoE
/// iff j >= first_k_dense and (j - first_k_dense) % layer_freq == layer_offset,
/// else it becomes D), so recipes built in C++ need no parser.
std::vector<BlockKind> ExpandedLayers(const ModelConfig& m);

}  // namespace preflight

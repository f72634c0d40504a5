// BuildInventory: every parameter tensor of the model with its global shape,
// split, optimizer and dtype (docs/formulas.md §1 and 9.4), plus the per-layer totals
// and prefix sums that let the estimator and planner price a layout with
// plain arithmetic.
//
// Shapes are written input x output for linears (docs/formulas.md §8.1, Y = X W), so a
// TP-column tensor splits its last dimension and a TP-row tensor its first.
// Names follow the Megatron/HF habit: "layers.<i>.<module>.<tensor>".
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/partition.h"
#include "preflight/recipe/units.h"

namespace preflight {
namespace {

/// Which optimizer owns each kind of tensor (docs/formulas.md §9.4).
struct OptimizerPolicy {
  OptimizerKind matrix = OptimizerKind::kMuon;         // 2-D hidden matrices
  OptimizerKind mamba_in_proj = OptimizerKind::kAdamW;  // Megatron sets in_proj.use_muon = False
  OptimizerKind router = OptimizerKind::kAdamW;         // the project's default (docs/formulas.md §9.4)
  // Embeddings, head, norms, biases, conv, A_log, D, dt_bias, Lambda and the R
  // gate blocks always use AdamW.
  OptimizerKind vector = OptimizerKind::kAdamW;
};

OptimizerPolicy PolicyOf(const OptimizerConfig& o) {
  OptimizerPolicy p;
  p.matrix = o.matrices;
  // The in_proj and router knobs choose between "like the matrices" and AdamW:
  // with matrices = adamw there is no Muon anywhere.
  const bool muon = o.matrices == OptimizerKind::kMuon;
  p.mamba_in_proj = muon ? o.mamba_in_proj : OptimizerKind::kAdamW;
  p.router = muon ? o.router : OptimizerKind::kAdamW;
  return p;
}

/// The layers' and MTP modules' projection matrices ("*_proj.weight"; the
/// routed-expert stacks "*_proj"), which Transformer Engine runs as GEMMs.
bool IsLinearWeight(const ParamTensor& t) {
  const std::string_view name = t.name;
  return t.shape.size() >= 2 && (name.ends_with("_proj.weight") || name.ends_with("_proj"));
}

/// Appends tensors that share a name prefix and a default dtype.
class TensorList {
 public:
  TensorList(std::string prefix, DType dtype, std::vector<ParamTensor>* out)
      : prefix_(std::move(prefix)), dtype_(dtype), out_(out) {}

  void Add(const std::string& name, std::vector<int64_t> shape, Split split, OptimizerKind optimizer) {
    Add(name, std::move(shape), split, optimizer, dtype_);
  }
  void Add(const std::string& name, std::vector<int64_t> shape, Split split, OptimizerKind optimizer, DType dtype) {
    ParamTensor t;
    t.name = prefix_ + name;
    t.shape = std::move(shape);
    t.split = split;
    t.optimizer = optimizer;
    t.dtype = dtype;
    t.linear = IsLinearWeight(t);
    out_->push_back(std::move(t));
  }
  /// An untrained buffer (ParamTensor::trained false) in `dtype`.
  void AddBuffer(const std::string& name, std::vector<int64_t> shape, Split split, DType dtype) {
    Add(name, std::move(shape), split, OptimizerKind::kAdamW, dtype);
    out_->back().trained = false;
  }

 private:
  std::string prefix_;
  DType dtype_;
  std::vector<ParamTensor>* out_;
};

/// A residual pre-norm or the final norm: RMSNorm weight, or LayerNorm weight + bias, [h], REP.
void AddNorm(TensorList& list, const std::string& name, int64_t hidden, NormKind kind, const OptimizerPolicy& p) {
  list.Add(name + ".weight", {hidden}, Split::kReplicated, p.vector);
  if (kind == NormKind::kLayerNorm) list.Add(name + ".bias", {hidden}, Split::kReplicated, p.vector);
}

// GQA/MQA/MHA (docs/formulas.md §1.2). The optional q/k norms are per-head RMSNorms
// (their own kind, not model.norm).
void AddGqa(TensorList& list, const ModelConfig& m, const OptimizerPolicy& p) {
  const AttentionConfig& a = m.attention;
  const int64_t qkv_out = CheckedMul(CheckedAdd(a.heads, CheckedMul(2, a.kv_heads)), a.head_dim);
  list.Add("mixer.qkv_proj.weight", {m.hidden, qkv_out}, Split::kTpColumn, p.matrix);
  list.Add("mixer.o_proj.weight", {CheckedMul(a.heads, a.head_dim), m.hidden}, Split::kTpRow, p.matrix);
  if (m.linear_bias) {
    // Megatron's ColumnParallelLinear splits its bias with the output; a
    // RowParallelLinear adds its full bias after the reduction (replicated).
    list.Add("mixer.qkv_proj.bias", {qkv_out}, Split::kTpChannel, p.vector);
    list.Add("mixer.o_proj.bias", {m.hidden}, Split::kReplicated, p.vector);
  }
  if (a.qk_norm) {
    list.Add("mixer.q_norm.weight", {a.head_dim}, Split::kReplicated, p.vector);
    list.Add("mixer.k_norm.weight", {a.head_dim}, Split::kReplicated, p.vector);
  }
}

// MLA (docs/formulas.md §1.3, DeepSeek-V2/V3 names). Down projections are replicated
// (Megatron's TELinear "duplicated"), up projections TP column, W_o TP row;
// all of them are 2-D hidden matrices and go to Muon (docs/formulas.md §9.4).
void AddMla(TensorList& list, const ModelConfig& m, const OptimizerPolicy& p) {
  const MlaConfig& a = *m.mla;
  const int64_t q_head = CheckedAdd(a.qk_nope_head_dim, a.qk_rope_head_dim);
  const int64_t q_out = CheckedMul(a.heads, q_head);
  if (a.q_lora_rank > 0) {
    list.Add("mixer.q_a_proj.weight", {m.hidden, a.q_lora_rank}, Split::kReplicated, p.matrix);
    list.Add("mixer.q_a_norm.weight", {a.q_lora_rank}, Split::kReplicated, p.vector);
    list.Add("mixer.q_b_proj.weight", {a.q_lora_rank, q_out}, Split::kTpColumn, p.matrix);
  } else {
    list.Add("mixer.q_proj.weight", {m.hidden, q_out}, Split::kTpColumn, p.matrix);
  }
  list.Add("mixer.kv_a_proj.weight", {m.hidden, CheckedAdd(a.kv_lora_rank, a.qk_rope_head_dim)}, Split::kReplicated,
           p.matrix);
  list.Add("mixer.kv_a_norm.weight", {a.kv_lora_rank}, Split::kReplicated, p.vector);
  const int64_t kv_out = CheckedMul(a.heads, CheckedAdd(a.qk_nope_head_dim, a.v_head_dim));
  list.Add("mixer.kv_b_proj.weight", {a.kv_lora_rank, kv_out}, Split::kTpColumn, p.matrix);
  list.Add("mixer.o_proj.weight", {CheckedMul(a.heads, a.v_head_dim), m.hidden}, Split::kTpRow, p.matrix);
}

// Mamba-2 mixer (docs/formulas.md §1.4; mamba_ssm mamba2.py, Megatron mamba_mixer.py).
// in_proj packs [z, x, B, C, dt]; conv1d runs over [x, B, C]. Megatron keeps
// A_log and D in fp32 whatever the parameter dtype.
void AddMamba(TensorList& list, const ModelConfig& m, const OptimizerPolicy& p) {
  const MambaConfig& c = m.mamba;
  const int64_t d_inner = c.Inner(m.hidden);
  const int64_t heads = d_inner / c.head_dim;
  const int64_t bc = CheckedMul(2, CheckedMul(c.groups, c.d_state));
  const int64_t conv_dim = CheckedAdd(d_inner, bc);
  const int64_t in_out = CheckedAdd(CheckedAdd(CheckedMul(2, d_inner), bc), heads);
  list.Add("mixer.in_proj.weight", {m.hidden, in_out}, Split::kTpColumn, p.mamba_in_proj);
  list.Add("mixer.conv1d.weight", {conv_dim, c.d_conv}, Split::kTpChannel, p.vector);
  list.Add("mixer.conv1d.bias", {conv_dim}, Split::kTpChannel, p.vector);
  list.Add("mixer.dt_bias", {heads}, Split::kTpChannel, p.vector);
  list.Add("mixer.A_log", {heads}, Split::kTpChannel, p.vector, DType::kFp32);
  list.Add("mixer.D", {heads}, Split::kTpChannel, p.vector, DType::kFp32);
  list.Add("mixer.norm.weight", {d_inner}, Split::kTpChannel, p.vector);
  list.Add("mixer.out_proj.weight", {d_inner, m.hidden}, Split::kTpRow, p.matrix);
}

/// Weight matrices of an FFN: gate, up and down with SwiGLU; up and down otherwise.
int64_t FfnMatrices(FfnActivation a) { return a == FfnActivation::kSwiglu ? 3 : 2; }

/// Elements of one routed expert's weights and biases (what a token touches top_k of).
int64_t ExpertElements(const ModelConfig& m) {
  const int64_t f = m.moe.ffn_hidden;
  const int64_t weights = CheckedMul(FfnMatrices(m.moe.activation), CheckedMul(m.hidden, f));
  if (!m.linear_bias) return weights;
  return CheckedAdd(weights, CheckedAdd(CheckedMul(FfnMatrices(m.moe.activation) - 1, f), m.hidden));
}

// MoE FFN (docs/formulas.md §1.5). Routed experts are stacked with the expert
// count leading: gate+up [E, h, 2 f_e] (SwiGLU) or up [E, h, f_e], and down
// [E, f_e, h]; with linear_bias each expert has its fc1 and fc2 biases.
// Muon treats each expert's matrix on its own (docs/formulas.md §9.4).
void AddMoe(TensorList& list, const ModelConfig& m, const OptimizerPolicy& p) {
  const MoeConfig& e = m.moe;
  list.Add("mlp.router.weight", {e.experts, m.hidden}, Split::kReplicated, p.router);
  // Megatron's router keeps expert_bias as an fp32 buffer (router.py
  // register_buffer; _maintain_float32_expert_bias), moved by the sign of each
  // expert's load after the step, never by a gradient (moe_utils.py
  // get_updated_expert_bias).
  if (e.router_bias) list.AddBuffer("mlp.router.expert_bias", {e.experts}, Split::kReplicated, DType::kFp32);
  const bool gated = e.activation == FfnActivation::kSwiglu;
  const int64_t fc1 = gated ? CheckedMul(2, e.ffn_hidden) : e.ffn_hidden;
  list.Add(gated ? "mlp.experts.gate_up_proj" : "mlp.experts.up_proj", {e.experts, m.hidden, fc1}, Split::kExpert,
           p.matrix);
  list.Add("mlp.experts.down_proj", {e.experts, e.ffn_hidden, m.hidden}, Split::kExpert, p.matrix);
  if (m.linear_bias) {
    list.Add("mlp.experts.fc1_bias", {e.experts, fc1}, Split::kExpert, p.vector);
    list.Add("mlp.experts.fc2_bias", {e.experts, m.hidden}, Split::kExpert, p.vector);
  }
  const int64_t shared = e.SharedWidth();
  if (shared > 0) {
    // Megatron's shared expert is an MLP with the experts' activation.
    list.Add(gated ? "mlp.shared_expert.gate_up_proj.weight" : "mlp.shared_expert.up_proj.weight",
             {m.hidden, gated ? CheckedMul(2, shared) : shared}, Split::kTpColumn, p.matrix);
    list.Add("mlp.shared_expert.down_proj.weight", {shared, m.hidden}, Split::kTpRow, p.matrix);
  }
  if (e.shared_gate) list.Add("mlp.shared_expert_gate.weight", {m.hidden}, Split::kReplicated, p.vector);
}

// Dense MLP: SwiGLU packs gate and up in one column-parallel matrix.
void AddDenseMlp(TensorList& list, const ModelConfig& m, const OptimizerPolicy& p) {
  const int64_t f = m.mlp.ffn_hidden;
  const bool gated = m.mlp.activation == FfnActivation::kSwiglu;
  const int64_t fc1 = gated ? CheckedMul(2, f) : f;
  list.Add(gated ? "mlp.gate_up_proj.weight" : "mlp.up_proj.weight", {m.hidden, fc1}, Split::kTpColumn, p.matrix);
  list.Add("mlp.down_proj.weight", {f, m.hidden}, Split::kTpRow, p.matrix);
  if (m.linear_bias) {
    list.Add("mlp.up_proj.bias", {fc1}, Split::kTpChannel, p.vector);
    list.Add("mlp.down_proj.bias", {m.hidden}, Split::kReplicated, p.vector);
  }
}

// RG-LRU block after Griffin (docs/formulas.md §1.6). The gate matrices W_a, W_x are
// block-diagonal: n_b independent (d_r/n_b)^2 blocks stored as a 3-D stack.
// They are not hidden matrices in Muon's sense (each block is a small
// per-head map, TP-split by whole blocks), so they go to AdamW with the other
// per-channel parameters; W_g, W_u and W_o are the R linears that Muon owns.
void AddRecurrent(TensorList& list, const ModelConfig& m, const OptimizerPolicy& p) {
  const RecurrentConfig& r = m.recurrent;
  const int64_t block = r.width / r.heads;
  list.Add("mixer.gate_proj.weight", {m.hidden, r.width}, Split::kTpColumn, p.matrix);
  list.Add("mixer.input_proj.weight", {m.hidden, r.width}, Split::kTpColumn, p.matrix);
  list.Add("mixer.conv1d.weight", {r.width, r.d_conv}, Split::kTpChannel, p.vector);
  list.Add("mixer.conv1d.bias", {r.width}, Split::kTpChannel, p.vector);
  list.Add("mixer.rg_lru.recurrent_gate.weight", {r.heads, block, block}, Split::kTpChannel, p.vector);
  list.Add("mixer.rg_lru.recurrent_gate.bias", {r.width}, Split::kTpChannel, p.vector);
  list.Add("mixer.rg_lru.input_gate.weight", {r.heads, block, block}, Split::kTpChannel, p.vector);
  list.Add("mixer.rg_lru.input_gate.bias", {r.width}, Split::kTpChannel, p.vector);
  list.Add("mixer.rg_lru.recurrent_param", {r.width}, Split::kTpChannel, p.vector);
  list.Add("mixer.out_proj.weight", {r.width, m.hidden}, Split::kTpRow, p.matrix);
}

/// Elements Muon orthogonalises as one matrix: one expert's slice for a stack.
int64_t MuonMatrixElements(const ParamTensor& t) {
  if (t.split == Split::kExpert && !t.shape.empty() && t.shape.front() > 0) return t.elements() / t.shape.front();
  return t.elements();
}

/// One block's tensors: its pre-norm and its mixer or FFN.
void AddBlock(TensorList& list, const ModelConfig& m, BlockKind kind, const OptimizerPolicy& p) {
  AddNorm(list, "norm", m.hidden, m.norm, p);
  switch (kind) {
    case BlockKind::kAttention:
      if (m.mla) {
        AddMla(list, m, p);
      } else {
        AddGqa(list, m, p);
      }
      break;
    case BlockKind::kMamba: AddMamba(list, m, p); break;
    case BlockKind::kMoe: AddMoe(list, m, p); break;
    case BlockKind::kRecurrent: AddRecurrent(list, m, p); break;
    case BlockKind::kDenseMlp: AddDenseMlp(list, m, p); break;
  }
}

Layer BuildLayer(const Recipe& recipe, int64_t index, BlockKind kind, const OptimizerPolicy& p) {
  Layer layer;
  layer.index = index;
  layer.kind = kind;
  TensorList list("layers." + std::to_string(index) + ".", recipe.training.precision.params, &layer.params);
  AddBlock(list, recipe.model, kind, p);
  for (const ParamTensor& t : layer.params) {
    layer.totals.Add(t);
    if (t.optimizer == OptimizerKind::kMuon && MuonMatrixElements(t) > layer.max_muon_matrix_elements) {
      layer.max_muon_matrix_elements = MuonMatrixElements(t);
    }
  }
  layer.active_elements = layer.totals.total();
  if (kind == BlockKind::kMoe) {
    // A token runs through top_k routed experts (docs/formulas.md §1.5).
    const ModelConfig& m = recipe.model;
    const int64_t expert = ExpertElements(m);
    layer.active_elements = CheckedAdd(CheckedSub(layer.active_elements, CheckedMul(m.moe.experts, expert)),
                                       CheckedMul(m.moe.top_k, expert));
  }
  return layer;
}

void AddModelEnds(const Recipe& recipe, const OptimizerPolicy& p, Inventory& inv) {
  const ModelConfig& m = recipe.model;
  const DType dtype = recipe.training.precision.params;
  std::vector<ParamTensor> embedding;
  TensorList(std::string(), dtype, &embedding)
      .Add("embedding.word_embeddings.weight", {m.vocab, m.hidden},
           recipe.parallel.embedding == EmbeddingSplit::kReplicated ? Split::kReplicated : Split::kVocab, p.vector);
  inv.embedding = embedding.front();
  if (m.learned_positions > 0) {
    TensorList(std::string(), dtype, &inv.positions)
        .Add("embedding.position_embeddings.weight", {m.learned_positions, m.hidden}, Split::kReplicated, p.vector);
  }

  TensorList norms(std::string(), dtype, &inv.final_norms);
  AddNorm(norms, "final_norm", m.hidden, m.norm, p);
  inv.final_norm = inv.final_norms.front();

  if (!m.tie_embeddings) {
    TensorList(std::string(), dtype, &inv.head)
        .Add("output_layer.weight", {m.vocab, m.hidden}, Split::kVocab, p.vector);
  }
  // MTP modules (Megatron multi_token_prediction.py MultiTokenPredictionLayer):
  // enorm and hnorm, eh_proj [2h, h] column-parallel without bias, one
  // transformer layer like the model's last (attention + its FFN), and a
  // final norm; the embedding and output head are the model's.
  // --mtp-use-repeated-layer builds one module and applies it at every depth.
  const int64_t modules = m.mtp_shared_layer ? std::min<int64_t>(m.mtp_layers, 1) : m.mtp_layers;
  for (int64_t k = 0; k < modules; ++k) {
    TensorList list("mtp." + std::to_string(k) + ".", dtype, &inv.mtp);
    AddNorm(list, "enorm", m.hidden, m.norm, p);
    AddNorm(list, "hnorm", m.hidden, m.norm, p);
    list.Add("eh_proj.weight", {CheckedMul(2, m.hidden), m.hidden}, Split::kTpColumn, p.matrix);
    TensorList attention("mtp." + std::to_string(k) + ".attention.", dtype, &inv.mtp);
    AddBlock(attention, m, BlockKind::kAttention, p);
    TensorList ffn("mtp." + std::to_string(k) + ".ffn.", dtype, &inv.mtp);
    AddBlock(ffn, m, inv.mtp_ffn, p);
    AddNorm(list, "final_layernorm", m.hidden, m.norm, p);
  }
  // A token runs through top_k of an MTP MoE layer's experts.
  if (inv.mtp_ffn == BlockKind::kMoe && modules > 0) {
    inv.mtp_inactive = CheckedMul(modules, CheckedMul(m.moe.experts - m.moe.top_k, ExpertElements(m)));
  }
}

}  // namespace

std::vector<BlockKind> ExpandedLayers(const ModelConfig& m) {
  if (!m.layers.empty()) return m.layers;
  std::vector<BlockKind> out;
  int64_t e_slot = 0;  // E letters seen so far
  for (int64_t r = 0; r < m.repeat; ++r) {
    for (char c : m.pattern) {
      const auto kind = static_cast<BlockKind>(c);
      if (kind != BlockKind::kMoe) {
        out.push_back(kind);
        continue;
      }
      // The first k E slots are dense (DeepSeek first_k_dense_replace); after
      // them, slot j is MoE iff j % layer_freq == layer_offset, else dense.
      const int64_t j = e_slot++ - m.moe.first_k_dense;
      const bool moe = j >= 0 && j % m.moe.layer_freq == m.moe.layer_offset;
      out.push_back(moe ? BlockKind::kMoe : BlockKind::kDenseMlp);
    }
  }
  return out;
}

void SetLayerStarts(Inventory& inv) {
  std::vector<BlockKind> kinds;
  kinds.reserve(inv.layers.size());
  for (const Layer& l : inv.layers) kinds.push_back(l.kind);
  inv.layer_starts = LayerStarts(kinds);
  for (Layer& l : inv.layers) l.starts_layer = false;
  for (size_t i = 0; i + 1 < inv.layer_starts.size(); ++i) {
    inv.layers[static_cast<size_t>(inv.layer_starts[i])].starts_layer = true;
  }
}

void RecomputeDerived(Inventory& inv) {
  SetLayerStarts(inv);
  inv.embedding_totals = ParamTotals{};
  inv.embedding_totals.Add(inv.embedding);
  for (const ParamTensor& t : inv.positions) inv.embedding_totals.Add(t);
  inv.final_norm_totals = ParamTotals{};
  if (inv.final_norms.empty()) {
    inv.final_norm_totals.Add(inv.final_norm);
  } else {
    for (const ParamTensor& t : inv.final_norms) inv.final_norm_totals.Add(t);
  }
  inv.head_totals = ParamTotals{};
  for (const ParamTensor& t : inv.head) inv.head_totals.Add(t);
  inv.mtp_totals = ParamTotals{};
  for (const ParamTensor& t : inv.mtp) inv.mtp_totals.Add(t);
  inv.family_totals = {};
  inv.max_muon_matrix_elements = 0;

  const size_t n = inv.layers.size();
  inv.prefix_totals.assign(n + 1, ParamTotals{});
  inv.prefix_active.assign(n + 1, 0);
  inv.prefix_family_layers.assign(n + 1, std::array<int64_t, 5>{});
  inv.prefix_layer_starts.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Layer& layer = inv.layers[i];
    const int f = FamilyIndex(layer.kind);
    inv.prefix_layer_starts[i + 1] = inv.prefix_layer_starts[i] + (layer.starts_layer ? 1 : 0);
    inv.prefix_totals[i + 1] = inv.prefix_totals[i] + layer.totals;
    inv.prefix_active[i + 1] = CheckedAdd(inv.prefix_active[i], layer.active_elements);
    inv.prefix_family_layers[i + 1] = inv.prefix_family_layers[i];
    ++inv.prefix_family_layers[i + 1][static_cast<size_t>(f)];
    inv.family_totals[static_cast<size_t>(f)] += layer.totals;
    if (layer.max_muon_matrix_elements > inv.max_muon_matrix_elements) {
      inv.max_muon_matrix_elements = layer.max_muon_matrix_elements;
    }
  }
  inv.layer_totals = inv.prefix_totals[n];
  std::array<const ParamTotals*, 5> first_of{};
  inv.family_uniform.fill(true);
  for (const Layer& layer : inv.layers) {
    const size_t f = static_cast<size_t>(FamilyIndex(layer.kind));
    if (first_of[f] == nullptr) first_of[f] = &layer.totals;
    if (!(*first_of[f] == layer.totals)) inv.family_uniform[f] = false;
  }
  for (size_t f = 0; f < inv.family_params.size(); ++f) {
    inv.family_params[f] = inv.family_totals[f].total();
    inv.family_layers[f] = inv.prefix_family_layers[n][f];
  }
  const int64_t ends = CheckedAdd(
      CheckedAdd(CheckedAdd(inv.embedding_totals.total(), inv.final_norm_totals.total()), inv.head_totals.total()),
      inv.mtp_totals.total());
  inv.total_params = CheckedAdd(inv.layer_totals.total(), ends);
  // Embedding, final norm, head and MTP modules are used by every token.
  inv.active_params = CheckedSub(CheckedAdd(inv.prefix_active[n], ends), inv.mtp_inactive);
}

Inventory BuildInventory(const Recipe& recipe) {
  Inventory inv;
  inv.recipe = recipe;
  const OptimizerPolicy policy = PolicyOf(recipe.training.optimizer);
  const std::vector<BlockKind> kinds = ExpandedLayers(recipe.model);
  inv.recipe.model.layers = kinds;
  inv.layers.reserve(kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    inv.layers.push_back(BuildLayer(recipe, static_cast<int64_t>(i), kinds[i], policy));
  }
  // MTP layers repeat the model's last FFN kind (MoE or dense).
  inv.mtp_ffn = kinds.empty() ? BlockKind::kDenseMlp : kinds.back();
  AddModelEnds(recipe, policy, inv);
  RecomputeDerived(inv);
  return inv;
}

}  // namespace preflight

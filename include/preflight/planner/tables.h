// Per-layer tables, built once per inventory: what every pricing function
// after them reads instead of walking the inventory (a sweep prices millions
// of layouts on them).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/inventory/inventory.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Per-layer tables (built once per inventory)

/// Layout-independent constants of one layer family (all layers of a family
/// share their shapes). FLOPs are forward, per token, unsharded.
/// One matrix multiply of a layer, per token [tokens, k] x [k, n], and how
/// the layout splits it: kTpColumn divides n by tp, kTpRow k by tp; kExpert
/// is the routed experts' grouped GEMM (experts / ep matrices per rank, each
/// seeing top_k / experts of the tokens; expert_tp splits n, or k when
/// `row`); kReplicated runs whole on a rank's own tokens (s b / (c t)).
/// The module of selective recompute a GEMM belongs to, where one reruns
/// GEMMs apart from its family's whole forward.
enum class GemmPart { kOther, kSharedExpert, kMlaUpProj };

struct GemmShape {
  int64_t k = 0;
  int64_t n = 0;
  Split split = Split::kReplicated;
  bool row = false;
  int64_t experts = 0;
  int64_t top_k = 0;
  GemmPart part = GemmPart::kOther;
};

/// Of a family's forward elementwise bytes per token, what selective
/// recompute's modules rerun: one pre-norm (hidden stream) and, inside the TP
/// region, the routed and the shared experts' activation and MLA's RoPE.
struct RerunBytes {
  double norm = 0, routed_act = 0, shared_act = 0, rope = 0;
};

struct FamilyCost {
  /// 2 * parameters one token touches (routed experts: top_k of them).
  double matmul_flops = 0;
  /// Attention core, causal: per token per unit of sequence length, so the
  /// FLOPs are this * s (QK^T and PV over s/2 keys on average):
  /// GQA 2*n_q*d_h, MLA n_q*(d_nope + d_rope + d_v).
  double flops_per_token_per_seq = 0;
  /// Sequence-length-independent non-matmul work per token (Mamba-2 SSD
  /// chunked scan, [OURS]): Q*G*N + Q*H*P + 4*H*P*N.
  double scan_flops = 0;
  int64_t tp_regions = 0;  // column-in -> row-out pairs (docs/formulas.md §7.2)
  /// CP exchange width, elements per token, unsharded: attention K and V
  /// (p2p / all_gather), the Ulysses Q,K,V,O width (a2a), or Mamba/R
  /// all-to-all hand-off width.
  int64_t cp_kv_width = 0;
  int64_t cp_a2a_width = 0;
  /// Backward all-to-all width. Ulysses attention sends O again: TE's
  /// AttnFuncWithCPAndQKVOA2A saves the sequence-split O and its backward
  /// all-to-alls [O, dO] to heads, then [dQ, dK, dV] back, so GQA is
  /// (3 n_q + 2 n_kv) d_h against (2 n_q + 2 n_kv) d_h forward. M and R: as forward.
  int64_t cp_a2a_bwd_width = 0;
  bool is_moe = false;
  /// The layer's GEMMs (its matrix parameters; Muon-managed or not).
  std::vector<GemmShape> gemms;
  /// Query heads of the attention core (its score matrix, for the unfused kernel).
  int64_t attention_heads = 0;
  /// Elementwise HBM traffic per token, forward, bytes: on the hidden stream
  /// (norms, residual adds: split over TP only under SP) and inside the TP
  /// region (RoPE, the MLP activation, MoE permutation, scan and conv:
  /// split over TP), with fused kernels and as eager PyTorch runs them.
  double hidden_bytes = 0;
  double hidden_bytes_eager = 0;
  double region_bytes = 0;
  double region_bytes_eager = 0;
  RerunBytes rerun, rerun_eager;
};

struct PlanTables {
  int64_t layers = 0;
  std::vector<BlockKind> kinds;
  std::array<FamilyCost, 5> family{};  // indexed by FamilyIndex
  /// Prefix sums over layers (size layers + 1): entry i covers layers [0, i).
  std::vector<std::array<int64_t, 5>> family_count_prefix;
  /// The first layer of each family (-1: none), the one a uniform family's
  /// per-layer figures are worked out from (Inventory::family_uniform).
  std::array<int64_t, 5> first_of_family{-1, -1, -1, -1, -1};
  std::vector<ParamTotals> params_prefix;
  /// Elements of Muon-managed TP-sharded matrices (global) and of every Muon
  /// matrix, for the Muon gathers; Newton-Schulz FLOPs of the dense Muon
  /// matrices (full matrix) and of all experts' matrices (divide by ep).
  std::vector<double> muon_ns_dense_flops_prefix;
  std::vector<double> muon_ns_expert_flops_prefix;
  int64_t embedding_params = 0;  // V*h (logical)
  bool replicated_embedding = false;  // parallel.embedding: replicated (no TP lookup collective)
  bool learned_positions = false;     // model.learned_positions > 0
  int64_t head_params = 0;       // V*h when untied, else 0
  int64_t final_norm_params = 0;
  double head_flops = 0;          // forward per token: 2*V*h (+ loss, negligible)
  /// MTP modules at the head (model.mtp_layers): their layers by family, and
  /// their forward FLOPs per token beyond those layers (eh_proj 2*2h*h and
  /// their own head 2*V*h each).
  int64_t mtp_layers = 0;
  std::array<int64_t, 5> mtp_counts{};
  double mtp_extra_flops = 0;
  int64_t mtp_params = 0;
  double muon_ns_head_flops = 0;  // 0: embedding/head are AdamW (docs/formulas.md §9.4)
};

PlanTables BuildPlanTables(const Inventory& inventory);

/// HBM bytes a norm moves per element (fused: read and write bf16; eager
/// RMSNorm: PyTorch's op-by-op fp32 path, 36).
double NormBytes(NormKind norm, bool eager);

}  // namespace preflight

// Per-layer tables built once per inventory, so that pricing a layout is
// arithmetic on prefix sums (plan.h speed contract).
#include <algorithm>

#include "preflight/planner/tables.h"

namespace preflight {
namespace {

// Newton-Schulz FLOPs of one m x n matrix: 5 steps of 4*m^2*n + 2*m^3 with m
// the smaller dimension (docs/formulas.md §9.2, step 3).
double NewtonSchulzFlops(int64_t rows, int64_t cols) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return 5.0 * (4.0 * m * m * n + 2.0 * m * m * m);
}

// Muon treats a >2-D tensor as (out, rest) (docs/formulas.md §9.2, step 2); routed
// experts [E, a, b] are E separate a x b matrices (docs/formulas.md §9.4).
void AddMuonFlops(const ParamTensor& t, double* dense, double* expert) {
  if (t.optimizer != OptimizerKind::kMuon || t.shape.size() < 2) return;
  if (t.split == Split::kExpert && t.shape.size() == 3) {
    *expert += static_cast<double>(t.shape[0]) * NewtonSchulzFlops(t.shape[1], t.shape[2]);
    return;
  }
  int64_t rest = 1;
  for (size_t k = 1; k < t.shape.size(); ++k) rest = CheckedMul(rest, t.shape[k]);
  *dense += NewtonSchulzFlops(t.shape[0], rest);
}

// The layer's GEMMs from its matrix parameters (stored [in, out]; routed
// experts [E, in, out]; R's block-diagonal gates [heads, block, block], one
// GEMM of heads x block outputs split by head over TP).
std::vector<GemmShape> GemmsOf(const ModelConfig& m, const Layer& sample) {
  std::vector<GemmShape> out;
  for (const ParamTensor& t : sample.params) {
    const bool router = t.name.find("router.weight") != std::string::npos;
    if (t.shape.size() == 2 && router) {
      out.push_back({t.shape[1], t.shape[0], Split::kReplicated});  // stored [E, h]
    } else if (t.shape.size() == 2 && (t.split == Split::kTpColumn || t.split == Split::kTpRow ||
                                       (t.split == Split::kReplicated && t.name.find("_proj") != std::string::npos))) {
      GemmShape g{t.shape[0], t.shape[1], t.split};
      if (t.name.find("shared_expert.") != std::string::npos) g.part = GemmPart::kSharedExpert;
      if (t.name.find("q_b_proj") != std::string::npos || t.name.find("kv_b_proj") != std::string::npos) {
        g.part = GemmPart::kMlaUpProj;
      }
      out.push_back(g);
    } else if (t.shape.size() == 3 && t.split == Split::kExpert) {
      const bool row = t.name.find("down_proj") != std::string::npos;
      out.push_back({t.shape[1], t.shape[2], Split::kExpert, row, t.shape[0], m.moe.top_k});
    } else if (t.shape.size() == 3 && t.split == Split::kTpChannel) {
      out.push_back({t.shape[1], CheckedMul(t.shape[0], t.shape[2]), Split::kTpColumn});
    }
  }
  return out;
}

// Elementwise bytes per token (bf16 activations, 2 B an element), read +
// written, forward. Fused: each op reads its inputs and writes its output
// once (Transformer Engine's norms and RoPE, Megatron's fused activations,
// torch.compile). Eager: PyTorch ops one kernel each — an RMSNorm written as
// x.float(), pow, mean, rsqrt, two multiplies and type_as moves 36 B an
// element; RoPE by complex multiply in fp32 20 B; SwiGLU as silu then
// multiply 10 B per FFN element against 6.
constexpr double kNormFused = 4, kNormEager = 36, kResidual = 6, kRopeFused = 4, kRopeEager = 20;

// Bytes per FFN element of the activation: gated (reads two, writes one) or not.
double ActivationBytes(FfnActivation a, bool eager) {
  switch (a) {
    case FfnActivation::kSwiglu: return eager ? 10 : 6;
    case FfnActivation::kGelu: return 4;
    case FfnActivation::kRelu2: return eager ? 8 : 4;
  }
  return 6;
}

void SetElementwiseBytes(const ModelConfig& m, BlockKind kind, FamilyCost* f) {
  const double h = static_cast<double>(m.hidden);
  f->hidden_bytes = (kNormFused + kResidual) * h;
  f->hidden_bytes_eager = (NormBytes(m.norm, true) + kResidual) * h;
  f->rerun.norm = kNormFused * h;
  f->rerun_eager.norm = NormBytes(m.norm, true) * h;
  double fused = 0, eager = 0;
  switch (kind) {
    case BlockKind::kAttention:
      if (m.mla) {
        const MlaConfig& a = *m.mla;
        const double rope = static_cast<double>(a.heads * a.qk_rope_head_dim + a.qk_rope_head_dim);
        const double latent = static_cast<double>(a.q_lora_rank + a.kv_lora_rank);
        fused = kRopeFused * rope + kNormFused * latent;
        eager = kRopeEager * rope + NormBytes(m.norm, true) * latent;
        f->rerun.rope = kRopeFused * rope;
        f->rerun_eager.rope = kRopeEager * rope;
      } else {
        const AttentionConfig& a = m.attention;
        const double qk = static_cast<double>((a.heads + a.kv_heads) * a.head_dim);
        fused = kRopeFused * qk + (a.qk_norm ? kNormFused * qk : 0.0);
        eager = kRopeEager * qk + (a.qk_norm ? NormBytes(m.norm, true) * qk : 0.0);
      }
      break;
    case BlockKind::kDenseMlp: {
      const double ffn = static_cast<double>(m.mlp.ffn_hidden);
      fused = ActivationBytes(m.mlp.activation, false) * ffn;
      eager = ActivationBytes(m.mlp.activation, true) * ffn;
      break;
    }
    case BlockKind::kMoe: {
      const MoeConfig& e = m.moe;
      const double routed = static_cast<double>(e.top_k * e.ffn_hidden);
      const double shared = static_cast<double>(e.SharedWidth());
      // Token permutation to the experts and back, top_k rows each way
      // (read + write 4 B an element), then the weighted combine.
      const double permute = 8.0 * static_cast<double>(e.top_k) * h;
      fused = ActivationBytes(e.activation, false) * (routed + shared) + permute;
      eager = ActivationBytes(e.activation, true) * (routed + shared) + permute;
      f->rerun = {kNormFused * h, ActivationBytes(e.activation, false) * routed,
                  ActivationBytes(e.activation, false) * shared, 0};
      f->rerun_eager = {NormBytes(m.norm, true) * h, ActivationBytes(e.activation, true) * routed,
                        ActivationBytes(e.activation, true) * shared, 0};
      break;
    }
    case BlockKind::kMamba: {
      // [OURS] conv1d over x,B,C (read + write), the SSD scan's inputs and
      // output, its fp32 C B^T blocks (G x Q a token, written and read) and
      // chunk states (H P N fp32 per chunk, written and read twice), the
      // gated norm y * silu(z).
      const MambaConfig& c = m.mamba;
      const double d_inner = static_cast<double>(c.Inner(m.hidden));
      const double bc = static_cast<double>(2 * c.groups * c.d_state);
      const double heads = d_inner / static_cast<double>(c.head_dim);
      const double conv = 4.0 * (d_inner + bc);
      const double scan = 2.0 * (2.0 * d_inner + bc + heads) + 8.0 * static_cast<double>(c.groups * c.chunk) +
                          16.0 * d_inner * static_cast<double>(c.d_state) / static_cast<double>(c.chunk);
      fused = conv + scan + 6.0 * d_inner;
      eager = fused;
      break;
    }
    case BlockKind::kRecurrent: {
      // [OURS] conv1d (read + write), the gates' sigmoids, the RG-LRU scan
      // (reads x and the two gates, writes h) and the GeLU branch's multiply.
      const double d = static_cast<double>(m.recurrent.width);
      fused = 4.0 * d + 8.0 * d + 8.0 * d + 6.0 * d;
      eager = fused;
      break;
    }
  }
  f->region_bytes = fused;
  f->region_bytes_eager = eager;
}

FamilyCost CostOfFamily(const ModelConfig& m, BlockKind kind, const Layer& sample) {
  FamilyCost f;
  f.matmul_flops = 2.0 * static_cast<double>(sample.active_elements);
  f.gemms = GemmsOf(m, sample);
  SetElementwiseBytes(m, kind, &f);
  switch (kind) {
    case BlockKind::kAttention:
      f.tp_regions = 1;
      if (m.mla) {
        const MlaConfig& a = *m.mla;
        const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
        // Causal: each query sees s/2 keys on average; QK^T 2*qk and PV 2*v per key.
        f.flops_per_token_per_seq = static_cast<double>(a.heads * (qk + a.v_head_dim));
        f.attention_heads = a.heads;
        f.cp_kv_width = a.heads * (qk + a.v_head_dim);
        f.cp_a2a_width = a.heads * (2 * qk + 2 * a.v_head_dim);
        f.cp_a2a_bwd_width = f.cp_a2a_width + a.heads * a.v_head_dim;  // + O again (TE)
      } else {
        const AttentionConfig& a = m.attention;
        f.flops_per_token_per_seq = 2.0 * static_cast<double>(a.heads * a.head_dim);
        f.attention_heads = a.heads;
        f.cp_kv_width = 2 * a.kv_heads * a.head_dim;
        f.cp_a2a_width = (2 * a.heads + 2 * a.kv_heads) * a.head_dim;
        f.cp_a2a_bwd_width = f.cp_a2a_width + a.heads * a.head_dim;  // + O again (TE)
      }
      break;
    case BlockKind::kMamba: {
      const MambaConfig& mc = m.mamba;
      const int64_t d_inner = mc.Inner(m.hidden);
      const int64_t heads = d_inner / mc.head_dim;
      const double q = static_cast<double>(mc.chunk);
      // SSD chunked scan [OURS]: intra-chunk C*B^T (causal half: Q*G*N), its
      // product with x (Q*H*P), chunk states B^T x and state output C h (2*H*P*N each).
      f.scan_flops = q * static_cast<double>(mc.groups * mc.d_state) + q * static_cast<double>(heads * mc.head_dim) +
                     4.0 * static_cast<double>(heads * mc.head_dim * mc.d_state);
      f.tp_regions = 1;
      // zxBCdt to heads + y back (docs/formulas.md §7.2 Mamba all-to-all CP, r_g = 1).
      f.cp_a2a_width = 3 * d_inner + 2 * mc.groups * mc.d_state + heads;
      f.cp_a2a_bwd_width = f.cp_a2a_width;
      break;
    }
    case BlockKind::kMoe:
      f.is_moe = true;
      f.tp_regions = m.moe.SharedWidth() > 0 ? 1 : 0;
      break;
    case BlockKind::kRecurrent:
      f.tp_regions = 1;
      // [OURS] All-to-all CP on R: u in (sequence -> channel split), h back;
      // the GeLU gate g stays sequence-split (it is per token), so d_r in and
      // d_r out, and the backward moves dh in and du back (the simulator's R
      // block moves exactly these). docs/formulas.md §7.2 says 2d_r + d_r (g travelling
      // too, as Megatron's Mamba CP sends z); g never needs to.
      f.cp_a2a_width = 2 * m.recurrent.width;
      f.cp_a2a_bwd_width = f.cp_a2a_width;
      break;
    case BlockKind::kDenseMlp:
      f.tp_regions = 1;
      break;
  }
  return f;
}

}  // namespace

double NormBytes(NormKind norm, bool eager) { return eager && norm == NormKind::kRmsNorm ? kNormEager : kNormFused; }

PlanTables BuildPlanTables(const Inventory& inv) {
  PlanTables t;
  const ModelConfig& m = inv.recipe.model;
  t.layers = static_cast<int64_t>(inv.layers.size());
  t.kinds.reserve(inv.layers.size());
  std::array<bool, 5> seen{};
  t.family_count_prefix.assign(1, {});
  t.params_prefix.assign(1, ParamTotals{});
  t.muon_ns_dense_flops_prefix.assign(1, 0.0);
  t.muon_ns_expert_flops_prefix.assign(1, 0.0);
  for (const Layer& layer : inv.layers) {
    const int f = FamilyIndex(layer.kind);
    t.kinds.push_back(layer.kind);
    if (!seen[static_cast<size_t>(f)]) {
      t.family[static_cast<size_t>(f)] = CostOfFamily(m, layer.kind, layer);
      t.first_of_family[static_cast<size_t>(f)] = static_cast<int64_t>(t.kinds.size()) - 1;
      seen[static_cast<size_t>(f)] = true;
    }
    auto counts = t.family_count_prefix.back();
    ++counts[static_cast<size_t>(f)];
    t.family_count_prefix.push_back(counts);
    ParamTotals totals = t.params_prefix.back();
    totals += layer.totals;
    t.params_prefix.push_back(totals);
    double dense = 0, expert = 0;
    for (const ParamTensor& p : layer.params) AddMuonFlops(p, &dense, &expert);
    t.muon_ns_dense_flops_prefix.push_back(t.muon_ns_dense_flops_prefix.back() + dense);
    t.muon_ns_expert_flops_prefix.push_back(t.muon_ns_expert_flops_prefix.back() + expert);
  }
  t.embedding_params = inv.embedding.elements();
  t.replicated_embedding = inv.embedding.split == Split::kReplicated;
  t.learned_positions = !inv.positions.empty();
  for (const ParamTensor& p : inv.positions) t.embedding_params = CheckedAdd(t.embedding_params, p.elements());
  for (const ParamTensor& h : inv.head) t.head_params = CheckedAdd(t.head_params, h.elements());
  t.final_norm_params = inv.final_norm.elements();
  t.head_flops = 2.0 * static_cast<double>(m.vocab) * static_cast<double>(m.hidden);
  if (m.mtp_layers > 0) {
    t.mtp_layers = m.mtp_layers;
    t.mtp_counts[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))] += m.mtp_layers;
    t.mtp_counts[static_cast<size_t>(FamilyIndex(inv.mtp_ffn))] += m.mtp_layers;
    const double h = static_cast<double>(m.hidden);
    t.mtp_extra_flops = static_cast<double>(m.mtp_layers) * (2.0 * 2.0 * h * h + t.head_flops);
    t.mtp_params = inv.mtp_totals.total();
  }
  return t;
}

}  // namespace preflight

// Compute time per operation (docs/plan.md "Compute time"): GEMMs on the
// roofline of their shapes, attention at the kernel's measured rate for its
// sequence length, elementwise work from the bytes it moves.
#include "preflight/planner/compute.h"

#include <algorithm>

#include <fmt/format.h>

#include "preflight/estimator/memory_terms.h"

namespace preflight {
namespace {

bool Quantized(GemmPrecision p) { return p != GemmPrecision::kBf16; }

double GemmRate(const GpuSpec& gpu, const CostModel& cost, GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kBf16: break;
    case GemmPrecision::kFp8: return gpu.fp8_dense_tflops * 1e12 * gpu.rates.gemm_fp8;
    case GemmPrecision::kNvfp4:
    case GemmPrecision::kMxfp4: return gpu.fp4_dense_tflops * 1e12 * gpu.rates.gemm_fp8;
  }
  return gpu.bf16_dense_tflops * 1e12 * GemmEfficiency(gpu, cost);
}

double HbmRate(const GpuSpec& gpu) { return gpu.hbm_gbps * 1e9 * gpu.rates.hbm; }

// `groups` independent GEMMs [m, k] x [k, n] in one grouped kernel (routed
// experts): their FLOPs and bytes together on one roofline.
double GroupedGemmSeconds(double groups, double m, double n, double k, const GpuSpec& gpu, const CostModel& cost,
                          GemmPrecision p) {
  if (groups <= 0 || m <= 0 || n <= 0 || k <= 0) return 0.0;
  const double in_bytes = GemmInputBytes(p);
  const double flops = 2.0 * m * n * k * groups;
  const double bytes = groups * (in_bytes * (m * k + k * n) + 2.0 * m * n);
  double s = std::max(flops / GemmRate(gpu, cost, p) * (1.0 + gpu.rates.gemm_tile_k / k),
                      bytes / (gpu.hbm_gbps * 1e9 * gpu.rates.gemm_memory));
  // Both inputs cast from bf16 (amax, scale, cast): read 2 B, write the
  // quantized element.
  if (Quantized(p)) s += (2.0 + in_bytes) * groups * (m * k + k * n) / HbmRate(gpu);
  return s;
}

// Forward, and backward as the two GEMMs autograd runs: dgrad [m, n] x [n, k]
// and wgrad [k, m] x [m, n].
void AddGemm(double groups, double m, double n, double k, const GpuSpec& gpu, const CostModel& cost, GemmPrecision p,
             LayerSeconds* out) {
  out->forward.gemm += GroupedGemmSeconds(groups, m, n, k, gpu, cost, p);
  out->backward.gemm +=
      GroupedGemmSeconds(groups, m, k, n, gpu, cost, p) + GroupedGemmSeconds(groups, k, n, m, gpu, cost, p);
}

struct Shape {
  double tokens_cp = 0;    // tokens of a CP rank per micro-batch (s b / c): a TP-split GEMM's M
  double tokens_rank = 0;  // and of one rank (/ tp): replicated GEMMs, routed tokens
  double tp = 1, ep = 1, etp = 1;
  double seq = 0, query_chunk = 0;
  bool sp = false;
};

// The grouped GEMM one of a layer's GemmShapes runs on a rank:
// groups x [m, k] x [k, n].
struct GemmDims {
  double groups = 1, m = 0, n = 0, k = 0;
};

GemmDims DimsOf(const GemmShape& g, const Shape& sh) {
  const double k = static_cast<double>(g.k), n = static_cast<double>(g.n);
  switch (g.split) {
    case Split::kTpColumn: return {1, sh.tokens_cp, n / sh.tp, k};
    case Split::kTpRow: return {1, sh.tokens_cp, n, k / sh.tp};
    case Split::kExpert: {
      // E / ep local experts; each sees top_k / E of the tokens the EP x
      // expert-TP group routes (the uniform expectation of the router).
      const double experts = static_cast<double>(g.experts);
      const double m = sh.tokens_rank * static_cast<double>(g.top_k) * sh.ep * sh.etp / experts;
      return {experts / sh.ep, m, g.row ? n : n / sh.etp, g.row ? k / sh.etp : k};
    }
    default: return {1, sh.tokens_rank, n, k};
  }
}

void AddGemms(const FamilyCost& f, const Shape& sh, const GpuSpec& gpu, const CostModel& cost, GemmPrecision p,
              LayerSeconds* out) {
  for (const GemmShape& g : f.gemms) {
    const GemmDims d = DimsOf(g, sh);
    AddGemm(d.groups, d.m, d.n, d.k, gpu, cost, p, out);
  }
}

// Forward seconds of the GEMMs of one rerun module.
double PartForwardSeconds(const FamilyCost& f, GemmPart part, const Shape& sh, const GpuSpec& gpu,
                          const CostModel& cost, GemmPrecision p) {
  double s = 0;
  for (const GemmShape& g : f.gemms) {
    if (g.part != part) continue;
    const GemmDims d = DimsOf(g, sh);
    s += GroupedGemmSeconds(d.groups, d.m, d.n, d.k, gpu, cost, p);
  }
  return s;
}

// The attention core: causal FLOPs per rank F (QK^T and PV); backward runs
// 2.5 F (FlashAttention-2, Dao 2023: five GEMMs against two). Fused kernels
// at their measured rate; the unfused path (no FlashAttention) computes the
// full s x s scores with batched GEMMs and moves them through the
// scale-mask-softmax: 8 B an element forward, 16 backward.
void AddAttention(const FamilyCost& f, const Shape& sh, const Recipe& r, const GpuSpec& gpu, const CostModel& cost,
                  LayerSeconds* out) {
  if (f.flops_per_token_per_seq <= 0) return;
  const double flops = sh.tokens_rank * f.flops_per_token_per_seq * sh.seq;
  const double peak = gpu.bf16_dense_tflops * 1e12;
  double fwd = 0, bwd = 0;
  if (!r.training.flash_attention) {
    const double scores = sh.tokens_cp * static_cast<double>(f.attention_heads) / sh.tp * sh.seq;
    const double gemm = GemmRate(gpu, cost, GemmPrecision::kBf16);
    fwd = 2.0 * flops / gemm + 8.0 * scores / HbmRate(gpu);
    bwd = 4.0 * flops / gemm + 16.0 * scores / HbmRate(gpu);
  } else {
    const double achieved = peak * AttentionRate(AttentionKernelRate(r.training, gpu, cost), sh.query_chunk, gpu);
    fwd = flops / achieved;
    bwd = 2.5 * flops / achieved;
  }
  out->forward.attention += fwd;
  out->backward.attention += bwd;
  out->attention_core_forward += fwd;
}

// Norms and residual adds on the hidden stream (each TP rank holds all of a
// CP rank's tokens unless SP splits them); RoPE, activations, permutation
// and scans inside the TP region. Backward moves twice the forward's bytes.
// A Mamba scan's FLOPs run on tensor cores: its time is the larger of the two.
void AddElementwise(const FamilyCost& f, const Shape& sh, bool eager, const GpuSpec& gpu, const CostModel& cost,
                    LayerSeconds* out) {
  const double hidden = sh.tokens_cp * (eager ? f.hidden_bytes_eager : f.hidden_bytes) / (sh.sp ? sh.tp : 1.0);
  const double region = sh.tokens_cp * (eager ? f.region_bytes_eager : f.region_bytes) / sh.tp;
  const double scan = sh.tokens_rank * f.scan_flops / GemmRate(gpu, cost, GemmPrecision::kBf16);
  const double fwd = hidden / HbmRate(gpu) + std::max(region / HbmRate(gpu), scan);
  out->forward.elementwise += fwd;
  out->backward.elementwise += 2.0 * fwd;
}

// What backward reruns of one layer's forward: all of it under full
// recompute; under selective the modules training.recompute_modules lists
// (docs/recipe.md "Selective recompute by module"), each its own GEMMs and
// elementwise bytes.
struct Rerun {
  const Recipe& recipe;
  BlockKind kind;
  const FamilyCost& family;
  const Shape& shape;
  bool eager = false;
  GemmPrecision precision = GemmPrecision::kBf16;
};

void SetRecompute(const Rerun& x, Recompute policy, const GpuSpec& gpu, const CostModel& cost, LayerSeconds* l) {
  if (policy == Recompute::kNone) return;
  const TrainingConfig& t = x.recipe.training;
  const auto reruns = [&](RecomputeModule m) { return Reruns(t, policy, m); };
  const bool whole = policy == Recompute::kFull || (x.kind == BlockKind::kDenseMlp && reruns(RecomputeModule::kMlp)) ||
                     (x.kind == BlockKind::kMoe && reruns(RecomputeModule::kMoe));
  if (whole) {
    l->recompute = l->forward;
    return;
  }
  OpSeconds& o = l->recompute;
  if (policy == Recompute::kSelectiveOp) {
    // torchtitan's per-op policy keeps the attention core's outputs and every
    // other matmul's (SelectiveOpTokenBytes): the rest of the forward's
    // matmuls, by their FLOPs share, and all its elementwise ops rerun.
    o.gemm = l->forward.gemm * SelectiveOpRecomputedMatmulShare(x.recipe, x.kind);
    o.elementwise = l->forward.elementwise;
    return;
  }
  const Shape& sh = x.shape;
  const RerunBytes& b = x.eager ? x.family.rerun_eager : x.family.rerun;
  const double hbm = HbmRate(gpu);
  if (reruns(RecomputeModule::kCoreAttn)) o.attention = l->forward.attention;
  if (reruns(RecomputeModule::kLayernorm) && NormIsOwnModule(x.recipe, x.kind)) {
    o.elementwise += sh.tokens_cp * b.norm / (sh.sp ? sh.tp : 1.0) / hbm;
  }
  if (reruns(RecomputeModule::kMoeAct)) o.elementwise += sh.tokens_cp * b.routed_act / sh.tp / hbm;
  if (reruns(RecomputeModule::kSharedExperts)) {
    o.gemm += PartForwardSeconds(x.family, GemmPart::kSharedExpert, sh, gpu, cost, x.precision);
    o.elementwise += sh.tokens_cp * b.shared_act / sh.tp / hbm;
  }
  if (reruns(RecomputeModule::kMlaUpProj)) {
    o.gemm += PartForwardSeconds(x.family, GemmPart::kMlaUpProj, sh, gpu, cost, x.precision);
    o.elementwise += sh.tokens_cp * b.rope / sh.tp / hbm;
  }
}

// Final norm, output projection (vocab-parallel column GEMM) and the loss
// over V / t logits: cross entropy in fp32, about 14 B a logit fused (read
// bf16, exp and sums in fp32, gradient written), 18 eager or over an fp32
// copy (logits.float() first, training.cross_entropy: fp32_upcast). MTP
// modules add their eh_proj and their own head.
LayerSeconds HeadSeconds(const Inventory& inv, const PlanTables& t, const Shape& sh, bool eager, GemmPrecision p,
                         const CostModel& cost) {
  const ModelConfig& m = inv.recipe.model;
  const GpuSpec& gpu = inv.recipe.cluster.spec;
  const double h = static_cast<double>(m.hidden), v = static_cast<double>(m.vocab);
  LayerSeconds out;
  const double heads = 1.0 + static_cast<double>(t.mtp_layers);
  for (int i = 0; i < static_cast<int>(heads); ++i) {
    // The output projection stays bf16 under fp8 and fp4 recipes (TE's and
    // torchao's default; Megatron's output layer is not a TE module).
    AddGemm(1, sh.tokens_cp, v / sh.tp, h, gpu, cost, GemmPrecision::kBf16, &out);
    if (i > 0) AddGemm(1, sh.tokens_cp, h / sh.tp, 2.0 * h, gpu, cost, p, &out);
  }
  const double norm = NormBytes(m.norm, eager) * h;
  const bool upcast = eager || inv.recipe.training.cross_entropy == CrossEntropy::kFp32Upcast;
  const double bytes =
      heads * (sh.tokens_cp * norm / (sh.sp ? sh.tp : 1.0) + sh.tokens_cp * v / sh.tp * (upcast ? 18.0 : 14.0));
  out.forward.elementwise = bytes / HbmRate(gpu);
  out.backward.elementwise = 2.0 * out.forward.elementwise;
  return out;
}

}  // namespace

double GemmEfficiency(const GpuSpec& gpu, const CostModel& cost) {
  return cost.compute_efficiency > 0 ? cost.compute_efficiency : gpu.rates.gemm;
}

GemmPrecision LayerGemmPrecision(const Recipe& r) {
  switch (r.training.precision.fp4) {
    case Fp4Format::kNvfp4: return GemmPrecision::kNvfp4;
    case Fp4Format::kMxfp4: return GemmPrecision::kMxfp4;
    case Fp4Format::kNone: break;
  }
  const bool fp8 = r.training.precision.activations == DType::kFp8 && r.cluster.spec.fp8_dense_tflops > 0;
  return fp8 ? GemmPrecision::kFp8 : GemmPrecision::kBf16;
}

double GemmInputBytes(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kBf16: return 2.0;
    case GemmPrecision::kFp8: return 1.0;
    case GemmPrecision::kNvfp4: return 0.5 + 1.0 / 16.0;
    case GemmPrecision::kMxfp4: return 0.5 + 1.0 / 32.0;
  }
  return 2.0;
}

double GemmSeconds(double m, double n, double k, const GpuSpec& gpu, const CostModel& cost, GemmPrecision p) {
  return GroupedGemmSeconds(1, m, n, k, gpu, cost, p);
}

double AttentionRate(double rate, double s, const GpuSpec& gpu) {
  return rate * s / (s + gpu.rates.attention_half_seq);
}

const char* AttentionKernel(const TrainingConfig& training) {
  if (!training.flash_attention) return "unfused";
  return training.transformer_engine ? "fused" : "flash2";
}

double AttentionKernelRate(const TrainingConfig& training, const GpuSpec& gpu, const CostModel& cost) {
  if (!training.flash_attention) return GemmEfficiency(gpu, cost);
  return training.transformer_engine ? gpu.rates.attention_fused : gpu.rates.attention_flash2;
}

std::string PricedRates(const Recipe& r, const CostModel& cost) {
  const GpuSpec& g = r.cluster.spec;
  const GemmPrecision p = LayerGemmPrecision(r);
  const bool fp4 = p == GemmPrecision::kNvfp4 || p == GemmPrecision::kMxfp4;
  const double peak = fp4 ? g.fp4_dense_tflops : p == GemmPrecision::kFp8 ? g.fp8_dense_tflops : g.bf16_dense_tflops;
  std::string out = fmt::format("{}: GEMMs {:.2f} of {:.0f} TFLOPS {}", g.name,
                                p == GemmPrecision::kBf16 ? GemmEfficiency(g, cost) : g.rates.gemm_fp8, peak,
                                fp4                        ? Name(r.training.precision.fp4)
                                : p == GemmPrecision::kFp8 ? "fp8"
                                                           : "bf16");
  out += fmt::format(
      " or {:.2f} of {:.0f} GB/s HBM when memory-bound; attention {} at {:.2f} (half at s {:.0f}); "
      "elementwise {} at {:.2f} of HBM",
      g.rates.gemm_memory, g.hbm_gbps, AttentionKernel(r.training), AttentionKernelRate(r.training, g, cost),
      g.rates.attention_half_seq, r.training.fused_elementwise ? "fused" : "eager", g.rates.hbm);
  return out;
}

double AdamStepSeconds(double elements, const GpuSpec& gpu) { return 30.0 * elements / HbmRate(gpu); }

ComputeTimes LayerComputeTimes(const Inventory& inv, const PlanTables& t, const Layout& l, const CostModel& cost) {
  const Recipe& r = inv.recipe;
  const GpuSpec& gpu = r.cluster.spec;
  Shape sh;
  sh.seq = static_cast<double>(r.training.seq_len);
  sh.tokens_cp = sh.seq * static_cast<double>(l.micro_batch) / static_cast<double>(l.cp);
  sh.tp = static_cast<double>(l.tp);
  sh.tokens_rank = sh.tokens_cp / sh.tp;
  sh.ep = static_cast<double>(l.ep);
  sh.etp = static_cast<double>(l.expert_tp);
  sh.query_chunk = sh.seq / static_cast<double>(l.cp);
  sh.sp = l.sequence_parallel();
  const GemmPrecision precision = LayerGemmPrecision(r);
  ComputeTimes out;
  const bool eager = !r.training.fused_elementwise;
  for (size_t f = 0; f < 5; ++f) {
    const FamilyCost& fc = t.family[f];
    LayerSeconds& ls = out.family[f];
    AddGemms(fc, sh, gpu, cost, precision, &ls);
    AddAttention(fc, sh, r, gpu, cost, &ls);
    AddElementwise(fc, sh, eager, gpu, cost, &ls);
    SetRecompute({r, kAllBlockKinds[f], fc, sh, eager, precision}, l.recompute, gpu, cost, &ls);
  }
  out.head = HeadSeconds(inv, t, sh, eager, precision, cost);
  return out;
}

}  // namespace preflight

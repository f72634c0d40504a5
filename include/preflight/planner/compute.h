// Compute time per operation: each GEMM from its shape, the attention core
// from its FLOPs and sequence length, scans, norms and activations from the
// bytes they move, at the device's measured kernel rates (GpuSpec::rates).
// One micro-batch through one layer of each family on one rank, per layout;
// the partitioner and the step time both read these (docs/plan.md
// "Compute time").
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/collectives.h"
#include "preflight/planner/tables.h"

namespace preflight {

/// The achieved fraction of the bf16 peak for large GEMMs: the CostModel's
/// override when set, else the device's measured rate.
double GemmEfficiency(const GpuSpec& gpu, const CostModel& cost);

/// What a GEMM's inputs are cast to: bf16 (no cast), fp8 with tensorwise
/// scales, or an FP4 format with block scales (training.precision.fp4).
enum class GemmPrecision { kBf16, kFp8, kNvfp4, kMxfp4 };
/// The precision of the layers' GEMMs: fp4's format, else fp8 with fp8
/// activations on a device with fp8 tensor cores, else bf16.
GemmPrecision LayerGemmPrecision(const Recipe& r);
/// Bytes of one GEMM input element in `p`: 2, 1, or FP4's half byte plus
/// one scale byte per block (16 NVFP4, 32 MXFP4).
double GemmInputBytes(GemmPrecision p);

/// Seconds of one GEMM [m, k] x [k, n]: the roofline max(FLOPs / achievable
/// peak, operand bytes / achievable HBM bandwidth). fp8 and fp4 run it at
/// their peak (times rates.gemm_fp8, the block-scaled fp4 rate being
/// unmeasured) and add the casts of both inputs (read 2 B, write
/// GemmInputBytes an element).
double GemmSeconds(double m, double n, double k, const GpuSpec& gpu, const CostModel& cost, GemmPrecision p);

/// Attention rate at query-chunk length s: the kernel's long-sequence rate
/// times s / (s + attention_half_seq).
double AttentionRate(double rate, double s, const GpuSpec& gpu);

/// One micro-batch through one layer (or the head) on one rank, by kind of work.
struct OpSeconds {
  double gemm = 0;         // matrix multiplies
  double attention = 0;    // the attention core (FlashAttention / cuDNN / unfused)
  double elementwise = 0;  // norms, residuals, RoPE, activations, permutation, scans
  double total() const { return gemm + attention + elementwise; }
};

struct LayerSeconds {
  OpSeconds forward, backward;
  /// What the recompute policy runs again before backward: the attention
  /// core (selective) or the whole forward (full).
  OpSeconds recompute;
  double attention_core_forward = 0;  // the window a CP p2p ring hides under
  double total() const { return forward.total() + backward.total() + recompute.total(); }
};

/// Per layout: one layer of each family, the head (final norm, output
/// projection, loss; MTP modules' extras), and the optimizer step of one
/// parameter element.
struct ComputeTimes {
  std::array<LayerSeconds, 5> family{};  // indexed by FamilyIndex
  LayerSeconds head;
};
ComputeTimes LayerComputeTimes(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                               const CostModel& cost);

/// The attention kernel a recipe runs: "fused" (Transformer Engine's cuDNN
/// attention), "flash2" (PyTorch SDPA's FlashAttention-2) or "unfused"
/// (training.flash_attention: false).
const char* AttentionKernel(const TrainingConfig& training);
/// That kernel's long-sequence rate on `gpu` (unfused: the GEMM rate).
double AttentionKernelRate(const TrainingConfig& training, const GpuSpec& gpu, const CostModel& cost);

/// One line naming every rate the step time was priced at, for reports.
std::string PricedRates(const Recipe& recipe, const CostModel& cost);

/// Seconds of the optimizer's update of `elements` local elements: AdamW
/// reads the fp32 gradient, master copy and both moments and writes them and
/// the bf16 parameter (about 30 B an element) at the HBM rate.
double AdamStepSeconds(double elements, const GpuSpec& gpu);

}  // namespace preflight

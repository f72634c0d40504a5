// Collective volumes and times: wire bytes per rank in the NCCL ring
// convention, link rates and the cost-model knobs.
#pragma once

#include <cstdint>

#include "preflight/inventory/comm_bucket.h"
#include "preflight/planner/mesh.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Collectives (docs/formulas.md §7.1, NCCL ring convention). Payload S is the full
// buffer of one call: the input of an all-reduce, the gathered output of an
// all-gather, the unscattered input of a reduce-scatter, and the local send
// buffer of an all-to-all. Results floor when n does not divide the product
// (NCCL then sends uneven chunks; the floor is the per-rank mean).

/// 2(n-1)/n * S.
Bytes RingAllReduceSendBytes(Bytes payload, int64_t n);
/// (n-1)/n * S.
Bytes RingAllGatherSendBytes(Bytes payload, int64_t n);
/// (n-1)/n * S.
Bytes RingReduceScatterSendBytes(Bytes payload, int64_t n);
/// (n-1)/n * S (uniform destinations; the self share stays local).
Bytes AllToAllSendBytes(Bytes payload, int64_t n);
/// Dispatch on `kind`; kSendRecv sends the whole payload.
Bytes SendBytes(Collective kind, Bytes payload, int64_t n);
/// Sequential steps of the ring algorithm (latency term): AR 2(n-1), AG/RS/A2A n-1, p2p 1.
int64_t RingSteps(Collective kind, int64_t n);

/// Cost-model knobs; every default is [OURS] (docs/formulas.md §7.1 "calibrate").
struct CostModel {
  /// Achieved fraction of the dense peak for large GEMMs; 0 = the device's
  /// measured rate (GpuSpec::rates.gemm). Attention and elementwise work keep
  /// their own rates (compute.h).
  double compute_efficiency = 0;
  double nvlink_efficiency = 0.8;  // eta_nvl, docs/formulas.md §7.1 (0.75-0.85)
  double ib_efficiency = 0.8;      // eta_ib
  double latency_s = 8e-6;         // alpha per ring step, docs/formulas.md §7.1 (5-10 us)
  /// Gradient bucket (elements); Megatron DDP's default bucket_size is
  /// max(40M, 1M * dp) parameters. The last bucket's reduce is exposed.
  int64_t dp_bucket_elements = 40'000'000;
};

/// Link rates of one GPU, per direction (GpuSpec, decimal GB/s).
struct Links {
  double nvlink_bytes_per_s = 0;
  double ib_bytes_per_s = 0;
};
Links LinksOf(const GpuSpec& spec);

/// Time of one collective call on a group with `locality` (docs/formulas.md §7.1):
/// alpha * steps + wire / B_eff, with B_eff = eta_nvl*NVLink inside a node,
/// min(eta_nvl*NVLink, g_loc*eta_ib*IB) for a spanning ring, and the
/// NVLink/IB split of a spanning all-to-all.
double CollectiveSeconds(Collective kind, Bytes payload, const AxisLocality& locality, const Links& links,
                         const CostModel& cost);

}  // namespace preflight

// Collective volumes and times in the NCCL ring convention (docs/formulas.md §7.1;
// nccl-tests doc/PERFORMANCE.md for the bus-bandwidth factors).
#include <algorithm>

#include "preflight/planner/collectives.h"

namespace preflight {

Bytes RingAllReduceSendBytes(Bytes payload, int64_t n) {
  if (n <= 1) return Bytes(0);
  // Reduce-scatter then all-gather, each (n-1) chunks of S/n.
  return Bytes(CheckedMul(CheckedMul(2, n - 1), payload.count()) / n);
}

Bytes RingAllGatherSendBytes(Bytes payload, int64_t n) {
  if (n <= 1) return Bytes(0);
  return Bytes(CheckedMul(n - 1, payload.count()) / n);
}

Bytes RingReduceScatterSendBytes(Bytes payload, int64_t n) { return RingAllGatherSendBytes(payload, n); }

Bytes AllToAllSendBytes(Bytes payload, int64_t n) {
  if (n <= 1) return Bytes(0);
  return Bytes(CheckedMul(n - 1, payload.count()) / n);
}

Bytes SendBytes(Collective kind, Bytes payload, int64_t n) {
  switch (kind) {
    case Collective::kAllReduce: return RingAllReduceSendBytes(payload, n);
    case Collective::kAllGather: return RingAllGatherSendBytes(payload, n);
    case Collective::kReduceScatter: return RingReduceScatterSendBytes(payload, n);
    case Collective::kAllToAll: return AllToAllSendBytes(payload, n);
    case Collective::kSendRecv: return payload;
  }
  return Bytes(0);
}

int64_t RingSteps(Collective kind, int64_t n) {
  if (kind == Collective::kSendRecv) return 1;
  if (n <= 1) return 0;
  return kind == Collective::kAllReduce ? 2 * (n - 1) : n - 1;
}

Links LinksOf(const GpuSpec& spec) {
  return Links{spec.nvlink_gbps_per_dir * 1e9, spec.ib_gbps_per_dir * 1e9};
}

double CollectiveSeconds(Collective kind, Bytes payload, const AxisLocality& loc, const Links& links,
                         const CostModel& cost) {
  const int64_t n = kind == Collective::kSendRecv ? 2 : loc.size;
  if (n <= 1) return 0.0;
  const double latency = cost.latency_s * static_cast<double>(RingSteps(kind, n));
  const double wire = static_cast<double>(SendBytes(kind, payload, n).count());
  const double nvl = cost.nvlink_efficiency * links.nvlink_bytes_per_s;
  const double ib = cost.ib_efficiency * links.ib_bytes_per_s;
  if (loc.intra_node) return latency + wire / nvl;
  if (kind == Collective::kSendRecv) return latency + wire / ib;
  const double g_loc = static_cast<double>(loc.min_members_per_node);
  if (kind == Collective::kAllToAll) {
    // Of the (n-1)/n * S a rank sends, (g_loc-1)/n * S stays in the node and
    // (n-g_loc)/n * S crosses IB; the slower part sets the time.
    const double s = static_cast<double>(payload.count());
    const double nn = static_cast<double>(n);
    return latency + std::max(s * (g_loc - 1) / nn / nvl, s * (nn - g_loc) / nn / ib);
  }
  return latency + wire / std::min(nvl, g_loc * ib);
}

}  // namespace preflight

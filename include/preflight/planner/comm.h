// Communication per step: the collective streams (CommItem) each pipeline
// rank issues, priced in bytes and seconds, and the context-parallel state
// hand-off chain of M and R blocks.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "preflight/inventory/comm_bucket.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/collectives.h"
#include "preflight/planner/mesh.h"
#include "preflight/planner/tables.h"
#include "preflight/recipe/units.h"

namespace preflight {

// ---------------------------------------------------------------------------
// Context-parallel state hand-off of M and R blocks (cp_recurrent: handoff,
// [OURS]; docs/plan.md). The sequence is cut into n chunks (n = 2c with causal
// load balancing, CP rank r holding chunks r and 2c-1-r; else c, rank r
// holding chunk r). The conv tail and the recurrent state pass along the
// chain 0 -> 1 -> ... -> n-1 in forward and back along it in backward; an
// edge j -> j+1 is a message when another CP rank owns chunk j+1.

/// The CP rank holding sequence chunk `chunk`.
int64_t CpChunkOwner(int64_t cp, bool load_balance, int64_t chunk);
/// Messages CP rank `cp_rank` sends per layer per micro-batch in one pass
/// (forward sends on the forward edges, backward as many on the reverse
/// edges). Balanced: ranks 0 and c-1 send 1, the others 2; unbalanced: every
/// rank but the last (forward) sends 1.
int64_t CpHandoffSends(int64_t cp, bool load_balance, int64_t cp_rank);
/// The busiest CP rank's CpHandoffSends: what the planner reports per
/// pipeline rank (its items are per pipeline rank, not per CP rank).
int64_t CpHandoffMaxSends(int64_t cp, bool load_balance);
/// Message edges on the chain, the sequential p2p steps of one pass:
/// c - 1 unbalanced, 2c - 2 balanced (chunks c-1 and c share a rank).
int64_t CpHandoffChainMessages(int64_t cp, bool load_balance);

// ---------------------------------------------------------------------------
// Communication per step (docs/formulas.md §7.2)

/// One collective stream of one rank in one training step: `calls` calls of
/// `payload` each. The simulator counts its real messages per (axis, kind,
/// pass, what) and compares with send/recv.
struct CommItem {
  Axis axis = Axis::kTp;
  Collective kind = Collective::kAllReduce;
  Pass pass = Pass::kForward;
  CommWhat what = CommWhat::kAttention;
  int64_t group_size = 1;
  Bytes payload;               // S of one call (see Collective)
  int64_t calls = 0;           // per step on this rank
  Bytes send;                  // calls * SendBytes(kind, payload, group_size)
  Bytes recv;                  // ring/a2a symmetric: == send; p2p: what the rank receives
  double seconds = 0;          // all calls, before overlap
  double exposed_seconds = 0;  // after the overlap assumptions (docs/plan.md)
  /// Of `seconds`, the part no overlap can hide, the floor of exposed_seconds;
  /// set for traffic issued unit by unit (ZeRO 2/3: the collectives of each
  /// chunk's first or last unit, docs/plan.md "overlap rules"), else 0.
  double unhidden_seconds = 0;
};

struct StageComm {
  int64_t pipeline_rank = 0;
  /// The earlier pipeline rank whose chunks price exactly like this one's
  /// (identical middle stages), or -1: its items are a copy of that rank's,
  /// and EstimateStepTime takes that rank's compute and exposure.
  int64_t priced_as = -1;
  std::vector<CommItem> items;
  /// items[0, pipeline_items) are the TP, CP, PP and EP items, which do not
  /// depend on the ZeRO stage; the data-parallel and optimizer items follow.
  size_t pipeline_items = 0;
  /// Offloaded optimizer (training.optimizer.offload_fraction): bytes this
  /// rank moves over its host link each step, the offloaded elements' fp32
  /// gradients to the host and fp32 params back (4 B each way).
  Bytes host_transfer;
  /// Activation offload (training.activation_offload): bytes this rank moves
  /// over its host link each step, both ways (ActivationOffloadTransfer).
  Bytes activation_offload;
  Bytes send_total() const;
  Bytes send_on(Axis a) const;
  Bytes recv_on(Axis a) const;
};

/// Pricing for a given stage plan. `locality` from PlaceRanks (cached by sweeps).
/// Reads of layout.recompute only whether MoE layers are rerun (their
/// dispatch runs again in backward): a sweep shares one layout's items among
/// the recompute policies that agree on it (planner/sweep.cc CommSlot).
std::vector<StageComm> BuildStageComm(const Inventory& inventory, const PlanTables& tables, const Layout& layout,
                                      const StagePlan& stages, const MeshLocality& locality, const CostModel& cost);
/// The same into `out`, reusing its vectors' storage (a sweep prices
/// millions of layouts with one).
void BuildStageComm(const Inventory& inventory, const PlanTables& tables, const Layout& layout, const StagePlan& stages,
                    const MeshLocality& locality, const CostModel& cost, std::vector<StageComm>* out);

}  // namespace preflight

// Gradient synchronisation and one optimizer step on a rank, sharded over the
// data-parallel groups as the recipe's ZeRO stage says (docs/formulas.md §2.2, 7.2 "DP",
// 9.3). The executor moves and keeps what the step needs; the counters and
// memory tags measure it for comparison with the planner and estimator.
//
// Buffers [OURS, after Megatron's DDP buckets]: each layer is a unit, and the
// embedding and the head (with the final norm) are units of their own. A
// unit's parameters form four flat buffers: dense AdamW, dense Muon (reduced
// over the d*c group), expert AdamW, expert Muon (over the expert-data-parallel
// group). Each buffer is padded with zeros to a multiple of its group size D
// (Megatron pads its grad buffers so they split evenly), and rank k of the
// group owns elements [k n_pad/D, (k+1) n_pad/D). Optimizer state is kept for
// the real (unpadded) elements of a rank's share. A tied embedding's copy on
// the first or last stage (Param::tied) is a buffer of its own, as Megatron's
// "shared_embedding" bucket: both stages shard it alike.
//
// Tied copies (the embedding group): ZeRO 0/1 sum the whole gradients
// before the DP sync; ZeRO 2/3 sum the owned shares in the step, after the
// per-unit reduce-scatters (Megatron FSDP, finalize_model_grads.py).
// ZeRO 0: all-reduce each buffer's grads. ZeRO 1: reduce-scatter the grads
// once per step, update the owned share, all-gather the params. ZeRO 2: as 1,
// but each unit's grads are reduce-scattered in every micro-batch's backward
// (ReduceUnitGradients) so only the owned shares and one unit's unsharded
// grads live (DeepSpeed stage 2); with SP the unit's replicated grads are
// all-reduced over TP first. ZeRO 3 (FSDP, reshard after forward): as 2, and
// the parameters live as shares too: a unit is all-gathered before its
// forward and again before its backward in every micro-batch, the next unit
// prefetched (current + next gathered at once), and there is no gather
// after the step. Muon (Moonshot "Distributed Muon"): the momentum is
// updated on the owned share, the momentum-updated shares are all-gathered over
// the group, each TP-sharded matrix is gathered over TP ("duplicated"), and
// Newton-Schulz runs on the full global matrix; each rank keeps its slice.
//
// HSDP (DistGroups::dp_replica): the groups above are one replica's; each
// reduce-scatter is followed by an all-reduce of the rank's share across the
// replicas (Megatron param_and_grad_buffer.py: the intra-instance
// reduce-scatter, then the inter-instance all-reduce; torchtitan's FSDP2
// HSDP mesh: reduce-scatter over "dp_shard", all-reduce over "dp_replicate").
//
// Megatron's layer-wise optimizer (OptimizerSettings::layer_wise; Muon with
// --use-distributed-optimizer, megatron/core/optimizer/layer_wise_optimizer.py
// LayerWiseDistributedOptimizer on its ping-pong path): gradients and
// parameters as ZeRO 0 (DDP all-reduces the full buffers, every rank keeps
// every parameter), but each rank keeps the optimizer state of, and steps,
// only the whole tensors dealt to it (_shard_params_ping_pong), Muon's TP
// gathers included; then every rank's updated tensors are all-gathered over
// the group (allgather_params: one gather of uneven per-rank sizes, here
// one per parameter dtype).
//
// Offloads (PlaceState): Megatron's optimizer CPU offload
// (cpu_offloading/hybrid_optimizer.py HybridDeviceOptimizer, ZeRO >= 1) keeps
// the first ceil(fraction x owned) AdamW elements of each optimizer's shares
// on the host and steps them there, their fp32 gradients copied down and
// fp32 parameters back up; FSDP2's CPUOffloadPolicy (ZeRO 3) keeps every
// owned share on the host, copying a unit's share up before each all-gather
// and each reduce-scatter's share down. Host bytes go to the rank's host
// tracker, copies to its host-link counters.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "blocks.h"
#include "optimizers.h"

namespace preflight::sim {

struct OptimizerSettings {
  AdamWConfig adamw;
  MuonConfig muon;
  int64_t step = 1;       // the step being taken (AdamW bias correction)
  int zero = 0;
  /// Megatron's layer-wise deal of whole tensors (with zero = 0 for the
  /// gradients and parameters, see above).
  bool layer_wise = false;
  int64_t master_bytes = 4;    // fp32 master copy per element, 0 = none
  int64_t momentum_bytes = 4;  // Muon momentum per element
  /// Divides the summed gradients: the dense and the expert gradient of the
  /// global-batch mean loss is the sum over the d*c replicas / (d*c).
  double dense_grad_scale = 1.0;
  double expert_grad_scale = 1.0;
  /// Megatron's optimizer CPU offload (HybridDeviceOptimizer, ZeRO >= 1):
  /// the first ceil(fraction x owned AdamW elements) of each optimizer's
  /// (dense, expert) shares keep their state on the host and step there.
  double offload_fraction = 0.0;
  /// FSDP2's CPUOffloadPolicy (ZeRO 3): every owned share (parameters,
  /// gradients, optimizer state) lives on the host.
  bool fsdp_cpu_offload = false;
};

/// The groups of one rank the step communicates over.
struct DistGroups {
  const Group* tp = nullptr;
  const Group* dp_cp = nullptr;
  const Group* etp = nullptr;
  const Group* edp = nullptr;
  bool sp = false;  // REP grads are partial over TP: all-reduce them first
  const Group* embedding = nullptr;  // a tied embedding's two copies (first and last stage)
  const Group* mirror = nullptr;     // DualPipe: the rank holding the other copies of this rank's two stages
  /// HSDP: the ranks holding the same share in the other replicas (dense, expert).
  const Group* dp_replica = nullptr;
  const Group* edp_replica = nullptr;
};

/// A rank's optimizer: buffers and state of its units.
template <class T>
class DistOptimizer {
 public:
  DistOptimizer(Ctx& ctx, const DistGroups& groups, std::vector<std::vector<Param<T>*>> units,
                const OptimizerSettings& settings);
  ~DistOptimizer();
  DistOptimizer(const DistOptimizer&) = delete;
  DistOptimizer& operator=(const DistOptimizer&) = delete;

  /// ZeRO 3: all-gathers unit `u`'s parameters (no-op if gathered or below
  /// ZeRO 3); they count as live parameters until ReleaseUnit.
  void GatherUnit(Ctx& ctx, size_t unit);
  void ReleaseUnit(size_t unit);
  /// ZeRO 2/3: unit `u`'s unsharded gradients are live from its backward...
  void BeginUnitBackward(Ctx& ctx, size_t unit);
  /// ... until they are reduce-scattered into the owned shares and zeroed
  /// (after the unit's backward of every micro-batch). No-op below ZeRO 2.
  void ReduceUnitGradients(Ctx& ctx, size_t unit);
  /// After the last backward: the remaining gradient synchronisation, the
  /// AdamW and Muon updates and the parameter all-gathers (ZeRO 1/2).
  void Step(Ctx& ctx);
  /// ZeRO 3: writes the updated shares into every rank's full parameters for
  /// the verifier, with counting off (not part of the modeled step).
  void GatherForVerification(Ctx& ctx);
  /// Each parameter's gradient summed over this rank's micro-batches, before
  /// any reduction (for the verifier).
  const std::map<std::string, Mat<double>>& local_gradients() const { return observed_; }

 private:
  struct Buffer;
  void Observe(const std::vector<Param<T>*>& params);
  void AllReduceReplicated(Ctx& ctx, const std::vector<Param<T>*>& params);
  void AllReduceTied(Ctx& ctx, const std::vector<Param<T>*>& params);
  void AllReduceTiedShares(Ctx& ctx);
  void AllReduceMirror(Ctx& ctx);
  void SyncGradients(Ctx& ctx, Buffer& b);
  void OwnedValues(Buffer& b);
  void StepAdamW(Ctx& ctx, Buffer& b);
  void StepMuon(Ctx& ctx, Buffer& b);
  /// Allocates each buffer's optimizer state on the device or, offloaded,
  /// on the host (OptimizerSettings::offload_fraction, fsdp_cpu_offload).
  void PlaceState(Ctx& ctx);
  int64_t SteppedElements(const Buffer& b) const;
  void GatherParams(Ctx& ctx, Buffer& b, bool into_values);
  void DealLayerWise(Ctx& ctx);
  bool Owns(const Param<T>* p) const { return !settings_.layer_wise || owned_.count(p) != 0; }
  /// Layer-wise: one framework tensor, elements [first, first + n) of a
  /// parameter (all of it, or one row of a Param::row_tensors one).
  struct Piece {
    Param<T>* param = nullptr;
    int64_t first = 0, n = 0;
  };
  void GatherDealt(Ctx& ctx);
  /// The element ranges of a buffer this rank steps at ZeRO 0: all, or the dealt tensors'.
  std::vector<std::pair<int64_t, int64_t>> Stepped(const Buffer& b) const;

  DistGroups groups_;
  OptimizerSettings settings_;
  std::vector<std::vector<Param<T>*>> unit_params_;
  std::vector<std::vector<Buffer>> units_;  // per unit, its non-empty buffers
  std::vector<std::vector<Allocation>> gathered_;  // ZeRO 3: per unit, live full parameters (one per category)
  std::vector<Allocation> unit_grads_;             // ZeRO 2/3: per unit, live unsharded gradients
  std::map<std::string, Mat<double>> observed_;
  /// Layer-wise: the element ranges of each parameter this rank steps, and
  /// every group member's dealt tensors in deal order ([dense, expert][member]).
  std::map<const Param<T>*, std::vector<std::pair<int64_t, int64_t>>> owned_;
  std::array<std::vector<std::vector<Piece>>, 2> dealt_;
};

}  // namespace preflight::sim

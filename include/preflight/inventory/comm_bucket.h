// The typed vocabulary of communication, shared by the planner (which prices
// each bucket) and the executor (which counts the bytes it really sends into
// the same buckets). A bucket is (axis, collective, pass, what): both sides
// name it with these enums, so agreement never depends on spelling, and
// reports print the Key() names.
#pragma once

namespace preflight {

/// Process-group axes. The expert axes are the MoE folding of the same t*c*d
/// ranks of a pipeline stage; kDpCp is the group dense gradients are reduced
/// and ZeRO state is sharded over: the d*c ranks, or with HSDP the d*c /
/// dp_replicate consecutive ones of a replica (Megatron's intra_dp_cp_group);
/// kExpertDp likewise for experts. kDpReplica and kExpertDpReplica join the
/// same shard of each replica (Megatron's inter-instance groups; one rank
/// without HSDP). kEmbedding is the 2-rank tied-embedding group (first and last
/// pipeline stage).
enum class Axis : int {
  kTp = 0,
  kCp,
  kDp,
  kPp,
  kEp,
  kExpertTp,
  kExpertDp,
  kDpCp,
  kEmbedding,
  kDpReplica,
  kExpertDpReplica,
  kPpMirror,  // DualPipe: pipeline ranks r and p-1-r, which hold copies of the same two stages
};
inline constexpr int kNumAxes = 12;
/// Stable snake_case key: "tp", "cp", "dp", "pp", "ep", "expert_tp", "expert_dp", "dp_cp", "embedding",
/// "dp_replica", "expert_dp_replica", "pp_mirror".
const char* Key(Axis a);

/// Collectives as NCCL offers them; kSendRecv is one point-to-point message.
enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
/// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv".
const char* Key(Collective c);

/// The part of the training step a message belongs to.
enum class Pass { kForward, kBackward, kOptimizer };
/// "fwd", "bwd", "opt".
const char* Key(Pass p);

/// What a message carries: the block or buffer that issued it.
enum class CommWhat {
  kAttention,           // TP/SP regions of an attention block
  kAttentionKv,         // CP: K,V ring (p2p) or all-gather
  kAttentionQkvo,       // CP: Ulysses all-to-all of Q, K, V and O
  kMamba,               // TP/SP regions (and CP all-to-all) of a Mamba-2 mixer
  kMambaState,          // CP hand-off of conv tails and SSM states
  kMlp,                 // TP/SP regions of a dense MLP
  kMoeSharedExpert,     // TP/SP regions around the MoE layer
  kMoeDispatch,         // EP all-to-all of routed tokens
  kMoeCombine,          // EP all-to-all of expert outputs back
  kMoeCounts,           // EP exchange of per-expert token counts
  kMoeExperts,          // expert-TP gather/scatter of received tokens
  kRecurrent,           // TP/SP regions (and CP all-to-all) of a recurrent block
  kRecurrentState,      // CP hand-off of recurrent states
  kEmbedding,           // vocab-parallel embedding
  kHead,                // vocab-parallel output layer
  kMtpProjection,       // MTP: eh_proj's input and output gathers
  kLoss,                // cross-entropy statistics over the vocab shards
  kActivations,         // pipeline: activations sent forward
  kActivationGrads,     // pipeline: their gradients sent back
  kParams,              // DP: dense parameters gathered (ZeRO)
  kExpertParams,        // DP: expert parameters gathered (ZeRO)
  kGrads,               // DP: dense gradients reduced
  kExpertGrads,         // DP: expert gradients reduced
  kReplicatedGrads,     // TP: gradients of TP-replicated parameters (SP norms)
  kTiedEmbedding,       // embedding group: tied word-embedding gradient
  kMuonGather,          // distributed Muon: dense momentum shares gathered
  kMuonExpertGather,    // distributed Muon: expert momentum shares gathered
  kMuonTpGather,        // Muon: TP-sharded dense matrices gathered for Newton-Schulz
  kMuonExpertTpGather,  // Muon: expert-TP-sharded matrices gathered
  kReplicaGrads,        // HSDP: dense gradient shards all-reduced across replicas
  kExpertReplicaGrads,  // HSDP: expert gradient shards all-reduced across replicas
  kRouterBias,          // DP x CP x TP: routed-token counts per expert for the expert-bias update
  kDualPipeCopyGrads,   // DualPipe: the two copies of a stage sum their gradients (mirror pipeline ranks)
  kUnlabeled,           // executor only: traffic no block labeled (runtime tests)
};
inline constexpr int kNumCommWhats = 34;
/// Stable snake_case key: "attention", "moe_dispatch", "muon_gather", ...
const char* Key(CommWhat w);

}  // namespace preflight

// Names of the shared communication vocabulary (include/preflight/inventory/comm_bucket.h).
#include "preflight/inventory/comm_bucket.h"

namespace preflight {

const char* Key(Axis a) {
  switch (a) {
    case Axis::kTp: return "tp";
    case Axis::kCp: return "cp";
    case Axis::kDp: return "dp";
    case Axis::kPp: return "pp";
    case Axis::kEp: return "ep";
    case Axis::kExpertTp: return "expert_tp";
    case Axis::kExpertDp: return "expert_dp";
    case Axis::kDpCp: return "dp_cp";
    case Axis::kEmbedding: return "embedding";
    case Axis::kDpReplica: return "dp_replica";
    case Axis::kExpertDpReplica: return "expert_dp_replica";
    case Axis::kPpMirror: return "pp_mirror";
  }
  return "?";
}

const char* Key(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kSendRecv: return "send_recv";
  }
  return "?";
}

const char* Key(Pass p) {
  switch (p) {
    case Pass::kForward: return "fwd";
    case Pass::kBackward: return "bwd";
    case Pass::kOptimizer: return "optimizer";
  }
  return "?";
}

const char* Key(CommWhat w) {
  switch (w) {
    case CommWhat::kAttention: return "attention";
    case CommWhat::kAttentionKv: return "attention_kv";
    case CommWhat::kAttentionQkvo: return "attention_qkvo";
    case CommWhat::kMamba: return "mamba";
    case CommWhat::kMambaState: return "mamba_state";
    case CommWhat::kMlp: return "mlp";
    case CommWhat::kMoeSharedExpert: return "moe_shared_expert";
    case CommWhat::kMoeDispatch: return "moe_dispatch";
    case CommWhat::kMoeCombine: return "moe_combine";
    case CommWhat::kMoeCounts: return "moe_counts";
    case CommWhat::kMoeExperts: return "moe_experts";
    case CommWhat::kRecurrent: return "recurrent";
    case CommWhat::kRecurrentState: return "recurrent_state";
    case CommWhat::kEmbedding: return "embedding";
    case CommWhat::kMtpProjection: return "mtp_projection";
    case CommWhat::kHead: return "head";
    case CommWhat::kLoss: return "loss";
    case CommWhat::kActivations: return "activations";
    case CommWhat::kActivationGrads: return "activation_grads";
    case CommWhat::kParams: return "params";
    case CommWhat::kExpertParams: return "expert_params";
    case CommWhat::kGrads: return "grads";
    case CommWhat::kExpertGrads: return "expert_grads";
    case CommWhat::kReplicatedGrads: return "replicated_grads";
    case CommWhat::kTiedEmbedding: return "tied_embedding";
    case CommWhat::kMuonGather: return "muon_gather";
    case CommWhat::kMuonExpertGather: return "muon_expert_gather";
    case CommWhat::kMuonTpGather: return "muon_tp_gather";
    case CommWhat::kMuonExpertTpGather: return "muon_expert_tp_gather";
    case CommWhat::kReplicaGrads: return "replica_grads";
    case CommWhat::kExpertReplicaGrads: return "expert_replica_grads";
    case CommWhat::kRouterBias: return "router_bias";
    case CommWhat::kDualPipeCopyGrads: return "dualpipe_copy_grads";
    case CommWhat::kUnlabeled: return "";
  }
  return "?";
}

}  // namespace preflight

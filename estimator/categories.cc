// Names of the memory categories and the RankMemory total.
#include "preflight/estimator/estimate.h"

namespace preflight {

const char* Key(Category c) {
  switch (c) {
    case Category::kReplicatedParams: return "replicated_params";
    case Category::kTpShardedParams: return "tp_sharded_params";
    case Category::kEpShardedParams: return "ep_sharded_params";
    case Category::kGradients: return "gradients";
    case Category::kOptimizerMuon: return "optimizer_muon";
    case Category::kOptimizerAdamW: return "optimizer_adamw";
    case Category::kActivations: return "activations";
    case Category::kRoutingScratch: return "routing_scratch";
    case Category::kServingState: return "serving_state";
    case Category::kLibraryWorkspaces: return "library_workspaces";
    case Category::kRuntimeReserve: return "runtime_reserve";
    case Category::kAllocatorOverhead: return "allocator_overhead";
  }
  return "unknown";
}

const char* Label(Category c) {
  switch (c) {
    case Category::kReplicatedParams: return "replicated params";
    case Category::kTpShardedParams: return "TP-sharded params";
    case Category::kEpShardedParams: return "EP-sharded params";
    case Category::kGradients: return "gradients";
    case Category::kOptimizerMuon: return "optimizer (Muon + master)";
    case Category::kOptimizerAdamW: return "optimizer (AdamW + master)";
    case Category::kActivations: return "activations";
    case Category::kRoutingScratch: return "MoE routing scratch";
    case Category::kServingState: return "serving KV + state pool";
    case Category::kLibraryWorkspaces: return "library workspaces";
    case Category::kRuntimeReserve: return "runtime reserve";
    case Category::kAllocatorOverhead: return "allocator overhead";
  }
  return "unknown";
}

Bytes RankMemory::total() const {
  Bytes sum;
  for (const Bytes& b : bytes) sum += b;
  return sum;
}

}  // namespace preflight

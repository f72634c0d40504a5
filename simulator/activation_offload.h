// Fine-grained activation offloading in the reference executor
// (training.activation_offload), after Megatron-LM's
// --fine-grained-activation-offloading (megatron/core/pipeline_parallel/
// fine_grained_activation_offload.py).
//
// Megatron wraps each listed module of a layer (attention.py, transformer_layer.py,
// moe/experts.py) in an offload group: the saved-tensor hooks collect what the
// module saves for backward, and the group's commit at the module's end
// (ChunkOffloadHandler.bulk_offload_group) copies each tensor of at least
// --min-offloaded-tensor-size elements to pinned host memory and frees it on
// the device; the group is reloaded before the module's backward
// (on_group_commit_backward waits for the reload). After the warmup iteration
// (post_warmup_callback) the last group of each module name in the first
// chunk (micro-batch) to run backward stays on the device, and
// should_bulk_offload keeps the last group of each name of any chunk whose
// backward is the next to run (every micro-batch on the last pipeline stage),
// so that their reload cannot stall the backward.
//
// The executor frees a layer's saved tensors when the layer's backward ends,
// so it moves them at the layer's granularity: after the block's forward,
// each listed scope's tensors of at least the minimum leave the device for
// the rank's host tracker, and they come back before the block's backward,
// each byte counted on the host link both ways.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "world.h"

namespace preflight::sim {

/// One framework tensor a module saved for backward: the allocations of the
/// executor tensors it is made of (SwiGLU's fc1 output is the executor's a
/// and u), and its element count as the framework sees it (a LayerNorm's
/// statistics: one entry per row).
struct SavedTensor {
  OffloadModule scope = OffloadModule::kAttnNorm;
  int64_t elements = 0;
  std::vector<Allocation*> parts;
};

/// The offload modules a layer of pattern letter `letter` runs (Megatron
/// TransformerLayer._set_offload_modules: a norm fused into its linear by
/// Transformer Engine is an IdentityOp, no group of its own; MLA's and the
/// MoE's pre-norms are always their own modules). M and R layers run none.
OffloadSet OffloadModulesOf(char letter, bool mla, bool transformer_engine);

/// One rank's offloader: what each layer and micro-batch moved to the host.
class ActivationOffload {
 public:
  ActivationOffload(Rank* rank, OffloadSet modules, int64_t min_elements)
      : rank_(rank), modules_(modules), min_elements_(min_elements) {}
  /// The modules whose groups the next layer's forward keeps on the device.
  void set_kept(OffloadSet kept) { kept_ = kept; }
  /// The forward of `layer` for micro-batch `mb` ended: the listed scopes'
  /// tensors of at least the minimum go to the host, except the kept ones.
  void Commit(int64_t layer, int64_t mb, const std::vector<SavedTensor>& saved);
  /// Before the backward of `layer` for `mb`: what went comes back.
  void Reload(int64_t layer, int64_t mb);

 private:
  Rank* rank_;
  OffloadSet modules_;
  int64_t min_elements_ = 0;
  OffloadSet kept_;
  std::map<std::pair<int64_t, int64_t>, std::vector<Allocation*>> on_host_;
};

}  // namespace preflight::sim

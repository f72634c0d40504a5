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
// The blocks hand each listed scope's tensors of at least the minimum to the
// rank's host tracker where Megatron commits the module's group inside the
// forward (one group per scope: FineGrainedOffloadingGroupCommitFunction.forward
// -> on_group_commit_forward -> bulk_offload_group, at the ends of
// attention.py's get_query_key_value_tensors, core attention and linear_proj,
// transformer_layer.py's norms, and experts.py's linear_fc1 and, after
// linear_fc2, the activation), so a module's tensors are on the device
// together with those of the modules before it that stay, never with the
// earlier groups. The executor frees a layer's saved tensors when the
// layer's backward ends, so it reloads at the layer's granularity: the
// groups come back before the block's backward, each byte counted on the
// host link both ways. Megatron
// reloads a group when the backward of a group after it ends (bulk_reload),
// so its reloads replace freed groups as the executor's do. Once a chunk has
// no group left to reload, each further group backward brings back one of
// the last groups of the next chunk to run backward, if its forward is done
// (pre_reload_last_layer): as many as the chunk keeps (one per module name).
// The executor brings them back when the backward of the chunk's first block
// with groups has ended.
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
/// Under a "core_attn" rerun (`rerun`) the core runs no group: attention.py
/// calls _checkpointed_attention_forward outside the core_attn scope.
OffloadSet OffloadModulesOf(char letter, bool mla, bool transformer_engine, ModuleSet rerun);

/// One rank's offloader: what each layer and micro-batch moved to the host.
class ActivationOffload {
 public:
  ActivationOffload(Rank* rank, OffloadSet modules, int64_t min_elements)
      : rank_(rank), modules_(modules), min_elements_(min_elements) {}
  /// The modules whose groups the next layer's forward keeps on the device.
  void set_kept(OffloadSet kept) { kept_ = kept; }
  /// Whether the forwards that follow are a checkpoint's: under torch.no_grad
  /// (a full-recompute or Transformer Engine "mlp" checkpoint), which saves
  /// nothing inside the modules' scopes, or its rerun in backward, whose
  /// tensors the backward reads at once. Neither hands anything to the host.
  void set_checkpointed(bool on) { checkpointed_ = on; }
  /// The forward of `layer` for micro-batch `mb` reached the end of module
  /// `scope` (Megatron's group commit): if listed and not kept, the scope's
  /// tensors in `saved` of at least the minimum go to the host.
  void Hand(int64_t layer, int64_t mb, OffloadModule scope, const std::vector<SavedTensor>& saved);
  /// The forward of `layer` for `mb` ended: the listed scopes not handed yet
  /// go now, and the groups follow the tensors to where the block keeps them
  /// (`saved`: a block may move its state after a hand-off).
  void Commit(int64_t layer, int64_t mb, const std::vector<SavedTensor>& saved);
  /// Before the backward of `layer` for `mb`: what went comes back.
  void Reload(int64_t layer, int64_t mb);
  /// The backward of `layer` for `mb` ended (its saved tensors are freed):
  /// after the micro-batch's last layer with groups, the next micro-batch's
  /// last groups come back ahead (micro-batches run backward in order: the
  /// executor runs offload without virtual stages).
  void Backwarded(int64_t layer, int64_t mb);

 private:
  /// One offload group: a module scope's tensors that went to the host (none
  /// when all were under the minimum).
  struct Group {
    OffloadModule scope = OffloadModule::kAttnNorm;
    std::vector<Allocation*> moved;
  };
  void Bring(const Group& g);
  void PreReload(int64_t mb);

  Rank* rank_;
  OffloadSet modules_;
  int64_t min_elements_ = 0;
  OffloadSet kept_;
  bool checkpointed_ = false;
  // The running forward's (Hand, until Commit): the scopes handed and their groups.
  OffloadSet handed_;
  bool ran_ = false;
  std::vector<Group> forming_;
  OffloadSet names_;  // the module names whose groups ran (ChunkOffloadHandler.get_max_deduplicated_groups)
  std::map<std::pair<int64_t, int64_t>, std::vector<Group>> on_host_;  // (mb, layer): forward order
  std::map<int64_t, std::vector<int64_t>> pending_;  // per micro-batch: layers with groups not yet backwarded
};

}  // namespace preflight::sim

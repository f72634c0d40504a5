// A layout: the parallel degrees and batch/recompute choices that a sweep
// varies, separate from the recipe so that one inventory is priced under
// millions of layouts without re-parsing (docs/architecture.md).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight {
struct Inventory;
}

namespace preflight {

struct Layout {
  int64_t tp = 1;
  bool sp = true;
  int64_t cp = 1;
  int64_t pp = 1;
  int64_t vpp = 1;
  int64_t dp = 1;          // dense data-parallel degree = world / (tp*cp*pp)
  int64_t ep = 1;
  int64_t expert_tp = 1;
  int64_t zero = 1;        // 0..3
  int64_t dp_replicate = 1;  // HSDP replicas of the ZeRO group (ParallelConfig::dp_replicate)
  int64_t micro_batch = 1;
  int64_t micro_batches = 1;  // per step per pipeline = global_batch / (micro_batch * dp)
  Recompute recompute = Recompute::kSelective;
  Schedule schedule = Schedule::k1F1B;
  int64_t microbatch_group = 0;  // ParallelConfig::microbatch_group: 0 = pp
  AxisOrder order = AxisOrder::kTpCpDpPp;
  CpComm cp_comm = CpComm::kP2p;
  CpRecurrent cp_recurrent = CpRecurrent::kAllToAll;
  bool cp_load_balance = true;

  int64_t world() const { return tp * cp * pp * dp; }
  /// Expert-data-parallel degree d_e = tp*cp*dp / (ep*expert_tp) (docs/formulas.md §0).
  int64_t expert_dp() const { return tp * cp * dp / (ep * expert_tp); }
  /// The dense ZeRO group: the d*c ranks of one replica (Megatron's
  /// intra_dp_cp group); d*c without HSDP.
  int64_t zero_group() const { return dp * cp / dp_replicate; }
  /// The expert ZeRO group: d_e / dp_replicate ranks.
  int64_t expert_zero_group() const { return expert_dp() / dp_replicate; }
  /// Micro-batches each virtual stage of the interleaved schedule runs in a
  /// row (Megatron's microbatch_group_size_per_vp_stage, pp by default).
  int64_t MicrobatchGroup() const { return microbatch_group > 0 ? microbatch_group : pp; }
  /// True when sequence parallelism is in effect (needs tp > 1).
  bool sequence_parallel() const { return sp && tp > 1; }
};

/// True when the last pipeline stage keeps its own copy of the word embedding
/// (a tied head or MTP reads it) that the first stage's mirrors: pp > 1,
/// except DualPipe, whose ranks 0 and p-1 hold both ends, and DualPipeV,
/// whose rank 0 holds the first and the last chunk (docs/formulas.md §1.1).
inline bool KeepsEmbeddingCopy(const ModelConfig& model, const Layout& layout) {
  return model.embedding_on_last_stage() && layout.pp > 1 && layout.schedule != Schedule::kDualPipe &&
         layout.schedule != Schedule::kDualPipeV;
}

/// The layout a recipe names.
Layout LayoutOf(const Recipe& recipe);

/// One model chunk: a contiguous range of layers on one pipeline rank.
struct StageChunk {
  int64_t pipeline_rank = 0;  // 0..pp-1
  int64_t virtual_index = 0;  // 0..vpp-1 (chunk index on that rank)
  int64_t first_layer = 0;    // inclusive
  int64_t end_layer = 0;      // exclusive
  bool owns_embedding = false;  // first chunk of pipeline rank 0
  bool owns_head = false;       // last chunk of pipeline rank pp-1 (final norm, head, loss)
};

/// The assignment of layers to pipeline ranks: pp*vpp chunks in model order
/// (chunk c lives on pipeline rank c % pp, virtual index c / pp, Megatron's
/// interleaving).
struct StagePlan {
  std::vector<StageChunk> chunks;
};

/// A chunk's layers in the framework's unit: [first, end) over
/// `layer_starts` (Inventory::layer_starts; recipe/partition.h LayerStarts).
/// A chunk that starts or ends inside a layer counts from the next layer.
struct LayerRange {
  int64_t first = 0;
  int64_t end = 0;
};
LayerRange LayerRangeOf(const StageChunk& chunk, const std::vector<int64_t>& layer_starts);

/// Chunks owned by one pipeline rank.
std::vector<StageChunk> ChunksOfRank(const StagePlan& plan, int64_t pipeline_rank);

/// Equal split of `layers` into `chunks` contiguous ranges (the first
/// layers % chunks ranges get one extra layer). Used when a caller has no
/// partitioner result; the planner's partitioner is the default in the CLI.
StagePlan EqualStagePlan(int64_t layers, int64_t pp, int64_t vpp);

/// Pipeline rank and virtual index of chunk `chunk` of `chunks`: c mod pp
/// and c / pp (Megatron's interleaving), or DualPipeV's V (chunks c and
/// 2p-1-c on device c).
std::pair<int64_t, int64_t> PlaceChunk(int64_t chunk, int64_t chunks, int64_t pp, Schedule schedule);

/// Chunks of `layers_per_chunk` framework layers each, in chunk order, as
/// sublayer ranges (layer_starts: Inventory::layer_starts), placed on
/// pipeline ranks as `schedule` places them (c mod pp; DualPipeV's V).
StagePlan PlanFromLayerCounts(const std::vector<int64_t>& layers_per_chunk, const std::vector<int64_t>& layer_starts,
                              int64_t pp, Schedule schedule);

/// The stages the recipe fixes for `layout`: its pinned boundaries, else its
/// framework's rule (parallel.partition). nullopt for a balanced partition
/// (the planner's to compute) or a split the framework refuses (validation
/// reports it).
std::optional<StagePlan> RecipeStagePlan(const Inventory& inventory, const Layout& layout);

}  // namespace preflight

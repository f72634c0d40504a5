// The stage partition the frameworks compute (recipe/partition.h): every
// shipped recipe's default split against Megatron-LM's own offset rule,
// hand-worked torchtitan splits, the layer as the unit of depth, and full
// recompute keeping one checkpoint per layer.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/partition.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::partition_test {
namespace {

using testing::SourcePath;

Recipe Load(const std::string& name, const std::vector<std::string>& sets = {}) {
  std::vector<Override> overrides;
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/" + name), overrides);
  EXPECT_TRUE(loaded.ok()) << name << ": " << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  return loaded.ok() ? *loaded.recipe : Recipe{};
}

/// [first, end) in layers of every chunk of the plan MakePlan prices.
std::vector<std::pair<int64_t, int64_t>> PlannedChunks(const Recipe& r) {
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, LayoutOf(r));
  EXPECT_TRUE(planned.plan.has_value()) << r.name;
  std::vector<std::pair<int64_t, int64_t>> out;
  if (!planned.plan) return out;
  for (const StageChunk& c : planned.plan->stages.chunks) {
    const LayerRange range = LayerRangeOf(c, inv.layer_starts);
    out.emplace_back(range.first, range.end);
  }
  return out;
}

/// Megatron-LM's offset and count of the chunk on (pp_rank, vp_stage), as
/// transformer_layer.py get_transformer_layer_offset and transformer_block.py
/// get_num_layers_to_build state them for the even split (with the embedding
/// and loss accounted) and the uneven first/last stage; restated here from
/// those functions, independently of recipe/partition.cc's per-chunk counts.
std::pair<int64_t, int64_t> MegatronChunk(const ParallelConfig& p, int64_t layers, int64_t pp_rank, int64_t vp) {
  const int64_t vpp = p.vpp;
  const bool first_vp = vp == 0, last_vp = vp == vpp - 1;
  if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
    const int64_t first = p.first_stage_layers, last = p.last_stage_layers;
    const int64_t middle_stages = p.pp - (first > 0) - (last > 0);
    const int64_t middle = layers - first - last;
    const int64_t per_rank = middle_stages > 0 ? middle / middle_stages : 0;
    int64_t count = per_rank;
    if (pp_rank == 0 && first > 0) count = first;
    if (pp_rank == p.pp - 1 && last > 0) count = last;
    count /= vpp;
    const int64_t total_virtual = first / vpp + middle / vpp + last / vpp;
    const int64_t middle_rank = first > 0 ? pp_rank - 1 : pp_rank;
    const int64_t offset = pp_rank == 0
                               ? vp * total_virtual
                               : vp * total_virtual + first / vpp + middle_rank * (middle / vpp / middle_stages);
    return {offset, count};
  }
  const int64_t counted = layers + p.embedding_in_split + p.loss_in_split;
  const int64_t per_rank = counted / p.pp;
  int64_t count = per_rank / vpp;
  int64_t offset = vp * (counted / vpp) + pp_rank * (per_rank / vpp);
  if (p.embedding_in_split && first_vp && pp_rank == 0) count -= 1;
  if (p.loss_in_split && last_vp && pp_rank == p.pp - 1) count -= 1;
  if (p.embedding_in_split && !(first_vp && pp_rank == 0)) offset -= 1;
  return {offset, count};
}

// Every shipped recipe with Megatron's partition is priced on Megatron's
// split; the one that asks for the balanced cut (DeepSeek-V3 on DualPipe,
// which neither framework runs) is cut on layer boundaries.
TEST(Partition, EveryShippedRecipeIsPricedOnItsFrameworksSplit) {
  int megatron = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SourcePath("recipes"))) {
    const Recipe r = Load(entry.path().filename().string());
    const int64_t layers = LayerCount(r.model.layers);
    const auto chunks = PlannedChunks(r);
    ASSERT_EQ(static_cast<int64_t>(chunks.size()), ChunkCountOf(r.parallel.schedule, r.parallel.pp, r.parallel.vpp));
    EXPECT_EQ(chunks.back().second, layers) << r.name;
    if (r.parallel.partition != Partition::kMegatron || !r.parallel.stage_boundaries.empty()) continue;
    ++megatron;
    for (int64_t vp = 0; vp < r.parallel.vpp; ++vp) {
      for (int64_t rank = 0; rank < r.parallel.pp; ++rank) {
        const auto [offset, count] = MegatronChunk(r.parallel, layers, rank, vp);
        const auto& chunk = chunks[static_cast<size_t>(vp * r.parallel.pp + rank)];
        EXPECT_EQ(chunk.first, offset) << r.name << " rank " << rank << " vp " << vp;
        EXPECT_EQ(chunk.second - chunk.first, count) << r.name << " rank " << rank << " vp " << vp;
      }
    }
  }
  EXPECT_EQ(megatron, 9);
}

// The design notes' example: Llama 3 8B's 32 transformer layers on pp 8 put
// 4 layers on each stage; no stage separates a layer's attention from its MLP.
TEST(Partition, Llama8BOnPp8IsFourLayersAStage) {
  const auto chunks = PlannedChunks(
      Load("llama3-8b-h200.yaml", {"parallel.pp=8", "parallel.tp=1", "cluster.nodes=1", "training.global_batch=64"}));
  ASSERT_EQ(chunks.size(), 8u);
  for (int64_t s = 0; s < 8; ++s) EXPECT_EQ(chunks[static_cast<size_t>(s)], std::make_pair(4 * s, 4 * s + 4));
}

// Llama 3 405B as the paper runs it (section 3.3.2: the first and last stage
// one layer fewer): 126 + embedding + loss = 128 = 16 ranks x 2 chunks x 4.
TEST(Partition, Llama405BFirstAndLastChunkHoldThree) {
  const auto chunks = PlannedChunks(Load("llama3-405b-h200.yaml"));
  ASSERT_EQ(chunks.size(), 32u);
  EXPECT_EQ(chunks.front(), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(chunks[1], std::make_pair(int64_t{3}, int64_t{7}));
  EXPECT_EQ(chunks.back(), std::make_pair(int64_t{123}, int64_t{126}));
}

// torchtitan's generate_llm_fqn_per_model_part, worked by hand: 32 layers in
// 4 stages, embedding and output one layer each: 34 effective, 8 a stage and
// the first 34 % 4 = 2 stages one more: 9 - 1, 9, 8, 8 - 1 = 8, 9, 8, 7.
TEST(Partition, TorchtitanWeighsTheEmbeddingAndOutputAsALayerEach) {
  ParallelConfig p;
  p.pp = 4;
  p.partition = Partition::kTorchtitan;
  EXPECT_EQ(RuleSplit(p, 32, true).layers, (std::vector<int64_t>{8, 9, 8, 7}));
  // DualPipeV on pp 16 (2 x 16 = 32 V-shaped stages) with DeepSeek-V3's 61
  // layers: 63 effective, 1 a stage, the first 31 one more: 1, 2 x 30, 0.
  p.pp = 16;
  p.schedule = Schedule::kDualPipeV;
  const std::vector<int64_t> v = RuleSplit(p, 61, true).layers;
  ASSERT_EQ(v.size(), 32u);
  EXPECT_EQ(v.front(), 1);
  EXPECT_EQ(v[1], 2);
  EXPECT_EQ(v[30], 2);
  EXPECT_EQ(v.back(), 0);
}

// The uneven ends the import's default layout writes, by hand: the middle
// stages take ceil(L / pp), the first and last share the rest.
TEST(Partition, UnevenEndsShareWhatTheMiddleLeaves) {
  using Ends = std::optional<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(UnevenEnds(32, 8), Ends({0, 0}));     // even
  EXPECT_EQ(UnevenEnds(61, 2), Ends({30, 31}));   // no middle
  EXPECT_EQ(UnevenEnds(61, 4), Ends({14, 15}));   // 2 x 16 in the middle
  EXPECT_EQ(UnevenEnds(61, 16), Ends({2, 3}));    // 14 x 5 in the middle
  EXPECT_EQ(UnevenEnds(61, 32), Ends({15, 16}));  // ceil 2 leaves 1: floor 1 a middle stage
  ParallelConfig p;
  p.pp = 16;
  p.first_stage_layers = 2;
  p.last_stage_layers = 3;
  EXPECT_TRUE(RuleSplit(p, 61, true).ok());
}

// Uneven first/last counts describe the recipe's own pp: a sweep or an
// advice move to another pp re-derives them. Llama 3 8B's 32 layers on pp 3
// as 10 | 11 | 11; on pp 6 the ends become 4 and 4 around 4 x 6.
TEST(Partition, UnevenEndsAreRederivedForAnotherPp) {
  const Recipe r = Load("llama3-8b-h200.yaml", {"parallel.pp=3", "cluster.nodes=3", "training.global_batch=48",
                                                "parallel.first_stage_layers=10", "parallel.last_stage_layers=11"});
  const Inventory inv = BuildInventory(r);
  auto counts = [&](const Layout& l) {
    std::vector<int64_t> out;
    for (const StageChunk& c : RecipeStagePlan(inv, l).value_or(StagePlan{}).chunks) {
      const LayerRange range = LayerRangeOf(c, inv.layer_starts);
      out.push_back(range.end - range.first);
    }
    return out;
  };
  Layout l = LayoutOf(r);
  EXPECT_EQ(counts(l), (std::vector<int64_t>{10, 11, 11}));
  l.pp = 6;
  EXPECT_EQ(counts(l), (std::vector<int64_t>{4, 6, 6, 6, 6, 4}));
  EXPECT_TRUE(ValidateForPlan(r, l).empty());
}

// What Megatron-LM refuses, refused with the key to change.
TEST(Partition, MegatronsRefusalsNameTheKey) {
  ParallelConfig p;
  p.pp = 16;
  p.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  const LayerSplit uneven = RuleSplit(p, 126, true);  // 126 % 16 != 0
  EXPECT_EQ(uneven.key, "parallel.pp");
  p.embedding_in_split = true;
  p.loss_in_split = true;
  EXPECT_TRUE(RuleSplit(p, 126, true).ok());
  p.first_stage_layers = 6;  // not with the accounted embedding/loss
  EXPECT_EQ(RuleSplit(p, 126, true).key, "parallel.embedding_in_split");
  ParallelConfig h;
  h.pp = 2;
  h.vpp = 2;
  h.schedule = Schedule::kInterleaved;
  EXPECT_EQ(RuleSplit(h, 48, false).key, "parallel.vpp");  // hybrids need '|' cuts for vpp
  h.vpp = 1;
  h.schedule = Schedule::kDualPipe;
  EXPECT_EQ(RuleSplit(h, 48, false).key, "parallel.partition");
}

// The unit of depth: a transformer stack's layer is its attention + MLP pair;
// anything with another mixer is a hybrid whose layer is one letter.
TEST(Partition, TheLayerIsTheFrameworksUnit) {
  using K = BlockKind;
  EXPECT_EQ(LayerStarts({K::kAttention, K::kDenseMlp, K::kAttention, K::kMoe}), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(LayerStarts({K::kMamba, K::kDenseMlp, K::kAttention, K::kDenseMlp}), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(LayerStarts({K::kAttention, K::kDenseMlp, K::kDenseMlp}), (std::vector<int64_t>{0, 1, 2, 3}));
}

// Korthikanti et al. (Reducing Activation Recomputation, section 4.1): full
// recompute keeps the layer input, 2sbh bytes a transformer layer in bf16,
// where today's stage keeps one per layer, not one per sublayer. Llama 3 8B
// on one GPU (no SP): 32 layers x 2 x 8192 x 1 x 4096 B = 2 GiB in flight.
TEST(Partition, FullRecomputeKeepsOneCheckpointPerLayer) {
  const Recipe r = Load("llama3-8b-h200.yaml", {"training.recompute=full", "cluster.nodes=1", "cluster.gpus_per_node=1",
                                                "training.global_batch=1"});
  const Inventory inv = BuildInventory(r);
  const Layout l = LayoutOf(r);
  const MemoryEstimate est = EstimateMemory(inv, l, *RecipeStagePlan(inv, l));
  const RankMemory& m = est.stages.front();
  EXPECT_EQ(m.activations_by_family[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))].count(),
            int64_t{32} * 2 * 8192 * 4096);
  EXPECT_EQ(m.activations_by_family[static_cast<size_t>(FamilyIndex(BlockKind::kDenseMlp))].count(), 0);
}

}  // namespace
}  // namespace preflight::partition_test

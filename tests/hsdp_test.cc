// HSDP (parallel.dp_replicate): ZeRO shards inside each replica, replicas
// all-reduce their shards. Memory, groups and collectives on the worked
// example of 8 GPUs as TP 2 x FSDP 2 x DP 2 (TP and FSDP inside a node, the
// replicas across the two nodes), validation, and the Megatron import.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/advice.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::hsdp_test {
namespace {

using testing::SourcePath;

LoadResult Llama8b(const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const char* s : {"training.optimizer.matrices=adamw", "training.global_batch=16", "cluster.nodes=2",
                        "cluster.gpus_per_node=4"}) {
    overrides.push_back(*ParseOverride(s));
  }
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

Plan PlanOf(const std::vector<std::string>& sets) {
  const LoadResult loaded = Llama8b(sets);
  EXPECT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  const Inventory inv = BuildInventory(*loaded.recipe);
  PlanResult planned = MakePlan(inv, LayoutOf(*loaded.recipe));
  EXPECT_TRUE(planned.plan.has_value());
  return *planned.plan;
}

const CommItem* Find(const StageComm& s, Axis axis, Collective kind, CommWhat what) {
  for (const CommItem& i : s.items) {
    if (i.axis == axis && i.kind == kind && i.what == what) return &i;
  }
  return nullptr;
}

TEST(Hsdp, WorkedExampleGroupsLinksAndCollectives) {
  const Plan p = PlanOf({"parallel.tp=2", "parallel.zero=3", "parallel.dp_replicate=2"});
  ASSERT_EQ(p.layout.dp, 4);
  const auto& loc = p.mesh.locality;
  // TP {0,1} and the FSDP shard group {0,2} inside node 0; the replicas {0,4} across nodes.
  EXPECT_EQ(p.mesh.groups[static_cast<size_t>(Axis::kTp)].front(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.mesh.groups[static_cast<size_t>(Axis::kDpCp)].front(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(p.mesh.groups[static_cast<size_t>(Axis::kDpReplica)].front(), (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(loc[static_cast<size_t>(Axis::kTp)].intra_node);
  EXPECT_TRUE(loc[static_cast<size_t>(Axis::kDpCp)].intra_node);
  EXPECT_FALSE(loc[static_cast<size_t>(Axis::kDpReplica)].intra_node);
  // FSDP inside the replica: parameters gathered and gradients reduce-scattered over the shard
  // group, every micro-batch; the shards all-reduced across replicas (half the buffer: D = 2).
  const StageComm& s = p.comm.front();
  const CommItem* gather = Find(s, Axis::kDpCp, Collective::kAllGather, CommWhat::kParams);
  const CommItem* scatter = Find(s, Axis::kDpCp, Collective::kReduceScatter, CommWhat::kGrads);
  const CommItem* across = Find(s, Axis::kDpReplica, Collective::kAllReduce, CommWhat::kReplicaGrads);
  ASSERT_NE(gather, nullptr);
  ASSERT_NE(scatter, nullptr);
  ASSERT_NE(across, nullptr);
  EXPECT_EQ(scatter->group_size, 2);
  EXPECT_EQ(across->group_size, 2);
  EXPECT_EQ(across->calls, scatter->calls);
  EXPECT_EQ(across->payload.count() * 2, scatter->payload.count());
  // No full-width data-parallel reduction remains.
  EXPECT_EQ(Find(s, Axis::kDpCp, Collective::kAllReduce, CommWhat::kGrads), nullptr);
}

TEST(Hsdp, StateIsShardedOverOneReplicaOnly) {
  // dp 4 as 2 replicas shards ZeRO state over 2 ranks: the same bytes as plain ZeRO on dp 2.
  const auto state = [](const std::vector<std::string>& sets) {
    const LoadResult loaded = Llama8b(sets);
    EXPECT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
    const Inventory inv = BuildInventory(*loaded.recipe);
    const RankMemory m = EstimateRank(inv, LayoutOf(*loaded.recipe), EqualStagePlan(64, 1, 1), 0);
    return m.of(Category::kOptimizerAdamW).count() + m.of(Category::kGradients).count() +
           m.of(Category::kTpShardedParams).count() + m.of(Category::kReplicatedParams).count();
  };
  for (const char* zero : {"parallel.zero=1", "parallel.zero=2", "parallel.zero=3"}) {
    EXPECT_EQ(state({"parallel.tp=2", zero, "parallel.dp_replicate=2"}),
              state({"parallel.tp=2", zero, "cluster.nodes=1"}))
        << zero;
    // More replicas, smaller shard groups, more memory.
    EXPECT_GT(state({"parallel.tp=2", zero, "parallel.dp_replicate=4"}),
              state({"parallel.tp=2", zero, "parallel.dp_replicate=2"}))
        << zero;
  }
}

TEST(Hsdp, ReplicasMustSplitTheGroupAndNeedZero) {
  const LoadResult uneven = Llama8b({"parallel.tp=2", "parallel.dp_replicate=3"});
  ASSERT_FALSE(uneven.ok());
  EXPECT_EQ(uneven.diagnostics.front().key_path, "parallel.dp_replicate");
  const LoadResult ddp = Llama8b({"parallel.tp=2", "parallel.zero=0", "parallel.dp_replicate=2"});
  ASSERT_FALSE(ddp.ok());
  EXPECT_EQ(ddp.diagnostics.front().key_path, "parallel.dp_replicate");
}

// A recipe that does not fit because its replicas shard too little hears
// "fewer replicas" from fit's advice.
TEST(Hsdp, AdviceProposesFewerReplicas) {
  const auto worst_total = [](const std::vector<std::string>& sets) {
    const LoadResult loaded = Llama8b(sets);
    EXPECT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
    const Inventory inv = BuildInventory(*loaded.recipe);
    const Layout l = LayoutOf(*loaded.recipe);
    const MemoryEstimate m = EstimateMemory(inv, l, PartitionStages(inv, l));
    return m.stages[static_cast<size_t>(m.worst_stage)].total();
  };
  const Bytes eight = worst_total({"parallel.dp_replicate=8"});
  const Bytes four = worst_total({"parallel.dp_replicate=4"});
  ASSERT_GT(eight, four);
  // A capacity between the two: 8 replicas (no sharding at all) overflow, 4 fit.
  const int64_t capacity_mib = (eight.count() + four.count()) / 2 / (1024 * 1024);
  const LoadResult loaded = Llama8b({"parallel.dp_replicate=8", "cluster.capacity_mib=" + std::to_string(capacity_mib),
                                     "cluster.min_headroom_gib=0"});
  ASSERT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  const Inventory inv = BuildInventory(*loaded.recipe);
  const Layout l = LayoutOf(*loaded.recipe);
  const FitAdvice advice = AdviseFit(inv, l, PartitionStages(inv, l));
  ASSERT_FALSE(advice.fits);
  bool proposed = false;
  for (const Suggestion& s : advice.suggestions) {
    for (const AdviceChange& c : s.changes) {
      proposed |= c.move == AdviceMove::kFewerReplicas && c.from == "8" && c.to == "4";
    }
  }
  EXPECT_TRUE(proposed);
}

TEST(Hsdp, ImportedFromMegatronInstances) {
  const MegatronImport m = ImportMegatronArgs(
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n  --vocab-size: 100\n"
      "  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n  --use-distributed-optimizer: true\n"
      "  --num-distributed-optimizer-instances: 2\n",
      "i.yaml");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m.unrepresented.empty());
  std::vector<Diagnostic> errors;
  const std::string yaml = EmitMegatronRecipe(m, {}, "i", "i.yaml", &errors);
  const LoadResult loaded = LoadRecipeFromString(yaml, "i.yaml");
  ASSERT_TRUE(loaded.ok()) << Format(loaded.diagnostics.front());
  EXPECT_EQ(loaded.recipe->parallel.dp_replicate, 2);
  EXPECT_EQ(loaded.recipe->parallel.zero, 1);
}

}  // namespace
}  // namespace preflight::hsdp_test

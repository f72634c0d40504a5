// parallel.fsdp_cpu_offload: FSDP2's CPUOffloadPolicy on Llama 3 8B, ZeRO 3
// over dp 32, AdamW. The rank's K owned elements (its shards) leave the
// device: their bf16 params (2 B), fp32 grads (4 B) and AdamW m, v and master
// (12 B), and take 16 B each on the host (fp32 param, grad, m, v). Every
// micro-batch copies each shard up before its two all-gathers and its
// gradient shard down after the reduce-scatter: 12 B an element over PCIe
// Gen5 x16 (63 GB/s), not overlapped.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::fsdp_cpu_offload_test {
namespace {

LoadResult Load(const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const char* s : {"training.optimizer.matrices=adamw", "parallel.zero=3"}) {
    overrides.push_back(*ParseOverride(s));
  }
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

Plan PlanOf(const std::vector<std::string>& sets) {
  const LoadResult loaded = Load(sets);
  EXPECT_TRUE(loaded.ok()) << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  return *MakePlan(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe)).plan;
}

int64_t Params(const RankMemory& m) {
  return (m.of(Category::kReplicatedParams) + m.of(Category::kTpShardedParams) + m.of(Category::kEpShardedParams))
      .count();
}

TEST(FsdpCpuOffload, TheShardsLiveOnTheHost) {
  const Plan base = PlanOf({});
  const Plan off = PlanOf({"parallel.fsdp_cpu_offload=true"});
  const RankMemory& b = base.memory->stages.front();
  const RankMemory& o = off.memory->stages.front();
  ASSERT_EQ(b.of(Category::kOptimizerAdamW).count() % 12, 0);
  const int64_t k = b.of(Category::kOptimizerAdamW).count() / 12;  // m, v, fp32 master
  EXPECT_EQ(o.of(Category::kOptimizerAdamW).count(), 0);
  EXPECT_EQ(Params(b) - Params(o), k * 2);
  EXPECT_EQ((b.of(Category::kGradients) - o.of(Category::kGradients)).count(), k * 4);
  EXPECT_EQ(o.host.count(), k * 16);
  EXPECT_EQ(b.host.count(), 0);
  // The gathered units stay: the device still holds parameters.
  EXPECT_GT(Params(o), 0);
  EXPECT_EQ(off.memory->verdict.host_per_node.count(), k * 16 * 8);
  // 16 micro-batches (global 512 / dp 32) move 12 B of each owned element.
  const double expected = static_cast<double>(k) * 12.0 * 16.0 / 63e9;
  EXPECT_NEAR(off.time.host_offload_s, expected, 1e-9 * expected);
  EXPECT_EQ(base.time.host_offload_s, 0.0);
}

TEST(FsdpCpuOffload, NeedsFsdpAndAdamW) {
  EXPECT_NE(
      testing::FirstErrorText(Load({"parallel.fsdp_cpu_offload=true", "parallel.zero=1"})).find("set parallel.zero: 3"),
      std::string::npos);
  EXPECT_NE(testing::FirstErrorText(Load({"parallel.fsdp_cpu_offload=true", "training.optimizer.matrices=muon"}))
                .find("CPU AdamW step"),
            std::string::npos);
  EXPECT_NE(testing::FirstErrorText(Load({"parallel.fsdp_cpu_offload=true", "training.optimizer.offload_fraction=0.5"}))
                .find("offload_fraction: 0"),
            std::string::npos);
}

TEST(FsdpCpuOffload, TorchtitanSaysEnableCpuOffload) {
  const LoadResult loaded = Load({"parallel.fsdp_cpu_offload=true"});
  ASSERT_TRUE(loaded.ok());
  const Plan plan = *MakePlan(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe)).plan;
  // TrainingConfig.enable_cpu_offload (torchtitan/config/configs.py @ b5bcd76), a keyword of the config module.
  EXPECT_NE(EmitTorchtitan(*loaded.recipe, plan).text.find("enable_cpu_offload=True,\n"), std::string::npos);
}

}  // namespace
}  // namespace preflight::fsdp_cpu_offload_test

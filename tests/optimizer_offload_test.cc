// training.optimizer.offload_fraction: Megatron's optimizer CPU offload
// (HybridDeviceOptimizer) on Llama 3 8B with AdamW, dp 32, ZeRO 1. With K
// the rank's AdamW elements (its shard), the offloaded ceil(f K) leave the
// device (12 B each: m, v, fp32 master), take 16 B each on the host (fp32
// param, grad, m, v), and move 8 B each over the host link every step
// (grads down, params up; PCIe Gen5 x16, 63 GB/s per direction).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::optimizer_offload_test {
namespace {

LoadResult Load(const std::vector<std::string>& sets) {
  std::vector<Override> overrides = {*ParseOverride("training.optimizer.matrices=adamw")};
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

Plan PlanOf(const std::vector<std::string>& sets) {
  const LoadResult loaded = Load(sets);
  EXPECT_TRUE(loaded.ok()) << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  const Inventory inv = BuildInventory(*loaded.recipe);
  return *MakePlan(inv, LayoutOf(*loaded.recipe)).plan;
}

TEST(OptimizerOffload, HalfTheShardLeavesTheDeviceForTheHost) {
  const Plan base = PlanOf({});
  const Plan half = PlanOf({"training.optimizer.offload_fraction=0.5"});
  const RankMemory& b = base.memory->stages.front();
  const RankMemory& h = half.memory->stages.front();
  ASSERT_EQ(b.of(Category::kOptimizerAdamW).count() % 12, 0);
  const int64_t k = b.of(Category::kOptimizerAdamW).count() / 12;  // m + v + master: 12 B an element
  const int64_t offloaded = (k + 1) / 2;
  EXPECT_EQ(h.of(Category::kOptimizerAdamW).count(), (k - offloaded) * 12);
  EXPECT_EQ(h.host.count(), offloaded * 16);
  EXPECT_EQ(b.host.count(), 0);
  // Eight GPUs a node, each holding that stage's offload, within 2 TB.
  EXPECT_EQ(half.memory->verdict.host_per_node.count(), offloaded * 16 * 8);
  EXPECT_TRUE(half.memory->verdict.host_fits);
  // The step pays the host link: offloaded x 8 B at 63 GB/s, not overlapped.
  EXPECT_EQ(base.time.host_offload_s, 0.0);
  const double expected = static_cast<double>(offloaded) * 8.0 / 63e9;
  EXPECT_NEAR(half.time.host_offload_s, expected, 1e-12 * expected);
  // and the device's update shrinks to the half it keeps.
  EXPECT_NEAR(half.time.optimizer_step_s * 2.0, base.time.optimizer_step_s, 1e-6 * base.time.optimizer_step_s);
  EXPECT_NEAR(half.time.step_s - base.time.step_s, expected - half.time.optimizer_step_s, 1e-9 * base.time.step_s);
}

// The presets' host side, from the specifications: PCIe 5.0 runs 32 GT/s a
// lane with 128b/130b encoding, so x16 carries 32e9 x 16 x 128/130 / 8 =
// 63.0 GB/s per direction; a DGX H100 / H200 has 2 TB of system memory
// (NVIDIA DGX H100/H200 datasheets) = 2e12 / 2^30 = 1862.6 GiB.
TEST(OptimizerOffload, PresetHostSideFollowsTheSpecifications) {
  for (const char* gpu : {"h100", "h200"}) {
    const std::optional<GpuSpec> spec = GpuPreset(gpu);
    ASSERT_TRUE(spec.has_value()) << gpu;
    EXPECT_NEAR(spec->host_link_gbps_per_dir, 32e9 * 16 * 128 / 130 / 8 / 1e9, 0.05) << gpu;
    EXPECT_NEAR(spec->host_memory_gib, 2e12 / 1073741824.0, 0.5) << gpu;
  }
}

TEST(OptimizerOffload, HostMemoryIsAVerdict) {
  // 10 GiB of host a node cannot hold 8 x ~2 GiB.
  const Plan tight = PlanOf({"training.optimizer.offload_fraction=0.5", "cluster.host_memory_gib=10"});
  EXPECT_FALSE(tight.memory->verdict.host_fits);
  EXPECT_FALSE(tight.memory->verdict.fits);
  EXPECT_NE(tight.memory->verdict.reason.find("host memory"), std::string::npos) << tight.memory->verdict.reason;
}

TEST(OptimizerOffload, RefusedWhereMegatronCannotOffload) {
  std::vector<Override> muon = {*ParseOverride("training.optimizer.offload_fraction=1")};
  const LoadResult m = LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), muon);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.diagnostics.front().key_path, "training.optimizer.offload_fraction");
  const LoadResult ddp = Load({"training.optimizer.offload_fraction=1", "parallel.zero=0"});
  ASSERT_FALSE(ddp.ok());
  EXPECT_EQ(ddp.diagnostics.front().key_path, "training.optimizer.offload_fraction");
}

}  // namespace
}  // namespace preflight::optimizer_offload_test

// The offloads through the executor (simulator/dist_optimizer.h PlaceState):
// Megatron's optimizer CPU offload (training.optimizer.offload_fraction, its
// HybridDeviceOptimizer) and FSDP2's CPU offload (parallel.fsdp_cpu_offload).
// The step's numerics stay those of the unsharded reference; the host memory
// the rank keeps and the bytes it copies over the host link are measured and
// must equal fit's `host` and plan's `host_transfer`, and the hand figures:
// an offloaded AdamW element leaves its 12 device bytes (m, v, fp32 master)
// for 16 host bytes (fp32 param, grad, m, v), and moves 4 B each way a step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_offload_test {
namespace {

using testing_sim::ExpectStepAgrees;
using testing_sim::FindMemory;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

/// tp 2 with SP, pp 2, ep 2, dp 2, AdamW everywhere (the offloads are
/// Adam's): one layer each of A, E (padded capacity), M and D.
std::vector<Override> SmallHybrid(int zero, std::vector<Override> more) {
  std::vector<Override> o = {{"model.pattern", "AEMD"},
                             {"model.moe.pad_to_capacity", "true"},
                             {"cluster.nodes", "1"},
                             {"cluster.gpus_per_node", "8"},
                             {"parallel.tp", "2"},
                             {"parallel.sp", "true"},
                             {"parallel.pp", "2"},
                             {"parallel.ep", "2"},
                             {"training.global_batch", "8"},
                             {"training.optimizer.matrices", "adamw"},
                             {"parallel.zero", std::to_string(zero)}};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

/// The stage's host row and host-link row (measured == modeled, both > 0).
struct Host {
  int64_t bytes = 0, copied = 0;
};
Host ExpectHostAgrees(const StageComparison& s) {
  Host h;
  const MemoryAgreement& m = FindMemory(s, "host (offloaded)");
  EXPECT_GT(m.measured, 0) << "stage " << s.pipeline_rank;
  EXPECT_EQ(m.measured, m.modeled) << "stage " << s.pipeline_rank;
  h.bytes = m.measured;
  for (const CommAgreement& a : s.comm) {
    if (a.axis != "host") continue;
    EXPECT_GT(a.measured_sent, 0);
    EXPECT_EQ(a.measured_sent, a.modeled_sent) << "stage " << s.pipeline_rank;
    h.copied = a.measured_sent;
  }
  EXPECT_GT(h.copied, 0) << "no host-link row, stage " << s.pipeline_rank;
  return h;
}

/// The stage's worst rank's AdamW state on the device.
int64_t AdamWBytes(const SimComparison& c, int64_t stage) {
  return FindMemory(Stage(c, stage), "optimizer_adamw").measured;
}

TEST(SimulatorOffload, HalfTheOptimizerOnTheHostAtZeroOneTwoAndThree) {
  for (int zero : {1, 2, 3}) {
    const SimComparison base = ExpectStepAgrees(ScaledDefault(SmallHybrid(zero, {})));
    const SimComparison half =
        ExpectStepAgrees(ScaledDefault(SmallHybrid(zero, {{"training.optimizer.offload_fraction", "0.5"}})));
    for (int64_t s = 0; s < 2; ++s) {
      const Host h = ExpectHostAgrees(Stage(half, s));
      // The device keeps the rest; each element moved took 12 B off it.
      EXPECT_EQ(h.bytes % 16, 0);
      const int64_t moved = h.bytes / 16;
      EXPECT_EQ(AdamWBytes(half, s), AdamWBytes(base, s) - moved * 12) << "zero " << zero << " stage " << s;
      EXPECT_EQ(h.copied, moved * 8);
      // At least half of the shard's AdamW elements, and at most one more
      // per optimizer (dense and expert) than half.
      const int64_t kept = AdamWBytes(base, s) / 12;
      EXPECT_GE(2 * moved, kept);
      EXPECT_LE(2 * moved, kept + 4);
    }
  }
}

TEST(SimulatorOffload, TheWholeOptimizerOnTheHost) {
  const SimComparison base = ExpectStepAgrees(ScaledDefault(SmallHybrid(1, {})));
  const SimComparison all =
      ExpectStepAgrees(ScaledDefault(SmallHybrid(1, {{"training.optimizer.offload_fraction", "1.0"}})));
  for (int64_t s = 0; s < 2; ++s) {
    const Host h = ExpectHostAgrees(Stage(all, s));
    EXPECT_EQ(AdamWBytes(all, s), 0);
    ASSERT_EQ(AdamWBytes(base, s) % 12, 0);
    const int64_t elements = AdamWBytes(base, s) / 12;
    EXPECT_EQ(h.bytes, elements * 16);
    EXPECT_EQ(h.copied, elements * 8);
  }
}

TEST(SimulatorOffload, FsdpCpuOffloadKeepsTheShardsOnTheHost) {
  const SimComparison base = ExpectStepAgrees(ScaledDefault(SmallHybrid(3, {})));
  const Recipe r = ScaledDefault(SmallHybrid(3, {{"parallel.fsdp_cpu_offload", "true"}}));
  const SimComparison off = ExpectStepAgrees(r);
  for (int64_t s = 0; s < 2; ++s) {
    const Host h = ExpectHostAgrees(Stage(off, s));
    EXPECT_EQ(AdamWBytes(off, s), 0);
    ASSERT_EQ(AdamWBytes(base, s) % 12, 0);
    EXPECT_EQ(h.bytes, AdamWBytes(base, s) / 12 * 16);
    // Only the gathered units' parameters and one unit's unsharded gradients
    // stay on the device: less than without the offload.
    EXPECT_LT(FindMemory(Stage(off, s), "params (sum of classes)").measured,
              FindMemory(Stage(base, s), "params (sum of classes)").measured);
    EXPECT_LT(FindMemory(Stage(off, s), "gradients").measured, FindMemory(Stage(base, s), "gradients").measured);
  }
}

}  // namespace
}  // namespace preflight::simulator_offload_test

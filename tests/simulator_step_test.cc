// A full training step of small recipes through the executor, compared with
// the planner and the estimator where their figures claim exactness: the
// data-parallel traffic and the optimizer state of buffers that do NOT split
// evenly over their group (the distributed optimizer pads them,
// simulator/dist_optimizer.h), and the activation peak of the interleaved
// schedule with chunks of unequal bytes (the estimator replays the schedule,
// include/preflight/pipeline_replay.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_step_test {
namespace {

// The default recipe scaled small (testing_sim::ScaledDefault): hidden 16,
// so a norm of 16 elements is not a multiple of 3.
using testing_sim::ScaledDefault;

/// Three data-parallel replicas: 3 nodes of 8 = 24 GPUs, tp 4, pp 2, dp 3;
/// ep 4 so that the expert group d_e = t c d / (e t_e) = 12 / 4 = 3 too.
std::vector<Override> DpThree(int zero) {
  return {{"model.pattern", "AEDD"},         {"model.moe.pad_to_capacity", "true"},
          {"cluster.nodes", "3"},            {"parallel.pp", "2"},
          {"parallel.ep", "4"},              {"training.global_batch", "24"},
          {"parallel.zero", std::to_string(zero)}};
}

const MemoryAgreement* Row(const StageComparison& s, const std::string& category) {
  for (const MemoryAgreement& m : s.memory) {
    if (m.category == category) return &m;
  }
  return nullptr;
}

void ExpectExactStep(const Recipe& r) {
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_TRUE(c.numerics_ok);
  EXPECT_TRUE(c.comm_ok());
  EXPECT_TRUE(c.memory_ok());
  for (const StageComparison& s : c.stages) {
    for (const CommAgreement& a : s.comm) {
      if (a.exact) {
        EXPECT_EQ(a.measured_sent, a.modeled_sent)
            << "stage " << s.pipeline_rank << ": " << a.axis << " " << a.kind << " " << a.pass << " " << a.what;
      }
    }
    // The optimizer states (padded shares) and the activations (the
    // schedule's peak) are exact, not merely within the tolerance.
    for (const char* category : {"optimizer_muon", "optimizer_adamw", "gradients", "activations",
                                 "in-flight micro-batches"}) {
      const MemoryAgreement* m = Row(s, category);
      ASSERT_NE(m, nullptr) << category;
      EXPECT_EQ(m->measured, m->modeled) << "stage " << s.pipeline_rank << ": " << category;
    }
  }
}

TEST(SimulatorStep, UnevenBuffersZeroZero) {
  const Recipe r = ScaledDefault(DpThree(0));
  ASSERT_EQ(r.dp(), 3);
  // The premise: a layer's replicated elements (its norm, and the router of
  // the MoE layer) do not divide by D = 3, so its buffers are padded.
  const Inventory inv = BuildInventory(r);
  ASSERT_NE(inv.layers.at(0).totals.of(ShardClass::kReplicated) % 3, 0);
  ExpectExactStep(r);
}

TEST(SimulatorStep, UnevenBuffersZeroOne) {
  const Recipe r = ScaledDefault(DpThree(1));
  ASSERT_EQ(r.dp(), 3);
  ExpectExactStep(r);
}

TEST(SimulatorStep, InterleavedHybridChunksPeakExactly) {
  // The default recipe's A/E/D pattern on pp 4 x vpp 3 (tp 4, dp 1, 16
  // ranks): one layer per chunk, so a rank holds chunks as unequal as one
  // attention layer beside an MoE layer; the estimator's replay must find the
  // executor's measured peak. Counting the first warmup + 1 forwards per chunk
  // missed it: on rank 0 the chunk with the embedding's ids holds 8
  // micro-batches at the peak, not 7; rank 3 peaks with its two MoE chunks
  // full and nothing on its D + head chunk.
  const Recipe r = ScaledDefault({{"model.pattern", "AEDEAEDEAEDD"},
                                  {"model.moe.pad_to_capacity", "true"},
                                  {"cluster.nodes", "2"},
                                  {"parallel.ep", "4"},
                                  {"parallel.vpp", "3"},
                                  {"parallel.schedule", "interleaved"},
                                  {"parallel.partition", "balanced"}});  // Megatron's hybrids need '|' cuts for vpp
  ExpectExactStep(r);
}

}  // namespace
}  // namespace preflight::simulator_step_test

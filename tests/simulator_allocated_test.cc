// The allocator figures simulate measures per rank (what stays allocated
// after the optimizer step, and the most allocated during the step) beside
// fit's allocated_static_bytes / allocated_peak_bytes (docs/simulate.md).
#include <gtest/gtest.h>

#include <algorithm>

#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_allocated_test {
namespace {

using testing_sim::FindMemory;
using testing_sim::OneStage;
using testing_sim::Stage;

TEST(SimulatorAllocated, BetweenStepsIsTheModelStateOfOneStage) {
  // One dense stage (tp 4, ZeRO 1): between steps a rank holds exactly its
  // parameters, gradient buffers and optimizer state (each allocated once for
  // the whole step, so its peak is its size), as fit prices them.
  const Recipe r = OneStage({{"model.pattern", "AD"}, {"training.recompute", "none"}});
  const SimulationReport rep = Simulate(r);
  for (const RankMeasurement& m : rep.per_rank) {
    int64_t state = 0;
    for (SimCategory c : {SimCategory::kReplicatedParams, SimCategory::kTpShardedParams, SimCategory::kEpShardedParams,
                          SimCategory::kGradients, SimCategory::kOptimizerMuon, SimCategory::kOptimizerAdamW}) {
      state += m.peak_bytes[static_cast<size_t>(c)];
    }
    EXPECT_EQ(m.allocated_static_bytes, state) << "rank " << m.rank;
    // The step's peak holds that and the activation peak at least.
    EXPECT_GE(m.allocated_peak_bytes,
              m.allocated_static_bytes + m.peak_bytes[static_cast<size_t>(SimCategory::kActivations)]);
  }
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  const MemoryAgreement& row = FindMemory(Stage(c, 0), "allocated between steps");
  EXPECT_GT(row.measured, 0);
  EXPECT_EQ(row.measured, row.modeled);
}

}  // namespace
}  // namespace preflight::simulator_allocated_test

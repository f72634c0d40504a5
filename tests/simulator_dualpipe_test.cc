// DualPipe in the executor: the scaled DeepSeek-V3 recipe on DeepSeek's
// two-direction schedule (simulator/schedule.cc DualPipe: every rank holds
// stage r and a copy of stage p-1-r, half the micro-batches enter at each
// end), numerics against one rank, the copies' gradient sum and the p2p bytes
// against plan, and per-chunk activations against fit's replay of the same
// order (ReplayDualPipe), with routing padded to capacity so the MoE
// activations compare exactly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/estimator/pipeline_replay.h"
#include "preflight/simulator/sim.h"
#include "schedule.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_dualpipe_test {
namespace {

Recipe ScaledDualPipe(int64_t pp, std::vector<Override> more) {
  std::vector<Override> sets = {
      {"parallel.schedule", "dualpipe"},     {"parallel.pp", std::to_string(pp)}, {"parallel.ep", "2"},
      {"training.recompute", "none"},        {"model.mtp_layers", "0"},           {"model.moe.dropless", "false"},
      {"model.moe.pad_to_capacity", "true"}, {"model.moe.capacity_factor", "1.0"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml", sets, /*max_world=*/2 * pp);
}

/// The copies' gradient sum over each mirror pair: measured and priced.
void ExpectCopiesSummed(const SimComparison& c) {
  for (const StageComparison& s : c.stages) {
    const CommAgreement* a = testing_sim::FindComm(s, Axis::kPpMirror, Collective::kAllReduce, Pass::kOptimizer,
                                                   CommWhat::kDualPipeCopyGrads);
    ASSERT_NE(a, nullptr) << "stage " << s.pipeline_rank;
    EXPECT_GT(a->measured_sent, 0);
  }
}

TEST(SimulatorDualPipe, TwoStagesAgree) {
  const SimComparison c = testing_sim::ExpectStepAgrees(ScaledDualPipe(2, {}));
  ExpectCopiesSummed(c);
  // The README's PP + 1 stage-micro-batches on every rank.
  for (const StageComparison& s : c.stages)
    EXPECT_EQ(testing_sim::FindMemory(s, "in-flight micro-batches").measured, 3);
}

TEST(SimulatorDualPipe, FourStagesWithTheRouterBiasAgree) {
  // Each copy of an MoE layer routes one direction's micro-batches: the
  // expert-bias counts are summed over the mirror pair too.
  const SimComparison c = testing_sim::ExpectStepAgrees(ScaledDualPipe(4, {}));
  ExpectCopiesSummed(c);
}

TEST(SimulatorDualPipe, MtpAndTensorParallelAgree) {
  // Ranks 0 and p-1 hold both ends: the MTP module reads the rank's own
  // embedding, no third copy, and the mirror sum carries the embedding's.
  testing_sim::ExpectStepAgrees(
      ScaledDualPipe(2, {{"model.mtp_layers", "1"}, {"parallel.tp", "2"}, {"parallel.sp", "true"}}));
}

TEST(SimulatorDualPipe, ShippedShapeWithFullRecomputeAndMtpAgrees) {
  // The shipped recipe's knobs (full recompute, MTP) on 4 stages.
  const SimComparison c =
      testing_sim::ExpectStepAgrees(ScaledDualPipe(4, {{"training.recompute", "full"}, {"model.mtp_layers", "1"}}));
  ExpectCopiesSummed(c);
}

TEST(SimulatorDualPipe, ReplayHoldsWhatTheScheduleHolds) {
  // fit's replay (estimator, pipeline_replay.h) and the executor's order
  // (simulator/schedule.cc) are two copies of DualPipe.step: with one byte per
  // micro-batch on each chunk, the replay's peak is the schedule's in-flight peak.
  for (int64_t p : {2, 4, 8, 16}) {
    for (int64_t m : {2 * p, 2 * p + 2, 30 * p}) {
      for (int64_t r = 0; r < p; ++r) {
        const DualPipeVPeak peak = ReplayDualPipe(p, m, r, [](int64_t) { return ChunkActivation{1, 0}; });
        const std::vector<sim::PipeOp> ops = sim::PipelineSchedule(Schedule::kDualPipe, p, 2, m, r);
        EXPECT_EQ(peak.units, sim::PeakInFlight(ops)) << "p " << p << " m " << m << " r " << r;
        EXPECT_EQ(peak.bytes, peak.units);
      }
    }
  }
}

}  // namespace
}  // namespace preflight::simulator_dualpipe_test

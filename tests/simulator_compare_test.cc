// The agreement check: counted bytes against the planner, measured memory
// against the estimator, for small recipes where both claim exactness.
#include <gtest/gtest.h>

#include <string>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_compare_test {
namespace {

using testing_sim::Disagreements;
using testing_sim::FindComm;
using testing_sim::OneStage;
using testing_sim::Stage;

TEST(SimulatorCompare, DenseTpSpAgreesExactlyWithPlanner) {
  const Recipe r = OneStage({{"model.pattern", "AD"}});
  ASSERT_EQ(r.world(), 4);
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_TRUE(c.agrees()) << Disagreements(c);
  ASSERT_EQ(c.stages.size(), 1u);
  for (const CommAgreement& a : Stage(c, 0).comm) {
    EXPECT_TRUE(a.exact) << a.what;
    EXPECT_TRUE(a.in_model && a.in_run) << a.axis << " " << a.kind << " " << a.pass << " " << a.what;
  }
  // X = s b h beta = 8 * 16 * 2 = 256 B per micro-batch; attention's backward
  // AG (dy gather + input re-gather) sends 2 * (t-1)/t X = 384 B per
  // micro-batch, and the step runs 2 micro-batches: 768 B.
  const CommAgreement* a =
      FindComm(Stage(c, 0), Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kAttention);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->measured_sent, 768);
  EXPECT_EQ(a->modeled_sent, 768);
}

TEST(SimulatorCompare, PaddedMoeAgreesExactlyOnExpertAxes) {
  const Recipe r = OneStage({{"model.pattern", "AE"}, {"parallel.ep", "2"}, {"parallel.expert_tp", "2"},
                             {"model.moe.pad_to_capacity", "true"}});
  ASSERT_EQ(r.world(), 4);
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_TRUE(c.comm_ok()) << Disagreements(c);
  // T = 2 tokens per rank, C = ceil(2 * 2 / 64 * 1.25) = 1: E * C = 64 rows of
  // 16 x 2 B = 2048 B per A2A buffer; (e-1)/e of it = 1024 B on the wire per
  // micro-batch, 2 micro-batches.
  const CommAgreement* d =
      FindComm(Stage(c, 0), Axis::kEp, Collective::kAllToAll, Pass::kForward, CommWhat::kMoeDispatch);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->exact);
  EXPECT_EQ(d->measured_sent, 2 * 1024);
  EXPECT_EQ(d->modeled_sent, 2 * 1024);
  // Expert-TP all-gather of the 64 received rows: (t_e - 1) x 2048 B per micro-batch.
  const CommAgreement* g =
      FindComm(Stage(c, 0), Axis::kExpertTp, Collective::kAllGather, Pass::kForward, CommWhat::kMoeExperts);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->measured_sent, 2 * 2048);
  EXPECT_EQ(g->modeled_sent, 2 * 2048);
}

TEST(SimulatorCompare, DroplessRoutingBucketsAreInformational) {
  const Recipe r = OneStage({{"model.pattern", "AE"}, {"parallel.ep", "2"}});
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  const CommAgreement* d =
      FindComm(Stage(c, 0), Axis::kEp, Collective::kAllToAll, Pass::kForward, CommWhat::kMoeDispatch);
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->exact);
  const CommAgreement* counts =
      FindComm(Stage(c, 0), Axis::kEp, Collective::kAllToAll, Pass::kForward, CommWhat::kMoeCounts);
  ASSERT_NE(counts, nullptr);
  EXPECT_FALSE(counts->in_model);
  // Counts exchange: 32 local experts' int64 counts to the one other EP rank =
  // 256 B per micro-batch, 2 micro-batches.
  EXPECT_EQ(counts->measured_sent, 2 * 256);
  // Exact buckets still hold: the replicated-grad all-reduce over TP.
  const CommAgreement* rep_grads =
      FindComm(Stage(c, 0), Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads);
  ASSERT_NE(rep_grads, nullptr);
  EXPECT_TRUE(rep_grads->agrees);
}

TEST(SimulatorCompare, ACountThatDiffersIsADisagreement) {
  const Recipe r = OneStage({{"model.pattern", "AD"}});
  SimulationReport rep = Simulate(r);
  rep.per_rank[0].comm[0].bytes_sent += 2;  // one bf16 element too many
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_FALSE(c.comm_ok());
  EXPECT_FALSE(c.agrees());
  rep = Simulate(r);
  rep.gradients[0].max_rel = 1e-6;  // a gradient off by more than fp64 tolerance
  EXPECT_FALSE(CompareWithModels(r, rep, SimPrecision::kFp64).numerics_ok);
  rep = Simulate(r);
  rep.updates[0].max_rel = 1e-6;  // an optimizer update off by more than fp64 tolerance
  EXPECT_FALSE(CompareWithModels(r, rep, SimPrecision::kFp64).numerics_ok);
}

}  // namespace
}  // namespace preflight::simulator_compare_test

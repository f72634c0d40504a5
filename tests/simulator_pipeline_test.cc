// One training step of the executor over pipeline stages and data-parallel
// replicas: sharded numerics (losses, gradients, AdamW and Muon updates)
// equal the unsharded run, and every stage's counted bytes and measured
// memory equal the planner's and the estimator's figures. Byte counts worked
// by hand in the comments (docs/formulas.md §7.2).
#include <gtest/gtest.h>

#include <string>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_pipeline_test {
namespace {

using testing_sim::Disagreements;
using testing_sim::FindComm;
using testing_sim::FindMemory;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

void ExpectAgree(const Recipe& r, const SimulationReport& rep) { testing_sim::ExpectStepAgrees(r, rep); }

/// Dense stack AD x 2 (two transformer layers) over pp 2, tp 2 (sp), dp 2:
/// 8 ranks, 4 micro-batches; Megatron's split puts one layer on each stage.
Recipe DensePipeline(std::vector<Override> sets = {}) {
  sets.insert(sets.begin(), {{"model.pattern", "AD"}, {"parallel.pp", "2"}, {"parallel.tp", "2"}});
  return ScaledDefault(sets, /*max_world=*/8);
}

TEST(SimulatorPipeline, OneFOneBOverTwoStagesAndTwoReplicas) {
  const Recipe r = DensePipeline();
  ASSERT_EQ(r.world(), 8);
  ASSERT_EQ(r.dp(), 2);
  const SimulationReport rep = Simulate(r);
  EXPECT_EQ(rep.microbatches, 4);
  ExpectAgree(r, rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  // Stage 0 sends each micro-batch's activations forward: s b h beta / t
  // (SP-sharded) = 8 x 16 x 2 / 2 = 128 B, 4 micro-batches: 512 B.
  const CommAgreement* fwd =
      FindComm(Stage(c, 0), Axis::kPp, Collective::kSendRecv, Pass::kForward, CommWhat::kActivations);
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->measured_sent, 512);
  // and stage 1 sends the gradients back, the same bytes.
  const CommAgreement* bwd =
      FindComm(Stage(c, 1), Axis::kPp, Collective::kSendRecv, Pass::kBackward, CommWhat::kActivationGrads);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->measured_sent, 512);
  // 1F1B with m = 4 >= p = 2: stage 0 holds 2 micro-batches, stage 1 one.
  EXPECT_EQ(FindMemory(Stage(c, 0), "in-flight micro-batches").measured, 2);
  EXPECT_EQ(FindMemory(Stage(c, 1), "in-flight micro-batches").measured, 1);
}

TEST(SimulatorPipeline, InterleavedOverTwoStages) {
  const Recipe r = DensePipeline({{"parallel.vpp", "2"}, {"parallel.schedule", "interleaved"}});
  const SimulationReport rep = Simulate(r);
  ExpectAgree(r, rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  // p = 2, v = 2, m = 4: stage 0 warms up 2(p-1) + (v-1)p = 4 forwards and
  // then holds 5 chunk-micro-batches; stage 1 warms up 2, holds 3.
  EXPECT_EQ(FindMemory(Stage(c, 0), "in-flight micro-batches").measured, 5);
  EXPECT_EQ(FindMemory(Stage(c, 1), "in-flight micro-batches").measured, 3);
}

TEST(SimulatorPipeline, InterleavedWithALargerMicrobatchGroup) {
  // parallel.microbatch_group 4 (Megatron's group, pp by default): stage 0
  // warms up 2(p-1) + (v-1) 4 = 6 forwards and holds 7 of its 8
  // chunk-micro-batches; stage 1 warms up 4, holds 5. fit agrees.
  const Recipe r =
      DensePipeline({{"parallel.vpp", "2"}, {"parallel.schedule", "interleaved"}, {"parallel.microbatch_group", "4"}});
  const SimulationReport rep = Simulate(r);
  ExpectAgree(r, rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_EQ(FindMemory(Stage(c, 0), "in-flight micro-batches").measured, 7);
  EXPECT_EQ(FindMemory(Stage(c, 1), "in-flight micro-batches").measured, 5);
}

TEST(SimulatorPipeline, DataParallelGradientsAllReducedWithoutZero) {
  const Recipe r = DensePipeline({{"parallel.zero", "0"}});
  const SimulationReport rep = Simulate(r);
  ExpectAgree(r, rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_NE(FindComm(Stage(c, 0), Axis::kDpCp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kGrads), nullptr);
  EXPECT_EQ(FindComm(Stage(c, 0), Axis::kDpCp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kGrads),
            nullptr);
  EXPECT_EQ(FindComm(Stage(c, 0), Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonGather),
            nullptr);
}

TEST(SimulatorPipeline, ZeroOneShardsStateAndGathersMuonMatrices) {
  const Recipe r = DensePipeline({{"parallel.zero", "1"}});
  const SimulationReport rep = Simulate(r);
  ExpectAgree(r, rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  // Megatron cuts between transformer layers: stage 1 = the second layer (A
  // and D) + final norm + head. Its Muon buffers: A's W_qkv 16 x (32 + 2 x 8)
  // x 4 = 3072 and W_o 128 x 16 = 2048, D's 3 x 16 x 16 = 768: 5888 global
  // elements, 2944 local over t = 2, 1472 per rank over d x c = 2, at
  // momentum 4 B + master 4 B.
  const StagePlan stages = SimulatedStages(r);
  ASSERT_EQ(stages.chunks.size(), 2u);
  EXPECT_EQ(stages.chunks[1].first_layer, 2);  // sublayer 2: the second layer's attention
  EXPECT_EQ(FindMemory(Stage(c, 1), "optimizer_muon").measured, 1472 * 8);
  // The momentum-updated shares are gathered back (Moonshot Distributed
  // Muon): (d-1)/d x 2944 elements x 4 B = 5888 B.
  const CommAgreement* g =
      FindComm(Stage(c, 1), Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonGather);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->measured_sent, 5888);
  // Then each TP-sharded Muon matrix is gathered over TP in its global shape
  // ("duplicated"): (t-1)/t x 5888 global elements x 4 B = 11776 B.
  const CommAgreement* t =
      FindComm(Stage(c, 1), Axis::kTp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonTpGather);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->measured_sent, 11776);
}

TEST(SimulatorPipeline, AdamWEverywhereHasNoMuonState) {
  const Recipe r = DensePipeline({{"training.optimizer.matrices", "adamw"}});
  const SimulationReport rep = Simulate(r);
  ExpectAgree(r, rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_EQ(FindMemory(Stage(c, 1), "optimizer_muon").measured, 0);
  EXPECT_GT(FindMemory(Stage(c, 1), "optimizer_adamw").measured, 0);
}

TEST(SimulatorPipeline, ExpertsOverDataParallelAndPipeline) {
  // pp 2, tp 2, dp 2, ep 4 folded over tp x dp: expert grads over d_e = 1.
  const Recipe r = ScaledDefault({{"model.pattern", "AE"}, {"parallel.pp", "2"}, {"parallel.tp", "2"},
                                  {"parallel.ep", "4"}, {"model.moe.pad_to_capacity", "true"}},
                                 /*max_world=*/8);
  ASSERT_EQ(r.world(), 8);
  const SimulationReport rep = Simulate(r);
  ExpectAgree(r, rep);
  EXPECT_EQ(rep.dropped_pairs, rep.dropped_pairs_reference);
}

TEST(SimulatorPipeline, Fp32StepAgreesToFp32Tolerance) {
  const Recipe r = DensePipeline();
  SimOptions opt;
  opt.precision = SimPrecision::kFp32;
  const SimulationReport rep = Simulate(r, opt);
  const NumericsTolerance tol = ToleranceFor(SimPrecision::kFp32);
  EXPECT_LE(rep.loss.max_rel, tol.values);
  EXPECT_LE(rep.worst_gradient.max_rel, tol.gradients) << rep.worst_gradient.name;
  EXPECT_LE(rep.worst_update.max_rel, tol.updates) << rep.worst_update.name;
}

}  // namespace
}  // namespace preflight::simulator_pipeline_test

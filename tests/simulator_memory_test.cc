// Measured peaks of the executor beside the estimator's figures for the same
// scaled recipe: parameters, gradients and optimizer state exactly,
// activations within the documented tolerance (simulator/compare.cc).
#include <gtest/gtest.h>

#include <string>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_memory_test {
namespace {

using testing_sim::Disagreements;
using testing_sim::FindMemory;
using testing_sim::OneStage;
using testing_sim::Stage;

TEST(SimulatorMemory, ParamsGradsAndOptimizerStateMatchTheEstimatorExactly) {
  const Recipe r = OneStage({{"model.pattern", "ADE"}, {"parallel.ep", "4"}});
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  for (const char* k : {"replicated_params", "tp_sharded_params", "ep_sharded_params", "gradients", "optimizer_muon",
                        "optimizer_adamw"}) {
    EXPECT_EQ(FindMemory(Stage(c, 0), k).measured, FindMemory(Stage(c, 0), k).modeled) << k;
    EXPECT_GT(FindMemory(Stage(c, 0), k).measured, 0) << k;
  }
}

TEST(SimulatorMemory, DenseParamsByHand) {
  // Hand count. tp 4, h 16, vocab 40 padded to 8 x 4 = 64, pattern AD with heads
  // 32/8 of dim 4 and ffn 16; bf16 params (2 B), fp32 grads (4 B).
  // REP: 2 block norms + final norm = 3 x 16 = 48 elements.
  // TP per rank: embedding + head 2 x 64/4 x 16 = 512, qkv 16 x (32 + 2 x 8) x 4 / 4 = 768,
  // o 128 x 16 / 4 = 512, mlp 3 x 16 x 16 / 4 = 192: 1984 elements.
  const Recipe r = OneStage({{"model.pattern", "AD"}});
  const SimulationReport rep = Simulate(r);
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kReplicatedParams)], 48 * 2);
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kTpShardedParams)], 1984 * 2);
  // fp32 gradients of both: (48 + 1984) x 4 B.
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kGradients)], (48 + 1984) * 4);
  // Optimizer state, ZeRO 1 over dp = 1 (the default recipe's zero): Muon owns
  // qkv, o and the three MLP matrices: 768 + 512 + 192 = 1472 elements at
  // momentum 4 B + master 4 B; AdamW owns the norms and the vocab tensors:
  // 48 + 512 = 560 elements at m + v 8 B + master 4 B.
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kOptimizerMuon)], 1472 * 8);
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kOptimizerAdamW)], 560 * 12);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_EQ(FindMemory(Stage(c, 0), "tp_sharded_params").modeled, 1984 * 2);
  EXPECT_EQ(FindMemory(Stage(c, 0), "optimizer_muon").modeled, 1472 * 8);
  EXPECT_EQ(FindMemory(Stage(c, 0), "optimizer_adamw").modeled, 560 * 12);
}

TEST(SimulatorMemory, DenseActivationsWithinTolerance) {
  const Recipe r = OneStage({{"model.pattern", "AD"}});
  const SimComparison c = CompareWithModels(r, Simulate(r), SimPrecision::kFp64);
  EXPECT_TRUE(FindMemory(Stage(c, 0), "activations").agrees) << Disagreements(c);
}

TEST(SimulatorMemory, PaddedMoeActivationsWithinTolerance) {
  const Recipe r = OneStage({{"model.pattern", "AE"}, {"parallel.ep", "2"}, {"model.moe.pad_to_capacity", "true"}});
  const SimComparison c = CompareWithModels(r, Simulate(r), SimPrecision::kFp64);
  EXPECT_TRUE(FindMemory(Stage(c, 0), "activations").agrees) << Disagreements(c);
}

}  // namespace
}  // namespace preflight::simulator_memory_test

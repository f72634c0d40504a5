// Measured peaks of the executor beside the estimator's figures for the same
// scaled recipe: parameters and gradients exactly, activations within the
// documented tolerance (simulator/compare.cc).
#include <gtest/gtest.h>

#include <string>

#include "preflight/recipe.h"
#include "preflight/sim.h"

namespace preflight {
namespace {

Recipe Scaled(const std::vector<Override>& sets) {
  const LoadResult loaded = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/nam56r-h200.yaml", sets);
  EXPECT_TRUE(loaded.ok());
  ScaleOptions s;
  s.hidden = 16;
  s.head_dim = 4;
  s.ffn_hidden = 16;
  s.moe_ffn_hidden = 8;
  s.vocab = 40;
  s.seq_len = 8;
  return ScaleRecipe(*loaded.recipe, s);
}

const MemoryAgreement& Row(const SimComparison& c, const std::string& category) {
  for (const MemoryAgreement& m : c.memory) {
    if (m.category == category) return m;
  }
  ADD_FAILURE() << "no row " << category;
  static const MemoryAgreement kNone;
  return kNone;
}

TEST(SimulatorMemory, ParamsAndGradsMatchTheEstimatorExactly) {
  const Recipe r = Scaled({{"model.pattern", "ADE"}, {"parallel.ep", "4"}});
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64, 0);
  for (const char* k : {"replicated_params", "tp_sharded_params", "ep_sharded_params", "gradients"}) {
    EXPECT_EQ(Row(c, k).measured, Row(c, k).modeled) << k;
    EXPECT_GT(Row(c, k).measured, 0) << k;
  }
}

TEST(SimulatorMemory, DenseParamsByHand) {
  // Hand count. tp 4, h 16, vocab 40 padded to 8 x 4 = 64, pattern AD with heads
  // 32/8 of dim 4 and ffn 16; bf16 params (2 B), fp32 grads (4 B).
  // REP: 2 block norms + final norm = 3 x 16 = 48 elements.
  // TP per rank: embedding + head 2 x 64/4 x 16 = 512, qkv 16 x (32 + 2 x 8) x 4 / 4 = 768,
  // o 128 x 16 / 4 = 512, mlp 3 x 16 x 16 / 4 = 192: 1984 elements.
  const Recipe r = Scaled({{"model.pattern", "AD"}});
  const SimulationReport rep = Simulate(r);
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kReplicatedParams)], 48 * 2);
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kTpShardedParams)], 1984 * 2);
  // fp32 gradients of both: (48 + 1984) x 4 B.
  EXPECT_EQ(rep.per_rank[0].peak_bytes[static_cast<size_t>(SimCategory::kGradients)], (48 + 1984) * 4);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64, 0);
  EXPECT_EQ(Row(c, "tp_sharded_params").modeled, 1984 * 2);
}

TEST(SimulatorMemory, DenseActivationsWithinTolerance) {
  const Recipe r = Scaled({{"model.pattern", "AD"}});
  const SimComparison c = CompareWithModels(r, Simulate(r), SimPrecision::kFp64, 0);
  EXPECT_TRUE(Row(c, "activations").agrees) << Row(c, "activations").measured << " vs " << Row(c, "activations").modeled;
}

TEST(SimulatorMemory, PaddedMoeActivationsWithinTolerance) {
  const Recipe r = Scaled({{"model.pattern", "AE"}, {"parallel.ep", "2"}, {"model.moe.pad_to_capacity", "true"}});
  const SimComparison c = CompareWithModels(r, Simulate(r), SimPrecision::kFp64, 0);
  EXPECT_TRUE(Row(c, "activations").agrees) << Row(c, "activations").measured << " vs " << Row(c, "activations").modeled;
}

}  // namespace
}  // namespace preflight

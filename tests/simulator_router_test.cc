// DeepSeek-V3's router in the executor (simulator/moe_block.cc): sigmoid
// scores normalised over the chosen experts, and the fp32 expert bias that
// chooses the experts but never weighs them, moved after the step by the sign
// of each expert's load (Megatron-LM moe_utils.py topk_routing_with_score_function
// and get_updated_expert_bias, router.py, NVIDIA/Megatron-LM d98e8a6).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "blocks.h"
#include "preflight/inventory/inventory.h"
#include "preflight/simulator/sim.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_router_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::OnOneRank;
using testing::Random;

/// h 8, 4 experts (ffn 6) and a shared expert, 12 tokens.
Dims RouterDims(int64_t top_k, bool bias) {
  Dims d;
  d.hidden = 8;
  d.experts = 4;
  d.top_k = top_k;
  d.expert_ffn = 6;
  d.shared_ffn = 6;
  d.router_sigmoid = true;
  d.router_bias = bias;
  d.seq = 6;
  d.batch = 2;
  return d;
}

void CheckFd(const Dims& d, const std::string& what) {
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, 1e-6, what);
  });
}

TEST(SimulatorRouter, SigmoidTopTwoMatchesFiniteDifferences) { CheckFd(RouterDims(2, false), "sigmoid k 2"); }
TEST(SimulatorRouter, SigmoidTopOneMatchesFiniteDifferences) { CheckFd(RouterDims(1, false), "sigmoid k 1"); }
TEST(SimulatorRouter, SigmoidWithBiasMatchesFiniteDifferences) { CheckFd(RouterDims(2, true), "sigmoid + bias"); }

/// The block's output for input `x` with its expert bias set to `bias`.
Mat<double> OutputWithBias(const Dims& d, const Mat<double>& x, const std::vector<double>& bias) {
  Mat<double> y;
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
    ExpertBias<double>* b = block->expert_bias();
    ASSERT_NE(b, nullptr);
    for (size_t e = 0; e < bias.size(); ++e) b->bias.m(0, static_cast<int64_t>(e)) = bias[e];
    y = block->Forward(ctx, x);
  });
  return y;
}

// The bias only chooses: adding the same constant to every expert's bias
// keeps every choice, so the output is bit-identical (a bias that entered the
// weights would move it); a bias that makes expert 3 everyone's first choice
// changes the output.
TEST(SimulatorRouter, BiasChoosesButDoesNotWeigh) {
  const Dims d = RouterDims(2, true);
  const Mat<double> x = Random(d.tokens(), d.hidden, 5);
  const Mat<double> base = OutputWithBias(d, x, {0.01, -0.02, 0.03, 0.0});
  EXPECT_EQ(OutputWithBias(d, x, {0.51, 0.48, 0.53, 0.5}), base);
  EXPECT_NE(OutputWithBias(d, x, {0.01, -0.02, 0.03, 10.0}), base);
}

// counts 3, 1, 2, 2 (mean 2): the overloaded expert 0 moves down by the rate
// 1e-3, the underloaded expert 1 up, the two at the mean stay; the counts restart.
TEST(SimulatorRouter, BiasUpdateBySignOfLoad) {
  OnOneRank([&](Ctx& ctx) {
    ExpertBias<double> b;
    b.bias = Tensor<double>(ctx.mem(), SimCategory::kReplicatedParams, 4, Mat<double>::Constant(1, 4, 0.5));
    b.counts = Tensor<double>(ctx.mem(), SimCategory::kRoutingScratch, 4, Mat<double>::Constant(1, 4, 7.0));
    Mat<double> counts(1, 4);
    counts << 3, 1, 2, 2;
    UpdateExpertBias(counts, &b);
    EXPECT_DOUBLE_EQ(b.bias.m(0, 0), 0.499);
    EXPECT_DOUBLE_EQ(b.bias.m(0, 1), 0.501);
    EXPECT_DOUBLE_EQ(b.bias.m(0, 2), 0.5);
    EXPECT_DOUBLE_EQ(b.bias.m(0, 3), 0.5);
    EXPECT_EQ(b.counts.m.sum(), 0.0);
  });
}

// The counts: every kept (token, expert) pair once, k per token when dropless.
TEST(SimulatorRouter, CountsEveryRoutedPair) {
  const Dims d = RouterDims(2, true);
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
    block->Forward(ctx, Random(d.tokens(), d.hidden, 5));
    EXPECT_EQ(block->expert_bias()->counts.m.sum(), static_cast<double>(d.tokens() * d.top_k));
  });
}

}  // namespace
}  // namespace preflight::sim::simulator_router_test

namespace preflight::simulator_router_test {
namespace {

Recipe LoadDeepSeek(const std::vector<Override>& sets) {
  const LoadResult loaded = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/deepseek-v3-h200.yaml", sets);
  EXPECT_TRUE(loaded.ok());
  return loaded.ok() ? *loaded.recipe : Recipe();
}

// Megatron keeps expert_bias as an fp32 buffer: counted as a checkpoint tensor
// (DeepSeek-V3's e_score_correction_bias), stored at 4 B, with no gradient and
// no optimizer state.
TEST(RouterBiasInventory, ExpertBiasIsAnUntrainedFp32Buffer) {
  const Inventory inv = BuildInventory(LoadDeepSeek({}));
  const Layer& moe = inv.layers.back();  // layer 60's MoE sublayer
  ASSERT_EQ(moe.kind, BlockKind::kMoe);
  const int rep = static_cast<int>(ShardClass::kReplicated);
  EXPECT_EQ(moe.totals.buffer_elements[static_cast<size_t>(rep)], 256);
  // Replicated and trained: the router [256, 7168] and the pre-norm (7168), nothing else.
  EXPECT_EQ(moe.totals.of(ShardClass::kReplicated), 256 * 7168 + 7168);
  EXPECT_EQ(moe.totals.param_bytes[static_cast<size_t>(rep)], (256 * 7168 + 7168) * 2 + 256 * 4);
}

/// The scaled DeepSeek-V3 MoE part (1F1B on two stages, no MTP, every E slot MoE).
Recipe ScaledMoe(std::vector<Override> more) {
  std::vector<Override> sets = {{"parallel.schedule", "1f1b"},
                                {"parallel.pp", "2"},
                                {"parallel.ep", "4"},
                                {"model.mtp_layers", "0"},
                                {"model.moe.first_k_dense", "0"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml", sets, /*max_world=*/16);
}

// The step agrees with the unsharded run (the biases' moves included) and
// with plan and fit. Stage 0 holds one MoE layer of 256 experts: its counts
// are 1 x 256 fp32 = 1024 B, all-reduced once over the 8 DP ranks (2 x 7/8 x
// 1024 = 1792 B sent); under tp 2 (dp 4) over DP (2 x 3/4 x 1024 = 1536) and
// over TP (2 x 1/2 x 1024 = 1024).
TEST(RouterBiasStep, AgreesAndAllReducesTheCounts) {
  {
    const Recipe r = ScaledMoe({});
    const SimulationReport rep = Simulate(r);
    const SimComparison c = testing_sim::ExpectStepAgrees(r, rep);
    const CommAgreement* dp = testing_sim::FindComm(testing_sim::Stage(c, 0), Axis::kDpCp, Collective::kAllReduce,
                                                    Pass::kOptimizer, CommWhat::kRouterBias);
    ASSERT_NE(dp, nullptr);
    EXPECT_EQ(dp->measured_sent, 1792);
    bool moved = false;
    for (const ErrorStat& u : rep.updates) {
      if (u.name.find("expert_bias") != std::string::npos) moved = true;
    }
    EXPECT_TRUE(moved) << "the expert biases are compared with the reference's";
  }
  {
    const Recipe r = ScaledMoe({{"parallel.tp", "2"}, {"parallel.sp", "true"}});
    const SimComparison c = testing_sim::ExpectStepAgrees(r);
    const auto& s0 = testing_sim::Stage(c, 0);
    const CommAgreement* dp =
        testing_sim::FindComm(s0, Axis::kDpCp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias);
    const CommAgreement* tp =
        testing_sim::FindComm(s0, Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kRouterBias);
    ASSERT_NE(dp, nullptr);
    ASSERT_NE(tp, nullptr);
    EXPECT_EQ(dp->measured_sent, 1536);
    EXPECT_EQ(tp->measured_sent, 1024);
  }
}

TEST(RouterBiasStep, SigmoidWithoutBiasAndTopOneAgree) {
  testing_sim::ExpectStepAgrees(ScaledMoe({{"model.moe.router_bias", "false"}}));
  testing_sim::ExpectStepAgrees(ScaledMoe({{"model.moe.top_k", "1"}}));
}

TEST(RouterBiasStep, BiasOnTheSoftmaxRouterIsRefused) {
  EXPECT_THROW(Simulate(ScaledMoe({{"model.moe.router", "softmax"}})), SimUnsupported);
}

}  // namespace
}  // namespace preflight::simulator_router_test

// Multi-head latent attention in the executor (simulator/mla_block.cc):
// hand-written backward against finite differences, sharded (TP with SP, CP
// in each mode) against one rank, the saved bytes and the TP bytes by hand,
// and whole steps of the scaled DeepSeek-V3 recipe against plan and fit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "blocks.h"
#include "preflight/simulator/sim.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_mla_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::ExpectSame;
using testing::MakeBlockLayout;
using testing::OnOneRank;
using testing::Random;
using testing::RunBlock;

/// h 8, 4 heads with d_nope 4, d_rope 2, d_v 3 (three different widths, so a
/// slip between them shows), latents d_cq 6 and d_c 5, 8 positions x 2.
Dims MlaDims(int64_t q_lora) {
  Dims d;
  d.hidden = 8;
  d.mla = true;
  d.heads = d.kv_heads = 4;
  d.mla_nope = 4;
  d.mla_rope = 2;
  d.mla_v = 3;
  d.head_dim = d.mla_nope + d.mla_rope;
  d.mla_q_lora = q_lora;
  d.mla_kv_lora = 5;
  d.seq = 8;
  d.batch = 2;
  return d;
}

TEST(SimulatorMla, MatchesFiniteDifferences) {
  OnOneRank(8, [&](Ctx& ctx) {
    auto block = MakeBlock<double>('A', ctx, MlaDims(6), 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, MlaDims(6), 1e-6, "mla");
  });
}

TEST(SimulatorMla, WithoutQueryLatentMatchesFiniteDifferences) {
  OnOneRank(8, [&](Ctx& ctx) {
    auto block = MakeBlock<double>('A', ctx, MlaDims(0), 0, 7, 0.8);
    EXPECT_EQ(block->params().size(), 6u);  // norm, W_q, W_dkv, kv norm, W_ukv, W_o
    ExpectBackwardMatchesFd(ctx, *block, MlaDims(0), 1e-6, "mla q_lora 0");
  });
}

TEST(SimulatorMla, ShardedEqualsOneRank) {
  for (int64_t q_lora : {6, 0}) {
    const Dims d = MlaDims(q_lora);
    const Mat<double> x = Random(d.tokens(), d.hidden, 3), dy = Random(d.tokens(), d.hidden, 4);
    const auto ref = RunBlock('A', d, MakeBlockLayout(1, 1, false), x, dy);
    struct Case {
      int tp, cp;
      CpComm comm;
    };
    for (const Case c : {Case{2, 1, CpComm::kP2p}, Case{1, 2, CpComm::kP2p}, Case{2, 2, CpComm::kP2p},
                         Case{2, 2, CpComm::kAllGather}, Case{2, 2, CpComm::kA2a}, Case{4, 1, CpComm::kP2p}}) {
      testing::BlockLayout l = MakeBlockLayout(c.tp, c.cp, c.tp > 1);
      l.cp_comm = c.comm;
      ExpectSame(RunBlock('A', d, l, x, dy), ref,
                 "q_lora " + std::to_string(q_lora) + " " + testing::Describe(l) + " " + Name(c.comm));
    }
  }
}

// What Megatron's MLA keeps for the backward, per token (bf16 = 2 B, fp32
// statistics 4 B), with h 8, n 4, d_nope + d_rope 6, d_v 3, d_cq 6, d_c 5:
//   residual input x and norm output 2h + 2h = 32, rstd 4;
//   q latent (q_layernorm input) 2*6 = 12, its norm output (W_uq input) 12, rstd 4;
//   [c_kv | k_pe] (kv_layernorm reads a view of it) 2*(5 + 2) = 14, normed c_kv (W_ukv input) 10, rstd 4;
//   Q and K 2*4*6 each = 96, V and O 2*4*3 each = 48, fp32 log-sum-exp 4*4 = 16.
// Sum 252 B a token; 16 tokens = 4032 B on one rank. Under TP 2 with SP each
// rank keeps half the tokens of the first group and half the heads of the
// second: 2016 B.
TEST(SimulatorMla, SavedBytesByHand) {
  const Dims d = MlaDims(6);
  const Mat<double> x = Random(d.tokens(), d.hidden, 3), dy = Random(d.tokens(), d.hidden, 4);
  EXPECT_EQ(RunBlock('A', d, MakeBlockLayout(1, 1, false), x, dy).activation_peak.at(0), 252 * 16);
  const auto tp2 = RunBlock('A', d, MakeBlockLayout(2, 1, true), x, dy);
  for (int64_t peak : tp2.activation_peak) EXPECT_EQ(peak, 126 * 16);
}

// TP 2 with SP, one layer, 16 tokens: each all-gather or reduce-scatter sends
// half its full tensor (16 tokens x width x 2 B / 2 = 16 B a column).
// Forward AG: the normed q latent (6), normed c_kv (5) and k_pe (2): 13 x 16 = 208;
// forward RS of W_o's output (h 8): 128. Backward AG: dy (8) and the two
// re-gathered latents (11): 304; backward RS of their dgrads and d k_pe: 208.
TEST(SimulatorMla, TensorParallelBytesByHand) {
  const Dims d = MlaDims(6);
  const Mat<double> x = Random(d.tokens(), d.hidden, 3), dy = Random(d.tokens(), d.hidden, 4);
  const auto run = RunBlock('A', d, MakeBlockLayout(2, 1, true), x, dy);
  for (const auto& comm : run.comm) {
    using K = CollectiveKind;
    EXPECT_EQ(testing::Sent(comm, Axis::kTp, K::kAllGather, Pass::kForward, CommWhat::kAttention), 208);
    EXPECT_EQ(testing::Sent(comm, Axis::kTp, K::kReduceScatter, Pass::kForward, CommWhat::kAttention), 128);
    EXPECT_EQ(testing::Sent(comm, Axis::kTp, K::kAllGather, Pass::kBackward, CommWhat::kAttention), 304);
    EXPECT_EQ(testing::Sent(comm, Axis::kTp, K::kReduceScatter, Pass::kBackward, CommWhat::kAttention), 208);
  }
}

TEST(SimulatorMla, TensorParallelWithoutSequenceParallelIsRefused) {
  const Dims d = MlaDims(6);
  const Mat<double> x = Random(d.tokens(), d.hidden, 3), dy = Random(d.tokens(), d.hidden, 4);
  EXPECT_THROW(RunBlock('A', d, MakeBlockLayout(2, 1, false), x, dy), SimUnsupported);
}

}  // namespace
}  // namespace preflight::sim::simulator_mla_test

namespace preflight::simulator_mla_test {
namespace {

/// The DeepSeek-V3 recipe through the parser with `sets`, scaled to at most
/// 32 ranks (h 16, head_dim 4: MLA d_nope 4, d_rope 2, d_v 3, d_cq 12, d_c 8).
Recipe ScaledDeepSeek(const std::vector<Override>& sets) {
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml", sets, /*max_world=*/32);
}

/// MLA only: 1F1B on two stages, no MTP, the softmax router.
std::vector<Override> MlaOnly(std::vector<Override> more) {
  std::vector<Override> sets = {{"parallel.schedule", "1f1b"},
                                {"parallel.pp", "2"},
                                {"parallel.ep", "4"},
                                {"model.mtp_layers", "0"},
                                {"model.moe.router", "softmax"},
                                {"model.moe.router_bias", "false"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

TEST(SimulatorMlaRecipe, ScaledSizes) {
  const Recipe r = ScaledDeepSeek(MlaOnly({}));
  ASSERT_TRUE(r.model.mla.has_value());
  EXPECT_EQ(r.model.mla->heads, 128);  // kept
  EXPECT_EQ(r.model.mla->qk_nope_head_dim, 4);
  EXPECT_EQ(r.model.mla->qk_rope_head_dim, 2);
  EXPECT_EQ(r.model.mla->v_head_dim, 3);
  EXPECT_EQ(r.model.mla->q_lora_rank, 12);
  EXPECT_EQ(r.model.mla->kv_lora_rank, 8);
}

TEST(SimulatorMlaRecipe, StepAgreesWithPlanAndFit) { testing_sim::ExpectStepAgrees(ScaledDeepSeek(MlaOnly({}))); }

TEST(SimulatorMlaRecipe, TensorAndContextParallelStepAgrees) {
  testing_sim::ExpectStepAgrees(ScaledDeepSeek(
      MlaOnly({{"parallel.tp", "2"}, {"parallel.sp", "true"}, {"parallel.cp", "2"}, {"parallel.cp_comm", "a2a"}})));
  testing_sim::ExpectStepAgrees(ScaledDeepSeek(
      MlaOnly({{"parallel.tp", "2"}, {"parallel.sp", "true"}, {"model.mla.q_lora_rank", "0"}, {"parallel.cp", "2"}})));
}

}  // namespace
}  // namespace preflight::simulator_mla_test

// The block harness of tests/support (sharded == one rank for one block) on
// the part-1 blocks, so tests of new blocks can rely on it.
#include <gtest/gtest.h>

#include <string>

#include "support/sim_block_harness.h"
#include "support/sim_checks.h"

namespace preflight::sim::simulator_harness_test {
namespace {

using testing::BlockLayout;
using testing::BlockRun;
using testing::ExpectSame;
using testing::GlobalValueInput;
using testing::RunBlock;

constexpr double kTolerance = 1e-12;

Dims SmallDims() {
  Dims d;
  d.hidden = 8;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 4;
  d.ffn = 8;
  d.seq = 8;
  d.batch = 1;
  d.vocab = 16;
  return d;
}

TEST(SimulatorHarness, TensorAndSequenceParallelBlocksEqualOneRank) {
  const Dims d = SmallDims();
  const Mat<double> x = GlobalValueInput(d.tokens(), d.hidden, 1);
  const Mat<double> dy = GlobalValueInput(d.tokens(), d.hidden, 2);
  for (char letter : {'A', 'D'}) {
    const BlockRun ref = RunBlock(letter, d, BlockLayout{}, x, dy);
    for (bool sp : {false, true}) {
      BlockLayout l;
      l.tp = 2;
      l.sp = sp;
      ExpectSame(RunBlock(letter, d, l, x, dy), ref, std::string(1, letter) + (sp ? " tp2 sp" : " tp2"), kTolerance);
    }
  }
}

TEST(SimulatorHarness, LocalRowsFollowTheLoadBalancedChunks) {
  // seq 8, cp 2, balanced: 4 chunks of 2; rank 1 holds chunks 1 and 2 = positions 2,3,4,5.
  Mat<double> g(8, 1);
  for (int i = 0; i < 8; ++i) g(i, 0) = i;
  const SeqLayout s = SeqLayout::Make(8, 2, 1, true);
  const Mat<double> local = testing::LocalRows(g, s, 1, false, 1, 0);
  ASSERT_EQ(local.rows(), 4);
  EXPECT_EQ(local(0, 0), 2);
  EXPECT_EQ(local(3, 0), 5);
  // Rank 0 holds chunks 0 and 3 = positions 0,1,6,7.
  const Mat<double> r0 = testing::LocalRows(g, SeqLayout::Make(8, 2, 0, true), 1, false, 1, 0);
  EXPECT_EQ(r0(2, 0), 6);
}

}  // namespace
}  // namespace preflight::sim::simulator_harness_test

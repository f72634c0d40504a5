// The block harness of tests/support (sharded == one rank for one block) on
// the part-1 blocks, so tests of new blocks can rely on it.
#include <gtest/gtest.h>

#include "support/sim_block_harness.h"

namespace preflight::sim {
namespace {

using testing::BlockLayout;
using testing::BlockRun;
using testing::RunBlock;

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

Mat<double> Random(int64_t rows, int64_t cols, uint64_t seed) {
  return GlobalValue("input" + std::to_string(seed), rows, cols, Init::kMatrix, seed, 1.0);
}

double Rel(const Mat<double>& a, const Mat<double>& b) {
  return (a - b).cwiseAbs().maxCoeff() / std::max(1e-300, b.cwiseAbs().maxCoeff());
}

void ExpectSame(const BlockRun& got, const BlockRun& ref) {
  EXPECT_LT(Rel(got.y, ref.y), 1e-12);
  EXPECT_LT(Rel(got.dx, ref.dx), 1e-12);
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (const auto& [name, g] : ref.grads) EXPECT_LT(Rel(got.grads.at(name), g), 1e-12) << name;
}

TEST(SimulatorHarness, TensorAndSequenceParallelBlocksEqualOneRank) {
  const Dims d = SmallDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  for (char letter : {'A', 'D'}) {
    const BlockRun ref = RunBlock(letter, d, BlockLayout{}, x, dy);
    for (bool sp : {false, true}) {
      BlockLayout l;
      l.tp = 2;
      l.sp = sp;
      ExpectSame(RunBlock(letter, d, l, x, dy), ref);
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
}  // namespace preflight::sim

// Hand-written backward of every block against central finite differences on
// the unsharded (one-rank) fp64 reference. For L = sum(F(x) * R) with a fixed
// random R, dL/dtheta ~ (L(theta + h) - L(theta - h)) / 2h; the O(h^2)
// truncation with h = 1e-5 leaves ~1e-9 relative error, so we assert 1e-6.
#include <gtest/gtest.h>

#include <string>

#include "blocks.h"
#include "support/sim_checks.h"

namespace preflight::sim::simulator_blocks_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::FdRelError;
using testing::Numeric;
using testing::OnOneRank;
using testing::Random;
using testing::SmallDims;

constexpr double kTolerance = 1e-6;  // the step is testing::kFdStep = 1e-5

void CheckBlock(char letter, const Dims& d, int64_t router_groups = 1) {
  OnOneRank([&](Ctx& ctx) {
    ctx.router_groups = router_groups;
    auto block = MakeBlock<double>(letter, ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kTolerance, std::string(1, letter));
  });
}

TEST(SimulatorBlocks, AttentionMatchesFiniteDifferences) { CheckBlock('A', SmallDims()); }

TEST(SimulatorBlocks, MultiHeadAttentionMatchesFiniteDifferences) {
  Dims d = SmallDims();
  d.kv_heads = d.heads;
  CheckBlock('A', d);
}

TEST(SimulatorBlocks, SwigluMlpMatchesFiniteDifferences) { CheckBlock('D', SmallDims()); }

TEST(SimulatorBlocks, DroplessMoeMatchesFiniteDifferences) { CheckBlock('E', SmallDims()); }

TEST(SimulatorBlocks, CapacityMoeWithDropsMatchesFiniteDifferences) {
  Dims d = SmallDims();
  d.dropless = false;
  d.capacity_factor = 0.5;  // C = ceil(6*2/4 * 0.5) = 2 per group of 6 tokens: drops for sure
  d.shared_ffn = 0;
  CheckBlock('E', d, /*router_groups=*/2);
}

TEST(SimulatorBlocks, PaddedCapacityMoeMatchesFiniteDifferences) {
  Dims d = SmallDims();
  d.dropless = false;
  d.pad_to_capacity = true;
  d.capacity_factor = 1.0;
  CheckBlock('E', d);
}

TEST(SimulatorBlocks, CapacityDropsCountedPerGroup) {
  Dims d = SmallDims();
  d.dropless = false;
  d.capacity_factor = 0.5;
  OnOneRank([&](Ctx& ctx) {
    ctx.router_groups = 2;
    auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
    block->Forward(ctx, Random(d.tokens(), d.hidden, 11));
    // 2 groups of 6 tokens, 12 pairs each, at most E * C = 4 * 2 = 8 kept per group.
    EXPECT_GE(ctx.dropped_pairs, 2 * (12 - 8));
  });
}

TEST(SimulatorBlocks, EmbeddingMatchesFiniteDifferences) {
  const Dims d = SmallDims();
  OnOneRank([&](Ctx& ctx) {
    Embedding<double> emb(ctx, d, 7, 0.8);
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < d.tokens(); ++t) ids.push_back((t * 5 + 3) % d.vocab);
    const Mat<double> r = Random(d.tokens(), d.hidden, 12);
    const auto loss = [&] {  // each evaluation is its own micro-batch: FD runs forwards only
      ++ctx.microbatch;
      return emb.Forward(ctx, ids).cwiseProduct(r).sum();
    };
    loss();
    emb.Backward(ctx, r);
    EXPECT_LT(FdRelError(emb.weight().grad.m, Numeric(&emb.weight().value.m, loss)), kTolerance);
  });
}

TEST(SimulatorBlocks, HeadAndCrossEntropyMatchFiniteDifferences) {
  const Dims d = SmallDims();
  OnOneRank([&](Ctx& ctx) {
    Head<double> head(ctx, d, 7, 0.8);
    Mat<double> x = Random(d.tokens(), d.hidden, 11);
    std::vector<int64_t> targets;
    for (int64_t t = 0; t < d.tokens(); ++t) targets.push_back((t * 7 + 1) % d.vocab);
    const auto loss = [&] {  // each evaluation is its own micro-batch: FD runs forwards only
      ++ctx.microbatch;
      return head.Forward(ctx, x, targets);
    };
    const double l = loss();
    // A near-uniform softmax over 16 classes gives a loss near log 16 = 2.77.
    EXPECT_GT(l, 1.5);
    EXPECT_LT(l, 4.0);
    const Mat<double> dx = head.Backward(ctx);
    EXPECT_LT(FdRelError(dx, Numeric(&x, loss)), kTolerance);
    for (Param<double>* p : head.params()) {
      EXPECT_LT(FdRelError(p->grad.m, Numeric(&p->value.m, loss)), kTolerance) << p->name;
    }
  });
}

TEST(SimulatorBlocks, RmsNormOfConstantRowIsItsWeight) {
  // x = c * ones: mean x^2 = c^2, so y = w * c / sqrt(c^2 + eps) ~ w for c = 3.
  Mat<double> x = Mat<double>::Constant(1, 4, 3.0), w(1, 4), rstd;
  w << 1, 2, 3, 4;
  const Mat<double> y = RmsNormForward(x, w, 1e-5, &rstd);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y(0, i), w(0, i) * 3.0 / std::sqrt(9.0 + 1e-5), 1e-15);
}

}  // namespace
}  // namespace preflight::sim::simulator_blocks_test

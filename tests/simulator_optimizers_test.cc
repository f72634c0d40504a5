// Optimizer math of the reference executor (simulator/optimizers.h) against
// hand-worked values, the singular-value form of Newton-Schulz, and the
// sharding properties the distributed optimizer relies on. Every expected
// number names where it comes from; none is produced by the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "optimizers.h"
#include "support/sim_checks.h"

namespace preflight::sim::simulator_optimizers_test {
namespace {

using testing::Random;

/// max_ij |actual - expected| / max_ij |expected|: the inequality every
/// matrix comparison below asserts is MaxRelError(actual, expected) <= tol.
template <class T>
double MaxRelError(const Mat<T>& actual, const Mat<double>& expected) {
  const Mat<double> a = actual.template cast<double>();
  return (a - expected).cwiseAbs().maxCoeff() / expected.cwiseAbs().maxCoeff();
}

/// |actual - expected| <= rel * |expected|.
void ExpectClose(double actual, double expected, double rel) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected)) << actual << " vs " << expected;
}

std::vector<double> RandomVector(int64_t n, uint64_t seed) {
  const Mat<double> m = Random(1, n, seed);
  return std::vector<double>(m.data(), m.data() + n);
}

// ---------------------------------------------------------------- AdamW

TEST(AdamW, FirstStepFromZeroStateIsSignLike) {
  // Hand: m1 = 0.1 g, v1 = 0.05 g^2, so m_hat = g, v_hat = g^2 and the update
  // is lr g / (|g| + eps). p0 = 1, g = 0.5, lr = 1e-3, wd = 0.1, eps = 1e-8:
  // p1 = 1 (1 - 1e-4) - 1e-3 * 0.5 / 0.50000001 = 0.99890000002 (40-digit
  // decimal arithmetic: 0.99890000001999999960...).
  AdamWConfig c;  // lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1
  double p = 1.0, g = 0.5, m = 0.0, v = 0.0;
  AdamWStep(c, 1, &p, &g, &m, &v, 1);
  ExpectClose(p, 0.99890000001999999960, 1e-15);
  ExpectClose(m, 0.05, 1e-15);
  ExpectClose(v, 0.0125, 1e-15);

  // Sign-like: a gradient 1000x larger moves the weight by the same lr.
  double q = 0.0, big = -500.0, mq = 0.0, vq = 0.0;
  c.weight_decay = 0.0;
  AdamWStep(c, 1, &q, &big, &mq, &vq, 1);
  ExpectClose(q, 1e-3 * 500.0 / (500.0 + 1e-8), 1e-15);
}

TEST(AdamW, FirstStepSlackBoundsAndMatchesTheUpdateMove) {
  // The slack is checked against AdamWStep itself: move each gradient by d and
  // the first-step update moves by at most the slack, and by nearly all of it
  // where the slope is flat over the move (|g| << eps: lr / eps x d = 1e5 d).
  AdamWConfig c;  // lr 1e-3, eps 1e-8
  c.weight_decay = 0.0;
  const std::vector<double> gs = {0.0, 1e-12, -3e-10, 1e-8, -2e-8, 5e-7, 1e-3, -0.25};
  const double d = 1e-17;
  Mat<double> ga(1, static_cast<int64_t>(gs.size())), gb(1, static_cast<int64_t>(gs.size()));
  for (size_t i = 0; i < gs.size(); ++i) {
    ga(0, static_cast<int64_t>(i)) = gs[i];
    gb(0, static_cast<int64_t>(i)) = gs[i] + d;
  }
  const Mat<double> slack = AdamWFirstStepSlack(c, ga, gb);
  for (size_t i = 0; i < gs.size(); ++i) {
    double pa = 0.0, pb = 0.0, ma = 0.0, va = 0.0, mb = 0.0, vb = 0.0;
    const double a = ga(0, static_cast<int64_t>(i)), b = gb(0, static_cast<int64_t>(i));
    AdamWStep(c, 1, &pa, &a, &ma, &va, 1);
    AdamWStep(c, 1, &pb, &b, &mb, &vb, 1);
    const double moved = std::abs(pa - pb), bound = slack(0, static_cast<int64_t>(i));
    // 4 ulp of the update (~lr) for the rounding of the two steps themselves.
    EXPECT_LE(moved, bound + 4 * 1e-3 * std::numeric_limits<double>::epsilon()) << "g = " << gs[i];
  }
  // Near zero the bound is tight: the move is lr/eps x d = 1e-12 to 1 %.
  EXPECT_NEAR(slack(0, 0), 1e-12, 1e-16);
  double p0 = 0.0, p1 = 0.0, m0 = 0.0, v0 = 0.0, m1 = 0.0, v1 = 0.0;
  const double z = 0.0;
  AdamWStep(c, 1, &p0, &z, &m0, &v0, 1);
  AdamWStep(c, 1, &p1, &d, &m1, &v1, 1);
  EXPECT_NEAR(std::abs(p1 - p0), 1e-12, 1e-14);
  // Far from zero the slope is flat: at |g| = 0.25 the slack is below 1e-30.
  EXPECT_LT(slack(0, 7), 1e-30);
  // Crossing zero takes the slope at zero.
  Mat<double> cross_a(1, 1), cross_b(1, 1);
  cross_a(0, 0) = -1e-6;
  cross_b(0, 0) = 1e-6;
  EXPECT_NEAR(AdamWFirstStepSlack(c, cross_a, cross_b)(0, 0), 1e-3 / 1e-8 * 2e-6, 1e-9);
}

TEST(AdamW, TwoStepsOnThreeElements) {
  // lr 0.1, wd 0.01, betas (0.9, 0.95), eps 1e-8. Expected values by 40-digit
  // decimal arithmetic of docs/formulas.md §9.1. Element 2 by hand: step 1 has g = 0, so
  // m = v = 0, the update is 0 / (0 + eps) = 0 and p = 2 * 0.999 = 1.998. Step 2,
  // g = 3: m = 0.3, v = 0.45, m_hat = 0.3 / 0.19, v_hat = 0.45 / 0.0975,
  // p = 1.998 * 0.999 - 0.1 * 1.5789474 / (2.1483446 + 1e-8) = 1.9225060001.
  AdamWConfig c;
  c.lr = 0.1;
  c.weight_decay = 0.01;
  std::vector<double> p = {1.0, -0.5, 2.0}, m(3, 0.0), v(3, 0.0);
  const std::vector<double> g1 = {0.5, -2.0, 0.0}, g2 = {-0.25, 1.0, 3.0};
  AdamWStep(c, 1, p.data(), g1.data(), m.data(), v.data(), 3);
  ExpectClose(p[0], 0.89900000199999996000, 1e-15);
  ExpectClose(p[1], -0.39950000049999999750, 1e-15);
  ExpectClose(p[2], 1.998, 1e-15);
  AdamWStep(c, 2, p.data(), g2.data(), m.data(), v.data(), 3);
  ExpectClose(p[0], 0.87126405787382739086, 1e-14);
  ExpectClose(p[1], -0.37226355586216954994, 1e-14);
  ExpectClose(p[2], 1.92250600011174241330, 1e-14);
  ExpectClose(m[0], 0.020, 1e-14);
  ExpectClose(m[1], -0.080, 1e-14);
  ExpectClose(m[2], 0.300, 1e-14);
  ExpectClose(v[0], 0.015, 1e-14);
  ExpectClose(v[1], 0.240, 1e-14);
  ExpectClose(v[2], 0.450, 1e-14);
}

// ---------------------------------------------------------------- Muon momentum and apply

TEST(MuonMomentum, EmaAndNesterovByHand) {
  // beta 0.9. Hand: M = 0.9 M + 0.1 G: (1, -2), G (0.5, 4) -> (0.95, -1.4).
  // Nesterov U = 0.1 G + 0.9 M = (0.05 + 0.855, 0.4 - 1.26) = (0.905, -0.86).
  MuonConfig c;
  c.momentum = 0.9;
  const std::vector<double> g = {0.5, 4.0};
  std::vector<double> m = {1.0, -2.0}, u(2);
  MuonMomentum(c, g.data(), m.data(), u.data(), 2);
  ExpectClose(m[0], 0.95, 1e-15);
  ExpectClose(m[1], -1.4, 1e-15);
  ExpectClose(u[0], 0.905, 1e-15);
  ExpectClose(u[1], -0.86, 1e-15);

  // Without Nesterov the NS input is the momentum itself.
  c.nesterov = false;
  m = {1.0, -2.0};
  MuonMomentum(c, g.data(), m.data(), u.data(), 2);
  ExpectClose(u[0], 0.95, 1e-15);
  ExpectClose(u[1], -1.4, 1e-15);
}

TEST(MuonMomentum, UpdateMayOverwriteTheGradient) {
  // KJ muon.py updates the gradient in place (grad.lerp_); same hand values as above.
  MuonConfig c;
  c.momentum = 0.9;
  std::vector<double> g = {0.5, 4.0}, m = {1.0, -2.0};
  MuonMomentum(c, g.data(), m.data(), g.data(), 2);
  ExpectClose(g[0], 0.905, 1e-15);
  ExpectClose(g[1], -0.86, 1e-15);
}

TEST(MuonApply, DecayThenScaledStepByHand) {
  // Hand: lr 0.02, wd 0.1, scale 2: W = 1 * (1 - 0.002) - 0.02 * 2 * 0.5 = 0.978;
  // W = -1 * 0.998 - 0.04 * (-0.25) = -0.988. The decay uses lr, not lr * scale
  // (Moonlight toy_train.py: p.mul_(1 - lr * wd), then p.add_(u, alpha=-adjusted_lr)).
  MuonConfig c;
  std::vector<double> w = {1.0, -1.0};
  const std::vector<double> o = {0.5, -0.25};
  MuonApply(c, 2.0, w.data(), o.data(), 2);
  ExpectClose(w[0], 0.978, 1e-15);
  ExpectClose(w[1], -0.988, 1e-15);
}

// ---------------------------------------------------------------- Newton-Schulz

/// The scalar map NS applies to each normalised singular value: five times
/// s <- a s + b s^3 + c s^5, (a, b, c) = (3.4445, -4.7750, 2.0315) copied from
/// KJ muon.py zeropower_via_newtonschulz5 (not from optimizers.h). X X^T X has
/// the singular values s^3 with the same singular vectors, so NS(X) = U f(S) V^T.
double Quintic(double s, int steps) {
  for (int i = 0; i < steps; ++i) s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * s * s * s * s * s;
  return s;
}

/// Expected NS output from the SVD of x (Eigen JacobiSVD, not the NS code path).
Mat<double> NsFromSvd(const Mat<double>& x, int steps) {
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(x, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const double norm = x.norm() + 1e-7;  // KJ: X / (X.norm() + 1e-7)
  Eigen::VectorXd f = svd.singularValues();
  for (Eigen::Index i = 0; i < f.size(); ++i) f(i) = Quintic(f(i) / norm, steps);
  return svd.matrixU() * f.asDiagonal() * svd.matrixV().transpose();
}

TEST(NewtonSchulz5, RowVectorByHand) {
  // [3, 4] has one singular value 5, so NS gives Quintic^5(5 / (5 + 1e-7)) * [0.6, 0.8].
  // 40-digit decimal iteration: 0.701000014, 1.113620200, 0.720705928,
  // 1.089974228, 0.696436430047132491.
  Mat<double> x(1, 2);
  x << 3.0, 4.0;
  const Mat<double> o = NewtonSchulz5(x, 5);
  ExpectClose(o(0, 0), 0.41786185802827949456, 1e-13);
  ExpectClose(o(0, 1), 0.55714914403770599275, 1e-13);
  // The column vector takes the transposed path and gives the transpose.
  const Mat<double> ot = NewtonSchulz5(Mat<double>(x.transpose()), 5);
  ExpectClose(ot(0, 0), 0.41786185802827949456, 1e-13);
  ExpectClose(ot(1, 0), 0.55714914403770599275, 1e-13);
}

TEST(NewtonSchulz5, EqualsQuinticOfSingularValues) {
  struct Shape { int64_t rows, cols; };
  for (const Shape s : {Shape{5, 3}, Shape{3, 5}, Shape{4, 4}, Shape{2, 7}}) {
    const Mat<double> x = Random(s.rows, s.cols, 100 + static_cast<uint64_t>(s.rows * 10 + s.cols));
    for (int steps : {0, 1, 5}) {
      EXPECT_LE(MaxRelError(NewtonSchulz5(x, steps), NsFromSvd(x, steps)), 1e-12)
          << s.rows << "x" << s.cols << " steps " << steps;
    }
  }
}

TEST(NewtonSchulz5, SingularValuesLandNearOne) {
  // KJ docstring: the output is U S' V^T with S' roughly in [0.5, 1.5]. Build
  // x = Q1 diag(1, 0.7, 0.4) Q2^T with orthogonal Q1 (6x3), Q2 (3x3).
  const Eigen::MatrixXd q1 = Eigen::HouseholderQR<Eigen::MatrixXd>(Random(6, 3, 1)).householderQ() *
                             Eigen::MatrixXd::Identity(6, 3);
  const Eigen::MatrixXd q2 = Eigen::HouseholderQR<Eigen::MatrixXd>(Random(3, 3, 2)).householderQ();
  const Eigen::Vector3d s(1.0, 0.7, 0.4);
  const Mat<double> x = q1 * s.asDiagonal() * q2.transpose();
  const Mat<double> o = NewtonSchulz5(x, 5);
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(o);
  for (Eigen::Index i = 0; i < 3; ++i) {
    EXPECT_GE(svd.singularValues()(i), 0.5);
    EXPECT_LE(svd.singularValues()(i), 1.5);
  }
  // Same singular vectors as the input: Q1^T O Q2 is diagonal.
  const Eigen::MatrixXd core = q1.transpose() * o * q2;
  const double off = (core - Eigen::MatrixXd(core.diagonal().asDiagonal())).cwiseAbs().maxCoeff();
  EXPECT_LE(off, 1e-13);
}

TEST(NewtonSchulz5, AmplifiesTinySingularValues) {
  // Why fp32 Muon needs care (optimizers.h): a direction with singular value
  // d (after normalisation) comes out as Quintic^5(d) ~ 3.4445^5 d ~ 485 d
  // (hand: 3.4445^5 = 484.8763; the cubic terms are 1e-18 relative).
  // x = diag(1, d) padded to 2 x 3, so ||x|| + 1e-7 = 1 + 1e-7.
  const double d = 1e-9;
  Mat<double> x = Mat<double>::Zero(2, 3);
  x(0, 0) = 1.0;
  x(1, 1) = d;
  const Mat<double> o = NewtonSchulz5(x, 5);
  ExpectClose(o(1, 1), 484.876287 * d, 1e-6);
}

TEST(NewtonSchulz5, CommutesWithTranspose) {
  // Mathematically NS(X^T) = NS(X)^T (X X^T X = (X^T X X^T)^T); both calls run
  // on the same wide orientation, so only summation order differs.
  for (const Mat<double>& x : {Random(4, 6, 3), Random(5, 5, 4)}) {
    const Mat<double> ot = NewtonSchulz5(Mat<double>(x.transpose()), 5);
    const Mat<double> expected = NewtonSchulz5(x, 5).transpose();
    EXPECT_LE(MaxRelError(ot, expected), 1e-14);
  }
}

TEST(NewtonSchulz5, OurOrientationIsTheTransposeOfPytorch) {
  // Ours: W is (in = 3) x (out = 5), Y = X W (docs/formulas.md §8.1). PyTorch holds
  // W_pt = W^T, shape (out, in) = (5, 3), and KJ muon_update gives
  // NS(W_pt) * sqrt(max(1, 5 / 3)) (hand: grad.size(-2) / grad.size(-1) = 5/3).
  // Our update must be exactly the transpose of that.
  MuonConfig c;
  const Mat<double> w = Random(3, 5, 5);
  const Mat<double> w_pt = w.transpose();
  const Mat<double> update_pt = NewtonSchulz5(w_pt, 5) * std::sqrt(5.0 / 3.0);
  const Mat<double> ours = NewtonSchulz5(w, 5) * MuonScale(c, /*rows_in=*/3, /*cols_out=*/5);
  EXPECT_LE(MaxRelError(ours, Mat<double>(update_pt.transpose())), 1e-14);
  // Passing the PyTorch shape by mistake gives KJ's scale of a (3, 5) matrix: 1.
  EXPECT_DOUBLE_EQ(MuonScale(c, 5, 3), 1.0);
}

TEST(NewtonSchulz5, IgnoresTheScaleOfItsInput) {
  // NS normalises by ||X||_F + 1e-7, so scaling X changes only that epsilon's
  // share: X / (||X|| + 1e-7) moves by <= 1e-7 / ||X|| relatively (||X|| ~ 2
  // here, c >= 0.01), and five quintic steps amplify that by < 3.4445^5 < 500.
  const Mat<double> x = Random(4, 7, 6);
  const Mat<double> o = NewtonSchulz5(x, 5);
  for (double scale : {0.01, 100.0}) {
    EXPECT_LE(MaxRelError(NewtonSchulz5(Mat<double>(scale * x), 5), o), 500 * 1e-7 / (0.01 * x.norm()));
  }
  // So Moonlight's momentum form (M <- beta M + G, U = G + beta M), which is
  // 1/(1-beta) times KJ's EMA U, gives the same orthogonalised update.
  MuonConfig c;
  const std::vector<double> g = RandomVector(28, 7);
  std::vector<double> m(28, 0.0), u(28);
  MuonMomentum(c, g.data(), m.data(), u.data(), 28);
  Mat<double> u_kj(4, 7), u_moonlight(4, 7);
  for (int64_t i = 0; i < 28; ++i) {
    u_kj.data()[i] = u[static_cast<size_t>(i)];
    u_moonlight.data()[i] = g[static_cast<size_t>(i)] + c.momentum * g[static_cast<size_t>(i)];  // M = G, U = G + beta M
  }
  EXPECT_LE(MaxRelError(NewtonSchulz5(u_kj, 5), NewtonSchulz5(u_moonlight, 5)), 500 * 1e-7 / u_kj.norm());
}

TEST(NewtonSchulz5, CountsItsFlops) {
  // docs/formulas.md §9.2: each step costs 4 m^2 n + 2 m^3 with m = min dim. For 3 x 2
  // (m = 2, n = 3): 48 + 16 = 64 per step, 320 for five.
  double flops = 0.0;
  NewtonSchulz5(Random(3, 2, 8), 5, &flops);
  EXPECT_DOUBLE_EQ(flops, 320.0);
}

// ---------------------------------------------------------------- scale rules

struct ScaleCase {
  const char* name;
  MuonScaleRule rule;
  int64_t rows_in, cols_out;  // our storage shape (in x out)
  double expected;            // hand value on the PyTorch shape (out, in)
};
const ScaleCase kScaleCases[] = {
    // KJ muon.py: sqrt(max(1, out/in)).
    {"Kj_Out256_In64", MuonScaleRule::kShapeScaling, 64, 256, 2.0},  // sqrt(256/64)
    {"Kj_Out64_In256", MuonScaleRule::kShapeScaling, 256, 64, 1.0},  // max(1, 0.25)
    {"Kj_Square", MuonScaleRule::kShapeScaling, 96, 96, 1.0},
    {"Kj_Out36_In4", MuonScaleRule::kShapeScaling, 4, 36, 3.0},      // sqrt(9)
    // Moonlight toy_train.py: 0.2 sqrt(max(out, in)), symmetric in the shape.
    {"Moonshot_Out256_In64", MuonScaleRule::kMatchAdamWRms, 64, 256, 3.2},  // 0.2 * 16
    {"Moonshot_Out64_In256", MuonScaleRule::kMatchAdamWRms, 256, 64, 3.2},
    {"Moonshot_Out100_In25", MuonScaleRule::kMatchAdamWRms, 25, 100, 2.0},  // 0.2 * 10
};
class MuonScaleRules : public ::testing::TestWithParam<ScaleCase> {};
TEST_P(MuonScaleRules, MatchesHandValue) {
  MuonConfig c;
  c.scale = GetParam().rule;
  ExpectClose(MuonScale(c, GetParam().rows_in, GetParam().cols_out), GetParam().expected, 1e-15);
}
INSTANTIATE_TEST_SUITE_P(All, MuonScaleRules, ::testing::ValuesIn(kScaleCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// ---------------------------------------------------------------- sharding

/// Runs `op(begin, count)` on consecutive pieces of [0, n) cut at `cuts`.
template <class Op>
void OnPieces(int64_t n, const std::vector<int64_t>& cuts, Op op) {
  int64_t begin = 0;
  for (int64_t end : cuts) {
    op(begin, end - begin);
    begin = end;
  }
  op(begin, n - begin);
}

TEST(Sharding, ElementwiseStepsSplitAnywhere) {
  // Element-wise updates on shards of a flat buffer equal the whole-buffer
  // update bitwise, for any cut (here uneven, 3 pieces, as a ZeRO split of a
  // buffer that packs several parameters would be).
  constexpr int64_t kN = 11;
  const std::vector<int64_t> cuts = {3, 7};
  AdamWConfig ac;
  MuonConfig mc;
  std::vector<double> p_whole = RandomVector(kN, 9), m_whole(kN, 0.0), v_whole(kN, 0.0);
  std::vector<double> p_shard = p_whole, m_shard = m_whole, v_shard = v_whole;
  std::vector<double> mom_whole(kN, 0.0), mom_shard(kN, 0.0), u_whole(kN), u_shard(kN);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<double> g = RandomVector(kN, 10 + static_cast<uint64_t>(step));
    AdamWStep(ac, step, p_whole.data(), g.data(), m_whole.data(), v_whole.data(), kN);
    OnPieces(kN, cuts, [&](int64_t b, int64_t n) {
      AdamWStep(ac, step, p_shard.data() + b, g.data() + b, m_shard.data() + b, v_shard.data() + b, n);
    });
    MuonMomentum(mc, g.data(), mom_whole.data(), u_whole.data(), kN);
    OnPieces(kN, cuts, [&](int64_t b, int64_t n) {
      MuonMomentum(mc, g.data() + b, mom_shard.data() + b, u_shard.data() + b, n);
    });
  }
  EXPECT_EQ(p_shard, p_whole);
  EXPECT_EQ(m_shard, m_whole);
  EXPECT_EQ(v_shard, v_whole);
  EXPECT_EQ(mom_shard, mom_whole);
  EXPECT_EQ(u_shard, u_whole);

  std::vector<double> w_whole = RandomVector(kN, 20), w_shard = w_whole;
  const std::vector<double> o = RandomVector(kN, 21);
  MuonApply(mc, 1.5, w_whole.data(), o.data(), kN);
  OnPieces(kN, cuts, [&](int64_t b, int64_t n) { MuonApply(mc, 1.5, w_shard.data() + b, o.data() + b, n); });
  EXPECT_EQ(w_shard, w_whole);
}

TEST(Sharding, NewtonSchulzNeedsTheFullMatrix) {
  // A 4 x 6 matrix split in two row blocks (TP row-parallel, or a ZeRO flat
  // split at element 12 of the row-major buffer) or two column blocks
  // (column-parallel). NS of a block is not the block of NS: the sharded
  // optimizer must gather first.
  const Mat<double> x = Random(4, 6, 30);
  const Mat<double> full = NewtonSchulz5(x, 5);
  const Mat<double> top = x.topRows(2), left = x.leftCols(3);
  EXPECT_GT(MaxRelError(NewtonSchulz5(top, 5), Mat<double>(full.topRows(2))), 0.05);
  EXPECT_GT(MaxRelError(NewtonSchulz5(left, 5), Mat<double>(full.leftCols(3))), 0.05);

  // Gathering the blocks back into the global matrix restores the update.
  Mat<double> gathered(4, 6);
  gathered << top, x.bottomRows(2);
  EXPECT_EQ(NewtonSchulz5(gathered, 5), full);

  // DeepSpeed #7807: after a reduce-scatter over two DP ranks, rank 0 holds
  // the averaged top rows but its own unreduced bottom rows; NS of that
  // matrix is not NS of the average.
  const Mat<double> g0 = Random(4, 6, 31), g1 = Random(4, 6, 32);
  const Mat<double> average = 0.5 * (g0 + g1);
  Mat<double> partly_reduced(4, 6);
  partly_reduced << average.topRows(2), g0.bottomRows(2);
  EXPECT_GT(MaxRelError(NewtonSchulz5(partly_reduced, 5), NewtonSchulz5(average, 5)), 0.05);

  // The scale also needs the global shape: ours 4 x 6 is PyTorch (6, 4),
  // KJ scale sqrt(1.5); a 2 x 6 row block alone would give sqrt(3).
  MuonConfig c;
  ExpectClose(MuonScale(c, 4, 6), std::sqrt(1.5), 1e-15);
  ExpectClose(MuonScale(c, 2, 6), std::sqrt(3.0), 1e-15);
}

// ---------------------------------------------------------------- fp32

TEST(Fp32, AgreesWithFp64) {
  // docs/formulas.md §8: fp32 within 1e-5 relative of fp64.
  constexpr int64_t kRows = 6, kCols = 10, kN = kRows * kCols;
  // Large learning rates, so the updates dwarf fp32's rounding of the weights (6e-8).
  MuonConfig mc;
  mc.lr = 0.1;
  AdamWConfig ac;
  ac.lr = 0.1;
  const Mat<double> w0 = Random(kRows, kCols, 40);
  Mat<double> wd = w0, mom_d = Mat<double>::Zero(kRows, kCols), ud(kRows, kCols);
  Mat<float> wf = w0.cast<float>(), mom_f = Mat<float>::Zero(kRows, kCols), uf(kRows, kCols);
  Mat<double> ad = w0, md = Mat<double>::Zero(kRows, kCols), vd = md;
  Mat<float> af = wf, mf = Mat<float>::Zero(kRows, kCols), vf = mf;
  const double scale = MuonScale(mc, kRows, kCols);
  for (int64_t step = 1; step <= 3; ++step) {
    const Mat<double> gd = Random(kRows, kCols, 50 + static_cast<uint64_t>(step));
    const Mat<float> gf = gd.cast<float>();
    MuonMomentum(mc, gd.data(), mom_d.data(), ud.data(), kN);
    MuonMomentum(mc, gf.data(), mom_f.data(), uf.data(), kN);
    const Mat<double> od = NewtonSchulz5(ud, mc.ns_steps);
    const Mat<float> of = NewtonSchulz5(uf, mc.ns_steps);
    EXPECT_LE(MaxRelError(of, od), 1e-5) << "NS step " << step;
    MuonApply(mc, scale, wd.data(), od.data(), kN);
    MuonApply(mc, scale, wf.data(), of.data(), kN);
    AdamWStep(ac, step, ad.data(), gd.data(), md.data(), vd.data(), kN);
    AdamWStep(ac, step, af.data(), gf.data(), mf.data(), vf.data(), kN);
  }
  // The updates themselves, not just the weights (which are dominated by w0).
  EXPECT_LE(MaxRelError(Mat<float>(wf - w0.cast<float>()), Mat<double>(wd - w0)), 1e-5);
  EXPECT_LE(MaxRelError(Mat<float>(af - w0.cast<float>()), Mat<double>(ad - w0)), 1e-5);
}

}  // namespace
}  // namespace preflight::sim::simulator_optimizers_test

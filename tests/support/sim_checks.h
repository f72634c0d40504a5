// Checks shared by the simulator's block tests: random inputs, the two
// relative errors (sharded vs one rank; analytic vs finite differences),
// central finite differences, a one-rank context, sharded-vs-one-rank block
// runs and the bytes a rank counted. Header-only: only simulator tests, which
// see the executor's internal headers and Eigen, include it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "blocks.h"
#include "preflight/inventory/layout.h"
#include "support/sim_block_harness.h"
#include "world.h"

namespace preflight::sim::testing {

/// The finite-difference checks' model: h 8, 4 heads / 2 KV heads of 4, ffn
/// 12, 4 experts top-2 of 6 and a shared expert of 6, vocab 16, 6 positions x
/// batch 2.
inline Dims SmallDims() {
  Dims d;
  d.hidden = 8;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 4;
  d.ffn = 12;
  d.experts = 4;
  d.top_k = 2;
  d.expert_ffn = 6;
  d.shared_ffn = 6;
  d.vocab = 16;
  d.seq = 6;
  d.batch = 2;
  return d;
}

/// SmallDims with MLA attention: 4 heads with d_nope 4, d_rope 2, d_v 3 (three
/// widths, so a slip between them shows), latents d_cq 6 and d_c 4.
inline Dims SmallMlaDims() {
  Dims d = SmallDims();
  d.mla = true;
  d.heads = d.kv_heads = 4;
  d.mla_q_lora = 6;
  d.mla_kv_lora = 4;
  d.mla_rope = 2;
  d.mla_nope = 4;
  d.mla_v = 3;
  d.head_dim = d.mla_nope + d.mla_rope;
  return d;
}

/// rows x cols entries uniform in [lo, hi) from mt19937_64(seed).
inline Mat<double> Random(int64_t rows, int64_t cols, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Mat<double> m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = u(gen);
  return m;
}

/// rows x cols entries in [-1, 1) from the executor's parameter initialiser
/// (GlobalValue, named "input<seed>"): other values than Random's.
inline Mat<double> GlobalValueInput(int64_t rows, int64_t cols, uint64_t seed) {
  return GlobalValue("input" + std::to_string(seed), rows, cols, Init::kMatrix, seed, 1.0);
}

/// max |a - b| / max |b|: sharded against one rank, or any two results.
inline double Rel(const Mat<double>& a, const Mat<double>& b) {
  return (a - b).cwiseAbs().maxCoeff() / std::max(1e-300, b.cwiseAbs().maxCoeff());
}

/// max |analytic - numeric| / max(1e-3, max |numeric|): a gradient against
/// finite differences, where a near-zero numeric gradient would otherwise
/// turn the truncation error into a large relative one.
inline double FdRelError(const Mat<double>& analytic, const Mat<double>& numeric) {
  const double scale = std::max(1e-3, numeric.cwiseAbs().maxCoeff());
  return (analytic - numeric).cwiseAbs().maxCoeff() / scale;
}

/// Step of the central differences: dL/dθ ≈ (L(θ + h) - L(θ - h)) / 2h; the
/// O(h²) truncation with h = 1e-5 leaves ~1e-9 relative error (tests assert 1e-6).
constexpr double kFdStep = 1e-5;

/// Numeric gradient of `loss` with respect to every entry of `*theta`.
inline Mat<double> Numeric(Mat<double>* theta, const std::function<double()>& loss) {
  Mat<double> g(theta->rows(), theta->cols());
  for (int64_t i = 0; i < theta->size(); ++i) {
    const double keep = theta->data()[i];
    theta->data()[i] = keep + kFdStep;
    const double up = loss();
    theta->data()[i] = keep - kFdStep;
    const double down = loss();
    theta->data()[i] = keep;
    g.data()[i] = (up - down) / (2 * kFdStep);
  }
  return g;
}

/// Runs `body` on a one-rank world with a context of degree-1 groups (tp,
/// cp, ep, etp, edp); `seq` > 0 also sets the one-rank sequence layout.
inline void OnOneRank(int64_t seq, const std::function<void(Ctx&)>& body) {
  World world(1);
  const Group& g = world.NewGroup(Axis::kTp, {0});
  world.Run([&](Rank& r) {
    Ctx ctx;
    ctx.rank = &r;
    ctx.tp = ctx.ep = ctx.etp = ctx.edp = ctx.cp = &g;
    if (seq > 0) ctx.seq = SeqLayout::Make(seq, 1, 0, false);
    body(ctx);
  });
}
inline void OnOneRank(const std::function<void(Ctx&)>& body) { OnOneRank(0, body); }

/// The block's hand-written backward against central finite differences in
/// `ctx` (one rank): L = sum(F(x) * R) for x = Random(seed 11) and R =
/// Random(seed 12), dx and every parameter's gradient within `tolerance`
/// (FdRelError). Each loss evaluation is its own micro-batch: FD runs
/// forwards only.
inline void ExpectBackwardMatchesFd(Ctx& ctx, Block<double>& block, const Dims& d, double tolerance,
                                    const std::string& what = "") {
  Mat<double> x = Random(d.tokens(), d.hidden, 11);
  const Mat<double> r = Random(d.tokens(), d.hidden, 12);
  const auto loss = [&] {
    ++ctx.microbatch;
    return block.Forward(ctx, x).cwiseProduct(r).sum();
  };
  loss();
  const Mat<double> dx = block.Backward(ctx, r);
  EXPECT_LT(FdRelError(dx, Numeric(&x, loss)), tolerance) << what << " dx";
  for (Param<double>* p : block.params()) {
    EXPECT_LT(FdRelError(p->grad.m, Numeric(&p->value.m, loss)), tolerance) << what << " " << p->name;
  }
}

/// Sharded equals unsharded: output, input gradient and every parameter
/// gradient within `tolerance` (Rel; fp64 1e-10 relative, docs/formulas.md §8).
inline void ExpectSame(const BlockRun& got, const BlockRun& ref, const std::string& what, double tolerance = 1e-10) {
  EXPECT_LT(Rel(got.y, ref.y), tolerance) << what << " y";
  EXPECT_LT(Rel(got.dx, ref.dx), tolerance) << what << " dx";
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (const auto& [name, g] : ref.grads) EXPECT_LT(Rel(got.grads.at(name), g), tolerance) << what << " " << name;
}

/// A block layout of tp x cp ranks; `mode` is how M and R blocks cross CP.
inline BlockLayout MakeBlockLayout(int tp, int cp, bool sp, CpRecurrent mode = CpRecurrent::kAllToAll,
                                   bool balance = true) {
  BlockLayout l;
  l.tp = tp;
  l.cp = cp;
  l.sp = sp;
  l.cp_recurrent = mode;
  l.load_balance = balance;
  return l;
}

/// The planner's and the estimator's layout of a block run: its tp, cp, sp
/// and CP modes, micro-batch d.batch, one micro-batch, no recompute.
inline Layout ModelLayout(const Dims& d, const BlockLayout& b) {
  Layout l;
  l.tp = b.tp;
  l.cp = b.cp;
  l.sp = b.sp;
  l.micro_batch = d.batch;
  l.micro_batches = 1;
  l.recompute = Recompute::kNone;
  l.cp_comm = b.cp_comm;
  l.cp_recurrent = b.cp_recurrent;
  l.cp_load_balance = b.load_balance;
  return l;
}

/// "tp2 cp4 sp handoff balanced": a layout for failure messages.
inline std::string Describe(const BlockLayout& l) {
  return "tp" + std::to_string(l.tp) + " cp" + std::to_string(l.cp) + (l.sp ? " sp" : "") +
         (l.cp_recurrent == CpRecurrent::kHandoff ? " handoff" : " a2a") + (l.load_balance ? " balanced" : "");
}

/// Bytes a rank sent in the (axis, kind, pass, what) bucket, and its calls.
inline std::pair<int64_t, int64_t> SentAndCalls(const std::vector<CommCount>& counts, Axis axis, CollectiveKind kind,
                                                Pass pass, CommWhat what) {
  std::pair<int64_t, int64_t> out{0, 0};
  for (const CommCount& c : counts) {
    if (c.axis == axis && c.kind == kind && c.pass == pass && c.what == what) {
      out.first += c.bytes_sent;
      out.second += c.calls;
    }
  }
  return out;
}

/// Bytes a rank sent in the (axis, kind, pass, what) bucket.
inline int64_t Sent(const std::vector<CommCount>& counts, Axis axis, CollectiveKind kind, Pass pass, CommWhat what) {
  return SentAndCalls(counts, axis, kind, pass, what).first;
}

}  // namespace preflight::sim::testing

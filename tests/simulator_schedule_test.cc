// Pipeline schedules and rank placement of the executor, against hand-written
// orders (Megatron schedules.py) and against the estimator's and planner's
// independent formulas for the same quantities.
#include <gtest/gtest.h>

#include <vector>

#include "preflight/inventory/layout.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/planner/plan.h"
#include "schedule.h"
#include "topology.h"

namespace preflight::sim::simulator_schedule_test {
namespace {

PipeOp F(int64_t chunk, int64_t mb) { return {true, chunk, mb}; }
PipeOp B(int64_t chunk, int64_t mb) { return {false, chunk, mb}; }

TEST(SimulatorSchedule, OneFOneBByHand) {
  // p = 4, m = 6, rank 0: warmup p - r - 1 = 3 forwards, then F/B pairs, then the cooldown.
  const std::vector<PipeOp> want = {F(0, 0), F(0, 1), F(0, 2), F(0, 3), B(0, 0), F(0, 4), B(0, 1),
                                    F(0, 5), B(0, 2), B(0, 3), B(0, 4), B(0, 5)};
  EXPECT_EQ(PipelineSchedule(Schedule::k1F1B, 4, 1, 6, 0), want);
  // The last stage has no warmup: forward and backward alternate.
  const std::vector<PipeOp> last = {F(0, 0), B(0, 0), F(0, 1), B(0, 1), F(0, 2), B(0, 2),
                                    F(0, 3), B(0, 3), F(0, 4), B(0, 4), F(0, 5), B(0, 5)};
  EXPECT_EQ(PipelineSchedule(Schedule::k1F1B, 4, 1, 6, 3), last);
}

TEST(SimulatorSchedule, InterleavedByHand) {
  // p = 2, v = 2, m = 4, rank 0. Megatron's table with groups of g = p = 2:
  // (mb0,c0) (mb1,c0) (mb0,c1) (mb1,c1) (mb2,c0) (mb3,c0) (mb2,c1) (mb3,c1).
  // Warmup 2(p - r - 1) + (v - 1) g = 4; a backward runs chunk v-1-c of its entry.
  const std::vector<PipeOp> want = {F(0, 0), F(0, 1), F(1, 0), F(1, 1),                    // warmup
                                    F(0, 2), B(1, 0), F(0, 3), B(1, 1), F(1, 2), B(0, 0),  // steady
                                    F(1, 3), B(0, 1),                                      //
                                    B(1, 2), B(1, 3), B(0, 2), B(0, 3)};                   // cooldown
  EXPECT_EQ(PipelineSchedule(Schedule::kInterleaved, 2, 2, 4, 0), want);
  EXPECT_EQ(PeakInFlight(want), 5);
}

TEST(SimulatorSchedule, PeakInFlightEqualsTheEstimatorsScheduleModel) {
  // docs/formulas.md §4.1, hand example: 1F1B p = 4, m = 8 holds 4, 3, 2, 1.
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(PeakInFlight(PipelineSchedule(Schedule::k1F1B, 4, 1, 8, r)), 4 - r);
  // The estimator's closed forms (independent code) over a grid.
  for (int64_t p : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 4, 8, 12}) {
      for (int64_t r = 0; r < p; ++r) {
        EXPECT_EQ(PeakInFlight(PipelineSchedule(Schedule::k1F1B, p, 1, m, r)), OneFOneBInFlight(p, m, r))
            << "p " << p << " m " << m << " r " << r;
        if (p == 1 || m < p) continue;  // Megatron requires m >= p for interleaving
        for (int64_t v : {2, 3}) {
          EXPECT_EQ(PeakInFlight(PipelineSchedule(Schedule::kInterleaved, p, v, m, r)), InterleavedLive(p, v, m, r, p))
              << "p " << p << " v " << v << " m " << m << " r " << r;
        }
      }
    }
  }
}

TEST(SimulatorSchedule, EveryMicroBatchRunsForwardThenBackwardOnce) {
  for (int64_t r = 0; r < 4; ++r) {
    const std::vector<PipeOp> ops = PipelineSchedule(Schedule::kInterleaved, 4, 3, 8, r);
    ASSERT_EQ(ops.size(), 2u * 3 * 8);
    std::vector<int> state(3 * 8, 0);  // 0 none, 1 forward done, 2 backward done
    for (const PipeOp& op : ops) {
      int& s = state[static_cast<size_t>(op.chunk * 8 + op.microbatch)];
      EXPECT_EQ(s, op.forward ? 0 : 1);
      s = op.forward ? 1 : 2;
    }
    for (int s : state) EXPECT_EQ(s, 2);
  }
}

// DualPipe (deepseek-ai/DualPipe dualpipe/dualpipe.py, DualPipe.step), p 2,
// m 4: chunk 0 = stage r for micro-batches 0, 1 (entering at rank 0), chunk 1
// = stage 1-r for 2, 3 (entering at rank 1); W runs inside B. Rank 0 (half_rank
// 0, H 1): step 1 2(H-h-1) = 0; step 2 h+1 = 1 x (F0 F1); step 3 0; step 4
// m/2-p+h+1 = 1 x (F0 B1 F1 B0); step 5 0; step 6 1 x (B1 B0); step 7 0.
// Rank 1 is in the second half: its phase 0 is chunk 1 (phase ^= 1).
TEST(SimulatorSchedule, DualPipeByHand) {
  const std::vector<PipeOp> r0 = {F(0, 0), F(1, 2), F(0, 1), B(1, 2), F(1, 3), B(0, 0), B(1, 3), B(0, 1)};
  EXPECT_EQ(PipelineSchedule(Schedule::kDualPipe, 2, 2, 4, 0), r0);
  const std::vector<PipeOp> r1 = {F(1, 2), F(0, 0), F(1, 3), B(0, 0), F(0, 1), B(1, 2), B(0, 1), B(1, 3)};
  EXPECT_EQ(PipelineSchedule(Schedule::kDualPipe, 2, 2, 4, 1), r1);
  // The DualPipe README's PP + 1 activations.
  EXPECT_EQ(PeakInFlight(r0), 3);
  EXPECT_EQ(PeakInFlight(r1), 3);
}

TEST(SimulatorSchedule, DualPipeRunsEachHalfOnItsChunk) {
  for (int64_t p : {2, 4, 8}) {
    for (int64_t m : {2 * p, 2 * p + 2, 4 * p}) {
      for (int64_t r = 0; r < p; ++r) {
        const std::vector<PipeOp> ops = PipelineSchedule(Schedule::kDualPipe, p, 2, m, r);
        ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m));
        std::vector<int> state(static_cast<size_t>(m), 0);
        for (const PipeOp& op : ops) {
          EXPECT_EQ(op.chunk, op.microbatch < m / 2 ? 0 : 1);  // the first half goes down through chunk 0
          int& s = state[static_cast<size_t>(op.microbatch)];
          EXPECT_EQ(s, op.forward ? 0 : 1) << "p " << p << " m " << m << " r " << r;
          s = op.forward ? 1 : 2;
        }
        for (int s : state) EXPECT_EQ(s, 2);
      }
    }
  }
  EXPECT_THROW(PipelineSchedule(Schedule::kDualPipe, 3, 2, 8, 0), SimUnsupported);  // odd pp
  EXPECT_THROW(PipelineSchedule(Schedule::kDualPipe, 4, 2, 6, 0), SimUnsupported);  // m < 2p
}

// DualPipeV (deepseek-ai/DualPipe dualpipev.py, DualPipeV.step, 3da1bbe), p 2,
// m 4, chunk 0 = the down chunk, 1 = the up chunk; W runs inside B.
// Rank 0: step 1 2(p-r-1) = 2 F0; step 2 r+1 = 1 x (F0 F1); step 3 p-r-1 = 1 x
// (B1 F1); step 4 m-2p+r+1 = 1 x (F0 B1 F1 B0); step 5 1 x (B1 F1 B0); step 6
// 1 x (B1 B0); step 7 1 x B0.
// Rank 1 (the V's bottom): step 2 2 x (F0 F1); step 4 2 x (F0 B1 F1 B0); step 6 2 x (B1 B0).
TEST(SimulatorSchedule, DualPipeVByHand) {
  const std::vector<PipeOp> r0 = {F(0, 0), F(0, 1), F(0, 2), F(1, 0), B(1, 0), F(1, 1), F(0, 3), B(1, 1),
                                  F(1, 2), B(0, 0), B(1, 2), F(1, 3), B(0, 1), B(1, 3), B(0, 2), B(0, 3)};
  EXPECT_EQ(PipelineSchedule(Schedule::kDualPipeV, 2, 2, 4, 0), r0);
  const std::vector<PipeOp> r1 = {F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(0, 2), B(1, 0), F(1, 2), B(0, 0),
                                  F(0, 3), B(1, 1), F(1, 3), B(0, 1), B(1, 2), B(0, 2), B(1, 3), B(0, 3)};
  EXPECT_EQ(PipelineSchedule(Schedule::kDualPipeV, 2, 2, 4, 1), r1);
  // The DualPipe README's PP+1 activations with PP = 2p V-stages: 2p + 1 = 5.
  EXPECT_EQ(PeakInFlight(r0), 5);
  EXPECT_EQ(PeakInFlight(r1), 5);
}

TEST(SimulatorSchedule, DualPipeVRunsEveryMicroBatchOnceAndHoldsTwoPPlusOne) {
  for (int64_t p : {1, 2, 3, 4, 8}) {
    for (int64_t m : {2 * p, 2 * p + 1, 3 * p, int64_t{20}}) {
      for (int64_t r = 0; r < p; ++r) {
        const std::vector<PipeOp> ops = PipelineSchedule(Schedule::kDualPipeV, p, 2, m, r);
        ASSERT_EQ(ops.size(), static_cast<size_t>(4 * m));
        std::vector<int> state(static_cast<size_t>(2 * m), 0);
        for (const PipeOp& op : ops) {
          int& s = state[static_cast<size_t>(op.chunk * m + op.microbatch)];
          EXPECT_EQ(s, op.forward ? 0 : 1) << "p " << p << " m " << m << " r " << r;
          s = op.forward ? 1 : 2;
        }
        for (int s : state) EXPECT_EQ(s, 2);
        EXPECT_EQ(PeakInFlight(ops), 2 * p + 1) << "p " << p << " m " << m << " r " << r;
      }
    }
  }
  EXPECT_THROW(PipelineSchedule(Schedule::kDualPipeV, 4, 2, 7, 0), SimUnsupported);  // m < 2p
}

TEST(SimulatorTopology, CoordinatesByHand) {
  Topology t;
  t.tp = 2;
  t.cp = 1;
  t.dp = 2;
  t.pp = 2;
  // tp->cp->dp->pp: rank = tp + 2(cp + 1(dp + 2 pp)); 5 = 1 + 2 x 2: dp 0, pp 1.
  Topology::Coord c = t.CoordOf(5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  // tp->cp->pp->dp (Llama 3): rank = tp + 2(cp + 1(pp + 2 dp)); 5 = 1 + 2 x 2: pp 0, dp 1.
  t.order = AxisOrder::kTpCpPpDp;
  c = t.CoordOf(5);
  EXPECT_EQ(c.pp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(t.RankOf(1, 0, 1, 0), 5);
}

TEST(SimulatorTopology, AgreesWithThePlannersPlacement) {
  // The executor places ranks with its own code; the planner's placer is the
  // model. Every rank's coordinates, expert view included, must agree.
  for (AxisOrder order : {AxisOrder::kTpCpDpPp, AxisOrder::kTpCpPpDp}) {
    Layout l;
    l.tp = 2;
    l.cp = 2;
    l.dp = 3;
    l.pp = 2;
    l.ep = 3;
    l.expert_tp = 2;
    l.order = order;
    Topology t;
    t.tp = 2;
    t.cp = 2;
    t.dp = 3;
    t.pp = 2;
    t.ep = 3;
    t.etp = 2;
    t.edp = 2;
    t.order = order;
    for (int r = 0; r < t.world(); ++r) {
      const Topology::Coord mine = t.CoordOf(r);
      const RankCoord model = CoordOf(l, r, 8);
      EXPECT_EQ(mine.tp, model.tp);
      EXPECT_EQ(mine.cp, model.cp);
      EXPECT_EQ(mine.dp, model.dp);
      EXPECT_EQ(mine.pp, model.pp);
      EXPECT_EQ(mine.etp, model.expert_tp);
      EXPECT_EQ(mine.ep, model.ep);
      EXPECT_EQ(mine.edp, model.expert_dp);
      EXPECT_EQ(t.RankOfExpert(mine.etp, mine.ep, mine.edp, mine.pp), r);
    }
  }
}

TEST(SimulatorTopology, DenseGradientGroupIsDataTimesContextParallel) {
  Topology t;
  t.tp = 2;
  t.cp = 2;
  t.dp = 2;
  t.pp = 1;
  t.edp = 8;
  World world(t.world());
  const std::vector<RankGroups> g = MakeGroups(world, t);
  // Rank 0's d x c group: tp 0, ordered cp + c dp: (0,0)=0, (1,0)=2, (0,1)=4, (1,1)=6.
  EXPECT_EQ(g[0].dp_cp->members, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(g[0].dp_cp->axis, Axis::kDpCp);
  EXPECT_EQ(g[1].tp->members, (std::vector<int>{0, 1}));
  EXPECT_EQ(g[3].cp->members, (std::vector<int>{1, 3}));
  EXPECT_EQ(g[0].prev_pp, -1);
  EXPECT_EQ(g[0].next_pp, -1);
}

}  // namespace
}  // namespace preflight::sim::simulator_schedule_test

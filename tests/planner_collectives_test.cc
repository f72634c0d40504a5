// Collective volumes, link times and bubble fractions against the NCCL
// conventions (docs/formulas.md §7.1, nccl-tests PERFORMANCE.md) and docs/formulas.md §4.2,
// with the arithmetic done by hand in the comments.
#include <gtest/gtest.h>

#include "preflight/planner/plan.h"
#include "support/test_support.h"

namespace preflight::planner_collectives_test {
namespace {

using testing::RelativelyClose;

// Ring all-reduce: each rank sends 2(n-1)/n * S. 1 GiB over 8 ranks:
// 2*7/8 * 1073741824 = 1879048192.
TEST(PlannerCollectives, RingAllReduce) {
  EXPECT_EQ(RingAllReduceSendBytes(Bytes(kGiB), 8).count(), 1879048192);
  EXPECT_EQ(RingAllReduceSendBytes(Bytes(1000), 2).count(), 1000);  // 2*1/2*1000
  EXPECT_EQ(RingAllReduceSendBytes(Bytes(1000), 1).count(), 0);      // nothing to reduce
  EXPECT_EQ(RingAllReduceSendBytes(Bytes(10), 3).count(), 13);       // floor(2*2*10/3) = floor(13.33)
}

// All-gather / reduce-scatter / all-to-all: (n-1)/n * S. 1 GiB over 8:
// 7/8 * 1073741824 = 939524096; over 4: 3/4 * 4096 = 3072.
TEST(PlannerCollectives, GatherScatterAllToAll) {
  EXPECT_EQ(RingAllGatherSendBytes(Bytes(kGiB), 8).count(), 939524096);
  EXPECT_EQ(RingReduceScatterSendBytes(Bytes(kGiB), 8).count(), 939524096);
  EXPECT_EQ(AllToAllSendBytes(Bytes(4096), 4).count(), 3072);
  EXPECT_EQ(SendBytes(Collective::kSendRecv, Bytes(4096), 2).count(), 4096);
  EXPECT_EQ(RingSteps(Collective::kAllReduce, 8), 14);
  EXPECT_EQ(RingSteps(Collective::kAllGather, 8), 7);
}

GpuSpec H200() {
  GpuSpec g;
  g.name = "h200";
  g.bf16_dense_tflops = 989;
  g.nvlink_gbps_per_dir = 450;
  g.ib_gbps_per_dir = 50;
  return g;
}

// Inside a node: t = alpha * 2(n-1) + 2(n-1)/n * S / (eta_nvl * 450 GB/s).
// n = 8, S = 1 GiB, alpha = 8 us, eta = 0.8:
// 14 * 8e-6 + 1879048192 / 360e9 = 1.12e-4 + 5.2196e-3 = 5.33162e-3 s.
TEST(PlannerCollectives, IntraNodeAllReduceTime) {
  AxisLocality loc;
  loc.size = 8;
  loc.intra_node = true;
  const double t = CollectiveSeconds(Collective::kAllReduce, Bytes(kGiB), loc, LinksOf(H200()), CostModel{});
  EXPECT_TRUE(RelativelyClose(t, 14 * 8e-6 + 1879048192.0 / 360e9, 1e-12)) << t;
}

// A ring with one member per node runs at min(eta_nvl*450, 1*eta_ib*50) = 40 GB/s
// (docs/formulas.md §7.1 B_eff): AG of 1 GiB over 4 ranks: 3 * 8e-6 + 805306368 / 40e9.
TEST(PlannerCollectives, SpanningRingUsesIb) {
  AxisLocality loc;
  loc.size = 4;
  loc.intra_node = false;
  loc.min_members_per_node = 1;
  const double t = CollectiveSeconds(Collective::kAllGather, Bytes(kGiB), loc, LinksOf(H200()), CostModel{});
  EXPECT_TRUE(RelativelyClose(t, 3 * 8e-6 + 805306368.0 / 40e9, 1e-12)) << t;
}

// Spanning all-to-all, n = 16 with 8 per node, S_loc = 1.6 GB:
// NVLink part 1.6e9 * 7/16 / 360e9 = 1.9444e-3; IB part 1.6e9 * 8/16 / 40e9 = 0.02;
// the IB part dominates: 15 * 8e-6 + 0.02.
TEST(PlannerCollectives, SpanningAllToAllSplitsNvlinkAndIb) {
  AxisLocality loc;
  loc.size = 16;
  loc.intra_node = false;
  loc.min_members_per_node = 8;
  const double t = CollectiveSeconds(Collective::kAllToAll, Bytes(1'600'000'000), loc, LinksOf(H200()), CostModel{});
  EXPECT_TRUE(RelativelyClose(t, 15 * 8e-6 + 0.02, 1e-12)) << t;
}

// docs/formulas.md §4.2: 1F1B bubble (p-1)(t_F+t_B) against m(t_F+t_B) of work, so the
// share of the step is (p-1)/(m+p-1): p = 4, m = 8 -> 3/11. Interleaved divides
// the bubble by v: (p-1)/(v*m+p-1) = 3/19 for v = 2. Megatron paper
// (Narayanan et al. 2021, eq. 1): bubble/ideal = (p-1)/m, the same quantity
// before normalising by the step.
TEST(PlannerBubble, OneFOneBAndInterleaved) {
  EXPECT_DOUBLE_EQ(BubbleFraction(Schedule::k1F1B, 4, 1, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(Schedule::kInterleaved, 4, 2, 8), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(Schedule::k1F1B, 1, 1, 8), 0.0);
  // Narayanan et al. 2021: p = 8, m = 32 -> (p-1)/m = 7/32 of the ideal time,
  // i.e. 7/39 of the step.
  EXPECT_DOUBLE_EQ(BubbleFraction(Schedule::k1F1B, 8, 1, 32), 7.0 / 39.0);
}

// DualPipe (DS3 table, docs/formulas.md §4.2): (p/2-1)(F&B + B - 3W). With F&B = F+B,
// B = 2F, W = B/2 = F: (p/2-1)(F + 2F + 2F - 3F) = (p/2-1)*2F. Against
// m(F+B) = 3mF: p = 16, m = 20 -> 7*2/(60 + 14) = 14/74.
TEST(PlannerBubble, DualPipe) {
  EXPECT_DOUBLE_EQ(BubbleFraction(Schedule::kDualPipe, 16, 1, 20), 14.0 / 74.0);
  // Less than 1F1B's 15/35 for the same p and m.
  EXPECT_LT(BubbleFraction(Schedule::kDualPipe, 16, 1, 20), BubbleFraction(Schedule::k1F1B, 16, 1, 20));
}

}  // namespace
}  // namespace preflight::planner_collectives_test

// The simulated runtime: collective values, counted bytes (derived by hand
// from the ring algorithm in each comment), deadlock and mismatch detection.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "world.h"

namespace preflight::sim::simulator_runtime_test {
namespace {

int64_t Sent(const Rank& r, Axis axis, CollectiveKind k) {
  int64_t total = 0;
  for (const CommCount& c : r.Counts()) {
    if (c.axis == axis && c.kind == k) total += c.bytes_sent;
  }
  return total;
}
int64_t Received(const Rank& r, Axis axis, CollectiveKind k) {
  int64_t total = 0;
  for (const CommCount& c : r.Counts()) {
    if (c.axis == axis && c.kind == k) total += c.bytes_received;
  }
  return total;
}

TEST(SimulatorRuntime, AllReduceSumsAndCountsRingBytes) {
  World world(4);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1, 2, 3});
  std::vector<std::vector<double>> data(4);
  world.Run([&](Rank& r) {
    auto& d = data[static_cast<size_t>(r.id())];
    d.assign(8, 0.0);
    for (int i = 0; i < 8; ++i) d[static_cast<size_t>(i)] = r.id() * 10 + i;
    r.AllReduce(g, d.data(), 8, /*elem_bytes=*/2);
  });
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 8; ++i) EXPECT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)], 60 + 4 * i);
    // Ring AR of S = 8 elements x 2 B = 16 B on n = 4: 2(n-1) steps of one 2-element
    // chunk (4 B) each = 6 x 4 = 24 B sent and received (= 2(n-1)/n S).
    EXPECT_EQ(Sent(world.rank(r), Axis::kTp, CollectiveKind::kAllReduce), 24);
    EXPECT_EQ(Received(world.rank(r), Axis::kTp, CollectiveKind::kAllReduce), 24);
  }
}

TEST(SimulatorRuntime, AllReduceMaxAndUnevenChunks) {
  World world(3);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1, 2});
  std::vector<std::vector<double>> data(3);
  world.Run([&](Rank& r) {
    auto& d = data[static_cast<size_t>(r.id())];
    d = {double(r.id()), double(-r.id()), 5.0 * (r.id() == 1), 1.0};
    r.AllReduce(g, d.data(), 4, 4, ReduceOp::kMax);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(data[static_cast<size_t>(r)], (std::vector<double>{2, 0, 5, 1}));
  // 4 elements over 3 ranks: chunks of 2, 1, 1 elements. Rank 0 sends in the RS
  // phase chunks 2, 1 (steps 0, 1) and in the AG phase chunks 0, 2: 1+1+2+1 = 5
  // elements x 4 B = 20 B.
  EXPECT_EQ(Sent(world.rank(0), Axis::kTp, CollectiveKind::kAllReduce), 20);
}

TEST(SimulatorRuntime, AllGatherAndReduceScatter) {
  World world(2);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1});
  std::vector<std::vector<double>> gathered(2), scattered(2);
  world.Run([&](Rank& r) {
    // Uneven gather: rank 0 gives 3 elements, rank 1 gives 1.
    std::vector<double> in(r.id() == 0 ? 3 : 1, 1.0 + r.id());
    auto& out = gathered[static_cast<size_t>(r.id())];
    out.assign(4, 0.0);
    r.AllGather(g, in.data(), out.data(), {3, 1}, 2);
    std::vector<double> full = {1.0 + r.id(), 2.0, 3.0, 4.0 * r.id()};
    auto& mine = scattered[static_cast<size_t>(r.id())];
    mine.assign(2, 0.0);
    r.ReduceScatter(g, full.data(), mine.data(), {2, 2}, 2);
  });
  EXPECT_EQ(gathered[0], (std::vector<double>{1, 1, 1, 2}));
  EXPECT_EQ(gathered[1], gathered[0]);
  EXPECT_EQ(scattered[0], (std::vector<double>{3, 4}));
  EXPECT_EQ(scattered[1], (std::vector<double>{6, 4}));
  // AG: rank 0 sends its 3 elements (6 B), rank 1 its 1 element (2 B).
  EXPECT_EQ(Sent(world.rank(0), Axis::kTp, CollectiveKind::kAllGather), 6);
  EXPECT_EQ(Sent(world.rank(1), Axis::kTp, CollectiveKind::kAllGather), 2);
  EXPECT_EQ(Received(world.rank(1), Axis::kTp, CollectiveKind::kAllGather), 6);
  // RS, S = 4 elements x 2 B: each rank sends the other's 2-element chunk = 4 B = (n-1)/n S.
  EXPECT_EQ(Sent(world.rank(0), Axis::kTp, CollectiveKind::kReduceScatter), 4);
  EXPECT_EQ(Sent(world.rank(1), Axis::kTp, CollectiveKind::kReduceScatter), 4);
}

TEST(SimulatorRuntime, AllToAllUnevenSplits) {
  World world(3);
  const Group& g = world.NewGroup(Axis::kEp, {0, 1, 2});
  // Rank i sends (i + j) elements of value 100 i + j to rank j.
  std::vector<std::vector<double>> out(3);
  world.Run([&](Rank& r) {
    const int i = r.id();
    std::vector<int64_t> send, recv;
    std::vector<double> in;
    for (int j = 0; j < 3; ++j) {
      send.push_back(i + j);
      recv.push_back(j + i);
      for (int k = 0; k < i + j; ++k) in.push_back(100.0 * i + j);
    }
    auto& o = out[static_cast<size_t>(i)];
    o.assign(static_cast<size_t>(3 * i + 3), -1.0);
    r.AllToAll(g, in.data(), send, o.data(), recv, 2);
  });
  // Rank 1 receives 1 element from 0 (value 1), 2 from itself (101), 3 from 2 (201).
  EXPECT_EQ(out[1], (std::vector<double>{1, 101, 101, 201, 201, 201}));
  // Rank 1 sends 1 + 3 elements to the others (its 2 to itself stay local): 8 B.
  EXPECT_EQ(Sent(world.rank(1), Axis::kEp, CollectiveKind::kAllToAll), 8);
  EXPECT_EQ(Received(world.rank(1), Axis::kEp, CollectiveKind::kAllToAll), 8);
  EXPECT_EQ(Sent(world.rank(0), Axis::kEp, CollectiveKind::kAllToAll), (1 + 2) * 2);
}

TEST(SimulatorRuntime, BroadcastAndSendRecv) {
  World world(3);
  const Group& g = world.NewGroup(Axis::kDpCp, {0, 1, 2});
  std::vector<std::vector<double>> data(3);
  std::vector<double> got(2, 0.0);
  world.Run([&](Rank& r) {
    auto& d = data[static_cast<size_t>(r.id())];
    d.assign(5, r.id() == 1 ? 7.0 : 0.0);
    r.Broadcast(g, d.data(), 5, /*root=*/1, 2);
    if (r.id() == 0) {
      const std::vector<double> msg = {3.0, 4.0};
      r.Send(Axis::kPp, 2, msg.data(), 2, 2);
    } else if (r.id() == 2) {
      r.Recv(Axis::kPp, 0, got.data(), 2, 2);
    }
  });
  for (const auto& d : data) EXPECT_EQ(d, std::vector<double>(5, 7.0));
  EXPECT_EQ(got, (std::vector<double>{3, 4}));
  // Chain 1 -> 2 -> 0: ranks 1 and 2 forward 10 B once; rank 0 (last) sends nothing.
  EXPECT_EQ(Sent(world.rank(1), Axis::kDpCp, CollectiveKind::kBroadcast), 10);
  EXPECT_EQ(Sent(world.rank(2), Axis::kDpCp, CollectiveKind::kBroadcast), 10);
  EXPECT_EQ(Sent(world.rank(0), Axis::kDpCp, CollectiveKind::kBroadcast), 0);
  EXPECT_EQ(Sent(world.rank(0), Axis::kPp, CollectiveKind::kSend), 4);
  EXPECT_EQ(Received(world.rank(2), Axis::kPp, CollectiveKind::kRecv), 4);
}

TEST(SimulatorRuntime, CountsArePerPass) {
  World world(2);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1});
  world.Run([&](Rank& r) {
    double x[2] = {1, 2};
    r.AllReduce(g, x, 2, 2);
    r.set_pass(Pass::kBackward);
    r.AllReduce(g, x, 2, 2);
    r.AllReduce(g, x, 2, 2);
  });
  for (const CommCount& c : world.rank(0).Counts()) {
    // One 1-element chunk in each of the RS and AG phases: 2 x 2 B per call.
    EXPECT_EQ(c.calls, c.pass == Pass::kForward ? 1 : 2);
    EXPECT_EQ(c.bytes_sent, 4 * c.calls);
  }
}

TEST(SimulatorRuntime, MissingCollectiveIsADeadlockNotAHang) {
  World world(3);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1, 2});
  try {
    world.Run([&](Rank& r) {
      double x = 1.0;
      if (r.id() != 2) r.AllReduce(g, &x, 1, 2);  // rank 2 never joins
    });
    FAIL() << "expected a deadlock error";
  } catch (const SimError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 waits in all_reduce on tp group [0,1,2]"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 waits in all_reduce"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 finished"), std::string::npos) << m;
  }
}

TEST(SimulatorRuntime, CrossedSendsCompleteBecauseSendsAreEager) {
  // 1F1B's steady state: each neighbour sends before it receives. Sends are
  // eager (Megatron's batched isend/irecv), so this must not deadlock.
  World world(2);
  std::vector<double> got(2, 0.0);
  world.Run([&](Rank& r) {
    double x = 10.0 + r.id(), y = 0.0;
    r.set_what(CommWhat::kActivations);
    r.Send(Axis::kPp, 1 - r.id(), &x, 1, 2);
    r.set_what(CommWhat::kMoeCombine);  // changed after the send
    r.Recv(Axis::kPp, 1 - r.id(), &y, 1, 2);
    got[static_cast<size_t>(r.id())] = y;
  });
  EXPECT_EQ(got[0], 11.0);
  EXPECT_EQ(got[1], 10.0);
  // The send is counted under the label it was posted with.
  bool found = false;
  for (const CommCount& c : world.rank(0).Counts()) {
    if (c.kind == CollectiveKind::kSend) {
      EXPECT_EQ(c.what, CommWhat::kActivations);
      EXPECT_EQ(c.bytes_sent, 2);
      EXPECT_EQ(c.calls, 1);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(SimulatorRuntime, CrossedRecvsDeadlock) {
  World world(2);
  try {
    world.Run([&](Rank& r) {
      double x = 1.0, y = 0.0;
      // Both receive first: neither reaches its send.
      r.Recv(Axis::kPp, 1 - r.id(), &y, 1, 2);
      r.Send(Axis::kPp, 1 - r.id(), &x, 1, 2);
    });
    FAIL() << "expected a deadlock error";
  } catch (const SimError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 waits in recv on pp channel 1->0"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 waits in recv on pp channel 0->1"), std::string::npos) << m;
  }
}

TEST(SimulatorRuntime, MismatchedKindIsAnError) {
  World world(2);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1});
  try {
    world.Run([&](Rank& r) {
      std::vector<double> x(2, 1.0), y(4, 0.0);
      if (r.id() == 0) {
        r.AllReduce(g, x.data(), 2, 2);
      } else {
        r.AllGather(g, x.data(), y.data(), {2, 2}, 2);
      }
    });
    FAIL() << "expected a mismatch error";
  } catch (const SimError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mismatch on tp group [0,1] #0"), std::string::npos) << m;
    EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;
    EXPECT_NE(m.find("all_gather"), std::string::npos) << m;
  }
}

TEST(SimulatorRuntime, MismatchedSizeIsAnError) {
  World world(2);
  const Group& g = world.NewGroup(Axis::kTp, {0, 1});
  EXPECT_THROW(world.Run([&](Rank& r) {
                 std::vector<double> x(4, 1.0);
                 r.AllReduce(g, x.data(), r.id() == 0 ? 4 : 3, 2);
               }),
               SimError);
  World world2(2);
  const Group& g2 = world2.NewGroup(Axis::kEp, {0, 1});
  try {
    world2.Run([&](Rank& r) {
      std::vector<double> in(4, 1.0), out(4, 0.0);
      // Rank 0 sends 2 to rank 1, but rank 1 expects 1.
      r.AllToAll(g2, in.data(), {1, 2}, out.data(), r.id() == 0 ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{1, 1}, 2);
    });
    FAIL() << "expected a mismatch error";
  } catch (const SimError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 2 elements to rank 1, which expects 1"), std::string::npos)
        << e.what();
  }
}

TEST(SimulatorRuntime, MemoryPeaksPerCategory) {
  MemoryTracker m;
  {
    Allocation a(&m, SimCategory::kActivations, 100);
    Allocation b(&m, SimCategory::kTemporaries, 50);
    b.Release();
    Allocation c(&m, SimCategory::kActivations, 30);
    EXPECT_EQ(m.live(SimCategory::kActivations), 130);
  }
  EXPECT_EQ(m.live(SimCategory::kActivations), 0);
  EXPECT_EQ(m.peak(SimCategory::kActivations), 130);
  EXPECT_EQ(m.peak(SimCategory::kTemporaries), 50);
  EXPECT_EQ(m.peak_total(), 150);
}

}  // namespace
}  // namespace preflight::sim::simulator_runtime_test

// The MPI runtime's collectives against the thread runtime's, and its
// failure and hang reports (ctest mpi_counts_test, mpi_failure_test,
// mpi_hang_test; run under mpirun -np 4). Not a GoogleTest binary: every
// process runs it, and only rank 0 judges.
//   counts: one program of collectives (every kind, uneven and empty splits,
//     sum and max, two element types, counting off, tagged sends) runs on the
//     MPI ranks and on a 4-thread World in rank 0; every rank's results must
//     be bitwise equal and every (axis, kind, pass, what) bucket's calls and
//     bytes equal. Exit 0 when they are, 1 when not.
//   fail: rank 2 throws while the others wait in an all-reduce.
//   hang: rank 3 skips the all-reduce and finishes.
// Both end through the runtime's report (the test script checks the message
// and the exit code).
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "preflight/simulator/mpi.h"
#include "world.h"

namespace preflight::sim {
namespace {

constexpr int kRanks = 4;

/// What one rank computed: every buffer after the collectives.
std::vector<double> Program(Rank& r, const Group& all, const Group& pair, const Group& odd) {
  const int me = r.id();
  std::vector<double> out;
  const auto keep = [&](const auto& v) {
    for (auto x : v) out.push_back(static_cast<double>(x));
  };
  // Sums whose order matters in the last bits: thirds and sevenths.
  std::vector<double> a(11);
  for (size_t i = 0; i < a.size(); ++i) a[i] = (me + 1) / 3.0 + static_cast<double>(i) / 7.0;
  r.set_what(CommWhat::kGrads);
  r.AllReduce(all, a.data(), static_cast<int64_t>(a.size()), 2);
  keep(a);
  std::vector<float> f(5);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(me) * 0.3f - static_cast<float>(i);
  r.AllReduce(pair, f.data(), 5, 4, ReduceOp::kMax);
  keep(f);
  // Uneven all-gather with an empty member.
  const std::vector<int64_t> counts = {3, 0, 2, 1};
  std::vector<double> in(static_cast<size_t>(counts[static_cast<size_t>(me)]), me + 0.5);
  std::vector<double> gathered(6);
  r.set_pass(Pass::kBackward);
  r.AllGather(all, in.data(), gathered.data(), counts, 2);
  keep(gathered);
  std::vector<double> rs_in(6);
  for (size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = me * 1.1 + static_cast<double>(i) / 3.0;
  std::vector<double> rs_out(static_cast<size_t>(counts[static_cast<size_t>(me)]));
  r.ReduceScatter(all, rs_in.data(), rs_out.data(), counts, 2);
  keep(rs_out);
  // All-to-all: rank i sends i + j elements to rank j.
  std::vector<int64_t> send(kRanks), recv(kRanks);
  for (int j = 0; j < kRanks; ++j) send[static_cast<size_t>(j)] = me + j, recv[static_cast<size_t>(j)] = j + me;
  std::vector<double> a2a_in(static_cast<size_t>(4 * me + 6)), a2a_out(static_cast<size_t>(4 * me + 6));
  for (size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = me * 100 + static_cast<double>(i);
  r.set_what(CommWhat::kMoeDispatch);
  r.AllToAll(all, a2a_in.data(), send, a2a_out.data(), recv, 2);
  keep(a2a_out);
  std::vector<double> b(3, me == 1 ? 7.25 : 0.0);
  r.Broadcast(odd, b.data(), 3, 0, 4);
  keep(b);
  // Verification traffic is not counted.
  r.set_counting(false);
  r.AllReduce(all, a.data(), static_cast<int64_t>(a.size()), 2);
  r.set_counting(true);
  keep(a);
  // Tagged sends around the ring, received in the other tag order.
  r.set_pass(Pass::kForward);
  r.set_what(CommWhat::kActivations);
  const int next = (me + 1) % kRanks, prev = (me + kRanks - 1) % kRanks;
  std::vector<double> s1(4, me + 0.125), s2(2, me - 0.5), r1(4), r2(2);
  r.Send(Axis::kPp, next, s1.data(), 4, 2, 3);
  r.Send(Axis::kPp, next, s2.data(), 2, 2, 5);
  r.Recv(Axis::kPp, prev, r2.data(), 2, 2, 5);
  r.Recv(Axis::kPp, prev, r1.data(), 4, 2, 3);
  keep(r1);
  keep(r2);
  return out;
}

struct Groups {
  const Group* all;
  const Group* pair[2];  // {0,1} and {2,3}
  const Group* odd;
};

Groups MakeTestGroups(World& w) {
  const Group& all = w.NewGroup(Axis::kDpCp, {0, 1, 2, 3});
  const Group& pair0 = w.NewGroup(Axis::kTp, {0, 1});
  const Group& pair1 = w.NewGroup(Axis::kTp, {2, 3});
  // Members in a non-sorted order: the communicator ranks follow it.
  const Group& odd = w.NewGroup(Axis::kEp, {1, 3, 0, 2});
  return {&all, {&pair0, &pair1}, &odd};
}

/// A rank's results and counts as bytes (doubles bit for bit, counts field by field).
std::vector<char> Encode(const std::vector<double>& data, const std::vector<CommCount>& counts) {
  std::vector<int64_t> words;
  for (const CommCount& c : counts) {
    words.insert(words.end(), {static_cast<int64_t>(c.axis), static_cast<int64_t>(c.kind), static_cast<int64_t>(c.pass),
                               static_cast<int64_t>(c.what), c.calls, c.bytes_sent, c.bytes_received});
  }
  std::vector<char> out(data.size() * sizeof(double) + words.size() * sizeof(int64_t));
  if (!data.empty()) std::memcpy(out.data(), data.data(), data.size() * sizeof(double));
  if (!words.empty()) {
    std::memcpy(out.data() + data.size() * sizeof(double), words.data(), words.size() * sizeof(int64_t));
  }
  return out;
}

std::string Show(const CommCount& c) {
  return std::string(Key(c.axis)) + " " + Name(c.kind) + " " + Key(c.pass) + " " + Key(c.what) + ": " +
         std::to_string(c.calls) + " calls, " + std::to_string(c.bytes_sent) + " B sent, " +
         std::to_string(c.bytes_received) + " B received";
}

int Counts(MpiRuntime& mpi) {
  Transport& t = *mpi.transport();
  std::vector<double> mine;
  World world(kRanks, &t);
  const Groups g = MakeTestGroups(world);
  world.Run([&](Rank& r) { mine = Program(r, *g.all, *g.pair[r.id() / 2], *g.odd); });
  const Rank& me = world.rank(t.rank());
  if (t.rank() != 0) {
    t.Send(nullptr, 0, Transport::kResultsTag, Encode(mine, me.Counts()));
    return mpi.ShareExitCode(0);
  }
  // Rank 0: the same program on the thread runtime.
  World threads(kRanks);
  const Groups tg = MakeTestGroups(threads);
  std::vector<std::vector<double>> want(kRanks);
  threads.Run([&](Rank& r) { want[static_cast<size_t>(r.id())] = Program(r, *tg.all, *tg.pair[r.id() / 2], *tg.odd); });
  int bad = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<char> got = r == 0 ? Encode(mine, me.Counts()) : t.Recv(nullptr, r, Transport::kResultsTag, "");
    const std::vector<char> ref = Encode(want[static_cast<size_t>(r)], threads.rank(r).Counts());
    if (got != ref) {
      ++bad;
      std::fprintf(stderr, "mpi_counts: rank %d differs from the thread runtime; the thread runtime's buckets:\n", r);
      for (const CommCount& c : threads.rank(r).Counts()) std::fprintf(stderr, "  %s\n", Show(c).c_str());
    }
  }
  // An independent figure: a ring all-reduce of 11 elements x 2 B over 4 ranks
  // moves chunks of 3, 3, 3, 2 elements; rank 0 sends chunks 3, 2, 1 in the
  // reduce-scatter and 0, 3, 2 in the all-gather: 3+2+3+3+2+3 = 16 elements = 32 B.
  for (const CommCount& c : me.Counts()) {
    if (c.kind == CollectiveKind::kAllReduce && c.axis == Axis::kDpCp && c.bytes_sent != 32) {
      ++bad;
      std::fprintf(stderr, "mpi_counts: rank 0 all-reduce sent %lld B, expected 32\n",
                   static_cast<long long>(c.bytes_sent));
    }
  }
  std::printf("mpi_counts: %d of %d ranks differ from the thread runtime\n", bad, kRanks);
  return mpi.ShareExitCode(bad == 0 ? 0 : 1);
}

/// A rank fails or skips an operation; the runtime ends the run.
int Broken(MpiRuntime& mpi, bool hang) {
  Transport& t = *mpi.transport();
  World world(kRanks, &t);
  const Groups g = MakeTestGroups(world);
  world.Run([&](Rank& r) {
    std::vector<double> a(8, 1.0);
    r.AllReduce(*g.pair[r.id() / 2], a.data(), 8, 2);
    if (!hang && r.id() == 2) throw std::runtime_error("injected failure");
    if (hang && r.id() == 3) return;
    r.AllReduce(*g.all, a.data(), 8, 2);
  });
  if (t.rank() != 0) {
    t.Send(nullptr, 0, Transport::kResultsTag, {});
  } else {
    for (int r = 1; r < kRanks; ++r) t.Recv(nullptr, r, Transport::kResultsTag, "");
  }
  return mpi.ShareExitCode(0);
}

}  // namespace
}  // namespace preflight::sim

int main(int argc, char** argv) {
  using namespace preflight;
  const std::string mode = argc > 1 ? argv[1] : "counts";
  const double timeout = argc > 2 ? std::stod(argv[2]) : 30;
  MpiRuntime mpi(
      timeout,
      [](SimFailure kind, const std::string& what) {
        std::fprintf(stderr, "mpi_runtime_check: the simulated ranks failed: %s\n", what.c_str());
        return kind == SimFailure::kFailed ? 1 : 2;
      },
      2);
  if (mpi.size() != sim::kRanks) {
    std::fprintf(stderr, "mpi_runtime_check: run under mpirun -np %d\n", sim::kRanks);
    return 2;
  }
  if (mode == "counts") return sim::Counts(mpi);
  return sim::Broken(mpi, mode == "hang");
}

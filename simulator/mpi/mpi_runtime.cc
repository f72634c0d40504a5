// The MPI transport (include/preflight/simulator/mpi.h). Every wait is a
// polling loop (MPI_Iprobe), so a blocked rank can notice a hang and rank 0
// can read the control channel: a rank that failed or hangs sends its
// message there, rank 0 prints it through the CLI's handler and ends the job
// with MPI_Abort, as the thread runtime ends a run on a failure or deadlock.
#include "preflight/simulator/mpi.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "transport.h"
#include "world.h"

namespace preflight {
namespace {

// Tags of the point-to-point communicator: the exit code, the results, then
// the executor's pipeline tags shifted past them.
constexpr int kMpiExitTag = 0;
constexpr int kMpiResultsTag = 1;
constexpr int kFirstUserTag = 2;
// Tags of the control communicator (messages to rank 0).
constexpr int kFailTag = 0;
constexpr int kHangTag = 1;

double Now() { return MPI_Wtime(); }

/// Backs off while nothing arrives: a few yields, then sleeps growing to
/// 1 ms, and to 5 ms once a wait has lasted about 0.1 s (a pipeline rank
/// idle in the bubble), so an oversubscribed job (more ranks than cores)
/// leaves the cores to the ranks that have work.
void Idle(int* spins) {
  if (++*spins < 32) {
    sched_yield();
    return;
  }
  const int us = *spins > 200 ? 5000 : std::min(1000, 20 << std::min(6, (*spins - 32) / 8));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void Check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw sim::SimError(std::string("MPI call failed: ") + what);
}

}  // namespace

class MpiRuntime::Impl final : public sim::Transport {
 public:
  Impl(double timeout, FatalHandler on_fatal, int fallback_fd)
      : timeout_(timeout), on_fatal_(std::move(on_fatal)), fallback_fd_(fallback_fd) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_dup(MPI_COMM_WORLD, &p2p_);
    MPI_Comm_dup(MPI_COMM_WORLD, &control_);
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    tag_ub_ = found != 0 && ub != nullptr ? *ub : 32767;
    finished_.assign(static_cast<size_t>(size_), false);
  }

  ~Impl() override {
    WaitSends();
    for (MPI_Comm& c : comms_) MPI_Comm_free(&c);
    MPI_Comm_free(&p2p_);
    MPI_Comm_free(&control_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  /// One MPI_Comm_split per round of disjoint groups (each axis's groups
  /// partition the world: six rounds for the executor's topology); a
  /// member's communicator rank is its index in the group.
  void Connect(const std::vector<const sim::Group*>& groups) override {
    group_comm_.clear();
    std::vector<char> used(static_cast<size_t>(size_), 0);
    std::vector<const sim::Group*> round;
    const auto split = [&] {
      int color = MPI_UNDEFINED, key = 0;
      const sim::Group* mine = nullptr;
      for (const sim::Group* g : round) {
        const int i = g->IndexOf(rank_);
        if (i >= 0) color = g->id, key = i, mine = g;
      }
      MPI_Comm comm = MPI_COMM_NULL;
      Check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "MPI_Comm_split");
      if (mine != nullptr) {
        comms_.push_back(comm);
        group_comm_[mine->id] = comm;
      }
      round.clear();
      std::fill(used.begin(), used.end(), 0);
    };
    for (const sim::Group* g : groups) {
      const bool overlaps =
          std::any_of(g->members.begin(), g->members.end(), [&](int r) { return used[static_cast<size_t>(r)] != 0; });
      if (overlaps) split();
      round.push_back(g);
      for (int r : g->members) used[static_cast<size_t>(r)] = 1;
    }
    if (!round.empty()) split();
  }

  void Send(const sim::Group* g, int dest, int64_t tag, std::vector<char> message) override {
    const Channel c = ChannelOf(g, dest, tag);
    Post(c, std::move(message));
  }

  std::vector<char> Recv(const sim::Group* g, int src, int64_t tag, const std::string& pending) override {
    std::vector<char> out = Wait(ChannelOf(g, src, tag), pending);
    if (g == nullptr && tag == Transport::kResultsTag) finished_[static_cast<size_t>(src)] = true;
    return out;
  }

  [[noreturn]] void Fail(SimFailure kind, const std::string& message) override {
    if (rank_ == 0) Abort(kind, message);
    std::vector<char> m(sizeof(int) + message.size());
    const int k = static_cast<int>(kind);
    std::memcpy(m.data(), &k, sizeof k);
    std::memcpy(m.data() + sizeof k, message.data(), message.size());
    Post(Channel{control_, 0, kFailTag}, std::move(m));
    // Rank 0 ends the job when it reads the message; if it never does (it
    // hangs outside any wait), this rank ends it.
    const double start = Now();
    for (int spins = 0; Now() - start < 2 * timeout_ + 5;) {
      Progress();
      Idle(&spins);
    }
    SelfAbort(kind == SimFailure::kFailed ? 1 : 2, message);
  }

  int ShareExitCode(int code) {
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) {
        std::vector<char> m(sizeof code);
        std::memcpy(m.data(), &code, sizeof code);
        Post(Channel{p2p_, r, kMpiExitTag}, std::move(m));
      }
      return code;
    }
    const std::vector<char> m = Wait(Channel{p2p_, 0, kMpiExitTag}, "");
    int shared = 1;
    if (m.size() == sizeof shared) std::memcpy(&shared, m.data(), sizeof shared);
    return shared;
  }

 private:
  struct Channel {
    MPI_Comm comm = MPI_COMM_NULL;
    int peer = 0;  // rank in comm
    int tag = 0;
  };
  struct Outgoing {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<char> data;
  };

  Channel ChannelOf(const sim::Group* g, int global, int64_t tag) const {
    if (g != nullptr) {
      const auto it = group_comm_.find(g->id);
      const int peer = g->IndexOf(global);
      if (it == group_comm_.end() || peer < 0) throw sim::SimError("MPI runtime: no communicator for this group");
      return Channel{it->second, peer, 0};
    }
    // The results channel (Transport::kResultsTag = -1) lands on kMpiResultsTag.
    const int64_t t = tag + kFirstUserTag;
    static_assert(Transport::kResultsTag + kFirstUserTag == kMpiResultsTag);
    if (t < 0 || t > tag_ub_) {
      throw sim::SimError("MPI runtime: point-to-point tag " + std::to_string(tag) + " exceeds MPI_TAG_UB " +
                          std::to_string(tag_ub_));
    }
    return Channel{p2p_, global, static_cast<int>(t)};
  }

  /// Eager send: the buffer lives until MPI completes it.
  void Post(const Channel& c, std::vector<char> message) {
    if (message.size() > static_cast<size_t>(INT32_MAX)) throw sim::SimError("MPI runtime: a message over 2 GiB");
    outgoing_.push_back(Outgoing{MPI_REQUEST_NULL, std::move(message)});
    Outgoing& o = outgoing_.back();
    Check(MPI_Isend(o.data.data(), static_cast<int>(o.data.size()), MPI_BYTE, c.peer, c.tag, c.comm, &o.request),
          "MPI_Isend");
    Progress();
  }

  /// Waits for the next message on `c`, watching the clock unless `pending`
  /// is empty (the rank finished its program).
  std::vector<char> Wait(const Channel& c, const std::string& pending) {
    const double start = Now();
    bool reported = false;
    for (int spins = 0;;) {
      int flag = 0;
      MPI_Status status;
      Check(MPI_Iprobe(c.peer, c.tag, c.comm, &flag, &status), "MPI_Iprobe");
      if (flag != 0) {
        int bytes = 0;
        MPI_Get_count(&status, MPI_BYTE, &bytes);
        std::vector<char> out(static_cast<size_t>(bytes));
        Check(MPI_Recv(out.data(), bytes, MPI_BYTE, c.peer, c.tag, c.comm, MPI_STATUS_IGNORE), "MPI_Recv");
        return out;
      }
      if (rank_ == 0) self_finished_ = pending.empty();
      Progress();
      const double waited = Now() - start;
      if (!pending.empty() && !reported && waited > timeout_) {
        reported = true;
        ReportHang(pending);
      }
      if (reported && rank_ != 0 && waited > 3 * timeout_ + 5) {
        SelfAbort(1, "rank " + std::to_string(rank_) + " waits in " + pending + " (rank 0 did not end the run)");
      }
      Idle(&spins);
    }
  }

  /// Completes finished sends; rank 0 also reads the control channel.
  void Progress() {
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done != 0 ? outgoing_.erase(it) : it + 1;
    }
    if (rank_ == 0) ReadControl();
  }

  void WaitSends() {
    for (int spins = 0; !outgoing_.empty();) {
      Progress();
      Idle(&spins);
    }
  }

  void ReportHang(const std::string& pending) {
    const std::string what = "waits in " + pending;
    if (rank_ == 0) {
      hangs_[0] = what;
      if (hang_since_ < 0) hang_since_ = Now();
      return;
    }
    Post(Channel{control_, 0, kHangTag}, std::vector<char>(what.begin(), what.end()));
  }

  /// Rank 0: a failure ends the run at once; hang reports are collected
  /// until every rank is accounted for (or one more timeout passed).
  void ReadControl() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, control_, &flag, &status);
      if (flag == 0) break;
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      std::vector<char> m(static_cast<size_t>(bytes));
      MPI_Recv(m.data(), bytes, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, control_, MPI_STATUS_IGNORE);
      if (status.MPI_TAG == kFailTag && m.size() >= sizeof(int)) {
        int k = 0;
        std::memcpy(&k, m.data(), sizeof k);
        Abort(static_cast<SimFailure>(k), std::string(m.begin() + sizeof k, m.end()));
      }
      hangs_[status.MPI_SOURCE] = std::string(m.begin(), m.end());
      if (hang_since_ < 0) hang_since_ = Now();
    }
    if (hang_since_ < 0) return;
    int accounted = 0;
    for (int r = 0; r < size_; ++r) accounted += hangs_.count(r) > 0 || Finished(r) ? 1 : 0;
    if (accounted < size_ && Now() - hang_since_ < timeout_) return;
    std::ostringstream os;
    os << "deadlock: no pending operation completed within --hang-timeout " << timeout_ << " s;";
    for (int r = 0; r < size_; ++r) {
      const auto it = hangs_.find(r);
      os << " rank " << r << ' '
         << (it != hangs_.end() ? it->second
             : Finished(r)      ? "finished"
                                : "did not report")
         << ';';
    }
    Abort(SimFailure::kFailed, os.str());
  }

  /// Rank 0's view: the rank sent its results (or is rank 0, gathering them).
  bool Finished(int r) {
    if (r == 0) return self_finished_;
    if (finished_[static_cast<size_t>(r)]) return true;
    int flag = 0;
    MPI_Iprobe(r, kMpiResultsTag, p2p_, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }

  [[noreturn]] void Abort(SimFailure kind, const std::string& message) {
    const int code = on_fatal_(kind, message);
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  [[noreturn]] void SelfAbort(int code, const std::string& message) {
    const std::string line = "simulate: " + message + "\n";
    if (fallback_fd_ >= 0 && write(fallback_fd_, line.data(), line.size()) < 0) code = 3;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  double timeout_;
  FatalHandler on_fatal_;
  int fallback_fd_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
  MPI_Comm p2p_ = MPI_COMM_NULL, control_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> comms_;
  std::map<int, MPI_Comm> group_comm_;
  std::vector<Outgoing> outgoing_;
  // Rank 0's view of a hang.
  std::map<int, std::string> hangs_;
  double hang_since_ = -1;
  std::vector<bool> finished_;
  bool self_finished_ = false;
};

MpiRuntime::MpiRuntime(double hang_timeout_s, FatalHandler on_fatal, int fallback_fd)
    : impl_(std::make_unique<Impl>(hang_timeout_s, std::move(on_fatal), fallback_fd)) {}
MpiRuntime::~MpiRuntime() = default;
int MpiRuntime::rank() const { return impl_->rank(); }
int MpiRuntime::size() const { return impl_->size(); }
sim::Transport* MpiRuntime::transport() { return impl_.get(); }
int MpiRuntime::ShareExitCode(int code) { return impl_->ShareExitCode(code); }

}  // namespace preflight

// The second runtime of the executor: each simulated rank in its own process,
// messages through a library (MPI, simulator/mpi/). World (world.h) runs the
// local rank's program and its collectives run the thread runtime's ring,
// chain and direct algorithms from that rank's side (remote_inl.h), so results
// and byte counts are the thread runtime's. A Transport only moves opaque
// messages between ranks, in order per channel, and ends the run when a rank
// fails or hangs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "preflight/simulator/sim.h"

namespace preflight::sim {

struct Group;

class Transport {
 public:
  /// Channel of the executor's own traffic (each rank's results for the verifier).
  static constexpr int64_t kResultsTag = -1;

  virtual ~Transport() = default;
  /// The global rank this process runs, and how many there are.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every group of the world, in creation order, before the first
  /// operation; collective over all processes (communicators are made once).
  virtual void Connect(const std::vector<const Group*>& groups) = 0;
  /// Sends `message` to global rank `dest` without waiting: on group `g`'s
  /// channel, or with g == nullptr on the point-to-point channel `tag`.
  virtual void Send(const Group* g, int dest, int64_t tag, std::vector<char> message) = 0;
  /// The next message from global rank `src` on that channel. `pending` names
  /// the operation for hang reports; empty: this rank has finished its program
  /// (the wait is not timed, as the thread runtime's "finished").
  virtual std::vector<char> Recv(const Group* g, int src, int64_t tag, const std::string& pending) = 0;
  /// This rank's program failed: ends the whole run with `message`.
  [[noreturn]] virtual void Fail(SimFailure kind, const std::string& message) = 0;
};

}  // namespace preflight::sim

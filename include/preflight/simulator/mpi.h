// The executor's MPI runtime (library preflight_mpi, built with
// PREFLIGHT_WITH_MPI): each simulated rank is one MPI process and the
// collectives run over MPI point-to-point messages, in the in-process
// runtime's order (docs/simulate.md, "Runtimes").
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "preflight/simulator/sim.h"

namespace preflight {

class MpiRuntime {
 public:
  /// Prints rank 0's report of a failed run (a rank's failure, or a hang:
  /// the ranks and their pending operations) and returns the exit code.
  using FatalHandler = std::function<int(SimFailure kind, const std::string& message)>;

  /// Initialises MPI. A rank blocked for `hang_timeout_s` seconds reports its
  /// pending operation to rank 0, which ends the run (MPI_Abort) with
  /// `on_fatal`'s code. `fallback_fd`: where a rank other than 0 writes if
  /// rank 0 never ends the run (its stdout and stderr may be silenced).
  MpiRuntime(double hang_timeout_s, FatalHandler on_fatal, int fallback_fd);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const;
  int size() const;
  /// For SimOptions::transport.
  sim::Transport* transport();
  /// Rank 0's `code` on every rank (the others pass anything), so every
  /// process of the job exits alike.
  int ShareExitCode(int code);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace preflight

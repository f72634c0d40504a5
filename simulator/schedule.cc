#include "schedule.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "preflight/simulator/sim.h"

namespace preflight::sim {
namespace {

/// Megatron get_schedule_table: (micro-batch, chunk) of each virtual
/// micro-batch, groups of g micro-batches, every chunk of a group in turn.
std::vector<std::pair<int64_t, int64_t>> ScheduleTable(int64_t m, int64_t v, int64_t g) {
  std::vector<std::pair<int64_t, int64_t>> table;
  for (int64_t first = 0; first < m; first += g) {
    const int64_t end = std::min(first + g, m);
    for (int64_t chunk = 0; chunk < v; ++chunk) {
      for (int64_t mb = first; mb < end; ++mb) table.push_back({mb, chunk});
    }
  }
  return table;
}

/// The forwards and backwards of one rank's two phases, each phase's
/// micro-batches in order (DualPipe's current_f_chunk_id / current_b_chunk_id).
class PhaseOrder {
 public:
  void F(int64_t phase) { ops_.push_back(PipeOp{true, phase, next_f_[static_cast<size_t>(phase)]++}); }
  void B(int64_t phase) { ops_.push_back(PipeOp{false, phase, next_b_[static_cast<size_t>(phase)]++}); }
  std::vector<PipeOp> Take() { return std::move(ops_); }

 private:
  std::vector<PipeOp> ops_;
  std::array<int64_t, 2> next_f_{}, next_b_{};
};

/// DeepSeek's eight steps on a rank with parameters (p, m, r), the
/// schedule's phase s running chunk s ^ flip (DualPipeV: p, m, r, no flip).
std::vector<PipeOp> EightSteps(int64_t p, int64_t m, int64_t r, int64_t flip) {
  PhaseOrder o;
  const auto f = [&](int64_t phase) { o.F(phase ^ flip); };
  const auto b = [&](int64_t phase) { o.B(phase ^ flip); };
  for (int64_t i = 0; i < 2 * (p - r - 1); ++i) f(0);
  for (int64_t i = 0; i < r + 1; ++i) {
    f(0);
    f(1);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    b(1);
    f(1);
  }
  for (int64_t i = 0; i < m - 2 * p + r + 1; ++i) {
    f(0);
    b(1);
    f(1);
    b(0);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    b(1);
    f(1);
    b(0);
  }
  for (int64_t i = 0; i < r + 1; ++i) {
    b(1);
    b(0);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) b(0);
  return o.Take();
}

/// DualPipeV (deepseek-ai/DualPipe dualpipev.py, DualPipeV.step, 3da1bbe) on
/// rank r of p: phase 0 is the down chunk r, phase 1 the up chunk 2p-1-r;
/// every micro-batch goes down and comes back up. Its eight steps, with the
/// weight-gradient halves (W, zero bubble) run inside their B:
/// 1 2(p-r-1) F0; 2 r+1 x (F0 F1); 3 p-r-1 x (B1 F1); 4 m-2p+r+1 x (F0 B1 F1 B0);
/// 5 p-r-1 x (B1 F1 B0); 6 r+1 x (B1 B0); 7 p-r-1 B0; 8 the remaining W.
std::vector<PipeOp> DualPipeV(int64_t p, int64_t m, int64_t r) {
  if (m < 2 * p) {
    throw SimUnsupported("DualPipeV needs at least 2 x pp micro-batches per step; got " + std::to_string(m));
  }
  return EightSteps(p, m, r, 0);
}

/// DualPipe (deepseek-ai/DualPipe dualpipe/dualpipe.py, DualPipe.step) on
/// rank r of p (even): chunk 0 is stage r, which the first half of the m
/// micro-batches (0..m/2-1) cross going down from rank 0, chunk 1 is stage
/// p-1-r, which the second half (m/2..m-1) cross going up from rank p-1.
/// The schedule names phases from the rank's half: for ranks r >= p/2 its
/// phase 0 is chunk 1 (phase ^= is_in_second_half). With h = min(r, p-1-r)
/// and H = p/2, its eight steps, the weight halves (W, zero bubble) run
/// inside their B: 1 2(H-h-1) F0; 2 h+1 x (F0 F1); 3 H-h-1 x (B1 F1);
/// 4 m/2-p+h+1 x (F0 B1 F1 B0); 5 H-h-1 x (B1 F1 B0); 6 h+1 x (B1 B0);
/// 7 H-h-1 B0; 8 the remaining W: DualPipeV's steps with (p/2, m/2, h).
std::vector<PipeOp> DualPipe(int64_t p, int64_t m, int64_t r) {
  if (p % 2 != 0 || m % 2 != 0 || m < 2 * p) {
    throw SimUnsupported("DualPipe needs an even pp and an even micro-batch count of at least 2 x pp; got pp " +
                         std::to_string(p) + ", " + std::to_string(m) + " micro-batches");
  }
  std::vector<PipeOp> ops = EightSteps(p / 2, m / 2, std::min(r, p - 1 - r), r >= p / 2 ? 1 : 0);
  for (PipeOp& op : ops) op.microbatch += op.chunk * (m / 2);  // chunk 1 runs the second half
  return ops;
}

}  // namespace

std::vector<PipeOp> PipelineSchedule(Schedule schedule, int64_t p, int64_t v, int64_t m, int64_t rank, int64_t group) {
  if (schedule == Schedule::kDualPipeV) return DualPipeV(p, m, rank);
  if (schedule == Schedule::kDualPipe) return DualPipe(p, m, rank);
  const int64_t g = group > 0 ? group : p;
  const auto table = ScheduleTable(m, v, g);
  const int64_t total = m * v;
  int64_t warmup = v == 1 ? p - rank - 1 : 2 * (p - rank - 1) + (v - 1) * g;
  warmup = std::min(warmup, total);
  const auto fwd = [&](int64_t k) {
    return PipeOp{true, table[static_cast<size_t>(k)].second, table[static_cast<size_t>(k)].first};
  };
  const auto bwd = [&](int64_t k) {
    return PipeOp{false, v - 1 - table[static_cast<size_t>(k)].second, table[static_cast<size_t>(k)].first};
  };
  std::vector<PipeOp> ops;
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(fwd(k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(fwd(k + warmup));
    ops.push_back(bwd(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(bwd(k));
  return ops;
}

int64_t PeakInFlight(const std::vector<PipeOp>& ops) {
  int64_t live = 0, peak = 0;
  for (const PipeOp& op : ops) {
    live += op.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace preflight::sim

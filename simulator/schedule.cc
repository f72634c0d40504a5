#include "schedule.h"

#include <algorithm>
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

}  // namespace

std::vector<PipeOp> PipelineSchedule(Schedule schedule, int64_t p, int64_t v, int64_t m, int64_t rank) {
  if (schedule != Schedule::k1F1B && schedule != Schedule::kInterleaved) {
    throw SimUnsupported(std::string("the executor runs the 1f1b and interleaved schedules; got parallel.schedule = ") +
                         Name(schedule));
  }
  const auto table = ScheduleTable(m, v, p);
  const int64_t total = m * v;
  int64_t warmup = v == 1 ? p - rank - 1 : 2 * (p - rank - 1) + (v - 1) * p;
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

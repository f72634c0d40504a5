// Pipeline schedules of the reference executor: the order in which one
// pipeline rank runs the forward and backward of its (chunk, micro-batch)
// pairs, as Megatron's schedules.py orders them (docs/formulas.md §4.1).
#pragma once

#include <cstdint>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight::sim {

/// One step of a pipeline rank: the forward or backward of micro-batch
/// `microbatch` through the rank's model chunk `chunk` (0..v-1, the chunk's
/// global index is chunk * p + rank).
struct PipeOp {
  bool forward = true;
  int64_t chunk = 0;
  int64_t microbatch = 0;
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

/// The order of pipeline rank `rank` (0..p-1) for `m` micro-batches:
/// - 1F1B (v = 1): warmup min(p - rank - 1, m) forwards, then one forward and
///   one backward per remaining micro-batch, then the cooldown backwards
///   (p = 1 is Megatron's no-pipelining loop: F, B per micro-batch);
/// - interleaved (v > 1): Megatron's schedule table (micro-batches in groups of
///   g, parallel.microbatch_group, p when 0; chunk-major inside a group;
///   backwards run the chunks in reverse),
///   warmup 2(p - rank - 1) + (v - 1) g forwards (all of them when that
///   reaches m v), then 1F1B over the table, then the cooldown.
/// - DualPipeV (v = 2: chunk 0 the down chunk `rank`, chunk 1 the up chunk
///   2p-1-rank): DeepSeek's eight-step order (schedule.cc DualPipeV), m >= 2p.
/// - DualPipe (v = 2: chunk 0 stage `rank` for micro-batches 0..m/2-1 going
///   down, chunk 1 stage p-1-rank for m/2..m-1 going up): DeepSeek's
///   eight-step order (schedule.cc DualPipe), p and m even, m >= 2p.
std::vector<PipeOp> PipelineSchedule(Schedule schedule, int64_t p, int64_t v, int64_t m, int64_t rank,
                                     int64_t group = 0);

/// Most (chunk, micro-batch) forwards whose backward has not yet run, at any
/// point of `ops`: the micro-batches in flight whose activations a rank holds.
int64_t PeakInFlight(const std::vector<PipeOp>& ops);

}  // namespace preflight::sim

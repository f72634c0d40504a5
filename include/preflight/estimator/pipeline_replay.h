// The activation peak of one pipeline rank under Megatron's interleaved
// schedule, found by replaying the schedule's order (docs/formulas.md §4.1: "simulate
// the MG schedule table per chunk for exact non-uniform hybrid chunks"
// [OURS]). Counting the first warmup+1 forward units per chunk is exact only
// when every chunk keeps the same bytes per micro-batch; a hybrid model's
// chunks do not (one attention layer beside two MoE layers), and the peak of
// the live bytes then falls where the bulky chunks hold the most micro-batches.
//
// The order (Megatron schedules.py, forward_backward_pipelining_with_interleaving;
// the reference executor keeps its own copy in simulator/schedule.cc):
// - the schedule table lists (micro-batch, chunk) pairs in groups of g
//   micro-batches, chunk-major inside a group (get_schedule_table); forward k
//   runs table entry k, backward k runs its micro-batch through chunk
//   v-1-chunk (get_model_chunk_id(forward=False));
// - warmup: min(2(p-r-1) + (v-1)g, m v) forwards; then one forward and one
//   backward per step; then the remaining backwards.
// A forward adds its chunk's saved bytes, a backward removes them; the peak is
// at the end of some forward (backwards only free), where a chunk's transient
// (the head's logits while the head's forward runs) adds on top.
//
// Cost: O(warmup + 2 g v) chunk look-ups, whatever m: while the table is in
// whole groups the steady state repeats every g v steps, so whole periods are
// skipped (their live bytes repeat values already seen). Allocation-free.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "preflight/estimator/memory_terms.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Bytes one micro-batch keeps on a rank through one model chunk: `saved`
/// from the end of its forward until its backward; `transient` only at the
/// end of its forward (the head's bf16 logits on the chunk owning the head).
struct ChunkActivation {
  int64_t saved = 0;
  int64_t transient = 0;
};

/// Chunk (0..v-1) of entry `j` of Megatron's schedule table for m
/// micro-batches in groups of g (a last partial group of m % g); v past the end.
int64_t InterleavedTableChunk(int64_t v, int64_t m, int64_t g, int64_t j);

/// Entries of chunk `chunk` among the first `n` of that table.
int64_t InterleavedTableCount(int64_t v, int64_t m, int64_t g, int64_t n, int64_t chunk);

/// Walks that table entry by entry without dividing (the replay's hot loop).
class InterleavedTableCursor {
 public:
  InterleavedTableCursor(int64_t v, int64_t m, int64_t g) : v_(v), m_(m), g_(g) { Seek(0); }
  /// Positions the cursor at entry j (0 <= j < m v).
  void Seek(int64_t j);
  /// Chunk of the current entry.
  int64_t chunk() const { return chunk_; }
  /// Moves to the next entry.
  void Next() {
    if (++offset_ < size_) return;
    offset_ = 0;
    if (++chunk_ < v_) return;
    chunk_ = 0;
    first_ += g_;
    size_ = std::min(g_, m_ - first_);
  }

 private:
  int64_t v_, m_, g_;
  int64_t first_ = 0;   // first micro-batch of the current group
  int64_t size_ = 0;    // micro-batches in the current group
  int64_t chunk_ = 0;
  int64_t offset_ = 0;  // position inside the current (group, chunk) run
};

/// Where the live activation bytes of a rank peak under the interleaved schedule.
struct InterleavedPeak {
  int64_t bytes = 0;           // the peak: live saved bytes plus the running chunk's transient
  int64_t forward = 0;         // table index of the forward at whose end the peak falls (the first such)
  int64_t backwards_done = 0;  // backwards run before that forward
  int64_t units = 0;           // most live (chunk, micro-batch) units at any time
};

/// Micro-batches of chunk `chunk` whose activations are live at `peak`:
/// forwards 0..peak.forward of the chunk less the backwards already run on it.
int64_t InterleavedLiveAtPeak(const InterleavedPeak& peak, int64_t v, int64_t m, int64_t g, int64_t chunk);

/// Replays pipeline rank r of p with v chunks and m micro-batches in groups
/// of g. `bytes_of(chunk)` returns the ChunkActivation of chunk 0..v-1 (called
/// O(warmup + 2 g v) times). Ties keep the first peak, as a running maximum does.
template <class BytesOf>
InterleavedPeak ReplayInterleaved(int64_t p, int64_t v, int64_t m, int64_t r, int64_t g, const BytesOf& bytes_of) {
  const int64_t total = CheckedMul(m, v);
  const int64_t warmup = InterleavedWarmup(p, v, m, r, g);
  const int64_t period = CheckedMul(g, v);
  const int64_t whole = CheckedMul(CheckedMul(m / g, g), v);  // table entries in whole groups
  InterleavedPeak peak;
  peak.bytes = -1;
  int64_t live = 0, units = 0;
  InterleavedTableCursor next_forward(v, m, g), next_backward(v, m, g);
  const auto forward = [&](int64_t j, int64_t done) {
    const ChunkActivation a = bytes_of(next_forward.chunk());
    next_forward.Next();
    live = CheckedAdd(live, a.saved);
    peak.units = std::max(peak.units, ++units);
    const int64_t now = CheckedAdd(live, a.transient);
    if (now > peak.bytes) {
      peak.bytes = now;
      peak.forward = j;
      peak.backwards_done = done;
    }
  };
  const auto backward = [&] {
    live = CheckedSub(live, bytes_of(v - 1 - next_backward.chunk()).saved);
    next_backward.Next();
    --units;
  };
  for (int64_t j = 0; j < warmup; ++j) forward(j, 0);
  for (int64_t k = 0; k < total - warmup; ++k) {
    // Steady step k runs forward k + warmup, then backward k. While forward
    // k + warmup stays in whole groups, step k + g v repeats step k's live
    // bytes (each chunk gains g forwards and g backwards per period): after
    // one period, jump over the whole periods that stay in whole groups.
    if (k == period) {
      const int64_t skip = (whole - warmup - k) / period;
      if (skip > 0) {
        k += skip * period;
        if (k == total - warmup) break;  // the skipped periods reach the end of the steady state
        next_forward.Seek(k + warmup);
        next_backward.Seek(k);
      }
    }
    forward(k + warmup, k);
    backward();
  }
  // The cooldown only runs backwards: the live bytes only fall.
  peak.bytes = std::max<int64_t>(peak.bytes, 0);
  return peak;
}

/// Where the live activation bytes of a DualPipeV rank peak.
struct DualPipeVPeak {
  int64_t bytes = 0;              // live saved bytes plus the running chunk's transient
  std::array<int64_t, 2> live{};  // micro-batches live on the down (0) and up (1) chunk then
  int64_t running = 0;            // the chunk whose forward ends at the peak
  int64_t units = 0;              // most live (chunk, micro-batch) units at any time
};

/// The first five steps of DeepSeek's eight-step order on a rank with
/// parameters (p, m, r) (DualPipeV: p, m, r; DualPipe: p/2, m/2, min(r,
/// p-1-r)), the schedule's phase s running chunk s ^ flip; one step-4 round
/// stands for all; then backwards only. Returns the peak.
template <class BytesOf>
DualPipeVPeak ReplayEightSteps(int64_t p, int64_t m, int64_t r, int64_t flip, const BytesOf& bytes_of) {
  const std::array<ChunkActivation, 2> a = {bytes_of(0), bytes_of(1)};
  DualPipeVPeak peak;
  peak.bytes = -1;
  std::array<int64_t, 2> live{};
  int64_t bytes = 0, units = 0;
  const auto forward = [&](int64_t phase) {
    const size_t c = static_cast<size_t>(phase ^ flip);
    ++live[c];
    bytes = CheckedAdd(bytes, a[c].saved);
    peak.units = std::max(peak.units, ++units);
    const int64_t now = CheckedAdd(bytes, a[c].transient);
    if (now > peak.bytes) {
      peak.bytes = now;
      peak.live = live;
      peak.running = static_cast<int64_t>(c);
    }
  };
  const auto backward = [&](int64_t phase) {
    const size_t c = static_cast<size_t>(phase ^ flip);
    --live[c];
    bytes = CheckedSub(bytes, a[c].saved);
    --units;
  };
  for (int64_t i = 0; i < 2 * (p - r - 1); ++i) forward(0);
  for (int64_t i = 0; i < r + 1; ++i) {
    forward(0);
    forward(1);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    backward(1);
    forward(1);
  }
  if (m - 2 * p + r + 1 > 0) {
    forward(0);
    backward(1);
    forward(1);
    backward(0);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {
    backward(1);
    forward(1);
    backward(0);
  }
  peak.bytes = std::max<int64_t>(peak.bytes, 0);
  return peak;
}

/// Replays DualPipeV (deepseek-ai/DualPipe dualpipev.py, DualPipeV.step,
/// 3da1bbe; the reference executor keeps its own copy in
/// simulator/schedule.cc) on rank r of p with m >= 2p micro-batches: chunk 0
/// is the down chunk r, chunk 1 the up chunk 2p-1-r; a B frees its chunk's
/// bytes (the zero-bubble W halves run inside their B). Steps: 1 2(p-r-1) F0;
/// 2 r+1 x (F0 F1); 3 p-r-1 x (B1 F1); 4 m-2p+r+1 x (F0 B1 F1 B0); 5 p-r-1 x
/// (B1 F1 B0); then backwards only, which cannot raise the peak. Every step-4
/// round leaves the live bytes where it found them, so one round stands for
/// all: O(p) look-ups. `bytes_of(chunk)` gives chunk 0 or 1's ChunkActivation.
template <class BytesOf>
DualPipeVPeak ReplayDualPipeV(int64_t p, int64_t m, int64_t r, const BytesOf& bytes_of) {
  return ReplayEightSteps(p, m, r, 0, bytes_of);
}

/// Replays DualPipe (deepseek-ai/DualPipe dualpipe/dualpipe.py, DualPipe.step;
/// the reference executor keeps its own copy in simulator/schedule.cc) on
/// rank r of p (even) with m >= 2p micro-batches (even), half entering at
/// each end: chunk 0 is stage r, chunk 1 the copy of stage p-1-r; on the
/// second half of the ranks the schedule's phase 0 is chunk 1. With h =
/// min(r, p-1-r) and H = p/2: 1 2(H-h-1) F0; 2 h+1 x (F0 F1); 3 H-h-1 x
/// (B1 F1); 4 m/2-p+h+1 x (F0 B1 F1 B0); 5 H-h-1 x (B1 F1 B0); then
/// backwards only: DualPipeV's steps with (p/2, m/2, h). As in
/// ReplayDualPipeV a B frees its chunk's bytes (the W halves run inside it).
/// Returns the peak with live[] per chunk (0 own, 1 mirror).
template <class BytesOf>
DualPipeVPeak ReplayDualPipe(int64_t p, int64_t m, int64_t r, const BytesOf& bytes_of) {
  return ReplayEightSteps(p / 2, m / 2, std::min(r, p - 1 - r), r >= p / 2 ? 1 : 0, bytes_of);
}

}  // namespace preflight

// Megatron's interleaved schedule table, in closed form (see
// include/preflight/pipeline_replay.h for the replay built on it).
#include "preflight/estimator/pipeline_replay.h"

#include <algorithm>

namespace preflight {

int64_t InterleavedTableChunk(int64_t v, int64_t m, int64_t g, int64_t j) {
  const int64_t whole = CheckedMul(CheckedMul(m / g, g), v);
  if (j < whole) return (j % CheckedMul(g, v)) / g;
  const int64_t tail = m % g;  // the last, partial group
  return tail == 0 ? v : (j - whole) / tail;  // v: past the end of the table
}

void InterleavedTableCursor::Seek(int64_t j) {
  const int64_t whole = CheckedMul(CheckedMul(m_ / g_, g_), v_);
  if (j < whole) {
    const int64_t period = CheckedMul(g_, v_);
    first_ = j / period * g_;
    size_ = g_;
    chunk_ = j % period / g_;
    offset_ = j % g_;
    return;
  }
  first_ = m_ / g_ * g_;  // the last, partial group
  size_ = m_ % g_;
  chunk_ = size_ == 0 ? v_ : (j - whole) / size_;  // size 0: past the end (m v entries)
  offset_ = size_ == 0 ? 0 : (j - whole) % size_;
}

int64_t InterleavedTableCount(int64_t v, int64_t m, int64_t g, int64_t n, int64_t chunk) {
  const int64_t period = CheckedMul(g, v);
  const int64_t whole = CheckedMul(CheckedMul(m / g, g), v);
  const int64_t in_whole = std::min(n, whole);
  int64_t count = CheckedAdd(CheckedMul(in_whole / period, g),
                             std::clamp<int64_t>(in_whole % period - CheckedMul(chunk, g), 0, g));
  if (n > whole) {
    const int64_t tail = m % g;
    count = CheckedAdd(count, std::clamp<int64_t>(n - whole - CheckedMul(chunk, tail), 0, tail));
  }
  return count;
}

int64_t InterleavedLiveAtPeak(const InterleavedPeak& peak, int64_t v, int64_t m, int64_t g, int64_t chunk) {
  // Backward k runs table entry k's micro-batch through chunk v-1-(its chunk).
  return InterleavedTableCount(v, m, g, peak.forward + 1, chunk) -
         InterleavedTableCount(v, m, g, peak.backwards_done, v - 1 - chunk);
}

}  // namespace preflight

// Tensors of the reference executor: Eigen row-major matrices (rows = tokens,
// so a sequence shard is a contiguous block of rows) that carry a memory tag.
#pragma once

#include <cstdint>
#include <utility>

#include <Eigen/Dense>

#include "world.h"

namespace preflight::sim {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

/// A matrix a rank holds, charged to `category` at `elem_bytes` per element
/// (the modeled dtype: bf16 activations = 2, fp32 router/CE/rstd = 4, int64
/// indices = 8) for as long as it lives. The math runs in T.
template <class T>
struct Tensor {
  Mat<T> m;
  Allocation alloc;

  Tensor() = default;
  Tensor(MemoryTracker* mem, SimCategory c, int64_t elem_bytes, Mat<T> value)
      : m(std::move(value)), alloc(mem, c, static_cast<int64_t>(m.size()) * elem_bytes) {}
  void Release() {
    m.resize(0, 0);
    alloc.Release();
  }
};

/// An index list a rank keeps (int64 in the modeled program).
struct IndexTensor {
  std::vector<int64_t> v;
  Allocation alloc;
  IndexTensor() = default;
  IndexTensor(MemoryTracker* mem, SimCategory c, std::vector<int64_t> value)
      : v(std::move(value)), alloc(mem, c, static_cast<int64_t>(v.size()) * 8) {}
};

}  // namespace preflight::sim

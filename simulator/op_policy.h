// torchtitan's per-op selective activation checkpointing (training.recompute:
// selective_op) in the executor: each transformer block (its A and D
// sublayers) is one checkpoint whose policy keeps some op outputs for the
// backward's rerun (torchtitan/distributed/activation_checkpoint.py
// _apply_op_sac: _custom_policy; torch/utils/checkpoint.py
// create_selective_checkpoint_contexts).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "tensor.h"

namespace preflight::sim {

/// Which pass of a checkpointed block runs: none, its first forward (which
/// keeps only the policy's op outputs) or the backward's rerun (which takes
/// them back instead of running their ops).
enum class OpPass { kOff, kForward, kRerun };

/// The policy's state on a rank. _custom_policy counts the checkpoint's
/// aten.mm calls in each pass (meta["forward_mm_count"],
/// meta["recompute_mm_count"], one meta per checkpoint) and saves the
/// outputs of the SDPA ops and of every mm but each second one.
struct OpPolicy {
  OpPass pass = OpPass::kOff;
  int64_t matmuls = 0;
  bool on() const { return pass != OpPass::kOff; }
  /// Counts one aten.mm; true when the policy saves its output (the 1st,
  /// 3rd, ... of the checkpoint's pass).
  bool SavesNextMatmul() { return ++matmuls % 2 == 1; }
};

/// The outputs one block saved under the policy, per micro-batch, in op
/// order: torch's _CachingTorchDispatchMode appends each MUST_SAVE output in
/// the first forward (the same storage the op returned), and
/// _CachedTorchDispatchMode pops it in the rerun instead of running the op.
template <class T>
class OpOutputs {
 public:
  /// One aten.mm, `mm` computing its `elem_bytes`-per-element output. A
  /// recomputed one runs and is charged to `category`. A saved one runs in
  /// the first forward, is kept as an activation and comes back uncharged
  /// (its storage is the kept one); in the rerun it is taken back, its charge
  /// with it, without running.
  Tensor<T> Matmul(OpPolicy& policy, MemoryTracker* mem, SimCategory category, int64_t elem_bytes, int64_t microbatch,
                   const std::function<Mat<T>()>& mm) {
    if (!policy.SavesNextMatmul()) return Tensor<T>(mem, category, elem_bytes, mm());
    if (policy.pass == OpPass::kRerun) return Take(microbatch);
    return Keep(mem, elem_bytes, microbatch, mm());
  }
  /// An output the policy always saves (the SDPA's), in the first forward:
  /// kept as an activation (also inside a forward that keeps nothing else)
  /// and returned uncharged.
  Tensor<T> Keep(MemoryTracker* mem, int64_t elem_bytes, int64_t microbatch, Mat<T> value) {
    const SimCategory was = mem->saved_category();
    mem->set_saved_category(SimCategory::kActivations);
    live_[microbatch].emplace_back(mem, SimCategory::kActivations, elem_bytes, value);
    mem->set_saved_category(was);
    return Tensor<T>(nullptr, SimCategory::kActivations, elem_bytes, std::move(value));
  }
  /// In the rerun: the next kept output of `microbatch`, with its charge.
  Tensor<T> Take(int64_t microbatch) {
    auto it = live_.find(microbatch);
    if (it == live_.end() || it->second.empty()) {
      throw std::logic_error("rerun of micro-batch " + std::to_string(microbatch) + " found no saved op output");
    }
    Tensor<T> out = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) live_.erase(it);
    return out;
  }

 private:
  std::map<int64_t, std::deque<Tensor<T>>> live_;
};

}  // namespace preflight::sim

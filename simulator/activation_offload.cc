#include "activation_offload.h"

#include <stdexcept>
#include <string>

namespace preflight::sim {

OffloadSet OffloadModulesOf(char letter, bool mla, bool transformer_engine) {
  OffloadSet out;
  const auto add = [&](OffloadModule m) { out.bits |= OffloadSet::Of(m).bits; };
  if (letter == 'A') {
    if (mla || !transformer_engine) add(OffloadModule::kAttnNorm);
    for (OffloadModule m : {OffloadModule::kQkvLinear, OffloadModule::kCoreAttn, OffloadModule::kAttnProj}) add(m);
  } else if (letter == 'E') {
    for (OffloadModule m : {OffloadModule::kMlpNorm, OffloadModule::kExpertFc1, OffloadModule::kMoeAct}) add(m);
  } else if (letter == 'D' && !transformer_engine) {
    add(OffloadModule::kMlpNorm);
  }
  return out;
}

void ActivationOffload::Commit(int64_t layer, int64_t mb, const std::vector<SavedTensor>& saved) {
  std::vector<Allocation*> moved;
  for (const SavedTensor& t : saved) {
    // ChunkOffloadHandler.tensor_need_offloading_checker: numel >= the minimum.
    if (!modules_.has(t.scope) || kept_.has(t.scope) || t.elements == 0 || t.elements < min_elements_) continue;
    for (Allocation* a : t.parts) {
      if (a->bytes() == 0) continue;
      rank_->CountHostCopy(true, a->bytes());
      a->MoveTo(&rank_->host_memory());
      moved.push_back(a);
    }
  }
  kept_ = OffloadSet();
  if (moved.empty()) return;
  if (!on_host_.try_emplace({layer, mb}, std::move(moved)).second) {
    throw std::logic_error("layer " + std::to_string(layer) + " offloaded micro-batch " + std::to_string(mb) +
                           " twice");
  }
}

void ActivationOffload::Reload(int64_t layer, int64_t mb) {
  auto node = on_host_.extract({layer, mb});
  if (node.empty()) return;
  for (Allocation* a : node.mapped()) {
    rank_->CountHostCopy(false, a->bytes());
    a->MoveTo(&rank_->memory());
  }
}

}  // namespace preflight::sim

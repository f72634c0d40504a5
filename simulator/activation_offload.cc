#include "activation_offload.h"

#include <bit>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace preflight::sim {

OffloadSet OffloadModulesOf(char letter, bool mla, bool transformer_engine, ModuleSet rerun) {
  OffloadSet out;
  const auto add = [&](OffloadModule m) { out.bits |= OffloadSet::Of(m).bits; };
  if (letter == 'A') {
    if (mla || !transformer_engine) add(OffloadModule::kAttnNorm);
    add(OffloadModule::kQkvLinear);
    if (!rerun.has(RecomputeModule::kCoreAttn)) add(OffloadModule::kCoreAttn);
    add(OffloadModule::kAttnProj);
  } else if (letter == 'E') {
    for (OffloadModule m : {OffloadModule::kMlpNorm, OffloadModule::kExpertFc1, OffloadModule::kMoeAct}) add(m);
  } else if (letter == 'D' && !transformer_engine) {
    add(OffloadModule::kMlpNorm);
  }
  return out;
}

void ActivationOffload::Hand(int64_t /*layer*/, int64_t /*mb*/, OffloadModule scope,
                             const std::vector<SavedTensor>& saved) {
  if (checkpointed_ || !modules_.has(scope) || handed_.has(scope)) return;
  std::optional<Group> group;
  for (const SavedTensor& t : saved) {
    if (t.scope != scope) continue;
    handed_.bits |= OffloadSet::Of(scope).bits;
    ran_ = true;
    names_.bits |= OffloadSet::Of(scope).bits;
    if (kept_.has(scope)) continue;
    if (!group) group = Group{scope, {}};
    // ChunkOffloadHandler.tensor_need_offloading_checker: numel >= the minimum.
    if (t.elements == 0 || t.elements < min_elements_) continue;
    for (Allocation* a : t.parts) {
      if (a->bytes() == 0) continue;
      rank_->CountHostCopy(true, a->bytes());
      a->MoveTo(&rank_->host_memory());
    }
  }
  if (group) forming_.push_back(std::move(*group));
}

void ActivationOffload::Commit(int64_t layer, int64_t mb, const std::vector<SavedTensor>& saved) {
  if (checkpointed_) {
    kept_ = OffloadSet();
    return;
  }
  for (const SavedTensor& t : saved) Hand(layer, mb, t.scope, saved);
  // Each group's tensors as the block now keeps them: those of its scope on the host.
  for (Group& g : forming_) {
    for (const SavedTensor& t : saved) {
      if (t.scope != g.scope) continue;
      for (Allocation* a : t.parts) {
        if (a->bytes() > 0 && a->on(&rank_->host_memory())) g.moved.push_back(a);
      }
    }
  }
  std::vector<Group> groups = std::exchange(forming_, {});
  const bool ran = std::exchange(ran_, false);
  kept_ = OffloadSet();
  handed_ = OffloadSet();
  if (ran) pending_[mb].push_back(layer);
  if (groups.empty()) return;
  if (!on_host_.try_emplace({mb, layer}, std::move(groups)).second) {
    throw std::logic_error("layer " + std::to_string(layer) + " offloaded micro-batch " + std::to_string(mb) +
                           " twice");
  }
}

void ActivationOffload::Bring(const Group& g) {
  for (Allocation* a : g.moved) {
    rank_->CountHostCopy(false, a->bytes());
    a->MoveTo(&rank_->memory());
  }
}

void ActivationOffload::Reload(int64_t layer, int64_t mb) {
  auto node = on_host_.extract({mb, layer});
  if (node.empty()) return;
  for (const Group& g : node.mapped()) Bring(g);
}

void ActivationOffload::Backwarded(int64_t layer, int64_t mb) {
  const auto it = pending_.find(mb);
  if (it == pending_.end() || std::erase(it->second, layer) == 0 || !it->second.empty()) return;
  pending_.erase(it);
  PreReload(mb + 1);
}

void ActivationOffload::PreReload(int64_t mb) {
  // The chunk kept one group per module name (post_warmup_callback's
  // offload margin), so its backward ends with that many reloads to spare.
  int64_t left = std::popcount(names_.bits);
  auto it = on_host_.lower_bound({mb + 1, std::numeric_limits<int64_t>::min()});
  while (left > 0 && it != on_host_.begin()) {
    --it;
    if (it->first.first != mb) break;
    std::vector<Group>& groups = it->second;
    while (left > 0 && !groups.empty()) {
      Bring(groups.back());
      groups.pop_back();
      --left;
    }
    if (groups.empty()) it = on_host_.erase(it);
  }
}

}  // namespace preflight::sim

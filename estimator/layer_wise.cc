// Megatron's layer-wise distributed optimizer (parallel.optimizer_sharding:
// layer_wise; --optimizer muon --use-distributed-optimizer
// --no-use-layer-wise-param-layout). validate_args (training/arguments.py at
// d98e8a6) turns --use-distributed-optimizer off for a non-Adam optimizer and
// sets use_layer_wise_distributed_optimizer: DDP keeps every parameter and
// the full gradient buffer, and LayerWiseDistributedOptimizer
// (core/optimizer/layer_wise_optimizer.py) gives each data-parallel rank
// whole tensors, whose fp32 master, Muon momentum or Adam moments it alone
// keeps (core/optimizer/__init__.py: without the param layout every
// parameter group, Muon's and Adam's, dense and expert, goes to it).
#include <algorithm>
#include <utility>

#include "internal.h"

namespace preflight::estimator_detail {
namespace {

/// Appends `t` as Megatron's optimizer holds it on this rank: routed-expert
/// stacks as one tensor per local expert (TEGroupedMLP's weight<i>).
void Append(const ParamTensor& t, const Inventory& inv, const Layout& l, std::vector<DealtTensor>& dense,
            std::vector<DealtTensor>& expert) {
  if (!t.trained) return;  // a buffer: no optimizer state
  const int o = static_cast<int>(t.optimizer);
  if (t.split != Split::kExpert || t.shape.empty() || t.shape.front() <= 0) {
    const int64_t n = TensorLocalElements(t, inv, l);
    if (n > 0) dense.push_back({n, o});
    return;
  }
  const int64_t experts = t.shape.front();
  const int64_t each = CeilDiv(t.elements() / experts, l.expert_tp);
  for (int64_t i = CeilDiv(experts, l.ep); i > 0; --i) expert.push_back({each, o});
}

/// Deals `tensors` over `d` ranks into the heaviest rank's and the last
/// rank's elements, column `g` (dense 0, expert 1) of `out`.
void Deal(std::vector<DealtTensor>& tensors, int64_t d, const Context& x, int g, LayerWiseOwned& out) {
  thread_local std::vector<std::array<int64_t, 2>> owned;
  DealPingPong(tensors, d, &owned);
  const auto bytes = [&](const std::array<int64_t, 2>& e) {
    return Add(Mul(e[kAdam], StateBytesPerElement(kAdam, x)), Mul(e[kMuon], StateBytesPerElement(kMuon, x)));
  };
  const auto heaviest =
      std::max_element(owned.begin(), owned.end(), [&](const auto& a, const auto& b) { return bytes(a) < bytes(b); });
  for (int o = 0; o < 2; ++o) {
    out.heaviest[o][g] = (*heaviest)[o];
    out.last[o][g] = owned.back()[o];
  }
}

}  // namespace

void DealPingPong(std::vector<DealtTensor>& tensors, int64_t d, std::vector<std::array<int64_t, 2>>* owned) {
  owned->assign(static_cast<size_t>(std::max<int64_t>(d, 1)), {0, 0});
  SortForDeal(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t rank = DealMember(static_cast<int64_t>(i), static_cast<int64_t>(owned->size()));
    int64_t& slot = (*owned)[static_cast<size_t>(rank)][static_cast<size_t>(tensors[i].optimizer)];
    slot = Add(slot, tensors[i].elements);
  }
}

}  // namespace preflight::estimator_detail

namespace preflight {

void SortForDeal(std::vector<DealtTensor>& tensors) {
  const auto key = [](const DealtTensor& t) {
    return std::make_pair(t.elements, t.optimizer != static_cast<int>(OptimizerKind::kMuon));
  };
  std::stable_sort(tensors.begin(), tensors.end(),
                   [&](const DealtTensor& a, const DealtTensor& b) { return key(a) < key(b); });
}

int64_t DealMember(int64_t i, int64_t d) {
  const int64_t period = 2 * std::max<int64_t>(d, 1);
  const int64_t k = i % period;
  return k < period / 2 ? k : period - 1 - k;
}

}  // namespace preflight

namespace preflight::estimator_detail {

LayerWiseOwned LayerWiseOf(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, bool regular,
                           const Walk& w, const Context& x) {
  thread_local std::vector<DealtTensor> dense, expert;
  dense.clear();
  expert.clear();
  // The optimizer's param groups hold every chunk of the rank (DualPipe: its mirror too).
  const int64_t mirror = l.schedule == Schedule::kDualPipe ? l.pp - 1 - r : -1;
  ChunksOf(plan, l.pp, regular, r, mirror, [&](const StageChunk& c) {
    for (int64_t i = c.first_layer; i < c.end_layer; ++i) {
      for (const ParamTensor& t : inv.layers.at(static_cast<size_t>(i)).params) Append(t, inv, l, dense, expert);
    }
  });
  ForEachEndTensor(inv, w, [&](const ParamTensor& t, EndPart) { Append(t, inv, l, dense, expert); });
  LayerWiseOwned out;
  Deal(dense, x.dense_group, x, 0, out);
  Deal(expert, x.expert_group, x, 1, out);
  return out;
}

}  // namespace preflight::estimator_detail

// Element arithmetic of the inventory: tensor sizes, per-class totals, range
// queries over prefix sums, and the padded vocabulary.
#include <algorithm>
#include <cstddef>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/units.h"

namespace preflight {

int64_t ParamTensor::elements() const {
  // No parameter is a scalar: an empty shape is a default-constructed,
  // absent tensor, which holds nothing.
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n = CheckedMul(n, d);
  return n;
}

int64_t ParamTotals::total() const {
  int64_t n = 0;
  for (const auto& by_optimizer : elements) {
    for (int64_t e : by_optimizer) n = CheckedAdd(n, e);
  }
  for (int64_t e : buffer_elements) n = CheckedAdd(n, e);
  return n;
}

void ParamTotals::Add(const ParamTensor& t) {
  const int c = static_cast<int>(ClassOf(t.split));
  const int o = static_cast<int>(t.optimizer);
  const int64_t n = t.elements();
  param_bytes[c] = CheckedAdd(param_bytes[c], CheckedMul(n, SizeOf(t.dtype)));
  if (!t.trained) {
    buffer_elements[c] = CheckedAdd(buffer_elements[c], n);
    return;
  }
  elements[c][o] = CheckedAdd(elements[c][o], n);
  if (t.dtype == DType::kFp32) fp32_elements[c][o] = CheckedAdd(fp32_elements[c][o], n);
}

ParamTotals& ParamTotals::operator+=(const ParamTotals& o) {
  for (size_t c = 0; c < elements.size(); ++c) {
    for (size_t k = 0; k < elements[c].size(); ++k) {
      elements[c][k] = CheckedAdd(elements[c][k], o.elements[c][k]);
      fp32_elements[c][k] = CheckedAdd(fp32_elements[c][k], o.fp32_elements[c][k]);
    }
    param_bytes[c] = CheckedAdd(param_bytes[c], o.param_bytes[c]);
    buffer_elements[c] = CheckedAdd(buffer_elements[c], o.buffer_elements[c]);
  }
  return *this;
}

ParamTotals& ParamTotals::operator-=(const ParamTotals& o) {
  for (size_t c = 0; c < elements.size(); ++c) {
    for (size_t k = 0; k < elements[c].size(); ++k) {
      elements[c][k] = CheckedSub(elements[c][k], o.elements[c][k]);
      fp32_elements[c][k] = CheckedSub(fp32_elements[c][k], o.fp32_elements[c][k]);
    }
    param_bytes[c] = CheckedSub(param_bytes[c], o.param_bytes[c]);
    buffer_elements[c] = CheckedSub(buffer_elements[c], o.buffer_elements[c]);
  }
  return *this;
}

ParamTotals Inventory::RangeTotals(int64_t first, int64_t end) const {
  return prefix_totals[static_cast<size_t>(end)] - prefix_totals[static_cast<size_t>(first)];
}

int64_t Inventory::RangeActive(int64_t first, int64_t end) const {
  return prefix_active[static_cast<size_t>(end)] - prefix_active[static_cast<size_t>(first)];
}

std::array<int64_t, 5> Inventory::RangeFamilyLayers(int64_t first, int64_t end) const {
  const auto& hi = prefix_family_layers[static_cast<size_t>(end)];
  const auto& lo = prefix_family_layers[static_cast<size_t>(first)];
  std::array<int64_t, 5> out{};
  for (size_t f = 0; f < out.size(); ++f) out[f] = hi[f] - lo[f];
  return out;
}

int64_t Inventory::RangeLayerStarts(int64_t first, int64_t end) const {
  if (prefix_layer_starts.size() == layers.size() + 1) {
    return prefix_layer_starts[static_cast<size_t>(end)] - prefix_layer_starts[static_cast<size_t>(first)];
  }
  return std::lower_bound(layer_starts.begin(), layer_starts.end(), end) -
         std::lower_bound(layer_starts.begin(), layer_starts.end(), first);
}

int64_t PaddedVocab(const ModelConfig& m, int64_t tp) {
  // Megatron: make-vocab-size-divisible-by x tensor-model-parallel-size.
  return RoundUp(m.vocab, CheckedMul(m.vocab_pad_multiple, tp));
}

}  // namespace preflight

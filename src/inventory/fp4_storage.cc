// FP4 storage sizes (include/preflight/inventory/fp4_storage.h has the sources).
#include "preflight/inventory/fp4_storage.h"

#include <string_view>

namespace preflight {
namespace {

/// Packed E2M1 values of a [rows, cols] tensor, two a byte.
int64_t PackedValues(int64_t rows, int64_t cols) { return CeilDiv(CheckedMul(rows, cols), 2); }

/// A scale tensor whose `outer` dimension pads to 128 and `inner` to 4.
int64_t ScaleTile(int64_t outer, int64_t inner) { return CheckedMul(RoundUp(outer, 128), RoundUp(inner, 4)); }

constexpr int64_t kAmaxBytes = 4;

}  // namespace

int64_t Fp4Usage::total() const { return CheckedAdd(CheckedAdd(values, scales), tensor_scale); }

int64_t Fp4BlockSize(Fp4Format f) {
  switch (f) {
    case Fp4Format::kNone: return 0;
    case Fp4Format::kNvfp4: return 16;
    case Fp4Format::kMxfp4: return 32;
  }
  return 0;
}

Fp4Usage Fp4Rowwise(Fp4Format f, int64_t rows, int64_t cols) {
  if (f == Fp4Format::kNone) return {};
  const int64_t block = Fp4BlockSize(f);
  // Both layouts: one scale per `block` values of a row, rows padded to 128.
  return {PackedValues(rows, cols), ScaleTile(rows, CeilDiv(cols, block)), f == Fp4Format::kNvfp4 ? kAmaxBytes : 0};
}

Fp4Usage Fp4Columnwise(Fp4Format f, int64_t rows, int64_t cols) {
  if (f == Fp4Format::kNone) return {};
  const int64_t block = Fp4BlockSize(f);
  if (f == Fp4Format::kNvfp4) {
    // The transpose [cols, rows]: cols pad to 128, the row blocks to 4.
    return {PackedValues(cols, rows), ScaleTile(cols, CeilDiv(rows, block)), kAmaxBytes};
  }
  // MX: data in place, scales [round_up(rows/32, 4), round_up(cols, 128)].
  return {PackedValues(rows, cols), ScaleTile(cols, CeilDiv(rows, block)), 0};
}

int64_t Fp4WeightBytes(Fp4Format f, int64_t out_features, int64_t in_features) {
  return CheckedAdd(Fp4Rowwise(f, out_features, in_features).total(),
                    Fp4Columnwise(f, out_features, in_features).total());
}

int64_t Fp4LocalWeightBytes(const ParamTensor& t, Fp4Format f, const Layout& l) {
  if (!t.linear || f == Fp4Format::kNone || t.shape.size() < 2) return 0;
  // Shapes are input x output (inventory.h); routed experts lead with E.
  int64_t in = t.shape[t.shape.size() - 2];
  int64_t out = t.shape.back();
  int64_t copies = 1;
  switch (t.split) {
    case Split::kTpColumn: out = CeilDiv(out, l.tp); break;
    case Split::kTpRow: in = CeilDiv(in, l.tp); break;
    case Split::kExpert: {
      // Expert TP splits fc1 by columns and fc2 (the down projection) by rows.
      const bool row = std::string_view(t.name).ends_with("down_proj");
      (row ? in : out) = CeilDiv(row ? in : out, l.expert_tp);
      copies = CeilDiv(t.shape.front(), l.ep);
      break;
    }
    default: break;
  }
  return CheckedMul(copies, Fp4WeightBytes(f, out, in));
}

int64_t Fp4SavedInputThirtySeconds(Fp4Format f) {
  if (f == Fp4Format::kNone) return 0;
  return 16 + 32 / Fp4BlockSize(f);
}

}  // namespace preflight

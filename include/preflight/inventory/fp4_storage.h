// Bytes of FP4 tensors as Transformer Engine stores them (docs/formulas.md
// §2.5): packed E2M1 values, two a byte, with their block scales padded to the
// 128 x 4 tiles cuBLAS reads, and NVFP4's fp32 per-tensor amax.
//
// Sources (NVIDIA/TransformerEngine 01634950ba17e76ef8c73ef36039ea4588ef50fb):
// - transformer_engine/pytorch/tensor/nvfp4_tensor.py, NVFP4Quantizer.make_empty
//   and get_scale_shape: a tensor of M rows (the product of the leading dims)
//   and K columns keeps rowwise data [M, K/2] uint8, rowwise scales
//   [round_up(M, 128), round_up(ceil(K/16), 4)] E4M3 and an fp32 amax; its
//   columnwise usage is the transpose, data [K, M/2], scales
//   [round_up(K, 128), round_up(ceil(M/16), 4)] and a second amax. 2-D 16x16
//   weight scaling shares one scale per tile but keeps the same scale shape.
// - transformer_engine/pytorch/tensor/mxfp8_tensor.py, MXFP8Quantizer.make_empty:
//   the MX layout, one E8M0 scale per 32 values, rowwise scales
//   [round_up(M, 128), round_up(K/32, 4)], columnwise data not transposed
//   with scales [round_up(M/32, 4), round_up(K, 128)], no per-tensor scale.
//   TE has no MXFP4 recipe; MXFP4 is priced as this layout with 4-bit values.
#pragma once

#include <cstdint>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"

namespace preflight {

/// One usage (rowwise or columnwise) of a quantized [rows, cols] tensor.
struct Fp4Usage {
  int64_t values = 0;        // packed E2M1 values, two a byte
  int64_t scales = 0;        // block scales (one byte each), padded to 128 x 4 tiles
  int64_t tensor_scale = 0;  // NVFP4's fp32 amax; 0 for MXFP4
  int64_t total() const;
};

/// Values per block scale: 16 (NVFP4), 32 (MXFP4); 0 for kNone.
int64_t Fp4BlockSize(Fp4Format f);
/// The rowwise usage of a [rows, cols] tensor: blocks run along a row (the
/// forward GEMM's operand).
Fp4Usage Fp4Rowwise(Fp4Format f, int64_t rows, int64_t cols);
/// The columnwise usage: blocks run down a column (the transposed operand of
/// the backward GEMMs: dgrad for a weight, wgrad for an input).
Fp4Usage Fp4Columnwise(Fp4Format f, int64_t rows, int64_t cols);
/// A GEMM weight of out x in (torch's [out_features, in_features]) with both
/// usages, as TE keeps it between forward and backward.
int64_t Fp4WeightBytes(Fp4Format f, int64_t out_features, int64_t in_features);
/// This rank's FP4 copies of a linear weight (ParamTensor::linear) on layout
/// `l`: its TP or expert split applied, every local expert a weight of its own.
int64_t Fp4LocalWeightBytes(const ParamTensor& t, Fp4Format f, const Layout& l);
/// Bytes per element of a saved GEMM input's columnwise FP4 copy, in 1/32
/// bytes: values (16/32) plus one scale byte per block; the tile padding of
/// the scales (at most 127 rows of them a tensor) is not included.
int64_t Fp4SavedInputThirtySeconds(Fp4Format f);

}  // namespace preflight

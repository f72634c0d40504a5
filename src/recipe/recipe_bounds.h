// Bounds of recipe values and inputs. Upper bounds are deliberately generous
// (a 10-trillion-parameter model on a million GPUs must validate); they only
// exist so that products of sizes stay far inside int64.
#pragma once

#include <cstdint>

namespace preflight::recipe_internal {

inline constexpr int64_t kMaxFileBytes = int64_t{4} << 20;   // 4 MiB of YAML
inline constexpr int64_t kMaxLayers = 100'000;               // expanded layer list
/// Separators (',', ':', '-', '[', '{', newlines) allowed before handing text
/// to yaml-cpp: it needs ~7 s and ~1 GB for a 4 MiB flow list of 2 M items, so
/// such text is refused up front. A 100,000-layer list needs ~200,000.
inline constexpr int64_t kMaxSeparators = 400'000;
inline constexpr int64_t kMaxWidth = int64_t{1} << 24;       // hidden, FFN, recurrent widths, ranks
inline constexpr int64_t kMaxHeads = int64_t{1} << 20;       // heads, groups, experts
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 16;     // head_dim, d_state
inline constexpr int64_t kMaxVocab = int64_t{1} << 32;
inline constexpr int64_t kMaxDegree = int64_t{1} << 24;      // any parallel degree
inline constexpr int64_t kMaxNodes = int64_t{1} << 24;
inline constexpr int64_t kMaxGpusPerNode = 1024;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 32;      // tokens
inline constexpr int64_t kMaxBatch = int64_t{1} << 40;       // sequences
inline constexpr int64_t kMaxConv = 1024;                    // convolution widths
inline constexpr int64_t kMaxFlextronChoices = 1024;         // an elastic model's width choices
inline constexpr int64_t kMaxNameLength = 200;

}  // namespace preflight::recipe_internal

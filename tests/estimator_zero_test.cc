// Model-state memory against the ZeRO paper (Rajbhandari et al. 2020,
// arXiv:1910.02054), Figure 1: Psi = 7.5B parameters, N_d = 64, K = 12
// (mixed-precision Adam: bf16 params 2 + bf16 grads 2 + fp32 master 4 + two
// fp32 moments 8 = 16 B/param). Baseline 120 GB, Pos 31.4 GB, Pos+g 16.6 GB,
// Pos+g+p 1.9 GB.
#include <cstdint>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"

namespace preflight::estimator_zero_test {
namespace {

constexpr int64_t kPsi = 7'500'000'000;
constexpr int64_t kNd = 64;
// The hand-built model: 32 dense layers of 231,174,900 replicated params, a
// tied 32000 x 3200 embedding (vocab already a multiple of 128) and a 3200
// final norm: 32 * 231,174,900 + 102,400,000 + 3,200 = 7,500,000,000 = Psi.
constexpr int64_t kLayer = 231'174'900;
constexpr int64_t kLayers = 32;

Inventory ZeroInventory() {
  Recipe r = testing::SmallRecipe();
  r.model.hidden = 3200;
  r.model.vocab = 32000;
  r.model.tie_embeddings = true;
  r.training.precision = {DType::kBf16, DType::kBf16, DType::kFp32, DType::kBf16};
  r.training.optimizer.matrices = OptimizerKind::kAdamW;
  Inventory inv;
  for (int64_t i = 0; i < kLayers; ++i) {
    Layer l = testing::MakeLayer(i, BlockKind::kDenseMlp);
    testing::SetElements(l, ShardClass::kReplicated, OptimizerKind::kAdamW, kLayer);
    inv.layers.push_back(l);
    r.model.layers.push_back(BlockKind::kDenseMlp);
  }
  inv.recipe = r;
  testing::AddEnds(inv);
  return inv;
}

int64_t ModelState(int64_t zero) {
  const Inventory inv = ZeroInventory();
  Layout l;
  l.dp = kNd;
  l.zero = zero;
  l.micro_batches = 1;
  const RankMemory m = EstimateRank(inv, l, EqualStagePlan(kLayers, 1, 1), 0);
  return (m.of(Category::kReplicatedParams) + m.of(Category::kTpShardedParams) + m.of(Category::kEpShardedParams) +
          m.of(Category::kGradients) + m.of(Category::kOptimizerMuon) + m.of(Category::kOptimizerAdamW))
      .count();
}

// ZeRO >= 1 keeps optimizer state per unit and per flat buffer, each padded to
// a multiple of D (Megatron's distributed optimizer; simulator/dist_optimizer.h):
// the ZeRO paper's 12 Psi / N_d plus the padding rank 0 carries. Each of the 32
// layers has 231,174,900 = 64 * 3,612,107 + 52 elements: rank 0 keeps
// ceil(231,174,900 / 64) = 3,612,108, i.e. 3,612,108 * 64 - 231,174,900 = 12
// elements / 64 = 0.1875 elements more than the even share, per layer. The
// embedding (102,400,000 = 64 * 1,600,000) and the final norm (3,200 = 64 * 50)
// divide evenly. 32 * 0.1875 * 12 B = 72 B:
// 12 * (32 * 3,612,108 + 1,600,000 + 50) = 1,406,250,072 = 12 Psi / 64 + 72.
constexpr int64_t kStatePadding = 72;
// ZeRO >= 2 keeps the owned shares of the same padded buffers as gradients
// (bf16, 2 B): 2 * (32 * 3,612,108 + 1,600,000 + 50) = 2 Psi / 64 + 12, and
// ZeRO 3 the parameters likewise (bf16): 2 Psi / 64 + 12.
constexpr int64_t kGradPadding = 12;
constexpr int64_t kParamPadding = 12;

// The transients the paper leaves out (simulator/dist_optimizer.h):
// ZeRO 2/3 hold one unit's unsharded gradients from its backward until its
// reduce-scatter; the largest unit is one layer, 2 B * 231,174,900.
constexpr int64_t kUnitGrads = 462'349'800;
// ZeRO 3 holds, per class, the most two adjacent units of the chunk gathered
// (current + prefetched): replicated, two layers 2 * 462,349,800; TP-sharded
// (the vocab-parallel embedding, first unit), 102,400,000 * 2 B beside a layer
// with no TP elements. The units are the embedding, the 32 layers and the
// final norm (the head is tied, pp 1).
constexpr int64_t kGatheredUnits = 2 * 462'349'800 + 204'800'000;

TEST(ZeroPaper, Baseline) {
  EXPECT_EQ(ModelState(0), 16 * kPsi);  // (2 + 2 + K) Psi = 120 GB
}

TEST(ZeroPaper, OptimizerStatePartitioning) {
  EXPECT_EQ(ModelState(1), 4 * kPsi + 12 * kPsi / kNd + kStatePadding);  // 31.4 GB
}

TEST(ZeroPaper, OptimizerAndGradientPartitioning) {
  // 16.6 GB, plus the padding and one unit's unsharded gradients.
  EXPECT_EQ(ModelState(2), 2 * kPsi + 14 * kPsi / kNd + kStatePadding + kGradPadding + kUnitGrads);
}

TEST(ZeroPaper, FullPartitioning) {
  // 1.9 GB, plus the padding, one unit's gradients and the gathered units.
  EXPECT_EQ(ModelState(3),
            16 * kPsi / kNd + kStatePadding + kGradPadding + kParamPadding + kUnitGrads + kGatheredUnits);
}

// A tiny model whose buffers do not divide by D = d = 3 (tp 1, ep 1, so the
// expert group d_e = t c d / (e t_e) = 3 as well). bf16 params with fp32
// master (4 B), AdamW m + v (8 B), Muon momentum fp32 (4 B).
//   embedding  5 x 2 (vocab 5, no padding)      AdamW bf16 10
//   layer 0    REP 7 AdamW, TP 10 Muon
//   layer 1    REP 5 AdamW, TP 4 AdamW of which 2 fp32 (Mamba's A_log, D)
//   layer 2    REP 3 AdamW, EP 11 Muon
//   head       5 x 2 + final norm 2             AdamW bf16 12
Inventory OddInventory() {
  Recipe r = testing::SmallRecipe();
  r.model.hidden = 2;
  r.model.vocab = 5;
  r.model.vocab_pad_multiple = 1;
  Inventory inv;
  for (int64_t i = 0; i < 3; ++i) {
    inv.layers.push_back(testing::MakeLayer(i, BlockKind::kDenseMlp));
    r.model.layers.push_back(BlockKind::kDenseMlp);
  }
  testing::SetElements(inv.layers[0], ShardClass::kReplicated, OptimizerKind::kAdamW, 7);
  testing::SetElements(inv.layers[0], ShardClass::kTpSharded, OptimizerKind::kMuon, 10);
  testing::SetElements(inv.layers[1], ShardClass::kReplicated, OptimizerKind::kAdamW, 5);
  testing::SetElements(inv.layers[1], ShardClass::kTpSharded, OptimizerKind::kAdamW, 4);
  inv.layers[1].totals.fp32_elements[1][0] = 2;
  inv.layers[1].totals.param_bytes[1] += 2 * 2;  // fp32: 2 B more per element than bf16
  testing::SetElements(inv.layers[2], ShardClass::kReplicated, OptimizerKind::kAdamW, 3);
  testing::SetElements(inv.layers[2], ShardClass::kEpSharded, OptimizerKind::kMuon, 11);
  inv.recipe = r;
  testing::AddEnds(inv);
  return inv;
}

RankMemory OddRank(int64_t zero, int64_t vpp = 1) {
  const Inventory inv = OddInventory();
  Layout l;
  l.dp = 3;
  l.zero = zero;
  l.micro_batches = 1;
  l.vpp = vpp;
  if (vpp > 1) l.schedule = Schedule::kInterleaved;
  return EstimateRank(inv, l, EqualStagePlan(3, 1, vpp), 0);
}

int64_t ParamSum(const RankMemory& m) {
  return (m.of(Category::kReplicatedParams) + m.of(Category::kTpShardedParams) + m.of(Category::kEpShardedParams))
      .count();
}

TEST(ZeroBuffers, OptimizerStatePerPaddedBuffer) {
  // ZeRO 1, the busiest rank (rank 0 of each group) keeps ceil(n / 3) of each
  // unit's buffers:
  //   AdamW: embedding 10 -> 4; layer 0: 7 -> 3; layer 1: bf16 5 + 2 = 7 -> 3,
  //          fp32 2 -> 1; layer 2: 3 -> 1; head 12 -> 4. Sum 16 elements x (8 + 4) B = 192 B
  //          (an even third of the 41 elements would be 164 B).
  //   Muon:  dense layer 0: 10 -> 4; expert layer 2: 11 -> 4. (4 + 4) x (4 + 4) B = 64 B.
  const RankMemory z1 = OddRank(1);
  EXPECT_EQ(z1.of(Category::kOptimizerAdamW).count(), 192);
  EXPECT_EQ(z1.of(Category::kOptimizerMuon).count(), 64);
  // ZeRO 0: every element. AdamW 41 x 12 = 492 B; Muon (10 + 11) x 8 = 168 B.
  const RankMemory z0 = OddRank(0);
  EXPECT_EQ(z0.of(Category::kOptimizerAdamW).count(), 492);
  EXPECT_EQ(z0.of(Category::kOptimizerMuon).count(), 168);
  // Gradients stay the full, unpadded buffers under ZeRO 0 and 1: (41 + 10 + 11) x 4 B.
  EXPECT_EQ(z0.of(Category::kGradients).count(), 248);
  EXPECT_EQ(z1.of(Category::kGradients).count(), 248);
}

// ZeRO 2 (DeepSpeed stage 2): the owned gradient shares, ceil(n / 3) of
// every buffer above (fp32 grads, 4 B): 4 + (3 + 4) + (3 + 1) + (1 + 4) + 4
// = 24 elements = 96 B, plus the largest unit's unsharded gradients, live
// during its backward: layer 0, 7 + 10 = 17 elements = 68 B (embedding 10,
// layer 1 9, layer 2 14, head 12).
TEST(ZeroBuffers, ZeroTwoGradientsAreSharesPlusOneUnit) {
  const RankMemory z2 = OddRank(2);
  EXPECT_EQ(z2.of(Category::kGradients).count(), 96 + 68);
  // The optimizer state and the parameters are ZeRO 1's.
  const RankMemory z1 = OddRank(1);
  EXPECT_EQ(z2.of(Category::kOptimizerAdamW), z1.of(Category::kOptimizerAdamW));
  EXPECT_EQ(z2.of(Category::kOptimizerMuon), z1.of(Category::kOptimizerMuon));
  EXPECT_EQ(ParamSum(z2), ParamSum(z1));
  EXPECT_EQ(ParamSum(z1), 2 * 10 + 2 * 17 + (2 * 7 + 4 * 2) + 2 * 14 + 2 * 12);  // 128 B, every element
}

// ZeRO 3 (FSDP, reshard after forward). Owned parameter shares, ceil(n / 3)
// per buffer times its element bytes (bf16 2 B, the fp32 buffer 4 B):
//   embedding 4*2 = 8; layer 0 3*2 + 4*2 = 14; layer 1 3*2 + 1*4 = 10;
//   layer 2 dense 1*2 = 2, expert 4*2 = 8; head 4*2 = 8. Dense 42, expert 8.
// Gathered: full local bytes per unit and class (REP / TP / EP):
//   embedding 0/20/0, layer 0 14/20/0, layer 1 10/12/0 (2 bf16 + 2 fp32 TP),
//   layer 2 6/0/22, head 4/20/0 (final norm 2 REP, head 10 TP).
// Adjacent pairs: REP 14, 24, 16, 10 -> 24; TP 40, 32, 12, 20 -> 40; EP
// 0, 0, 22, 22 -> 22. Sum 50 + 24 + 40 + 22 = 136 B.
TEST(ZeroBuffers, ZeroThreeParametersAreSharesPlusAdjacentUnits) {
  const RankMemory z3 = OddRank(3);
  EXPECT_EQ(ParamSum(z3), 50 + 24 + 40 + 22);
  // Display split of the flat dense shares: ceil(REP bytes / D) =
  // ceil((14 + 10 + 6 + 4) / 3) = 12 replicated, 42 - 12 = 30 TP-sharded.
  EXPECT_EQ(z3.of(Category::kReplicatedParams).count(), 12 + 24);
  EXPECT_EQ(z3.of(Category::kTpShardedParams).count(), 30 + 40);
  EXPECT_EQ(z3.of(Category::kEpShardedParams).count(), 8 + 22);
  // Gradients as ZeRO 2.
  EXPECT_EQ(z3.of(Category::kGradients).count(), 96 + 68);
  // More than unsharded (128 B): with D = 3 and five small units, the shares
  // kept beside two gathered units save nothing.
  EXPECT_GT(ParamSum(z3), ParamSum(OddRank(2)));
}

// Units are adjacent only inside a chunk: the same model on one rank as
// three interleaved chunks (vpp 3): [embedding, layer 0], [layer 1],
// [layer 2, head]. Pairs: REP 14, 10 (a lone layer), 10 -> 14; TP 40, 12, 20
// -> 40; EP 0, 0, 22 -> 22. Shares unchanged: 50 + 14 + 40 + 22 = 126 B.
TEST(ZeroBuffers, ZeroThreeGathersPairsWithinAChunk) {
  EXPECT_EQ(ParamSum(OddRank(3, 3)), 50 + 14 + 40 + 22);
}

}  // namespace
}  // namespace preflight::estimator_zero_test

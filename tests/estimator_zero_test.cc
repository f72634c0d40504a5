// Model-state memory against the ZeRO paper (Rajbhandari et al. 2020,
// arXiv:1910.02054), Figure 1: Psi = 7.5B parameters, N_d = 64, K = 12
// (mixed-precision Adam: bf16 params 2 + bf16 grads 2 + fp32 master 4 + two
// fp32 moments 8 = 16 B/param). Baseline 120 GB, Pos 31.4 GB, Pos+g 16.6 GB,
// Pos+g+p 1.9 GB.
#include <cstdint>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"

namespace preflight {
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

// ZeRO-2/3 produce one unit's gradients unsharded before reduce-scattering
// them; the largest unit is one layer: 2 B * 231,174,900 = 462,349,800 B, of
// which its own shard ceil(462,349,800 / 64) = 7,224,216 B is already counted.
constexpr int64_t kGradUnit = 462'349'800 - 7'224'216;
// ZeRO-3 gathers two units (current + prefetch, as FSDP): two layers' bf16
// params beyond their shards, 2 * (462,349,800 - 7,224,216).
constexpr int64_t kGatheredUnits = 2 * (462'349'800 - 7'224'216);

TEST(ZeroPaper, Baseline) {
  EXPECT_EQ(ModelState(0), 16 * kPsi);  // (2 + 2 + K) Psi = 120 GB
}

TEST(ZeroPaper, OptimizerStatePartitioning) {
  EXPECT_EQ(ModelState(1), 4 * kPsi + 12 * kPsi / kNd);  // 31.4 GB
}

TEST(ZeroPaper, OptimizerAndGradientPartitioning) {
  EXPECT_EQ(ModelState(2), 2 * kPsi + 14 * kPsi / kNd + kGradUnit);  // 16.6 GB + one unit
}

TEST(ZeroPaper, FullPartitioning) {
  EXPECT_EQ(ModelState(3), 16 * kPsi / kNd + kGatheredUnits + kGradUnit);  // 1.9 GB + transient units
}

}  // namespace
}  // namespace preflight

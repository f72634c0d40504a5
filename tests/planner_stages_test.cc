// Stage partition and step time against hand-worked figures.
#include <algorithm>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "planner_tiny_model.h"
#include "preflight/planner/compute.h"
#include "preflight/planner/tables.h"
#include "support/shipped_recipes.h"
#include "support/test_support.h"

namespace preflight::planner_stages_test {
namespace {

using testing::Price;
using testing::RelativelyClose;
using testing::TinyInventory;
using testing::TinyLayout;

// Slowest chunk time of a plan under the partitioner's own weights.
double SlowestChunk(const LayerWeights& w, const StagePlan& plan) {
  double worst = 0;
  for (const StageChunk& c : plan.chunks) {
    double t = c.owns_embedding ? w.embedding_s : 0.0;
    if (c.owns_head) t += w.head_s;
    for (int64_t l = c.first_layer; l < c.end_layer; ++l) t += w.layer_s[static_cast<size_t>(l)];
    worst = std::max(worst, t);
  }
  return worst;
}

// Eight equal D layers and a big-vocab head: D GEMM FLOPs per token
// 2*3*64*128 = 49152; with vocab 770 the head is 2*770*64 = 98560, about 2
// layers (2.005).
// Equal split over pp 4: [2,2,2,2] -> last chunk 2 + 2 = 4 layer units.
// Best: the last chunk takes one layer (1 + 2 = 3) and the rest 7 layers in
// three chunks of at most 3: max 3 units. 3/4 of the equal split's slowest chunk.
TEST(PlannerStages, PartitionBeatsEqualSplitWithHeavyHead) {
  const auto inv = TinyInventory("DDDDDDDD", 770);
  const auto layout = TinyLayout(1, 1, 1, 4, 8);
  const PlanTables tables = BuildPlanTables(inv);
  const LayerWeights w = WeighLayers(inv, tables, layout);
  ASSERT_TRUE(RelativelyClose(w.head_s, 98560.0 / 49152.0 * w.layer_s[0], 1e-12));
  const StagePlan best = PartitionStages(w, layout);
  const StagePlan equal = EqualStagePlan(8, 4, 1);
  ASSERT_EQ(best.chunks.size(), 4u);
  EXPECT_TRUE(RelativelyClose(SlowestChunk(w, best), w.head_s + w.layer_s[0], 1e-9));
  EXPECT_TRUE(RelativelyClose(SlowestChunk(w, equal), w.head_s + 2.0 * w.layer_s[0], 1e-9));
  EXPECT_EQ(best.chunks.back().end_layer - best.chunks.back().first_layer, 1);
  EXPECT_TRUE(best.chunks.front().owns_embedding);
  EXPECT_TRUE(best.chunks.back().owns_head);
  // Priced end to end, the partition's step is shorter too.
  const auto priced_best = Price(inv, layout, &best);
  const auto priced_equal = Price(inv, layout, &equal);
  EXPECT_LT(priced_best.time.step_s, priced_equal.time.step_s);
}

// The partitioner's search as first written: every cut i of every cell
// (k, j) in order, kept when lexicographically better on (time, params) with
// a 1e-12 relative tolerance on time. PartitionStages skips the cuts that
// cannot change the outcome; its cuts must be these, tie for tie.
std::vector<int64_t> PlainSearchStarts(const LayerWeights& w, int64_t chunks) {
  const int64_t n = static_cast<int64_t>(w.layer_s.size());
  auto time = [&](int64_t a, int64_t b) {
    double prefix_b = 0, prefix_a = 0;  // summed left to right, as the prefix sums are
    for (int64_t l = 0; l < b; ++l) {
      prefix_b += w.layer_s[static_cast<size_t>(l)];
      if (l + 1 == a) prefix_a = prefix_b;
    }
    return prefix_b - prefix_a + (a == 0 ? w.embedding_s : 0.0) + (b == n ? w.head_s : 0.0);
  };
  auto params = [&](int64_t a, int64_t b) {
    int64_t sum = (a == 0 ? w.embedding_params : 0) + (b == n ? w.head_params : 0);
    for (int64_t l = a; l < b; ++l) sum += w.layer_params[static_cast<size_t>(l)];
    return sum;
  };
  struct Cell {
    double t = std::numeric_limits<double>::infinity();
    int64_t p = std::numeric_limits<int64_t>::max();
    int64_t cut = -1;
  };
  std::vector<std::vector<Cell>> cell(static_cast<size_t>(chunks + 1), std::vector<Cell>(static_cast<size_t>(n + 1)));
  cell[0][0] = Cell{0.0, 0, 0};
  for (int64_t k = 1; k <= chunks; ++k) {
    for (int64_t j = k; j <= n - (chunks - k); ++j) {
      Cell& c = cell[static_cast<size_t>(k)][static_cast<size_t>(j)];
      for (int64_t i = k - 1; i < j; ++i) {
        const Cell& prev = cell[static_cast<size_t>(k - 1)][static_cast<size_t>(i)];
        if (prev.cut < 0) continue;
        const double t = std::max(prev.t, time(i, j));
        const int64_t p = std::max(prev.p, params(i, j));
        const double tol = 1e-12 * std::max(t, c.t == std::numeric_limits<double>::infinity() ? t : c.t);
        if (t < c.t - tol || (t <= c.t + tol && p < c.p)) c = Cell{t, p, i};
      }
    }
  }
  std::vector<int64_t> starts(static_cast<size_t>(chunks));
  for (int64_t k = chunks, j = n; k >= 1; --k) {
    j = cell[static_cast<size_t>(k)][static_cast<size_t>(j)].cut;
    starts[static_cast<size_t>(k - 1)] = j;
  }
  return starts;
}

// Random weights shaped like real models (a repeating pattern of two to four
// layer kinds, a few odd layers, a heavy or light head, equal parameter
// counts that only the tiebreak separates, zero-weight layers) on 1F1B,
// interleaved and DualPipe chunkings: the same cuts as the plain search.
// With `whole`, every time is a small whole number, so sums are exact and
// many cuts tie exactly (the plateaus the shortcuts must keep in order).
// Returns the number of searches checked.
int CheckAgainstThePlainSearch(uint64_t seed, bool whole) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto draw = [&](double scale) { return whole ? static_cast<double>(rng() % 4) : scale * unit(rng); };
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 2 + static_cast<int64_t>(rng() % 70);
    const int64_t kinds = 2 + static_cast<int64_t>(rng() % 3);
    std::vector<double> kind_s(static_cast<size_t>(kinds));
    std::vector<int64_t> kind_params(static_cast<size_t>(kinds));
    for (size_t k = 0; k < kind_s.size(); ++k) {
      kind_s[k] = trial % 7 == 0 && k == 0 ? 0.0 : whole ? 1.0 + static_cast<double>(rng() % 2) : 0.5 + unit(rng);
      kind_params[k] = 1000 + static_cast<int64_t>(rng() % 3) * 10;
    }
    LayerWeights w;
    for (int64_t l = 0; l < n; ++l) {
      const size_t k = static_cast<size_t>(l % kinds);
      const bool odd = rng() % 10 == 0;
      w.layer_s.push_back(odd ? draw(3.0) : kind_s[k]);
      w.layer_params.push_back(kind_params[k]);
    }
    w.embedding_s = trial % 3 == 0 ? 0.0 : draw(1.0);
    w.head_s = draw(4.0);
    w.embedding_params = static_cast<int64_t>(rng() % 3000);
    w.head_params = static_cast<int64_t>(rng() % 3000);
    for (const auto& [pp, vpp, schedule] :
         std::vector<std::tuple<int64_t, int64_t, Schedule>>{{2, 1, Schedule::k1F1B},
                                                             {4, 1, Schedule::k1F1B},
                                                             {4, 2, Schedule::kInterleaved},
                                                             {8, 1, Schedule::kDualPipe},
                                                             {4, 1, Schedule::kDualPipeV},
                                                             {16, 1, Schedule::k1F1B}}) {
      Layout layout;
      layout.pp = pp;
      layout.vpp = vpp;
      layout.schedule = schedule;
      const int64_t chunks = ChunkCount(layout);
      if (chunks > n) continue;
      const StagePlan plan = PartitionStages(w, layout);
      std::vector<int64_t> starts;
      for (const StageChunk& c : plan.chunks) starts.push_back(c.first_layer);
      EXPECT_EQ(starts, PlainSearchStarts(w, chunks)) << "trial " << trial << " n " << n << " chunks " << chunks;
      ++checked;
    }
  }
  return checked;
}

TEST(PlannerStages, PartitionMatchesThePlainSearch) { EXPECT_GT(CheckAgainstThePlainSearch(17, false), 1500); }

TEST(PlannerStages, PartitionMatchesThePlainSearchOnExactTies) {
  EXPECT_GT(CheckAgainstThePlainSearch(18, true), 1500);
}

// The sweep's weights (ReweighFrameworkLayers: the times only, into weights
// whose parameter counts another layout set) against the composed
// WeighFrameworkLayers(WeighLayers(...)), bit for bit, on every shipped
// recipe over tp, micro-batch and recompute (the compute times change with
// each), reusing one set of weights as a sweep's worker does.
TEST(PlannerStages, ReweighedTimesAreTheComposedWeights) {
  int checked = 0;
  for (const char* name : testing::kShippedRecipes) {
    const Inventory inv = BuildInventory(testing::LoadSourceRecipe(std::string("recipes/") + name + ".yaml"));
    const PlanTables tables = BuildPlanTables(inv);
    LayerWeights reused;
    bool first = true;
    for (int64_t tp : {1, 2, 8}) {
      for (int64_t micro_batch : {1, 4}) {
        for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          Layout layout = LayoutOf(inv.recipe);
          layout.tp = tp;
          layout.micro_batch = micro_batch;
          layout.recompute = rc;
          const ComputeTimes times = LayerComputeTimes(inv, tables, layout, CostModel{});
          const LayerWeights want = WeighFrameworkLayers(WeighLayers(tables, times), inv.layer_starts);
          if (first) reused = want;  // the parameter counts, as the sweep sets them once
          first = false;
          ReweighFrameworkLayers(tables, times, inv.layer_starts, &reused);
          ASSERT_EQ(reused.layer_s.size(), want.layer_s.size()) << name;
          for (size_t l = 0; l < want.layer_s.size(); ++l) {
            EXPECT_EQ(reused.layer_s[l], want.layer_s[l]) << name << " layer " << l;
          }
          EXPECT_EQ(reused.layer_params, want.layer_params) << name;
          EXPECT_EQ(reused.head_s, want.head_s) << name;
          EXPECT_EQ(reused.embedding_s, want.embedding_s) << name;
          EXPECT_EQ(reused.head_params, want.head_params) << name;
          EXPECT_EQ(reused.embedding_params, want.embedding_params) << name;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 180);
}

// Attention costs grow with s, Mamba's do not (docs/formulas.md §4.3): at s = 1024 an
// A layer's GEMMs are 2*12288 = 24576 FLOPs a token and its core
// 2*8*8*1024 = 131072 (backward 2.5x, FlashAttention's five GEMMs to two);
// Mamba's GEMMs 2*20000 = 40000 and its scan 64*2*16 + 64*8*16 + 4*8*16*16 =
// 18432. With selective recompute (the core once more) an A layer weighs
// 3*24576 + 4.5*131072 = 663552 and an M layer 3*(40000 + 18432) = 175296.
// "AAMM" over 2 contiguous stages: [A][AMM] = max(663552, 1014144) beats
// [AA][MM] = 1327104 and [AAM][M] = 1502400.
TEST(PlannerStages, AttentionWeighsBySequenceLength) {
  const auto inv = TinyInventory("AAMM", 0);
  const auto layout = TinyLayout(1, 1, 1, 2, 4);
  const PlanTables tables = BuildPlanTables(inv);
  const LayerWeights w = WeighLayers(inv, tables, layout);
  EXPECT_TRUE(RelativelyClose(w.layer_s[0] / w.layer_s[2], (3.0 * 24576 + 4.5 * 131072) / (3.0 * 58432), 1e-12));
  const StagePlan plan = PartitionStages(w, layout);
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].end_layer, 1);
}

// Pinned boundaries are priced as given: [0,3) [3,6) [6,7) [7,8) is one of
// the optimal partitions above (3, 3, 1, 1+2 layer units).
TEST(PlannerStages, PinnedBoundariesPriced) {
  auto inv = TinyInventory("DDDDDDDD", 770);
  inv.recipe.parallel.pp = 4;
  inv.recipe.parallel.stage_boundaries = {3, 6, 7};
  const auto pinned = RecipeStagePlan(inv, LayoutOf(inv.recipe));
  ASSERT_TRUE(pinned.has_value());
  const auto layout = TinyLayout(1, 1, 1, 4, 8);
  const auto p = Price(inv, layout, &*pinned);
  ASSERT_EQ(p.time.stages.size(), 4u);
  // Per micro-batch forward of stage 2 (one layer) is 1/3 of stage 0's (three).
  EXPECT_TRUE(RelativelyClose(p.time.stages[2].forward_s * 3.0, p.time.stages[0].forward_s, 1e-12));
  // Stage 3 (one layer + head = 3.005 units) about ties stage 0.
  EXPECT_TRUE(RelativelyClose(p.time.stages[3].forward_s, p.time.stages[0].forward_s, 1e-2));
  const StagePlan equal = EqualStagePlan(8, 4, 1);
  EXPECT_LT(p.time.step_s, Price(inv, layout, &equal).time.step_s);
}

// No communication at all (one GPU): the step is pure compute, and the step
// is 3 * tokens * GEMM-FLOPs-per-token / (0.5 * 989e12). "DD" with vocab 770:
// per token 2*(2*3*64*128) + 2*770*64 = 196864; tokens 1024*2. MFU counts the
// norm vectors too (2*24640 a D layer): 197120 / 196864 of 0.5.
TEST(PlannerStepTime, SingleGpuIsPureCompute) {
  const auto inv = TinyInventory("DD", 770);
  const auto p = Price(inv, TinyLayout(1, 1, 1, 1, 1));
  const double expected = 3.0 * 2048.0 * 196864.0 / (0.5 * 989e12);
  EXPECT_TRUE(RelativelyClose(p.time.step_s, expected, 1e-12)) << p.time.step_s << " vs " << expected;
  EXPECT_TRUE(RelativelyClose(p.time.mfu, 0.5 * 197120.0 / 196864.0, 1e-12)) << p.time.mfu;
  EXPECT_TRUE(RelativelyClose(p.time.tokens_per_s, 2048.0 / expected, 1e-12));
}

// 1F1B with equal stages (no head: vocab 0): bubble = (p-1) * per-micro-batch
// time + the fill/drain p2p, 2*(p-1) sends of X = 262144 B inside one node:
// 8e-6 + 262144/(0.8*450e9) each. p = 4, m = 8.
TEST(PlannerStepTime, OneFOneBBubble) {
  const auto inv = TinyInventory("DDDD", 0);
  const auto p = Price(inv, TinyLayout(1, 1, 1, 4, 8));
  const double per_mb = p.time.steady_s / 8.0;
  const double p2p = 8e-6 + 262144.0 / 360e9;
  EXPECT_TRUE(RelativelyClose(p.time.bubble_s, 3.0 * per_mb + 6.0 * p2p, 1e-12));
  // Without the p2p term this is the docs/formulas.md §4.2 share (p-1)/(m+p-1) = 3/11.
  EXPECT_TRUE(RelativelyClose((p.time.bubble_s - 6.0 * p2p) / (p.time.steady_s + p.time.bubble_s - 6.0 * p2p),
                              BubbleFraction(Schedule::k1F1B, 4, 1, 8), 1e-12));
  EXPECT_EQ(p.time.slowest_stage, 0);
}

// Interleaved (docs/formulas.md §4.2): the bubble shrinks to (p-1)/v micro-batch
// times; the fill/drain crosses p*v - 1 chunk boundaries each way. Eight
// equal layers, pp 2, vpp 2 (four chunks of two), m 4:
// bubble = (1/2) * steady/4 + 2*3 sends of 262144 B on NVLink.
TEST(PlannerStepTime, InterleavedBubble) {
  const auto inv = TinyInventory("DDDDDDDD", 0);
  auto l = TinyLayout(1, 1, 1, 2, 4);
  l.vpp = 2;
  l.schedule = Schedule::kInterleaved;
  const auto p = Price(inv, l);
  ASSERT_EQ(p.stages.chunks.size(), 4u);
  const double p2p = 8e-6 + 262144.0 / 360e9;
  EXPECT_TRUE(RelativelyClose(p.time.bubble_s, 0.5 * p.time.steady_s / 4.0 + 6.0 * p2p, 1e-12));
  EXPECT_TRUE(RelativelyClose((p.time.bubble_s - 6.0 * p2p) / (p.time.steady_s + p.time.bubble_s - 6.0 * p2p),
                              BubbleFraction(Schedule::kInterleaved, 2, 2, 4), 1e-12));
}

}  // namespace
}  // namespace preflight::planner_stages_test

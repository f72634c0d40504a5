// Monotonicity properties of the capacity model over a grid of layouts, the
// explain/estimate agreement, and overflow behaviour at absurd scale.
#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"
#include "preflight/estimator/memory_terms.h"

namespace preflight::estimator_property_test {
namespace {

constexpr int64_t kWorld = 64;

Inventory Hybrid() {
  Recipe r = testing::SmallRecipe();
  r.training.global_batch = 256;
  return testing::HybridInventory(r, "AEMEAEMR", 2);  // 16 layers
}

Layout Base(const Inventory& inv, int64_t tp, int64_t pp, int64_t ep, int64_t zero) {
  Layout l = testing::LayoutFor(inv.recipe, kWorld, tp, pp, ep);
  l.zero = zero;
  return l;
}

RankMemory Rank(const Inventory& inv, const Layout& l, int64_t r) {
  return EstimateRank(inv, l, EqualStagePlan(static_cast<int64_t>(inv.layers.size()), l.pp, l.vpp), r);
}

TEST(Properties, RaisingTpNeverRaisesTpShardedBytes) {
  const Inventory inv = Hybrid();
  for (int64_t pp : {1, 2, 4}) {
    for (int64_t r = 0; r < pp; ++r) {
      Bytes previous(std::numeric_limits<int64_t>::max());
      for (int64_t tp : {1, 2, 4, 8}) {
        const Bytes now = Rank(inv, Base(inv, tp, pp, 1, 1), r).of(Category::kTpShardedParams);
        EXPECT_LE(now, previous) << "tp " << tp << " pp " << pp << " rank " << r;
        previous = now;
      }
    }
  }
}

TEST(Properties, RaisingEpShrinksExpertsAndKeepsReplicated) {
  const Inventory inv = Hybrid();
  for (int64_t tp : {1, 2, 4}) {
    Bytes previous_ep(std::numeric_limits<int64_t>::max());
    Bytes previous_rep;
    for (int64_t ep : {1, 2, 4, 8, 16}) {
      const RankMemory m = Rank(inv, Base(inv, tp, 2, ep, 1), 0);
      EXPECT_LE(m.of(Category::kEpShardedParams), previous_ep) << "ep " << ep << " tp " << tp;
      EXPECT_GE(m.of(Category::kReplicatedParams), previous_rep) << "ep " << ep << " tp " << tp;
      previous_ep = m.of(Category::kEpShardedParams);
      previous_rep = m.of(Category::kReplicatedParams);
    }
  }
}

// ZeRO 0 -> 1 -> 2 never uses more. ZeRO 3 differs from ZeRO 2 only in its
// parameters, and may hold more: it keeps every unit's share while two
// adjacent units are gathered, so a class held by few units on a rank (one
// MoE layer's experts: 1/D + the whole layer) costs more than unsharded (as
// FSDP, which keeps the sharded storage beside the gathered unit).
TEST(Properties, HigherZeroStageNeverUsesMoreBelowThree) {
  const Inventory inv = Hybrid();
  for (int64_t tp : {1, 2, 4}) {
    for (int64_t pp : {1, 2, 4}) {
      for (int64_t ep : {1, 4}) {
        for (int64_t r = 0; r < pp; ++r) {
          Bytes previous(std::numeric_limits<int64_t>::max());
          for (int64_t zero = 0; zero <= 2; ++zero) {
            const RankMemory m = Rank(inv, Base(inv, tp, pp, ep, zero), r);
            EXPECT_LE(m.total(), previous) << "zero " << zero << " tp " << tp << " pp " << pp << " rank " << r;
            previous = m.total();
          }
          const RankMemory z2 = Rank(inv, Base(inv, tp, pp, ep, 2), r);
          const RankMemory z3 = Rank(inv, Base(inv, tp, pp, ep, 3), r);
          for (int c = 0; c < kNumCategories; ++c) {
            const Category cat = static_cast<Category>(c);
            if (cat == Category::kReplicatedParams || cat == Category::kTpShardedParams ||
                cat == Category::kEpShardedParams || cat == Category::kAllocatorOverhead) {
              continue;
            }
            EXPECT_EQ(z3.of(cat), z2.of(cat)) << Key(cat) << " tp " << tp << " pp " << pp << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(Properties, SequenceParallelNeverRaisesActivations) {
  const Inventory inv = Hybrid();
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (int64_t tp : {1, 2, 4, 8}) {
      Layout on = Base(inv, tp, 2, 4, 1);
      on.recompute = rc;
      Layout off = on;
      off.sp = false;
      for (int64_t r = 0; r < 2; ++r) {
        EXPECT_LE(Rank(inv, on, r).of(Category::kActivations), Rank(inv, off, r).of(Category::kActivations))
            << "tp " << tp;
      }
    }
  }
}

TEST(Properties, RaisingCpNeverRaisesActivations) {
  // World fixed at 64: dp shrinks as c grows; the sequence a rank holds is s/c.
  const Inventory inv = Hybrid();
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (int64_t tp : {1, 2}) {
      Bytes previous(std::numeric_limits<int64_t>::max());
      for (int64_t cp : {1, 2, 4}) {
        Layout l = Base(inv, tp, 2, 1, 1);
        l.cp = cp;
        l.dp /= cp;
        l.micro_batches = inv.recipe.training.global_batch / (l.micro_batch * l.dp);
        l.recompute = rc;
        const Bytes now = Rank(inv, l, 0).of(Category::kActivations);
        EXPECT_LE(now, previous) << "cp " << cp << " tp " << tp;
        previous = now;
      }
    }
  }
}

TEST(Properties, MuonStateIsSmallerThanAdamWForTheSameTensors) {
  // The same inventory with every Muon-owned element moved to AdamW.
  const Inventory muon = Hybrid();
  Inventory adamw = muon;
  for (Layer& layer : adamw.layers) {
    for (auto& by_class : layer.totals.elements) {
      by_class[static_cast<int>(OptimizerKind::kAdamW)] += by_class[static_cast<int>(OptimizerKind::kMuon)];
      by_class[static_cast<int>(OptimizerKind::kMuon)] = 0;
    }
  }
  for (int64_t zero : {0, 1}) {
    const Layout l = Base(muon, 2, 2, 4, zero);
    const RankMemory a = Rank(muon, l, 0);
    const RankMemory b = Rank(adamw, l, 0);
    EXPECT_GT(a.of(Category::kOptimizerMuon).count(), 0);
    EXPECT_LT(a.of(Category::kOptimizerMuon) + a.of(Category::kOptimizerAdamW),
              b.of(Category::kOptimizerMuon) + b.of(Category::kOptimizerAdamW));
  }
}

TEST(Properties, OneFOneBStageZeroHasTheMostInFlight) {
  const Inventory inv = Hybrid();
  for (int64_t pp : {2, 4, 8}) {
    const Layout l = Base(inv, 1, pp, 1, 1);
    const int64_t first = Rank(inv, l, 0).in_flight_microbatches;
    for (int64_t r = 1; r < pp; ++r) EXPECT_LT(Rank(inv, l, r).in_flight_microbatches, first) << "pp " << pp;
  }
}

TEST(Explain, EveryCategoryIsTheSumOfItsLines) {
  Inventory inv = Hybrid();
  inv.recipe.serving = ServingConfig{};
  for (int64_t zero : {0, 1, 2, 3}) {
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      Layout l = Base(inv, 2, 2, 4, zero);
      l.recompute = rc;
      l.cp = 2;
      l.dp /= 2;
      for (int64_t r = 0; r < 2; ++r) {
        const StagePlan plan = EqualStagePlan(16, 2, 1);
        const RankMemory m = EstimateRank(inv, l, plan, r);
        const auto lines = ExplainRank(inv, l, plan, r);
        std::array<Bytes, kNumCategories> sums{};
        for (const Explanation& e : lines) {
          sums[static_cast<size_t>(e.category)] += e.bytes;
          EXPECT_FALSE(e.formula.empty()) << e.item;
          EXPECT_FALSE(e.inputs.empty()) << e.item;
        }
        for (int c = 0; c < kNumCategories; ++c) {
          EXPECT_EQ(sums[static_cast<size_t>(c)], m.bytes[static_cast<size_t>(c)])
              << Key(static_cast<Category>(c)) << " zero " << zero << " rank " << r;
        }
      }
    }
  }
}

TEST(Explain, HybridServingChargesKvOnlyToAttentionLayers) {
  // Pattern AEMEAEMR x2 on one stage: 4 A, 4 M, 2 R layers. KV for the 4 A
  // layers only: 4 * batch 2 * context 1024 * (2 * 4 KV heads * 64 * 2 B)
  // = 8,388,608 B; Mamba state per sequence (t 1): conv 3 * (2048 + 2*4*64) * 2
  // = 15,360 + SSM 32 heads * 64 * 64 * 4 = 524,288 -> 4 * 2 * 539,648
  // = 4,317,184; RG-LRU (3*2 + 4) * 1024 = 10,240 -> 2 * 2 * 10,240 = 40,960.
  Inventory inv = Hybrid();
  inv.recipe.serving = ServingConfig{2, 1024, DType::kBf16, DType::kFp32};
  const Layout l = Base(inv, 1, 1, 1, 1);
  const RankMemory m = Rank(inv, l, 0);
  EXPECT_EQ(m.of(Category::kServingState).count(), 8'388'608 + 4'317'184 + 40'960);
}

// Context parallelism holds 1/c of every sequence's positions, so 1/c of the
// KV cache (ceil); the Mamba and R state stays per sequence. cp 2: KV
// 8,388,608 / 2; cp 3: ceil(1024 / 3) = 342 positions, 342 / 1024 of it.
TEST(Explain, ServingKvIsShardedAlongTheSequenceByContextParallelism) {
  Inventory inv = Hybrid();
  inv.recipe.serving = ServingConfig{2, 1024, DType::kBf16, DType::kFp32};
  const int64_t states = 4'317'184 + 40'960;
  for (const auto& [cp, kv] : {std::pair<int64_t, int64_t>{2, 4'194'304}, {3, 8'388'608 / 1024 * 342}}) {
    Layout l = Base(inv, 1, 1, 1, 1);
    l.cp = cp;
    EXPECT_EQ(Rank(inv, l, 0).of(Category::kServingState).count(), kv + states) << "cp " << cp;
  }
}

TEST(Overflow, TenTrillionParamsOnAMillionGpus) {
  // 1000 dense layers of 1e10 TP-sharded params = 1e13 (10 T). tp 8, pp 125,
  // dp 1000 (world 1,000,000): a stage holds 8 layers, 8e10 / 8 = 1e10 local
  // params: bf16 2e10 B, fp32 grads 4e10 B, AdamW (8 + 4 master) * 1e10 / 1000 = 1.2e8 B.
  Recipe r = testing::SmallRecipe();
  r.training.global_batch = 4000;
  Inventory inv = testing::HybridInventory(r, "D", 1000);
  for (Layer& layer : inv.layers) {
    layer.totals = ParamTotals{};
    testing::SetElements(layer, ShardClass::kTpSharded, OptimizerKind::kAdamW, 10'000'000'000);
  }
  const Layout l = testing::LayoutFor(inv.recipe, 1'000'000, 8, 125, 1);
  const MemoryEstimate est = EstimateMemory(inv, l, EqualStagePlan(1000, 125, 1));
  const RankMemory& mid = est.stages[50];
  EXPECT_EQ(mid.of(Category::kTpShardedParams).count(), 20'000'000'000);
  EXPECT_EQ(mid.of(Category::kGradients).count(), 40'000'000'000);
  EXPECT_EQ(mid.of(Category::kOptimizerAdamW).count(), 120'000'000);
}

TEST(Overflow, BeyondInt64IsAnErrorNotAWrap) {
  // 1e18 replicated params: 4e18 B of fp32 grads fit, but AdamW's 12 B/param
  // (1.2e19) does not fit in int64.
  Recipe r = testing::SmallRecipe();
  Inventory inv = testing::HybridInventory(r, "D", 1);
  inv.layers[0].totals = ParamTotals{};
  testing::SetElements(inv.layers[0], ShardClass::kReplicated, OptimizerKind::kAdamW, 1'000'000'000'000'000'000);
  const Layout l = testing::LayoutFor(inv.recipe, 1, 1, 1, 1);
  EXPECT_THROW(EstimateRank(inv, l, EqualStagePlan(1, 1, 1), 0), ArithmeticOverflow);
}

}  // namespace
}  // namespace preflight::estimator_property_test

// EstimateRank must allocate nothing (estimate.h): sweeps call it millions of
// times. This executable replaces the global operator new to count calls.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace preflight::estimator_alloc_test {
namespace {

TEST(EstimateRank, AllocatesNothing) {
  Recipe r = testing::SmallRecipe();
  r.serving = ServingConfig{};
  const Inventory inv = testing::HybridInventory(r, "AEMEAEMR", 4);
  for (int64_t zero : {0, 1, 2, 3}) {
    for (Schedule s : {Schedule::k1F1B, Schedule::kInterleaved, Schedule::kDualPipe}) {
      Layout l = testing::LayoutFor(inv.recipe, 64, 2, 4, 4);
      l.zero = zero;
      l.schedule = s;
      l.vpp = s == Schedule::kInterleaved ? 2 : 1;
      const StagePlan plan = EqualStagePlan(32, 4, l.vpp);
      const int64_t before = g_allocations.load();
      Bytes sum;
      for (int64_t rank = 0; rank < 4; ++rank) sum += EstimateRank(inv, l, plan, rank).total();
      EXPECT_EQ(g_allocations.load() - before, 0) << "zero " << zero;
      EXPECT_GT(sum.count(), 0);
    }
  }
  // Deep interleaving: 68 chunks per rank, beyond the replay's 64 cached chunk
  // sizes (internal.h ChunkActivations), still allocation-free.
  {
    const Inventory deep = testing::HybridInventory(r, "AEMEAEMR", 17);  // 136 layers
    Layout l = testing::LayoutFor(deep.recipe, 64, 2, 2, 4);
    l.schedule = Schedule::kInterleaved;
    l.vpp = 68;
    const StagePlan plan = EqualStagePlan(136, 2, 68);
    const int64_t before = g_allocations.load();
    Bytes sum;
    for (int64_t rank = 0; rank < 2; ++rank) sum += EstimateRank(deep, l, plan, rank).total();
    EXPECT_EQ(g_allocations.load() - before, 0) << "vpp 68";
    EXPECT_GT(sum.count(), 0);
  }
  // The counter works: ExplainRank does allocate.
  const Layout l = testing::LayoutFor(inv.recipe, 64, 2, 4, 4);
  const int64_t before = g_allocations.load();
  EXPECT_FALSE(ExplainRank(inv, l, EqualStagePlan(32, 4, 1), 0).empty());
  EXPECT_GT(g_allocations.load() - before, 0);
}

}  // namespace
}  // namespace preflight::estimator_alloc_test

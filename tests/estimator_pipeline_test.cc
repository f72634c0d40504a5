// Micro-batches in flight per pipeline rank against hand-worked schedules
// (docs/formulas.md §4.1; Megatron schedules.py get_pp_rank_microbatches), and their
// effect on a rank's activations.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "estimator_fixtures.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/estimator/pipeline_replay.h"

namespace preflight::estimator_pipeline_test {
namespace {

TEST(InFlight, OneFOneB) {
  // p 4, m 8: rank r warms up p - r - 1 forwards, then holds one more: 4, 3, 2, 1.
  EXPECT_EQ(OneFOneBInFlight(4, 8, 0), 4);
  EXPECT_EQ(OneFOneBInFlight(4, 8, 1), 3);
  EXPECT_EQ(OneFOneBInFlight(4, 8, 2), 2);
  EXPECT_EQ(OneFOneBInFlight(4, 8, 3), 1);
  // m 2 < p: never more than the micro-batches there are.
  EXPECT_EQ(OneFOneBInFlight(4, 2, 0), 2);
}

TEST(InFlight, InterleavedRankZero) {
  // p 4, v 2, m 8, group g = p = 4: warmup 2(p-1) + (v-1)p = 6 + 4 = 10 forwards,
  // the 11th runs before the first backward: 11 live chunk-micro-batches.
  EXPECT_EQ(InterleavedWarmup(4, 2, 8, 0, 4), 10);
  EXPECT_EQ(InterleavedLive(4, 2, 8, 0, 4), 11);
  // Megatron's table order: mb 0-3 on chunk 0, mb 0-3 on chunk 1, mb 4-7 on
  // chunk 0, ...; the first 11 entries are 4 + 3 = 7 on chunk 0 and 4 on chunk 1.
  EXPECT_EQ(InterleavedTableCount(2, 8, 4, 11, 0), 7);
  EXPECT_EQ(InterleavedTableCount(2, 8, 4, 11, 1), 4);
  EXPECT_EQ(InterleavedTableChunk(2, 8, 4, 10), 0);  // entry 10: mb 6 through chunk 0
  EXPECT_EQ(InterleavedTableChunk(2, 8, 4, 12), 1);  // entry 12: mb 4 through chunk 1
}

TEST(InFlight, InterleavedLastRankAndShortRuns) {
  // Rank 3 of 4: warmup 0 + (v-1)p = 4, live 5: mb 0-3 on chunk 0, mb 0 on chunk 1.
  EXPECT_EQ(InterleavedLive(4, 2, 8, 3, 4), 5);
  EXPECT_EQ(InterleavedTableCount(2, 8, 4, 5, 0), 4);
  EXPECT_EQ(InterleavedTableCount(2, 8, 4, 5, 1), 1);
  // m = p = 4: warmup min(10, m*v = 8) = 8, all warmup: every unit live, 4 per chunk.
  EXPECT_EQ(InterleavedLive(4, 2, 4, 0, 4), 8);
  EXPECT_EQ(InterleavedTableCount(2, 4, 4, 8, 0), 4);
  EXPECT_EQ(InterleavedTableCount(2, 4, 4, 8, 1), 4);
  // m 6, g 4 (a partial last group of 2): the first 11 entries are mb 0-3
  // chunk 0, mb 0-3 chunk 1, then the group {4, 5}: chunk 0 (2), chunk 1 (1 of 2).
  EXPECT_EQ(InterleavedTableCount(2, 6, 4, 11, 0), 6);
  EXPECT_EQ(InterleavedTableCount(2, 6, 4, 11, 1), 5);
  EXPECT_EQ(InterleavedTableChunk(2, 6, 4, 9), 0);   // partial group: entries 8, 9 on chunk 0
  EXPECT_EQ(InterleavedTableChunk(2, 6, 4, 10), 1);  // entries 10, 11 on chunk 1
}

TEST(InFlight, TableCursorWalksTheTable) {
  // The cursor's Next and Seek agree with the closed form at every entry,
  // whole and partial groups (m 7, g 3: groups {0,1,2} {3,4,5} {6}).
  for (const auto& [v, m, g] : {std::array<int64_t, 3>{2, 7, 3}, {3, 8, 4}, {2, 2, 4}, {4, 9, 2}}) {
    InterleavedTableCursor walk(v, m, g);
    for (int64_t j = 0; j < m * v; ++j) {
      EXPECT_EQ(walk.chunk(), InterleavedTableChunk(v, m, g, j)) << v << " " << m << " " << g << " " << j;
      InterleavedTableCursor seek(v, m, g);
      seek.Seek(j);
      EXPECT_EQ(seek.chunk(), walk.chunk());
      walk.Next();
    }
  }
}

// Hand-worked replay, p 2, v 2, m 4 (g = p = 2), pipeline rank 1 (the last):
// its chunk 0 keeps 10 B per micro-batch (say two MoE layers), its chunk 1 --
// the model's last chunk -- keeps 3 B and adds 4 B of logits while its
// forward runs. Table: (mb, chunk) = (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1)
// (3,1); backward k runs entry k's micro-batch through chunk 1 - its chunk.
// Warmup (v-1)g = 2 forwards, then forward k+2 / backward k:
//   F(0,c0) 10   F(1,c0) 20
//   F(0,c1) 23 (+4 logits = 27)  B(0,c1) 20
//   F(1,c1) 23 (27)              B(1,c1) 20
//   F(2,c0) 30  <- the peak       B(0,c0) 20
//   F(3,c0) 30 (a tie, not a new peak)  B(1,c0) 20
//   F(2,c1) 23 (27)  B(2,c1) 20;  F(3,c1) 23 (27)  B(3,c1) 20;  B(2,c0) 10;  B(3,c0) 0.
// The peak, 30 B, is 3 micro-batches on chunk 0 and none on chunk 1, at the
// end of forward 4 (after 2 backwards), logits not live. Counting the first
// warmup + 1 = 3 forwards per chunk would say 2 on chunk 0 and 1 on chunk 1
// plus the logits: 2*10 + 3 + 4 = 27 B.
TEST(InterleavedReplay, HandWorkedUnequalChunks) {
  const auto bytes = [](int64_t chunk) { return chunk == 0 ? ChunkActivation{10, 0} : ChunkActivation{3, 4}; };
  const InterleavedPeak peak = ReplayInterleaved(2, 2, 4, 1, 2, bytes);
  EXPECT_EQ(peak.bytes, 30);
  EXPECT_EQ(peak.forward, 4);
  EXPECT_EQ(peak.backwards_done, 2);
  EXPECT_EQ(peak.units, 3);  // = InterleavedLive(2, 2, 4, 1, 2)
  EXPECT_EQ(InterleavedLiveAtPeak(peak, 2, 4, 2, 0), 3);
  EXPECT_EQ(InterleavedLiveAtPeak(peak, 2, 4, 2, 1), 0);
  EXPECT_EQ(InterleavedTableChunk(2, 4, 2, peak.forward), 0);  // the logits' chunk is not running
  // Rank 0 of the same pipeline, warmup 2(p-1) + (v-1)g = 4, with chunk 1
  // heavier (1 B vs 10 B): F(0,c0) 1, F(1,c0) 2, F(0,c1) 12, F(1,c1) 22,
  // F(2,c0) 23 <- peak (3 on chunk 0, 2 on chunk 1), B(0,c1) 13, F(3,c0) 14,
  // B(1,c1) 4, F(2,c1) 14, B(0,c0) 13, F(3,c1) 23 (a tie), ...
  const auto heavy_last = [](int64_t chunk) { return ChunkActivation{chunk == 0 ? 1 : 10, 0}; };
  const InterleavedPeak rank0 = ReplayInterleaved(2, 2, 4, 0, 2, heavy_last);
  EXPECT_EQ(rank0.bytes, 23);
  EXPECT_EQ(rank0.forward, 4);
  EXPECT_EQ(rank0.units, 5);
  EXPECT_EQ(InterleavedLiveAtPeak(rank0, 2, 4, 2, 0), 3);
  EXPECT_EQ(InterleavedLiveAtPeak(rank0, 2, 4, 2, 1), 2);
}

/// The replay written out op by op, with no period skipping: the oracle for
/// the closed-form table and the skip (docs/formulas.md §4.1, Megatron schedules.py).
InterleavedPeak NaiveReplay(int64_t p, int64_t v, int64_t m, int64_t r, int64_t g,
                            const std::vector<ChunkActivation>& a) {
  std::vector<int64_t> table;  // chunk of each entry
  for (int64_t first = 0; first < m; first += g) {
    for (int64_t c = 0; c < v; ++c) {
      for (int64_t mb = first; mb < std::min(first + g, m); ++mb) table.push_back(c);
    }
  }
  const int64_t total = m * v;
  const int64_t warmup = std::min(2 * (p - r - 1) + (v - 1) * g, total);
  InterleavedPeak best;
  best.bytes = -1;
  int64_t live = 0, units = 0, done = 0;
  const auto fwd = [&](int64_t j) {
    live += a[static_cast<size_t>(table[static_cast<size_t>(j)])].saved;
    best.units = std::max(best.units, ++units);
    const int64_t now = live + a[static_cast<size_t>(table[static_cast<size_t>(j)])].transient;
    if (now > best.bytes) best = {now, j, done, best.units};
  };
  const auto bwd = [&](int64_t k) {
    live -= a[static_cast<size_t>(v - 1 - table[static_cast<size_t>(k)])].saved;
    --units;
    ++done;
  };
  for (int64_t j = 0; j < warmup; ++j) fwd(j);
  for (int64_t k = 0; k < total - warmup; ++k) {
    fwd(k + warmup);
    bwd(k);
  }
  return best;
}

TEST(InterleavedReplay, NoMicroBatchesKeepNothing) {
  const auto bytes = [](int64_t) { return ChunkActivation{5, 1}; };
  const InterleavedPeak peak = ReplayInterleaved(2, 2, 0, 0, 2, bytes);
  EXPECT_EQ(peak.bytes, 0);
  EXPECT_EQ(peak.units, 0);
  EXPECT_EQ(InterleavedLiveAtPeak(peak, 2, 0, 2, 0), 0);
  EXPECT_EQ(InterleavedTableChunk(2, 0, 2, peak.forward), 2);  // past the end: no chunk runs
}

TEST(InterleavedReplay, CostDoesNotGrowWithMicroBatches) {
  // p 4, v 2, rank 0: warmup 10; one period of g v = 8 steady steps is
  // scanned, then whole periods are skipped: at most warmup + 2 (2 g v) chunk
  // look-ups whether m is 8 or a million.
  int64_t calls = 0;
  const auto bytes = [&](int64_t chunk) {
    ++calls;
    return ChunkActivation{chunk + 1, 0};
  };
  const InterleavedPeak peak = ReplayInterleaved(4, 2, 1'000'000, 0, 4, bytes);
  EXPECT_LE(calls, 10 + 2 * 2 * 8);
  EXPECT_EQ(peak.units, 11);
}

TEST(InterleavedReplay, MatchesTheOpByOpReplay) {
  // Every small shape, partial groups (m % p != 0) and long runs (m >> p v,
  // where whole periods are skipped) included; chunk bytes from a fixed
  // pseudo-random sequence, a transient on the last chunk.
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>((state >> 33) % 97);
  };
  for (int64_t p = 1; p <= 4; ++p) {
    for (int64_t v = 2; v <= 4; ++v) {
      for (int64_t m = p; m <= 23; m += 3) {
        for (int64_t r = 0; r < p; ++r) {
          std::vector<ChunkActivation> a;
          for (int64_t c = 0; c < v; ++c) a.push_back({next(), c == v - 1 ? next() : 0});
          const auto bytes = [&](int64_t c) { return a[static_cast<size_t>(c)]; };
          const InterleavedPeak got = ReplayInterleaved(p, v, m, r, p, bytes);
          const InterleavedPeak want = NaiveReplay(p, v, m, r, p, a);
          SCOPED_TRACE(::testing::Message() << "p " << p << " v " << v << " m " << m << " r " << r);
          EXPECT_EQ(got.bytes, want.bytes);
          EXPECT_EQ(got.forward, want.forward);
          EXPECT_EQ(got.backwards_done, want.backwards_done);
          EXPECT_EQ(got.units, InterleavedLive(p, v, m, r, p));
          int64_t sum = 0;
          for (int64_t c = 0; c < v; ++c) sum += a[static_cast<size_t>(c)].saved * InterleavedLiveAtPeak(got, v, m, p, c);
          const int64_t running = InterleavedTableChunk(v, m, p, got.forward);
          EXPECT_EQ(sum + a[static_cast<size_t>(running)].transient, got.bytes);
        }
      }
    }
  }
}

TEST(InFlight, DualPipe) {
  // DeepSeek-V3 / DualPipe README: p + 1 stage-micro-batches per device.
  EXPECT_EQ(DualPipeInFlight(8, 20), 9);
}

/// 8 identical D layers on p 4 ranks, 2 per rank; only activations matter here.
Inventory DenseStack(int64_t layers) {
  Recipe r = testing::SmallRecipe();
  Inventory inv = testing::HybridInventory(r, "D", layers);
  return inv;
}

TEST(InFlight, StageActivationsFollowTheSchedule) {
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);  // dp 2, m = 64 / 2 = 32
  const StagePlan plan = EqualStagePlan(8, 4, 1);
  const Bytes per_layer = LayerActivations(inv.recipe, l, BlockKind::kDenseMlp);
  for (int64_t r = 0; r < 4; ++r) {
    const RankMemory m = EstimateRank(inv, l, plan, r);
    EXPECT_EQ(m.in_flight_microbatches, 4 - r);
    // 2 layers x (4 - r) micro-batches.
    EXPECT_EQ(m.activations_by_family[4], per_layer * (2 * (4 - r)));
  }
}

TEST(InFlight, InterleavedStageActivations) {
  // p 4, v 2, m 8: rank 0 holds chunks 0 and 4 (1 D layer each) and chunk 0
  // also the embedding's int64 ids, so chunk 0 is the heavier. Table (g = 4):
  // mb 0-3 chunk 0, mb 0-3 chunk 1, mb 4-7 chunk 0, mb 4-7 chunk 1; warmup 10.
  // Forward 10 (mb 6, chunk 0): 7 on chunk 0 + 4 on chunk 1; backward 0 frees
  // mb 0 of chunk 1; forward 11 (mb 7, chunk 0): 8 + 3 -- the peak, the first
  // instant chunk 0 holds 8. Layer-micro-batches stay 11; the ids count 8
  // times (counting the first 11 table entries said 7).
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  l.vpp = 2;
  l.schedule = Schedule::kInterleaved;
  l.micro_batches = 8;
  const RankMemory m = EstimateRank(inv, l, EqualStagePlan(8, 4, 2), 0);
  EXPECT_EQ(m.in_flight_microbatches, 11);
  EXPECT_EQ(m.activations_by_family[4], LayerActivations(inv.recipe, l, BlockKind::kDenseMlp) * 11);
  EXPECT_EQ(m.activations_ends, FirstStageActivations(inv.recipe, l) * 8);
}

TEST(InFlight, InterleavedHybridChunksPeakWhereTheHeavyChunkIsFull) {
  // Pattern "DEEE" on p 2, v 2, one layer per chunk: rank 0 holds chunk 0
  // (D + the embedding's ids, a0 bytes) and chunk 2 (E, a1 < a0: the dense
  // FFN of SmallRecipe is 4096 wide, the experts 512); rank 1 holds chunk 1
  // (E) and chunk 3 (E + the head). m 4, g 2.
  // Rank 0, warmup 2(p-1) + (v-1)g = 4 (the order of HandWorkedUnequalChunks):
  //   F(0,c0) F(1,c0) F(0,c1) F(1,c1) | F(2,c0): 3 a0 + 2 a1, B(0,c1) |
  //   F(3,c0): 4 a0 + a1 <- the peak when a0 > a1, B(1,c1) | F(2,c1): 4 a0 + a1 ...
  // so 4 D layer-micro-batches, 1 E and the ids 4 times (counting the first
  // warmup + 1 = 5 table entries said 3 D, 2 E, 3 ids).
  Recipe rc = testing::SmallRecipe();
  Inventory inv = testing::HybridInventory(rc, "DEEE", 1);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 2, 1);
  l.vpp = 2;
  l.schedule = Schedule::kInterleaved;
  l.micro_batches = 4;
  const StagePlan plan = EqualStagePlan(4, 2, 2);
  const Bytes d = LayerActivations(inv.recipe, l, BlockKind::kDenseMlp);
  const Bytes e = LayerActivations(inv.recipe, l, BlockKind::kMoe);
  const Bytes ids = FirstStageActivations(inv.recipe, l);
  ASSERT_GT(d + ids, e);
  const RankMemory r0 = EstimateRank(inv, l, plan, 0);
  EXPECT_EQ(r0.activations_by_family[4], d * 4);
  EXPECT_EQ(r0.activations_by_family[2], e * 1);
  EXPECT_EQ(r0.activations_ends, ids * 4);
  EXPECT_EQ(r0.in_flight_microbatches, 5);
  // Rank 1, warmup (v-1)g = 2: F(0,c0) F(1,c0) | F(0,c1): 2e + e + head
  // saved terms + logits, B(0,c1) | F(1,c1) the same, B(1,c1) | F(2,c0): 3e,
  // ... The head's forward is the peak: 3 E layer-micro-batches, the head's
  // saved terms once and its logits, i.e. LastStageActivations (as 1F1B).
  const int64_t vocab = PaddedVocab(inv.recipe.model, l.tp);
  const RankMemory r1 = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(r1.activations_by_family[2], e * 3);
  EXPECT_EQ(r1.activations_ends, LastStageActivations(inv.recipe, l, vocab));
  EXPECT_EQ(r1.in_flight_microbatches, 3);
}

TEST(InFlight, DualPipeDoublesParams) {
  // DualPipe: rank r holds stages r and p-1-r, so twice the 1F1B parameters.
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  const StagePlan plan = EqualStagePlan(8, 4, 1);
  const Bytes one = EstimateRank(inv, l, plan, 1).of(Category::kTpShardedParams);
  l.schedule = Schedule::kDualPipe;
  const RankMemory dual = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(dual.of(Category::kTpShardedParams), one * 2);
  EXPECT_EQ(dual.in_flight_microbatches, 5);
  // 5 stage-micro-batches: 3 on its own stage, 2 on the mirror, 2 layers each.
  EXPECT_EQ(dual.activations_by_family[4], LayerActivations(inv.recipe, l, BlockKind::kDenseMlp) * 10);
}

TEST(InFlight, DualPipeVKeepsOneCopy) {
  // DualPipeV: 2p V-stages on p ranks, no duplicated params; 2p+1 = 9
  // V-stage-micro-batches per rank (the in-flight row counts them all, as the
  // executor does): with one chunk on the rank, its first layer (the down
  // stage) holds p+1 = 5, the second (up) p = 4.
  const Inventory inv = DenseStack(8);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  const StagePlan plan = EqualStagePlan(8, 4, 1);
  const Bytes one = EstimateRank(inv, l, plan, 1).of(Category::kTpShardedParams);
  l.schedule = Schedule::kDualPipeV;
  const RankMemory v = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(v.of(Category::kTpShardedParams), one);
  EXPECT_EQ(v.in_flight_microbatches, 9);
  EXPECT_EQ(v.activations_by_family[4], LayerActivations(inv.recipe, l, BlockKind::kDenseMlp) * 9);
}

// DualPipeV with its 2p chunks (rank r: down chunk r, up chunk 2p-1-r), p 4,
// m 8, chunk 1 of 2 layers and every other chunk of one. Rank 1 replays
// dualpipev.py's steps: 4 F0 | 2 x (F0 F1) | 2 x (B1 F1) | F0: the peak holds
// 7 micro-batches on the down chunk 1 and 2 on the up chunk 6 (2p-r and r+1),
// 7 x 2 + 2 x 1 = 16 layer-micro-batches; the fixed split p+1 / p said 5 x 2 +
// 4 x 1 = 14.
TEST(InFlight, DualPipeVReplaysTheOrder) {
  const Inventory inv = DenseStack(9);
  Layout l = testing::LayoutFor(inv.recipe, 8, 1, 4, 1);
  l.schedule = Schedule::kDualPipeV;
  l.micro_batches = 8;
  const std::vector<int64_t> starts = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};  // each D layer its own start
  const StagePlan plan = PlanFromLayerCounts({1, 2, 1, 1, 1, 1, 1, 1}, starts, 4, Schedule::kDualPipeV);
  const Bytes d = LayerActivations(inv.recipe, l, BlockKind::kDenseMlp);
  const RankMemory r1 = EstimateRank(inv, l, plan, 1);
  EXPECT_EQ(r1.in_flight_microbatches, 9);
  EXPECT_EQ(r1.activations_by_family[4], d * 16);
}

TEST(InFlight, DualPipeVReplayPeakByHand) {
  // Down chunk 3 bytes a micro-batch, up chunk 5 with a transient of 7 (the head).
  const auto bytes = [](int64_t c) { return c == 0 ? ChunkActivation{3, 0} : ChunkActivation{5, 7}; };
  // Rank 0 of p 2, m 4: F0 F0 | F0 F1 (9 + 5 + 7 = 21) | B1 F1 (21 again) |
  // F0 (17) B1 F1: the up forward ends with 4 x 3 + 5 + 7 = 24, the peak,
  // with 4 micro-batches on the down chunk and 1 on the up one.
  const DualPipeVPeak r0 = ReplayDualPipeV(2, 4, 0, bytes);
  EXPECT_EQ(r0.bytes, 24);
  EXPECT_EQ(r0.live, (std::array<int64_t, 2>{4, 1}));
  EXPECT_EQ(r0.running, 1);
  EXPECT_EQ(r0.units, 5);
}

}  // namespace
}  // namespace preflight::estimator_pipeline_test

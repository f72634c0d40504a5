// Dropout in the executor (training.dropout, simulator/dropout.h): the
// blocks' backward through the masks against finite differences, the masks
// a sharded run draws against the unsharded reference's (fp64 1e-10), the
// bytes the masks keep against a hand count and against fit, and a planted
// rank-dependent mask that the comparison must catch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_core.h"
#include "blocks.h"
#include "dropout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_block_harness.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_dropout_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::MakeBlockLayout;
using testing::OnOneRank;
using testing::Random;
using testing::Rel;
using testing::SmallDims;
using testing::SmallMlaDims;
using testing_sim::ExpectStepAgrees;
using testing_sim::OneStage;

constexpr double kFdTolerance = 1e-6;  // central differences, step 1e-5 (simulator_blocks_test.cc)
constexpr double kDropout = 0.3;

void CheckBlockWithDropout(char letter, const Dims& d) {
  OnOneRank([&](Ctx& ctx) {
    ctx.dropout = kDropout;
    ctx.data_index = 3;
    auto block = MakeBlock<double>(letter, ctx, d, 2, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance, std::string(1, letter) + " with dropout");
  });
}

TEST(SimulatorDropout, BlocksMatchFiniteDifferences) {
  Dims d = SmallDims();
  d.flash_attention = false;  // dropout runs in Megatron's unfused core
  CheckBlockWithDropout('A', d);
  CheckBlockWithDropout('D', d);
  CheckBlockWithDropout('E', d);
  d = SmallMlaDims();
  d.flash_attention = false;
  CheckBlockWithDropout('A', d);
}

TEST(SimulatorDropout, EmbeddingMatchesFiniteDifferences) {
  const Dims d = SmallDims();
  OnOneRank([&](Ctx& ctx) {
    ctx.dropout = kDropout;
    Embedding<double> emb(ctx, d, 7, 0.8);
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < d.tokens(); ++t) ids.push_back((t * 5 + 3) % d.vocab);
    const Mat<double> r = Random(d.tokens(), d.hidden, 12);
    const auto loss = [&] {
      ++ctx.microbatch;
      return emb.Forward(ctx, ids).cwiseProduct(r).sum();
    };
    const Mat<double> y = emb.Forward(ctx, ids);
    emb.Backward(ctx, r);
    const Mat<double> g = emb.weight().grad.m;
    EXPECT_LT(testing::FdRelError(g, testing::Numeric(&emb.weight().value.m, loss)), kFdTolerance);
    // The mask drops about p of the elements and scales the rest by 1 / (1 - p).
    const double dropped = static_cast<double>((y.array() == 0).count()) / static_cast<double>(y.size());
    EXPECT_GT(dropped, 0.15);
    EXPECT_LT(dropped, 0.45);
  });
}

TEST(SimulatorDropout, MaskIsAPureFunctionOfItsKey) {
  Ctx ctx;
  ctx.dropout = 0.5;
  ctx.dropout_seed = 7;
  int64_t kept = 0, same = 0, n = 0;
  for (int64_t a = 0; a < 40; ++a) {
    for (int64_t c = 0; c < 50; ++c, ++n) {
      const bool k = DropoutKeeps(ctx, DropoutSite::kHidden, 1, a, 0, c);
      kept += k ? 1 : 0;
      EXPECT_EQ(k, DropoutKeeps(ctx, DropoutSite::kHidden, 1, a, 0, c));  // a rerun redraws it
      same += k == DropoutKeeps(ctx, DropoutSite::kHidden, 2, a, 0, c) ? 1 : 0;
    }
  }
  // Bernoulli(1/2) over 2000 draws: 1000 +- 3 sigma (sigma ~ 22); another
  // layer's mask is independent: agreement 1000 +- 3 sigma too.
  EXPECT_NEAR(static_cast<double>(kept), 1000.0, 70.0);
  EXPECT_NEAR(static_cast<double>(same), 1000.0, 70.0);
}

/// A block's forward and backward on `tp` ranks with dropout, each rank
/// drawing with seed `seed(tp_rank)`, against the one-rank run with seed 0.
double ShardedVsUnsharded(char letter, int tp, bool sp, const std::function<uint64_t(int)>& seed) {
  Dims d = SmallDims();
  d.flash_attention = false;
  const auto make = [&](bool sharded) {
    return [&, sharded, letter](Ctx& ctx, const Dims& dims, uint64_t s, double scale) {
      ctx.dropout = kDropout;
      ctx.dropout_seed = sharded ? seed(ctx.tp_rank) : 0;
      return MakeBlock<double>(letter, ctx, dims, 0, s, scale);
    };
  };
  const Mat<double> x = Random(d.tokens(), d.hidden, 11), dy = Random(d.tokens(), d.hidden, 12);
  const testing::BlockRun got = testing::RunBlockWith(make(true), d, MakeBlockLayout(tp, 1, sp), x, dy);
  const testing::BlockRun ref = testing::RunBlockWith(make(false), d, MakeBlockLayout(1, 1, false), x, dy);
  double worst = std::max(Rel(got.y, ref.y), Rel(got.dx, ref.dx));
  for (const auto& [name, g] : ref.grads) worst = std::max(worst, Rel(got.grads.at(name), g));
  return worst;
}

TEST(SimulatorDropout, ShardedBlocksDrawTheUnshardedMasks) {
  for (const char letter : {'A', 'D'}) {
    for (const bool sp : {false, true}) {
      EXPECT_LT(ShardedVsUnsharded(letter, 2, sp, [](int) { return 0; }), 1e-10) << letter << " sp " << sp;
    }
  }
}

TEST(SimulatorDropout, PlantedRankSeededMaskIsCaught) {
  // A mask drawn per rank (each TP rank its own seed, as a run that seeds
  // the residual's dropout from the model-parallel stream would): the
  // replicated residual's masks differ across TP ranks, and with SP the
  // shards no longer draw the reference's masks.
  for (const char letter : {'A', 'D'}) {
    for (const bool sp : {false, true}) {
      EXPECT_GT(ShardedVsUnsharded(letter, 2, sp, [](int t) { return static_cast<uint64_t>(t); }), 1e-3)
          << letter << " sp " << sp;
    }
  }
}

TEST(SimulatorDropout, StepAgreesAcrossLayouts) {
  const std::vector<std::vector<Override>> layouts = {
      {{"parallel.sp", "true"}},
      {{"parallel.sp", "false"}},
      {{"model.pattern", "AMDER"}, {"parallel.sp", "true"}},
  };
  for (std::vector<Override> sets : layouts) {
    sets.push_back({"training.dropout", "0.2"});
    sets.push_back({"training.flash_attention", "false"});
    sets.push_back({"training.recompute", "none"});
    sets.push_back({"parallel.cp", "1"});
    if (sets.front().key_path != "model.pattern") sets.push_back({"model.pattern", "AD"});
    ExpectStepAgrees(OneStage(sets));
  }
}

TEST(SimulatorDropout, PipelineAndFullRecomputeRedrawTheMasks) {
  // Two stages, data parallel, and full recompute: each rerun must draw its
  // forward's masks, or the gradients leave the reference's.
  for (const char* recompute : {"none", "full"}) {
    const Recipe r = testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                               {{"training.dropout", "0.2"},
                                                {"training.flash_attention", "false"},
                                                {"training.recompute", recompute},
                                                {"parallel.tp", "2"},
                                                {"parallel.sp", "true"},
                                                {"parallel.pp", "2"}},
                                               /*max_world=*/8);
    ExpectStepAgrees(r);
  }
}

/// The activation peak of the step's worst rank.
int64_t ActivationPeak(const SimulationReport& rep) {
  int64_t peak = 0;
  for (const RankMeasurement& m : rep.per_rank) {
    peak = std::max(peak, m.peak_bytes[static_cast<size_t>(SimCategory::kActivations)]);
  }
  return peak;
}

TEST(SimulatorDropout, MasksKeepTheHandCountedBytes) {
  // One stage of tp 4 with SP, pattern AD, one micro-batch in flight:
  // 8 positions x micro-batch 1 = 8 tokens, hidden 16, 32 query heads (the
  // scaled recipe keeps the default's head count), 8 per TP rank. Per rank,
  // beside the run without dropout:
  //   embedding mask (SP rows)      8 / 4 x 16 x 1 B          =  32
  //   residual masks, A and D       2 x 8 / 4 x 16 x 1 B      =  64
  //   attention: mask + dropped     8 heads x 8 x 8 x (1 + 2) B = 1536
  const std::vector<Override> base = {{"model.pattern", "AD"},        {"training.flash_attention", "false"},
                                      {"training.recompute", "none"}, {"parallel.sp", "true"},
                                      {"parallel.cp", "1"},           {"training.micro_batch", "1"}};
  std::vector<Override> with = base;
  with.push_back({"training.dropout", "0.1"});
  const Recipe plain = OneStage(base), dropped = OneStage(with);
  ASSERT_EQ(dropped.parallel.tp, 4);
  ASSERT_EQ(dropped.training.seq_len, 8);
  ASSERT_EQ(dropped.model.hidden, 16);
  ASSERT_EQ(dropped.model.attention.heads, 32);
  const SimulationReport a = Simulate(plain), b = Simulate(dropped);
  EXPECT_EQ(ActivationPeak(b) - ActivationPeak(a), 32 + 64 + 1536);
  ExpectStepAgrees(dropped, b);  // and fit prices the same bytes
}

TEST(SimulatorDropout, UnsupportedCombinationsAreRefused) {
  const std::vector<Override> unfused = {{"training.dropout", "0.1"},
                                         {"model.pattern", "AD"},
                                         {"training.flash_attention", "false"},
                                         {"parallel.cp", "1"}};
  // Dropout inside flash attention.
  EXPECT_THROW(Simulate(OneStage({{"training.dropout", "0.1"}, {"model.pattern", "AD"}})), SimUnsupported);
  // The selective mlp rerun under Transformer Engine (the mask stays outside Megatron's checkpoint).
  std::vector<Override> mlp = unfused;
  mlp.push_back({"training.recompute", "selective"});
  mlp.push_back({"training.recompute_modules", "[mlp]"});
  EXPECT_THROW(Simulate(OneStage(mlp)), SimUnsupported);
  mlp.push_back({"training.transformer_engine", "false"});  // the rerun inside the block: runs
  ExpectStepAgrees(OneStage(mlp));
  Dims d = SmallDims();
  OnOneRank([&](Ctx& ctx) {
    ctx.dropout = kDropout;
    EXPECT_THROW(MakeBlock<double>('A', ctx, d, 0, 7, 0.8), SimUnsupported);
  });
}

}  // namespace
}  // namespace preflight::sim::simulator_dropout_test

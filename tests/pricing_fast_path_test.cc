// The pricing fast paths against the layer-by-layer paths they stand in for.
// A sweep prices millions of layouts, so pricing adds a uniform family's
// layers from their counts (VisitByFamilies, CountUniformLayers, CountKept), prices
// identical pipeline ranks once (SameRanks for communication and step time,
// RankVisits for memory), walks a rank once for ZeRO 0-2 and, in a
// transformer stack, once for every ZeRO stage (EstimateRanksByZero; a
// sweep's fallback cuts only until every stage has a rank over)
// and finds a rank's chunks at their StagePlan positions (RegularPlan). An inventory whose family_uniform flags are
// cleared (the state of a hand-built inventory) takes none of the family
// paths and prices every rank on its own; a plan whose chunks are listed out
// of order takes the scanning path. Both must give every figure bit for bit.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/estimate_by_zero.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/planner/stages.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/recipe.h"
#include "support/shipped_recipes.h"
#include "support/test_support.h"

namespace preflight::pricing_fast_path_test {
namespace {

using testing::SourcePath;

Recipe Load(const std::string& relative) { return testing::LoadSourceRecipe(relative); }

// The same inventory with no family known to be uniform and without its
// per-family prefix counts: every pricing loop walks the layers one by one
// (each layer's kept activations from KeptBy, not CountKept) and no two ranks
// are taken as alike.
Inventory LayerByLayer(const Inventory& inv) {
  Inventory slow = inv;
  slow.family_uniform.fill(false);
  slow.prefix_family_layers.clear();
  slow.prefix_layer_starts.clear();
  return slow;
}

void ExpectSameRanks(const std::vector<RankMemory>& a, const std::vector<RankMemory>& b, const std::string& where) {
  ASSERT_EQ(a.size(), b.size()) << where;
  for (size_t r = 0; r < a.size(); ++r) {
    const RankMemory& x = a[r];
    const RankMemory& y = b[r];
    const std::string at = fmt::format("{} rank {}", where, r);
    for (size_t c = 0; c < x.bytes.size(); ++c) EXPECT_EQ(x.bytes[c].count(), y.bytes[c].count()) << at << " cat " << c;
    for (size_t f = 0; f < 5; ++f) {
      EXPECT_EQ(x.activations_by_family[f].count(), y.activations_by_family[f].count()) << at;
    }
    EXPECT_EQ(x.activations_ends.count(), y.activations_ends.count()) << at;
    EXPECT_EQ(x.activations_transient.count(), y.activations_transient.count()) << at;
    EXPECT_EQ(x.activations_offload_kept.count(), y.activations_offload_kept.count()) << at;
    EXPECT_EQ(x.in_flight_microbatches, y.in_flight_microbatches) << at;
    EXPECT_EQ(x.allocated_static.count(), y.allocated_static.count()) << at;
    EXPECT_EQ(x.allocated_peak.count(), y.allocated_peak.count()) << at;
    EXPECT_EQ(x.host.count(), y.host.count()) << at;
  }
}

void ExpectSameMemory(const MemoryEstimate& a, const MemoryEstimate& b, const std::string& where) {
  EXPECT_EQ(a.worst_stage, b.worst_stage) << where;
  EXPECT_EQ(a.verdict.reason, b.verdict.reason) << where;
  ExpectSameRanks(a.stages, b.stages, where);
}

// Every figure of two plans of one layout, bit for bit (StageComm::priced_as
// says how a rank was priced, not what it costs, and is left out).
void ExpectSamePlan(const Plan& a, const Plan& b, const std::string& where) {
  ASSERT_EQ(a.stages.chunks.size(), b.stages.chunks.size()) << where;
  for (size_t c = 0; c < a.stages.chunks.size(); ++c) {
    EXPECT_EQ(a.stages.chunks[c].first_layer, b.stages.chunks[c].first_layer) << where;
    EXPECT_EQ(a.stages.chunks[c].end_layer, b.stages.chunks[c].end_layer) << where;
  }
  ExpectSameMemory(*a.memory, *b.memory, where);
  ASSERT_EQ(a.comm.size(), b.comm.size()) << where;
  for (size_t r = 0; r < a.comm.size(); ++r) {
    const StageComm& x = a.comm[r];
    const StageComm& y = b.comm[r];
    const std::string at = fmt::format("{} rank {}", where, r);
    EXPECT_EQ(x.pipeline_rank, y.pipeline_rank) << at;
    EXPECT_EQ(x.host_transfer.count(), y.host_transfer.count()) << at;
    EXPECT_EQ(x.activation_offload.count(), y.activation_offload.count()) << at;
    ASSERT_EQ(x.items.size(), y.items.size()) << at;
    for (size_t i = 0; i < x.items.size(); ++i) {
      const CommItem& p = x.items[i];
      const CommItem& q = y.items[i];
      EXPECT_TRUE(p.axis == q.axis && p.kind == q.kind && p.pass == q.pass && p.what == q.what) << at << " item " << i;
      EXPECT_EQ(p.group_size, q.group_size) << at << " item " << i;
      EXPECT_EQ(p.payload.count(), q.payload.count()) << at << " item " << i;
      EXPECT_EQ(p.calls, q.calls) << at << " item " << i;
      EXPECT_EQ(p.send.count(), q.send.count()) << at << " item " << i;
      EXPECT_EQ(p.recv.count(), q.recv.count()) << at << " item " << i;
      EXPECT_EQ(p.seconds, q.seconds) << at << " item " << i;
      EXPECT_EQ(p.exposed_seconds, q.exposed_seconds) << at << " item " << i;
      EXPECT_EQ(p.unhidden_seconds, q.unhidden_seconds) << at << " item " << i;
    }
  }
  const StepTime& s = a.time;
  const StepTime& t = b.time;
  EXPECT_EQ(s.step_s, t.step_s) << where;
  EXPECT_EQ(s.steady_s, t.steady_s) << where;
  EXPECT_EQ(s.bubble_s, t.bubble_s) << where;
  EXPECT_EQ(s.slowest_stage, t.slowest_stage) << where;
  EXPECT_EQ(s.dp_exposed_s, t.dp_exposed_s) << where;
  EXPECT_EQ(s.optimizer_s, t.optimizer_s) << where;
  EXPECT_EQ(s.newton_schulz_s, t.newton_schulz_s) << where;
  EXPECT_EQ(s.optimizer_step_s, t.optimizer_step_s) << where;
  EXPECT_EQ(s.host_offload_s, t.host_offload_s) << where;
  EXPECT_EQ(s.activation_offload_s, t.activation_offload_s) << where;
  EXPECT_EQ(s.activation_offload_exposed_s, t.activation_offload_exposed_s) << where;
  EXPECT_EQ(s.head_compute_s, t.head_compute_s) << where;
  EXPECT_EQ(s.tokens_per_s, t.tokens_per_s) << where;
  EXPECT_EQ(s.mfu, t.mfu) << where;
  EXPECT_EQ(s.exposed_by_axis, t.exposed_by_axis) << where;
  EXPECT_EQ(s.compute_by_family_s, t.compute_by_family_s) << where;
  ASSERT_EQ(s.stages.size(), t.stages.size()) << where;
  for (size_t r = 0; r < s.stages.size(); ++r) {
    EXPECT_EQ(s.stages[r].forward_s, t.stages[r].forward_s) << where;
    EXPECT_EQ(s.stages[r].backward_s, t.stages[r].backward_s) << where;
    EXPECT_EQ(s.stages[r].recompute_s, t.stages[r].recompute_s) << where;
    EXPECT_EQ(s.stages[r].exposed_comm_s, t.stages[r].exposed_comm_s) << where;
  }
}

// What the fast paths did over a recipe's sample, so that the test knows it
// compared them with something.
struct Reach {
  int plans = 0;
  int ranks_priced_as_another = 0;
  int fitting_stages = 0;  // ZeRO stages whose every rank fits (EstimateRanksByZero until all over)
  int stages_over = 0;
  int started_late = 0;           // until-all-over walks started past rank 0 (first_rank) that stopped early
  int stopped_past_first = 0;     // of them, those that stopped on a later rank than the first
  int subset_stages_fitting = 0;  // fitting stages priced with a subset of the ZeRO stages
};

// Every rank within capacity and the node's host memory (the sweep's test).
bool Fits(const Recipe& r, const std::vector<RankMemory>& ranks) {
  return std::all_of(ranks.begin(), ranks.end(),
                     [&](const RankMemory& m) { return m.total() <= m.capacity && HostMemoryFits(r, m.host); });
}

// About `want` valid layouts of the recipe's sweep space (micro-batch 1 and
// 2), evenly spread, each planned on the inventory and on its layer-by-layer
// copy; the stages of each are also estimated with their chunks listed
// backwards (the scanning path of a plan that breaks the StagePlan order).
Reach ComparePlans(const Recipe& base, size_t want) {
  std::string error;
  const Recipe r = *SweepRecipe(base, base.world(), &error);
  const Inventory fast = BuildInventory(r);
  const Inventory slow = LayerByLayer(fast);
  const testing::SweptSpace swept = testing::SweepDefaultSpace(fast);
  const std::vector<size_t>& valid = swept.valid;
  Reach reach;
  if (valid.empty()) return reach;
  const size_t stride = std::max<size_t>(1, valid.size() / want);
  for (size_t i = stride / 3; i < valid.size(); i += stride) {
    const Layout l = swept.result.LayoutOf(swept.result.rows[valid[i]]);
    const std::string where =
        fmt::format("{}: tp {} cp {} pp {} vpp {} ep {} etp {} mb {} recompute {} zero {}", r.name, l.tp, l.cp, l.pp,
                    l.vpp, l.ep, l.expert_tp, l.micro_batch, Name(l.recompute), l.zero);
    const PlanResult a = MakePlan(fast, l);
    const PlanResult b = MakePlan(slow, l);
    if (!a.plan || !b.plan) {
      ADD_FAILURE() << where << ": no plan";
      continue;
    }
    ExpectSamePlan(*a.plan, *b.plan, where);
    ++reach.plans;
    for (const StageComm& c : a.plan->comm) reach.ranks_priced_as_another += c.priced_as >= 0 ? 1 : 0;
    for (const StageComm& c : b.plan->comm) EXPECT_LT(c.priced_as, 0) << where << ": the slow path took a shortcut";
    // Every ZeRO stage at once (a sweep's item: one walk for ZeRO 0-2)
    // against each alone on the layer-by-layer path.
    const std::vector<int64_t> zeros =
        l.dp_replicate > 1 ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{0, 1, 2, 3};
    std::vector<std::vector<RankMemory>> by_zero;
    EstimateRanksByZero(fast, l, a.plan->stages, zeros, &by_zero);
    EXPECT_EQ(by_zero.size(), zeros.size()) << where;
    for (size_t z = 0; z < std::min(zeros.size(), by_zero.size()); ++z) {
      Layout at = l;
      at.zero = zeros[z];
      ExpectSameRanks(by_zero[z], EstimateMemory(slow, at, a.plan->stages).stages,
                      fmt::format("{} (at ZeRO {})", where, zeros[z]));
    }
    // Priced only until every stage has a rank over (a sweep's fallback
    // cuts): the stages that fit complete, the others still over.
    std::vector<std::vector<RankMemory>> until_over;
    EstimateRanksByZero(fast, l, a.plan->stages, zeros, &until_over, true);
    for (size_t z = 0; z < std::min(zeros.size(), until_over.size()); ++z) {
      const std::string at = fmt::format("{} (ZeRO {}, until all over)", where, zeros[z]);
      if (Fits(fast.recipe, by_zero[z])) {
        ExpectSameRanks(until_over[z], by_zero[z], at);
        ++reach.fitting_stages;
      } else {
        EXPECT_FALSE(Fits(fast.recipe, until_over[z])) << at;
        ++reach.stages_over;
      }
    }
    // Any subset of the stages priced together (a sweep's fallback cuts
    // price only the stages whose time-balanced cut is over): each stage's
    // figures do not depend on the others'.
    for (unsigned mask = 1; mask + 1 < (1u << zeros.size()); ++mask) {
      std::vector<int64_t> some;
      std::vector<size_t> index;
      for (size_t z = 0; z < zeros.size(); ++z) {
        if ((mask >> z) & 1u) {
          some.push_back(zeros[z]);
          index.push_back(z);
        }
      }
      std::vector<std::vector<RankMemory>> subset;
      EstimateRanksByZero(fast, l, a.plan->stages, some, &subset, true);
      EXPECT_EQ(subset.size(), some.size()) << where;
      for (size_t k = 0; k < std::min(subset.size(), some.size()); ++k) {
        const std::string at = fmt::format("{} (ZeRO {} of subset {})", where, some[k], mask);
        if (Fits(fast.recipe, by_zero[index[k]])) {
          ExpectSameRanks(subset[k], by_zero[index[k]], at);
          ++reach.subset_stages_fitting;
        } else {
          EXPECT_FALSE(Fits(fast.recipe, subset[k])) << at;
        }
      }
    }
    // The same from a later first rank, round the pipeline (a sweep starts
    // at the rank that stopped the cut's last layout): only the order moves.
    for (const int64_t first : {int64_t{1}, l.pp / 2, l.pp - 1}) {
      if (first <= 0 || first >= l.pp) continue;
      std::vector<std::vector<RankMemory>> from;
      int64_t hint = first;
      EstimateRanksByZero(fast, l, a.plan->stages, zeros, &from, true, &hint);
      const std::string at = fmt::format("{} (until all over, from rank {})", where, first);
      EXPECT_EQ(from.size(), zeros.size()) << at;
      if (from.size() != zeros.size()) continue;
      EXPECT_GE(hint, 0) << at;
      EXPECT_LT(hint, l.pp) << at;
      bool all_over = true, stop_is_over = false;
      for (size_t z = 0; z < zeros.size(); ++z) {
        if (Fits(fast.recipe, by_zero[z])) {
          ExpectSameRanks(from[z], by_zero[z], fmt::format("{} ZeRO {}", at, zeros[z]));
          all_over = false;
        } else {
          EXPECT_FALSE(Fits(fast.recipe, from[z])) << at << " ZeRO " << zeros[z];
          const RankMemory& m = from[z][static_cast<size_t>(hint)];
          stop_is_over = stop_is_over || m.total() > m.capacity || !HostMemoryFits(fast.recipe, m.host);
        }
      }
      if (all_over) {
        // The rank returned is the one the walk stopped at: over at some
        // stage. Each stage's ranks are priced from `first` on, round the
        // pipeline, up to the one its group stopped at and left empty after
        // it (a priced rank holds at least the runtime reserve); the last
        // group stops at the rank returned.
        EXPECT_TRUE(stop_is_over) << at << ": stopped at rank " << hint;
        int64_t last_priced = -1;
        for (size_t z = 0; z < zeros.size(); ++z) {
          int64_t priced = 0;  // ranks priced in a row from `first`
          while (priced < l.pp && from[z][static_cast<size_t>((first + priced) % l.pp)].total() > Bytes(0)) ++priced;
          for (int64_t t = priced; t < l.pp; ++t) {
            EXPECT_EQ(from[z][static_cast<size_t>((first + t) % l.pp)].total(), Bytes(0)) << at << " ZeRO " << zeros[z];
          }
          last_priced = std::max(last_priced, priced - 1);
        }
        EXPECT_EQ(last_priced, (hint - first + l.pp) % l.pp) << at << ": stopped at rank " << hint;
        reach.started_late += 1;
        reach.stopped_past_first += hint != first ? 1 : 0;
      } else {
        EXPECT_EQ(hint, first) << at << ": a stage fits, the hint is kept";
      }
    }
    StagePlan backwards = a.plan->stages;
    std::reverse(backwards.chunks.begin(), backwards.chunks.end());
    ExpectSameMemory(EstimateMemory(fast, a.plan->layout, backwards), *a.plan->memory, where + " (chunks backwards)");
  }
  return reach;
}

class FastPathsAgree : public ::testing::TestWithParam<const char*> {};

TEST_P(FastPathsAgree, WithTheLayerByLayerPaths) {
  const Reach reach = ComparePlans(Load(fmt::format("recipes/{}.yaml", GetParam())), 60);
  EXPECT_GT(reach.plans, 0);
}

// The stop after every stage has a rank over fires and leaves the fitting
// stages whole: DeepSeek-V3 on its cluster has both.
TEST(FastPaths, RanksArePricedUntilEveryStageIsOver) {
  const Reach reach = ComparePlans(Load("recipes/deepseek-v3-h200.yaml"), 40);
  EXPECT_GT(reach.fitting_stages, 0);
  EXPECT_GT(reach.stages_over, 0);
  EXPECT_GT(reach.started_late, 0);
  EXPECT_GT(reach.stopped_past_first, 0);
  EXPECT_GT(reach.subset_stages_fitting, 0);
}

INSTANTIATE_TEST_SUITE_P(ShippedRecipes, FastPathsAgree, ::testing::ValuesIn(testing::kShippedRecipes),
                         testing::RecipeTestName);

// The fast paths fire: pipelines with repeated middle stages price some ranks
// as others (Llama 3 405B: 126 uniform layer pairs, pp up to 16).
TEST(FastPaths, IdenticalRanksArePricedOnce) {
  const Reach reach = ComparePlans(Load("recipes/llama3-405b-h200.yaml"), 40);
  EXPECT_GT(reach.ranks_priced_as_another, 0);
}

// Branches the shipped recipes' defaults do not reach: full recompute's block
// method (the ranks' un-rerun layers), the optimizer's and activations'
// offload, and every schedule of the default hybrid recipe with them.
TEST(FastPaths, RecomputeBlockAndOffloadVariants) {
  Recipe block = Load("recipes/llama3-8b-h200.yaml");
  block.training.recompute_method = RecomputeMethod::kBlock;
  block.training.recompute_layers = 2;
  EXPECT_GT(ComparePlans(block, 40).plans, 0);

  Recipe offload = Load("recipes/jamba-v0.1-h200.yaml");  // AdamW throughout, as the offload needs
  offload.training.optimizer.offload_fraction = 0.5;
  EXPECT_GT(ComparePlans(offload, 40).plans, 0);

  Recipe hybrid = Load("recipes/nam56r-h200.yaml");
  hybrid.training.recompute_method = RecomputeMethod::kBlock;
  hybrid.training.recompute_layers = 3;
  EXPECT_GT(ComparePlans(hybrid, 40).plans, 0);

  // Full recompute's uniform method over two layers: its checkpoints follow
  // each layer's place in its chunk (walked layer by layer on both sides).
  Recipe uniform = Load("recipes/deepseek-v3-h200.yaml");
  uniform.training.recompute_layers = 2;
  EXPECT_GT(ComparePlans(uniform, 20).plans, 0);
}

// FP4 weight copies ride in the per-family figures the fast walk shares:
// NVFP4 and MXFP4 with and without fp4_params, on a dense and a MoE recipe
// moved to GB200 (the FP4 keys need FP4 tensor cores).
TEST(FastPaths, Fp4Variants) {
  for (const char* name : {"llama3-8b-h200", "mixtral-8x7b-h200"}) {
    for (const char* format : {"nvfp4", "mxfp4"}) {
      for (const char* params : {"false", "true"}) {
        std::vector<Override> overrides = {*ParseOverride("cluster.gpu=gb200"),
                                           *ParseOverride(std::string("training.precision.fp4=") + format),
                                           *ParseOverride(std::string("training.precision.fp4_params=") + params)};
        const LoadResult loaded =
            LoadRecipeFile(testing::SourcePath(std::string("recipes/") + name + ".yaml"), overrides);
        ASSERT_TRUE(loaded.ok()) << name << " " << testing::FirstErrorText(loaded);
        EXPECT_GT(ComparePlans(*loaded.recipe, 20).plans, 0) << name << " " << format << " " << params;
      }
    }
  }
}

// In a transformer stack one walk serves ZeRO 0-2 and ZeRO 3 (the ZeRO 3
// walk less its gathered units and share bytes, BelowZero3), each stage's
// model state priced in its own context: FSDP2's CPU offload and the
// prefetch after the step change ZeRO 3's figures only, on a dense and a MoE
// recipe (AdamW throughout, as the offload needs).
TEST(FastPaths, ZeroStagesShareOneWalk) {
  for (const char* name : {"llama3-8b-h200", "mixtral-8x7b-h200"}) {
    for (const char* offload : {"false", "true"}) {
      std::vector<Override> overrides = {
          *ParseOverride("training.optimizer.matrices=adamw"), *ParseOverride("parallel.zero=3"),
          *ParseOverride(std::string("parallel.fsdp_cpu_offload=") + offload),
          *ParseOverride("parallel.overlap_grad_reduce=true"), *ParseOverride("parallel.overlap_param_gather=true")};
      const LoadResult loaded =
          LoadRecipeFile(testing::SourcePath(std::string("recipes/") + name + ".yaml"), overrides);
      ASSERT_TRUE(loaded.ok()) << name << " " << testing::FirstErrorText(loaded);
      EXPECT_GT(ComparePlans(*loaded.recipe, 20).plans, 0) << name << " offload " << offload;
    }
  }
}

// DualPipe(V) ranks replay the schedule once (KeptDualReplay): the visit
// keys, the walk and the ZeRO groups of one layout read the kept replay. Each
// rank against EstimateRank, which keeps none, on DeepSeek-V3's DualPipe and
// on DualPipeV, at every ZeRO stage; `replayed` counts the layouts whose
// ranks take the replay (micro-batches >= 2 pp), so the test knows it ran.
TEST(FastPaths, DualPipeReplaysKeptPerRank) {
  for (const char* schedule : {"dualpipe", "dualpipev"}) {
    const LoadResult loaded = LoadRecipeFile(testing::SourcePath("recipes/deepseek-v3-h200.yaml"),
                                             {*ParseOverride(std::string("parallel.schedule=") + schedule)});
    ASSERT_TRUE(loaded.ok()) << schedule << " " << testing::FirstErrorText(loaded);
    const Inventory inv = BuildInventory(*loaded.recipe);
    const testing::SweptSpace swept = testing::SweepDefaultSpace(inv);
    ASSERT_FALSE(swept.valid.empty()) << schedule;
    const size_t stride = std::max<size_t>(1, swept.valid.size() / 40);
    int replayed = 0;
    for (size_t i = stride / 2; i < swept.valid.size(); i += stride) {
      const Layout l = swept.result.LayoutOf(swept.result.rows[swept.valid[i]]);
      const StagePlan stages = PartitionStages(inv, l);
      const std::vector<int64_t> zeros =
          l.dp_replicate > 1 ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{0, 1, 2, 3};
      std::vector<std::vector<RankMemory>> by_zero;
      EstimateRanksByZero(inv, l, stages, zeros, &by_zero);
      ASSERT_EQ(by_zero.size(), zeros.size());
      for (size_t z = 0; z < zeros.size(); ++z) {
        Layout at = l;
        at.zero = zeros[z];
        std::vector<RankMemory> one_by_one;
        for (int64_t r = 0; r < l.pp; ++r) one_by_one.push_back(EstimateRank(inv, at, stages, r));
        ExpectSameRanks(by_zero[z], one_by_one,
                        fmt::format("{} tp {} pp {} ep {} mb {} m {} zero {}", schedule, l.tp, l.pp, l.ep,
                                    l.micro_batch, l.micro_batches, zeros[z]));
      }
      replayed += l.micro_batches >= 2 * l.pp && l.pp > 1 ? 1 : 0;
    }
    EXPECT_GT(replayed, 5) << schedule;
  }
}

}  // namespace
}  // namespace preflight::pricing_fast_path_test

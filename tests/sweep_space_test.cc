// The sweep library: axis parsing, hand-counted valid layouts, the Pareto
// front and ranking of hand-made rows, determinism across thread counts.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/first_error.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/sweep_report.h"
#include "support/shipped_recipes.h"
#include "support/test_support.h"

namespace preflight::sweep_space_test {
namespace {

using testing::RunPreflight;
using testing::SourcePath;

Recipe Load(const std::string& relative) { return testing::LoadSourceRecipe(relative); }

// The status MakePlan's verdict gives a layout (SweepStatus's definition).
SweepStatus StatusOf(const Verdict& v) {
  if (!v.fits) return SweepStatus::kOverCapacity;
  return v.headroom_ok ? SweepStatus::kFits : SweepStatus::kTight;
}

// A valid sweep row against the ordinary single-layout path (MakePlan, its
// own uncached partition and locality): every number and the verdict equal,
// bit for bit. Returns MakePlan's partition name.
std::string ExpectRowMatchesPlan(const Inventory& inv, const SweepResult& result, const SweepRow& row) {
  const Layout l = result.LayoutOf(row);
  const PlanResult plan = MakePlan(inv, l);
  EXPECT_TRUE(plan.plan);
  if (!plan.plan) return "";
  const Plan& p = *plan.plan;
  const MemoryEstimate& m = *p.memory;
  const std::string where = fmt::format("tp {} cp {} pp {} vpp {} ep {} etp {} mb {} recompute {} zero {}", l.tp, l.cp,
                                        l.pp, l.vpp, l.ep, l.expert_tp, l.micro_batch, Name(l.recompute), l.zero);
  EXPECT_EQ(row.status, StatusOf(m.verdict)) << where;
  EXPECT_EQ(row.worst_stage, m.worst_stage) << where;
  EXPECT_EQ(row.peak.count(), m.stages[static_cast<size_t>(m.worst_stage)].total().count()) << where;
  EXPECT_EQ(row.step_s, p.time.step_s) << where;
  EXPECT_EQ(row.tokens_per_s, p.time.tokens_per_s) << where;
  EXPECT_EQ(row.mfu, p.time.mfu) << where;
  const StepBreakdown parts = BreakdownOf(p.time);
  EXPECT_EQ(row.compute_s, static_cast<float>(parts.compute_s)) << where;
  EXPECT_EQ(row.exposed_comm_s, static_cast<float>(parts.exposed_comm_s)) << where;
  EXPECT_EQ(row.bubble_s, static_cast<float>(parts.bubble_s)) << where;
  EXPECT_EQ(row.optimizer_s, static_cast<float>(parts.optimizer_s)) << where;
  return p.partition;
}

TEST(SweepAxis, ListsAndRanges) {
  std::string error;
  EXPECT_EQ(ParseAxisList("1,2,4", 1, &error), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(ParseAxisList("1..4", 1, &error), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(ParseAxisList("8,1..2,2", 1, &error), (std::vector<int64_t>{1, 2, 8}));  // sorted, deduplicated
  EXPECT_EQ(ParseAxisList("0..3", 0, &error), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(SweepAxis, MalformedListsNameTheBadPart) {
  std::string error;
  EXPECT_FALSE(ParseAxisList("3..x", 1, &error));
  EXPECT_NE(error.find("'x' is not an integer"), std::string::npos) << error;
  EXPECT_FALSE(ParseAxisList("4..2", 1, &error));
  EXPECT_NE(error.find("empty"), std::string::npos) << error;
  EXPECT_FALSE(ParseAxisList("0,1", 1, &error));
  EXPECT_FALSE(ParseAxisList("", 1, &error));
  EXPECT_FALSE(ParseAxisList("1,,2", 1, &error));
  EXPECT_FALSE(ParseAxisList("1..100000", 1, &error));  // more than 4096 values
  EXPECT_FALSE(ParseRecomputeList("selective,partial", &error));
  EXPECT_NE(error.find("'partial'"), std::string::npos) << error;
  EXPECT_NE(error.find("valid: none, selective, full, selective_op"), std::string::npos) << error;
  EXPECT_EQ(ParseRecomputeList("selective_op,none", &error),
            (std::vector<Recompute>{Recompute::kNone, Recompute::kSelectiveOp}));
}

TEST(SweepRecipe, GpusMustFillNodes) {
  const Recipe base = Load("recipes/llama3-8b-h200.yaml");  // 8 GPUs per node
  std::string error;
  EXPECT_FALSE(SweepRecipe(base, 12, &error));
  EXPECT_NE(error.find("try 8 or 16"), std::string::npos) << error;
  auto four = SweepRecipe(base, 4, &error);  // under one node: one node of 4
  ASSERT_TRUE(four);
  EXPECT_EQ(four->cluster.nodes, 1);
  EXPECT_EQ(four->cluster.gpus_per_node, 4);
  auto many = SweepRecipe(base, 1024, &error);
  ASSERT_TRUE(many);
  EXPECT_EQ(many->cluster.nodes, 128);
}

// Issue "Sweeps ...": a recipe laid out at tp 1 says `sp: false`, which
// would hold sequence parallelism off in every tp > 1 row; the sweep runs it
// wherever tp > 1, as Megatron-LM runs TP, unless the user holds it off.
TEST(SweepRecipe, SequenceParallelFollowsTpUnlessHeldOff) {
  const Recipe base = Load("recipes/llama3-8b-h200.yaml");
  ASSERT_FALSE(base.parallel.sp);
  std::string error;
  SweepSpace space;
  space.tp = {1, 2};
  space.pp = {1};
  space.cp = {1};
  space.micro_batch = {1};
  space.recompute = {Recompute::kSelective};
  space.zero = {1};
  for (const bool sp : {true, false}) {
    const Recipe r = *SweepRecipe(base, 8, &error, sp);
    EXPECT_EQ(r.parallel.sp, sp);
    const SweepResult result = RunSweep(BuildInventory(r), DefaultSweepSpace(r, space), SweepOptions{});
    EXPECT_EQ(result.sequence_parallel, sp);
    for (const std::string& held : result.held_fixed) EXPECT_EQ(held.rfind("parallel.sp", 0), std::string::npos);
    for (const SweepRow& row : result.rows) {
      const Layout l = result.LayoutOf(row);
      EXPECT_EQ(l.sequence_parallel(), sp && l.tp > 1) << l.tp;
    }
  }
  const auto cli = RunPreflight({"sweep", "recipes/llama3-8b-h200.yaml", "--gpus", "8", "--tp", "2", "--pp", "1"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("sequence parallelism on wherever tp > 1"), std::string::npos) << cli.out;
  const auto off =
      RunPreflight({"sweep", "recipes/llama3-8b-h200.yaml", "--gpus", "8", "--tp", "2", "--pp", "1", "--sp", "off"});
  EXPECT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(off.out.find("sequence parallelism held off"), std::string::npos) << off.out;
}

// Llama 3 8B (32 query / 8 KV heads, sp off, global batch 512) on 8 GPUs.
// tp {1,2,3,4} x pp {1,2} x micro_batch {1,3} x recompute {none,full} x
// zero {0,1,2,3} = 4*2*2*2*4 = 128 rows. By hand:
//  - tp 3 divides neither 8 KV heads nor the 8 GPUs: invalid for every pp/mb.
//  - micro_batch 3: global batch 512 is no multiple of 3*dp for any dp: invalid.
//  - tp {1,2,4} x pp {1,2} with micro_batch 1: tp*pp <= 8 divides 8, dp =
//    8/(tp*pp) divides 512: 3*2 = 6 valid items, x 2 recompute x 4 zero = 48.
// So 48 valid rows and 80 invalid.
SweepSpace SmallSpace() {
  SweepSpace s;
  s.gpus = 8;
  s.tp = {1, 2, 3, 4};
  s.cp = {1};
  s.pp = {1, 2};
  s.vpp = {1};
  s.ep = {1};
  s.expert_tp = {1};
  s.micro_batch = {1, 3};
  s.recompute = {Recompute::kNone, Recompute::kFull};
  s.zero = {0, 1, 2, 3};
  return s;
}

TEST(SweepRun, HandCountedValidLayouts) {
  std::string error;
  const Recipe r = *SweepRecipe(Load("recipes/llama3-8b-h200.yaml"), 8, &error);
  const Inventory inv = BuildInventory(r);
  const SweepSpace space = DefaultSweepSpace(r, SmallSpace());
  EXPECT_EQ(SweepSize(space), 128);
  SweepOptions options;
  const SweepResult result = RunSweep(inv, space, options);
  ASSERT_EQ(result.rows.size(), 128u);
  EXPECT_EQ(result.CountOf(SweepStatus::kInvalid), 80);
  EXPECT_EQ(result.CountOf(SweepStatus::kFits) + result.CountOf(SweepStatus::kTight) +
                result.CountOf(SweepStatus::kOverCapacity),
            48);
  // Canonical order: the first row is tp 1, pp 1, mb 1, recompute none, zero 0;
  // the last is tp 4, pp 2, mb 3, full, zero 3.
  const Layout first = result.LayoutOf(result.rows.front());
  EXPECT_EQ(first.tp, 1);
  EXPECT_EQ(first.pp, 1);
  EXPECT_EQ(first.micro_batch, 1);
  EXPECT_EQ(first.recompute, Recompute::kNone);
  EXPECT_EQ(first.zero, 0);
  const Layout last = result.LayoutOf(result.rows.back());
  EXPECT_EQ(last.tp, 4);
  EXPECT_EQ(last.pp, 2);
  EXPECT_EQ(last.micro_batch, 3);
  EXPECT_EQ(last.recompute, Recompute::kFull);
  EXPECT_EQ(last.zero, 3);
  // Invalid rows carry the validator's message naming the key.
  for (const SweepRow& row : result.rows) {
    const Layout l = result.LayoutOf(row);
    const bool expect_invalid = l.tp == 3 || l.micro_batch == 3;
    EXPECT_EQ(row.status == SweepStatus::kInvalid, expect_invalid) << l.tp << " " << l.micro_batch;
    if (l.tp == 3) {
      // The sweep runs sequence parallelism wherever tp > 1 (SweepRecipe):
      // its sequence split by tp is the first rule tp 3 breaks.
      EXPECT_EQ(result.ReasonOf(row).rfind("training.seq_len = 8192", 0), 0u) << result.ReasonOf(row);
      EXPECT_NE(result.ReasonOf(row).find("parallel.tp (3) with sequence parallelism"), std::string::npos);
    }
    if (l.tp != 3 && l.micro_batch == 3) {
      EXPECT_EQ(result.ReasonOf(row).rfind("training.global_batch = 512", 0), 0u) << result.ReasonOf(row);
    }
  }
}

// A sweep's workers validate without the recipe's file name and text (the
// diagnostics would copy both): the errors keep their order and wording.
// Jamba at tp 3, pp 5, micro-batch 3 breaks several rules on several lines.
TEST(SweepSpace, ReasonsDoNotNeedTheRecipeText) {
  Recipe r = Load("recipes/jamba-v0.1-h200.yaml");
  ASSERT_NE(r.source.lines, nullptr);
  r.parallel.tp = 3;
  r.parallel.pp = 5;
  r.training.micro_batch = 3;
  Recipe bare = r;
  bare.source.file.clear();
  bare.source.lines.reset();
  const std::vector<Diagnostic> with_text = ValidateRecipe(r);
  const std::vector<Diagnostic> without = ValidateRecipe(bare);
  ASSERT_GT(with_text.size(), 2u);
  ASSERT_EQ(with_text.size(), without.size());
  EXPECT_FALSE(with_text.front().source_line.empty());
  for (size_t i = 0; i < with_text.size(); ++i) {
    EXPECT_EQ(with_text[i].key_path, without[i].key_path) << i;
    EXPECT_EQ(with_text[i].value, without[i].value) << i;
    EXPECT_EQ(with_text[i].message, without[i].message) << i;
    EXPECT_EQ(with_text[i].severity, without[i].severity) << i;
  }
}

// The sweep's reason comes from FirstRecipeError, which builds only the error
// that file order puts first: on a grid of degrees that breaks rules on
// several lines (and with parallel.tp set by --set, which sorts after the file),
// it is ValidateRecipe's first error, field for field.
TEST(SweepSpace, FirstRecipeErrorIsValidateRecipesFirst) {
  int invalid = 0;
  int several = 0;  // layouts with more than one error: the order decides
  const auto check = [&](const Recipe& r) {
    const std::vector<Diagnostic> all = ValidateRecipe(r);
    const auto first =
        std::find_if(all.begin(), all.end(), [](const Diagnostic& d) { return d.severity == Severity::kError; });
    const std::optional<Diagnostic> got = FirstRecipeError(r);
    ASSERT_EQ(got.has_value(), first != all.end()) << r.parallel.tp << " " << r.parallel.pp;
    if (!got) return;
    ++invalid;
    several +=
        std::count_if(all.begin(), all.end(), [](const Diagnostic& d) { return d.severity == Severity::kError; }) > 1;
    EXPECT_EQ(got->key_path, first->key_path);
    EXPECT_EQ(got->value, first->value);
    EXPECT_EQ(got->message, first->message);
    EXPECT_EQ(got->file, first->file);
    EXPECT_EQ(got->mark.line, first->mark.line);
    EXPECT_EQ(got->mark.column, first->mark.column);
    EXPECT_EQ(got->source_line, first->source_line);
  };
  LoadResult with_set = LoadRecipeFile(SourcePath("recipes/jamba-v0.1-h200.yaml"), {{"parallel.tp", "1"}});
  ASSERT_TRUE(with_set.ok());
  for (Recipe base : {Load("recipes/jamba-v0.1-h200.yaml"), Load("recipes/deepseek-v3-h200.yaml"),
                      Load("recipes/nam56r-h200.yaml"), *with_set.recipe}) {
    for (int64_t tp : {1, 2, 3, 4, 8}) {
      for (int64_t pp : {1, 2, 3, 5}) {
        for (int64_t ep : {1, 2, 3}) {
          for (int64_t mb : {1, 3}) {
            Recipe r = base;
            r.parallel.tp = tp;
            r.parallel.pp = pp;
            r.parallel.ep = ep;
            r.training.micro_batch = mb;
            check(r);
          }
        }
      }
    }
  }
  EXPECT_GT(invalid, 300);
  EXPECT_GT(several, 200);
}

// Why nothing fits, on the same hand-counted space: the 80 invalid rows blame
// training.global_batch (micro-batch 3 with tp 1, 2, 4: 3 x 2 x 2 x 4 = 48)
// before training.seq_len (tp 3 under sequence parallelism: 2 x 2 x 2 x 4 =
// 32); the closest miss is the non-fitting valid row with the smallest peak.
TEST(SweepRun, WhyNothingFitsCountsTheBlamedKeys) {
  std::string error;
  const Recipe r = *SweepRecipe(Load("recipes/llama3-8b-h200.yaml"), 8, &error);
  const SweepResult result = RunSweep(BuildInventory(r), DefaultSweepSpace(r, SmallSpace()), SweepOptions{});
  const NoFitReasons why = WhyNothingFits(result);
  EXPECT_EQ(why.invalid_rows, 80);
  ASSERT_EQ(why.invalid.size(), 2u);
  EXPECT_EQ(why.invalid[0].key, "training.global_batch");
  EXPECT_EQ(why.invalid[0].rows, 48);
  EXPECT_EQ(why.invalid[1].key, "training.seq_len");
  EXPECT_EQ(why.invalid[1].rows, 32);
  EXPECT_NE(why.invalid[1].example.find("parallel.tp (3)"), std::string::npos) << why.invalid[1].example;
  int64_t over = 0;
  std::optional<Bytes> least;
  for (const SweepRow& row : result.rows) {
    if (row.status == SweepStatus::kInvalid || row.status == SweepStatus::kFits) continue;
    ++over;
    if (!least || row.peak < *least) least = row.peak;
  }
  EXPECT_EQ(why.over_rows, over);
  ASSERT_EQ(why.closest.has_value(), least.has_value());
  if (least) {
    EXPECT_EQ(result.rows[static_cast<size_t>(*why.closest)].peak, *least);
  }
}

// An item's ZeRO stages share each rank's step-time compute
// (SharedCompute), emptied for each recompute policy: every valid row of
// every ZeRO stage and policy equals MakePlan's, on a recipe with the
// framework's fixed split (one stage plan for all policies) and optimizer
// offload (the optimizer step reads the sharded elements), and on
// DeepSeek-V3's balanced DualPipe cuts with their fallbacks.
TEST(SweepRun, ZeroStagesShareTheRanksComputeExactly) {
  std::string error;
  const LoadResult dense = LoadRecipeFile(
      testing::SourcePath("recipes/llama3-8b-h200.yaml"),
      {*ParseOverride("training.optimizer.matrices=adamw"), *ParseOverride("training.optimizer.offload_fraction=0.5")});
  ASSERT_TRUE(dense.ok()) << testing::FirstErrorText(dense);
  for (const Recipe& base : {*dense.recipe, Load("recipes/deepseek-v3-h200.yaml")}) {
    const Recipe r = *SweepRecipe(base, base.world(), &error);
    const Inventory inv = BuildInventory(r);
    SweepSpace s;
    s.gpus = r.world();
    s.micro_batch = {1, 2};
    s.pp = {2, 4, 8};
    s.recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
    s.zero = {0, 1, 2, 3};
    s = DefaultSweepSpace(r, s);
    const SweepResult result = RunSweep(inv, s, SweepOptions{});
    // Every row of about 40 valid items, evenly spread.
    const size_t per_item = s.recompute.size() * s.zero.size();
    std::vector<size_t> items;
    for (size_t i = 0; i < result.rows.size(); i += per_item) {
      const auto first = result.rows.begin() + static_cast<std::ptrdiff_t>(i);
      if (std::any_of(first, first + static_cast<std::ptrdiff_t>(per_item),
                      [](const SweepRow& row) { return row.status != SweepStatus::kInvalid; })) {
        items.push_back(i);
      }
    }
    int checked = 0;
    for (size_t k = 0; k < items.size(); k += std::max<size_t>(1, items.size() / 40)) {
      for (size_t i = items[k]; i < items[k] + per_item; ++i) {
        if (result.rows[i].status == SweepStatus::kInvalid) continue;
        ExpectRowMatchesPlan(inv, result, result.rows[i]);
        ++checked;
      }
    }
    EXPECT_GT(checked, 200) << r.name;
  }
}

// torchtitan's per-op recompute (selective_op) is on the recompute axis when
// the recipe runs it, after full; its rules (no tp, no cp) bind its own rows
// only: Llama 3 8B as torchtitan runs it (torchtitan_sac_test) on 8 GPUs,
// where the other policies' rows at tp 2 are priced and selective_op's are
// invalid for parallel tp, every priced row as MakePlan prices it.
TEST(SweepRun, SelectiveOpRowsFollowTheirOwnRules) {
  std::vector<Override> sets;
  for (const char* text :
       {"cluster.gpu=h100", "cluster.nodes=1", "parallel.zero=3", "training.micro_batch=2", "training.global_batch=16",
        "training.optimizer.matrices=adamw", "training.transformer_engine=false", "training.recompute=selective_op"}) {
    sets.push_back(*ParseOverride(text));
  }
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/llama3-8b-h200.yaml"), sets);
  ASSERT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
  std::string error;
  const Recipe r = *SweepRecipe(*loaded.recipe, 8, &error);
  SweepSpace s;
  s.gpus = 8;
  s.tp = {1, 2};
  s.cp = {1};
  s.pp = {1, 2};
  s.vpp = {1};
  s.micro_batch = {1, 2};
  s.zero = {1, 3};
  s = DefaultSweepSpace(r, s);
  ASSERT_EQ(s.recompute, (std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull,
                                                 Recompute::kSelectiveOp}));
  // A recipe that does not run it keeps the three policies.
  Recipe full = r;
  full.training.recompute = Recompute::kFull;
  EXPECT_EQ(DefaultSweepSpace(full, SweepSpace{}).recompute.size(), 3u);

  const Inventory inv = BuildInventory(r);
  const SweepResult result = RunSweep(inv, s, SweepOptions{});
  int priced_tp2 = 0, priced_op = 0;
  for (const SweepRow& row : result.rows) {
    const Layout l = result.LayoutOf(row);
    if (l.recompute == Recompute::kSelectiveOp && l.tp > 1) {
      EXPECT_EQ(row.status, SweepStatus::kInvalid);
      EXPECT_NE(result.ReasonOf(row).find("training.recompute = selective_op"), std::string::npos)
          << result.ReasonOf(row);
      continue;
    }
    ASSERT_NE(row.status, SweepStatus::kInvalid) << Name(l.recompute) << " tp " << l.tp << ": " << result.ReasonOf(row);
    ExpectRowMatchesPlan(inv, result, row);
    priced_tp2 += l.tp > 1;
    priced_op += l.recompute == Recompute::kSelectiveOp;
  }
  EXPECT_EQ(priced_tp2, 3 * 2 * 2 * 2);  // none, selective, full x pp x micro-batch x ZeRO
  EXPECT_EQ(priced_op, 2 * 2 * 2);       // tp 1 x pp x micro-batch x ZeRO
}

TEST(SweepRun, ValidRowsMatchTheEstimatorAndPlanner) {
  // One valid row re-priced through the ordinary single-layout path.
  std::string error;
  const Recipe r = *SweepRecipe(Load("recipes/llama3-8b-h200.yaml"), 8, &error);
  const Inventory inv = BuildInventory(r);
  const SweepResult result = RunSweep(inv, DefaultSweepSpace(r, SmallSpace()), SweepOptions{});
  for (const SweepRow& row : result.rows) {
    if (row.status != SweepStatus::kInvalid) ExpectRowMatchesPlan(inv, result, row);
  }
}

SweepRow Row(double peak_gib, double step_s, SweepStatus status = SweepStatus::kFits) {
  SweepRow r;
  r.peak = GiB(peak_gib);
  r.step_s = step_s;
  r.tokens_per_s = 1.0 / step_s;
  r.status = status;
  return r;
}

// Near-ties: a group starts at a row and holds the rows within 2 % of its
// step time (10 s: up to 10.2 s; 10.5 s: up to 10.71 s).
TEST(SweepTies, GroupsWithinTheStatedUncertainty) {
  const std::vector<SweepRow> rows = {Row(1, 10.0), Row(1, 10.5), Row(1, 10.1), Row(1, 11.0), Row(1, 10.6)};
  EXPECT_EQ(TieGroups(rows, {0, 2, 1, 4, 3}), (std::vector<int64_t>{1, 1, 3, 3, 5}));
  EXPECT_EQ(TieGroups(rows, {}), std::vector<int64_t>{});
  EXPECT_EQ(TieGroups(rows, {3}), std::vector<int64_t>{1});
}

TEST(SweepPareto, HandMadeFront) {
  // index: (peak GiB, step s)
  const std::vector<SweepRow> rows = {
      Row(10, 5),                               // 0: on the front
      Row(20, 3),                               // 1: on the front
      Row(15, 6),                               // 2: dominated by 0 (more memory, slower)
      Row(30, 3),                               // 3: dominated by 1 (same time, more memory)
      Row(5, 9),                                // 4: on the front (least memory)
      Row(20, 3),                               // 5: equal to 1: kept too
      Row(1, 1, SweepStatus::kInvalid),         // 6: not a candidate
      Row(2, 2, SweepStatus::kOverCapacity),    // 7: not a candidate
      Row(3, 2, SweepStatus::kTight),           // 8: below the headroom floor: not a candidate
      Row(12, 5),                               // 9: dominated by 0 (same time, more memory)
  };
  EXPECT_EQ(ParetoFront(rows), (std::vector<int64_t>{4, 0, 1, 5}));
}

TEST(SweepRank, ThroughputThenPeakThenIndex) {
  const std::vector<SweepRow> rows = {
      Row(10, 5),                        // 0: 0.2 tokens/s
      Row(20, 2),                        // 1: 0.5
      Row(15, 2),                        // 2: 0.5, less memory than 1
      Row(5, 1, SweepStatus::kInvalid),  // 3: excluded
      Row(15, 2),                        // 4: tie with 2: canonical index breaks it
      Row(1, 4),                         // 5: 0.25
  };
  EXPECT_EQ(RankByThroughput(rows, 10), (std::vector<int64_t>{2, 4, 1, 5, 0}));
  EXPECT_EQ(RankByThroughput(rows, 2), (std::vector<int64_t>{2, 4}));
}

TEST(SweepRun, OutputIsIdenticalForOneAndFourThreads) {
  // The default hybrid recipe (MoE, Mamba, pinned stages dropped) on 64 GPUs,
  // a space with valid, over-capacity and invalid rows.
  std::string error;
  const Recipe r = *SweepRecipe(Load("recipes/nam56r-h200.yaml"), 64, &error);
  const Inventory inv = BuildInventory(r);
  SweepSpace s;
  s.gpus = 64;
  s.tp = {1, 2, 4, 8};
  s.cp = {1, 2};
  s.pp = {1, 2, 4};
  s.vpp = {1, 2};
  s.ep = {4, 8};
  s.expert_tp = {1};
  s.micro_batch = {1, 2, 4};
  s.recompute = {Recompute::kSelective, Recompute::kFull};
  s.zero = {1, 3};
  s = DefaultSweepSpace(r, s);
  SweepOptions one;
  one.threads = 1;
  SweepOptions four;
  four.threads = 4;
  const SweepResult a = RunSweep(inv, s, one);
  const SweepResult b = RunSweep(inv, s, four);
  EXPECT_GT(a.CountOf(SweepStatus::kFits), 0);
  EXPECT_GT(a.CountOf(SweepStatus::kInvalid), 0);
  EXPECT_EQ(SweepCsv(a), SweepCsv(b));
  // Every 37th valid row re-priced through MakePlan (its own, uncached
  // partition): the sweep's cached partitions and localities change nothing.
  int checked = 0;
  for (size_t i = 0; i < a.rows.size(); i += 37) {
    const SweepRow& row = a.rows[i];
    if (row.status == SweepStatus::kInvalid) continue;
    ExpectRowMatchesPlan(inv, a, row);
    ++checked;
  }
  EXPECT_GT(checked, 10);
  // Rows whose time-balanced cut overflows: MakePlan falls back to another cut
  // (parameters, equal layers) when one fits; the sweep must agree with it.
  int fallbacks = 0;
  for (const SweepRow& row : a.rows) {
    if (row.status == SweepStatus::kInvalid) continue;
    const Layout l = a.LayoutOf(row);
    if (EstimateMemory(inv, l, PartitionStages(inv, l)).verdict.fits) continue;
    fallbacks += ExpectRowMatchesPlan(inv, a, row) != "time" ? 1 : 0;
  }
  // This space has one such row (found by running it); keep the path exercised.
  EXPECT_GE(fallbacks, 1);
  EXPECT_EQ(SweepJson(a, "x.yaml"), SweepJson(b, "x.yaml"));
  EXPECT_EQ(RenderSweepTable(a, "x.yaml"), RenderSweepTable(b, "x.yaml"));
}

// The sweep prices an item's recompute policies on one set of communication
// items (it does not depend on the policy) and exposes them again under each:
// with Megatron's EP overlap (off under full recompute), TP overlap and the
// DP overlaps on, an item's EP all-to-alls are hidden under `none` and
// exposed whole under `full`. Every row equals MakePlan's, which builds its
// items afresh.
TEST(SweepRun, RecomputePoliciesShareCommunicationExactly) {
  std::string error;
  Recipe base = Load("recipes/nam56r-h200.yaml");
  base.parallel.ep_comm_overlap = true;
  base.parallel.tp_comm_overlap = true;
  base.parallel.overlap_grad_reduce = true;
  base.parallel.overlap_param_gather = true;
  const Recipe r = *SweepRecipe(base, 64, &error);
  const Inventory inv = BuildInventory(r);
  SweepSpace s;
  s.gpus = 64;
  s.tp = {2, 4};
  s.cp = {1};
  s.pp = {1, 2};
  s.vpp = {1, 2};
  s.ep = {8};
  s.expert_tp = {1};
  s.micro_batch = {1};
  s.recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  s.zero = {1, 2, 3};
  s = DefaultSweepSpace(r, s);
  const SweepResult result = RunSweep(inv, s, SweepOptions{});
  int checked = 0;
  for (const SweepRow& row : result.rows) {
    if (row.status == SweepStatus::kInvalid) continue;
    ExpectRowMatchesPlan(inv, result, row);
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

// Every shipped recipe on its own cluster over its default space (micro-batch
// 1 and 2 to keep the test short): every valid row, or an evenly spread
// sample of about 400 of them, equals MakePlan's pricing exactly. Covers the
// sweep's caches (compute times, partitions, localities) on every block
// family, schedule and partition rule the recipes use.
class SweepAgreesWithPlan : public ::testing::TestWithParam<const char*> {};

TEST_P(SweepAgreesWithPlan, EveryCheckedRowExactly) {
  const Recipe base = Load(fmt::format("recipes/{}.yaml", GetParam()));
  std::string error;
  const Recipe r = *SweepRecipe(base, base.world(), &error);
  const Inventory inv = BuildInventory(r);
  const testing::SweptSpace swept = testing::SweepDefaultSpace(inv);
  const std::vector<size_t>& valid = swept.valid;
  ASSERT_FALSE(valid.empty());
  const size_t stride = std::max<size_t>(1, valid.size() / 400);
  // An odd offset so the sample does not always land on zero 0.
  for (size_t i = stride / 2; i < valid.size(); i += stride) {
    ExpectRowMatchesPlan(inv, swept.result, swept.result.rows[valid[i]]);
  }
}

INSTANTIATE_TEST_SUITE_P(ShippedRecipes, SweepAgreesWithPlan, ::testing::ValuesIn(testing::kShippedRecipes),
                         testing::RecipeTestName);

}  // namespace
}  // namespace preflight::sweep_space_test

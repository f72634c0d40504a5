// Fit advice: suggestions that actually fit when applied through the
// ordinary recipe path (`preflight fit --set ...`), pairs only when no single
// change fits, cheapest first, and the dominant category when it fits.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/advice.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::advice_fit_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunPreflight;
using testing::SourcePath;

constexpr const char* kLlama = "recipes/llama3-8b-h200.yaml";

// Llama 3 8B on 32 GPUs, tp 1, no recompute, plain DDP (zero 0): with
// micro_batch 2 the worst rank is ~60 GiB over a 140 GiB H200: activations of
// 2 x 8192 tokens x 32 layers without recompute, plus unsharded bf16 weights,
// fp32 grads, fp32 master and optimizer state (Muon momentum 4 B/param for the
// 7B of hidden matrices, AdamW moments 8 B/param for the 1B of embedding and
// head): 14-18 B/param, ~115 GiB.
std::vector<std::string> Overrides(int micro_batch) {
  return {"training.recompute=none", "training.micro_batch=" + std::to_string(micro_batch), "parallel.zero=0"};
}

Inventory LoadInventory(int micro_batch) {
  std::vector<Override> overrides;
  for (const std::string& o : Overrides(micro_batch)) overrides.push_back(*ParseOverride(o));
  LoadResult r = LoadRecipeFile(SourcePath(kLlama), overrides);
  EXPECT_TRUE(r.ok());
  return BuildInventory(*r.recipe);
}

FitAdvice Advise(const Inventory& inv) {
  const Layout layout = LayoutOf(inv.recipe);
  return AdviseFit(inv, layout, PartitionStages(inv, layout));
}

// `preflight fit` with the overrides and the suggestion's changes: exit 0 = fits.
int FitExitWith(int micro_batch, const Suggestion& s) {
  std::vector<std::string> args = {"fit", kLlama};
  for (const std::string& o : Overrides(micro_batch)) {
    args.push_back("--set");
    args.push_back(o);
  }
  for (const AdviceChange& c : s.changes) {
    args.push_back("--set");
    args.push_back(c.key + "=" + c.to);
  }
  return RunPreflight(args).exit_code;
}

TEST(AdviceFit, FirstSuggestionFitsWhenApplied) {
  const Inventory inv = LoadInventory(2);
  const FitAdvice a = Advise(inv);
  ASSERT_FALSE(a.fits);
  ASSERT_FALSE(a.suggestions.empty());
  // A single change suffices here (ZeRO 1 alone shards master and optimizer
  // state over dp 32: (7.0e9 x 8 B + 1.05e9 x 12 B) x 31/32 = ~62 GiB > ~60 GiB),
  // so no pair is offered.
  for (const Suggestion& s : a.suggestions) EXPECT_EQ(s.changes.size(), 1u) << s.Summary();
  EXPECT_EQ(FitExitWith(2, a.suggestions.front()), 0) << a.suggestions.front().Summary();
  for (const Suggestion& s : a.suggestions) {
    EXPECT_EQ(FitExitWith(2, s), 0) << s.Summary();
    EXPECT_GT(s.headroom_gain, Bytes(0));
  }
  // Re-estimated by hand through the library's ordinary path as well.
  Recipe changed = inv.recipe;
  const AdviceChange& c = a.suggestions.front().changes.front();
  ASSERT_EQ(c.key, "parallel.zero");
  changed.parallel.zero = std::stoll(c.to);
  ASSERT_FALSE(HasErrors(ValidateRecipe(changed)));
  const Inventory inv2 = BuildInventory(changed);
  const Layout l2 = LayoutOf(changed);
  const MemoryEstimate est = EstimateMemory(inv2, l2, PartitionStages(inv2, l2));
  EXPECT_TRUE(est.verdict.fits);
  EXPECT_EQ(est.verdict.headroom.count(), a.suggestions.front().headroom.count());
}

TEST(AdviceFit, CheapestFirstAmongThoseAboveTheFloor) {
  const FitAdvice a = Advise(LoadInventory(2));
  ASSERT_GE(a.suggestions.size(), 2u);
  for (size_t i = 1; i < a.suggestions.size(); ++i) {
    const Suggestion& p = a.suggestions[i - 1];
    const Suggestion& q = a.suggestions[i];
    if (p.headroom_ok == q.headroom_ok) {
      EXPECT_LE(p.step_s, q.step_s);
    } else {
      EXPECT_TRUE(p.headroom_ok);  // those meeting the headroom floor come first
    }
    EXPECT_NEAR(q.step_change, q.step_s / a.step_s - 1.0, 1e-12);
  }
}

TEST(AdviceFit, PairsOnlyWhenNoSingleChangeFits) {
  // micro_batch 4 doubles the activations: ~145 GiB over; no single move
  // frees that much, so every suggestion is a pair.
  const Inventory inv = LoadInventory(4);
  const FitAdvice a = Advise(inv);
  ASSERT_FALSE(a.fits);
  ASSERT_FALSE(a.suggestions.empty());
  for (const Suggestion& s : a.suggestions) EXPECT_EQ(s.changes.size(), 2u) << s.Summary();
  EXPECT_EQ(FitExitWith(4, a.suggestions.front()), 0) << a.suggestions.front().Summary();
  // And indeed no single change fits through the ordinary path.
  const char* singles[] = {"parallel.tp=2", "parallel.pp=2", "parallel.zero=1", "training.recompute=selective",
                           "training.micro_batch=2"};
  for (const char* change : singles) {
    std::vector<std::string> args = {"fit", kLlama};
    for (const std::string& o : Overrides(4)) {
      args.push_back("--set");
      args.push_back(o);
    }
    args.push_back("--set");
    args.push_back(change);
    EXPECT_EQ(RunPreflight(args).exit_code, 1) << change;
  }
}

// `fit` with `overrides` on `recipe`: the exit code (0 fits, 1 does not).
int FitExit(const char* recipe, const std::vector<std::string>& overrides) {
  std::vector<std::string> args = {"fit", recipe};
  for (const std::string& o : overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  return RunPreflight(args).exit_code;
}

FitAdvice AdviseOn(const char* recipe, const std::vector<std::string>& overrides) {
  std::vector<Override> parsed;
  for (const std::string& o : overrides) parsed.push_back(*ParseOverride(o));
  const LoadResult r = LoadRecipeFile(SourcePath(recipe), parsed);
  EXPECT_TRUE(r.ok()) << testing::FirstErrorText(r);
  return Advise(BuildInventory(*r.recipe));
}

// Issue "Sweeps ... a search users can act on": a long-context recipe that
// does not fit hears about context parallelism. Llama 3 8B at 32K tokens with
// selective recompute is ~80 GiB over; cp 2 halves every activation.
TEST(AdviceFit, LongContextGetsAContextParallelSuggestionThatFits) {
  const std::vector<std::string> base = {"training.seq_len=32768", "training.global_batch=64"};
  ASSERT_EQ(FitExit(kLlama, base), 1);
  const FitAdvice a = AdviseOn(kLlama, base);
  const auto cp = std::find_if(a.suggestions.begin(), a.suggestions.end(), [](const Suggestion& s) {
    return s.changes.size() == 1 && s.changes.front().move == AdviceMove::kMoreCp;
  });
  ASSERT_NE(cp, a.suggestions.end());
  EXPECT_EQ(cp->changes.front().key, "parallel.cp");
  EXPECT_EQ(cp->changes.front().to, "2");
  std::vector<std::string> applied = base;
  applied.push_back("parallel.cp=2");
  EXPECT_EQ(FitExit(kLlama, applied), 0);
  for (const Suggestion& s : a.suggestions) {
    for (const AdviceChange& c : s.changes) EXPECT_NE(c.move, AdviceMove::kMoreNodes) << s.Summary();
  }
}

// Llama 3 405B on 4 nodes (tp 8 x pp 4, dp 1): the optimizer state of a
// tenth of the model per rank cannot shard (dp 1), tp and pp cannot grow on 32
// GPUs; only more nodes fit, and the fewest that do are offered with the GPU count.
TEST(AdviceFit, MoreNodesOnlyWhenNothingOnTheseGpusFits) {
  const char* k405b = "recipes/llama3-405b-h200.yaml";
  const std::vector<std::string> base = {
      "cluster.nodes=4",           "parallel.pp=4",   "parallel.vpp=1",         "parallel.schedule=1f1b",
      "training.global_batch=512", "parallel.zero=1", "training.recompute=full"};
  ASSERT_EQ(FitExit(k405b, base), 1);
  const FitAdvice a = AdviseOn(k405b, base);
  ASSERT_FALSE(a.suggestions.empty());
  const Suggestion& s = a.suggestions.front();
  ASSERT_EQ(s.changes.size(), 1u);
  EXPECT_EQ(s.changes.front().move, AdviceMove::kMoreNodes);
  EXPECT_EQ(s.changes.front().from, "4");
  const int64_t nodes = std::stoll(s.changes.front().to);
  EXPECT_THAT(s.Summary(), HasSubstr(fmt::format("({} GPUs)", nodes * 8)));
  std::vector<std::string> applied = base;
  applied.push_back("cluster.nodes=" + s.changes.front().to);
  EXPECT_EQ(FitExit(k405b, applied), 0);
  // The fewest doublings: half as many nodes does not fit.
  if (nodes > 8) {
    applied.back() = "cluster.nodes=" + std::to_string(nodes / 2);
    EXPECT_EQ(FitExit(k405b, applied), 1);
  }
}

TEST(AdviceFit, NothingNearbyFitsSaysSo) {
  const FitAdvice a = Advise(LoadInventory(16));  // ~650 GiB over
  EXPECT_FALSE(a.fits);
  EXPECT_TRUE(a.suggestions.empty());
  std::vector<std::string> args = {"fit", kLlama};
  for (const std::string& o : Overrides(16)) {
    args.push_back("--set");
    args.push_back(o);
  }
  const auto r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("no single change or pair of changes"));
}

TEST(AdviceFit, FittingRecipeNamesTheDominantCategory) {
  const LoadResult r = LoadRecipeFile(SourcePath("recipes/nam56r-h200.yaml"));
  ASSERT_TRUE(r.ok());
  const Inventory inv = BuildInventory(*r.recipe);
  const Layout layout = LayoutOf(inv.recipe);
  const StagePlan stages = PartitionStages(inv, layout);
  const FitAdvice a = AdviseFit(inv, layout, stages);
  ASSERT_TRUE(a.fits);
  EXPECT_TRUE(a.suggestions.empty());
  const MemoryEstimate est = EstimateMemory(inv, layout, stages);
  const RankMemory& worst = est.stages[static_cast<size_t>(est.worst_stage)];
  EXPECT_EQ(a.worst_stage, est.worst_stage);
  EXPECT_EQ(a.dominant_bytes.count(), worst.of(a.dominant).count());
  for (int c = 0; c < kNumCategories; ++c) EXPECT_GE(a.dominant_bytes, worst.bytes[static_cast<size_t>(c)]);
  EXPECT_NEAR(a.dominant_share, a.dominant_bytes.gib() / worst.total().gib(), 1e-12);
}

TEST(AdviceFit, MovesThatCannotApply) {
  const LoadResult r = LoadRecipeFile(SourcePath(kLlama));
  ASSERT_TRUE(r.ok());
  Recipe recipe = *r.recipe;
  AdviceChange c;
  recipe.parallel.zero = 3;
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kZeroUp, &c));
  recipe.parallel.tp = 8;  // a full node
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kMoreTp, &c));
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kMoreEp, &c));  // no MoE layers
  recipe.training.micro_batch = 1;
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kSmallerMicroBatch, &c));
  recipe.training.recompute = Recompute::kFull;
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kMoreRecompute, &c));
  recipe.parallel.stage_boundaries = {16};
  recipe.parallel.pp = 2;
  auto more_pp = ApplyMove(recipe, AdviceMove::kMorePp, &c);
  ASSERT_TRUE(more_pp);
  EXPECT_EQ(more_pp->parallel.pp, 4);
  EXPECT_TRUE(more_pp->parallel.stage_boundaries.empty());
  EXPECT_EQ(c.key, "parallel.pp");
  EXPECT_EQ(c.from, "2");
  EXPECT_EQ(c.to, "4");
}

TEST(AdviceFit, JsonKeyAdvice) {
  std::vector<std::string> args = {"fit", kLlama, "--format", "json"};
  for (const std::string& o : Overrides(2)) {
    args.push_back("--set");
    args.push_back(o);
  }
  const auto r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 1);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("advice"));
  EXPECT_EQ(j["advice"]["fits"], false);
  const auto& first = j["advice"]["suggestions"][0];
  EXPECT_EQ(first["changes"][0]["key"], "parallel.zero");
  EXPECT_EQ(first["changes"][0]["move"], "zero_up");
  for (const char* key : {"summary", "layout", "peak_bytes", "headroom_bytes", "headroom_gain_bytes", "headroom_ok",
                          "step_s", "step_change"}) {
    EXPECT_TRUE(first.contains(key)) << key;
  }
  const auto fits = nlohmann::json::parse(RunPreflight({"fit", "recipes/nam56r-h200.yaml", "--format", "json"}).out);
  EXPECT_EQ(fits["advice"]["fits"], true);
  EXPECT_TRUE(fits["advice"]["dominant"].contains("category"));
}

// Llama 3 8B as shipped fits with ~46 GiB headroom; a 60 GiB floor makes it
// fit below the floor. The advice then lists changes that meet the floor, and
// applying the first through the ordinary CLI path gives exit 0 without the
// below-floor warning.
TEST(AdviceFit, BelowTheFloorGetsChangesThatMeetIt) {
  const std::vector<std::string> floor = {"--set", "cluster.min_headroom_gib=60"};
  std::vector<std::string> args = {"fit", kLlama, "--format", "json"};
  args.insert(args.end(), floor.begin(), floor.end());
  const auto r = RunPreflight(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("below the floor"));
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["advice"]["below_floor"], true);
  const auto& suggestions = j["advice"]["suggestions"];
  ASSERT_FALSE(suggestions.empty());
  for (const auto& s : suggestions) EXPECT_EQ(s["headroom_ok"], true) << s["summary"];
  std::vector<std::string> applied = {"fit", kLlama};
  applied.insert(applied.end(), floor.begin(), floor.end());
  for (const auto& c : suggestions[0]["changes"]) {
    applied.push_back("--set");
    applied.push_back(fmt::format("{}={}", c["key"].get<std::string>(), c["to"].get<std::string>()));
  }
  const auto after = RunPreflight(applied);
  EXPECT_EQ(after.exit_code, 0) << suggestions[0]["summary"];
  EXPECT_THAT(after.err, Not(HasSubstr("below the floor"))) << suggestions[0]["summary"];
  const auto table = RunPreflight({"fit", kLlama, "--set", "cluster.min_headroom_gib=60"});
  EXPECT_THAT(table.out, HasSubstr("advice    changes that meet the headroom floor"));
}

// The default recipe fits with ~117 GiB free. Each "faster" change, applied
// through `plan`, still fits above the floor and shortens the step by more
// than the step-time model's uncertainty (2 %); the table points to sweep.
TEST(AdviceFit, AmpleHeadroomHearsOfFasterLayoutsThatFit) {
  constexpr const char* kDefault = "recipes/nam56r-h200.yaml";
  const auto base = nlohmann::json::parse(RunPreflight({"plan", kDefault, "--format", "json"}).out);
  const double step = base["step"]["step_s"].get<double>();
  const auto fit = nlohmann::json::parse(RunPreflight({"fit", kDefault, "--format", "json"}).out);
  const auto& faster = fit["advice"]["faster"];
  ASSERT_FALSE(faster.empty());
  double previous = 0;
  for (const auto& s : faster) {
    std::vector<std::string> args = {"plan", kDefault, "--format", "json"};
    for (const auto& c : s["changes"]) {
      args.push_back("--set");
      args.push_back(fmt::format("{}={}", c["key"].get<std::string>(), c["to"].get<std::string>()));
    }
    const auto after = RunPreflight(args);
    ASSERT_EQ(after.exit_code, 0) << after.err;
    const auto plan = nlohmann::json::parse(after.out);
    const double new_step = plan["step"]["step_s"].get<double>();
    EXPECT_LT(new_step, step * (1.0 - 0.02)) << s["summary"];
    EXPECT_GE(new_step, previous) << "fastest first";
    previous = new_step;
    args[0] = "fit";
    args.resize(2);
    for (const auto& c : s["changes"]) {
      args.push_back("--set");
      args.push_back(fmt::format("{}={}", c["key"].get<std::string>(), c["to"].get<std::string>()));
    }
    const auto fits = RunPreflight(args);
    EXPECT_EQ(fits.exit_code, 0) << s["summary"];
    EXPECT_THAT(fits.err, Not(HasSubstr("below the floor")));
  }
  EXPECT_THAT(RunPreflight({"fit", kDefault}).out, HasSubstr("`preflight sweep recipes/nam56r-h200.yaml --gpus 64`"));
}

// The default recipe's stages peak at 23.65, 20.49, 18.52 and 19.34 GiB
// (1F1B: stage 0 holds 4 micro-batches in flight, stage 2 two): stage 0 is
// 27.7 % above stage 2, which the table says, with the balanced cut after it.
TEST(AdviceFit, UnbalancedStagesAreSaid) {
  const auto r = RunPreflight({"fit", "recipes/nam56r-h200.yaml", "--format", "json"});
  const auto j = nlohmann::json::parse(r.out);
  int64_t most = 0, least = INT64_MAX;
  size_t heaviest = 0, lightest = 0;
  for (size_t s = 0; s < j["stages"].size(); ++s) {
    const int64_t peak = j["stages"][s]["peak_bytes"].get<int64_t>();
    if (peak > most) most = peak, heaviest = s;
    if (peak < least) least = peak, lightest = s;
  }
  EXPECT_EQ(j["advice"]["heaviest_stage"]["stage"], heaviest);
  EXPECT_EQ(j["advice"]["lightest_stage"]["stage"], lightest);
  const double spread = 100.0 * (static_cast<double>(most) / static_cast<double>(least) - 1.0);
  const auto table = RunPreflight({"fit", "recipes/nam56r-h200.yaml"});
  EXPECT_THAT(table.out,
              HasSubstr(fmt::format("balance   stage {} peaks {:.1f} % above stage {}", heaviest, spread, lightest)));
  EXPECT_LT(table.out.find("balance   "), table.out.find("stages    balanced cut"));
  // DeepSeek-V3's 16 DualPipe stages: each rank holds two mirrored stages,
  // but fit's replay of DualPipe.step (which the executor runs and measures)
  // puts most of the p + 1 in-flight micro-batches on a first-half rank's own
  // stage, so ranks 0 and 15 (stage 0's four layers and the embedding, beside
  // the head and MTP) peak 11.3 % above the middle ranks (9.1 % with the
  // earlier even split): said.
  const auto dsv3 =
      nlohmann::json::parse(RunPreflight({"fit", "recipes/deepseek-v3-h200.yaml", "--format", "json"}).out);
  EXPECT_GT(dsv3["advice"]["heaviest_stage"]["peak_bytes"].get<double>() /
                dsv3["advice"]["lightest_stage"]["peak_bytes"].get<double>(),
            1.10);
  EXPECT_THAT(RunPreflight({"fit", "recipes/deepseek-v3-h200.yaml"}).out, HasSubstr("balance   stage 0 peaks"));
}

TEST(AdviceFit, FasterMovesThatCannotApply) {
  const LoadResult r = LoadRecipeFile(SourcePath(kLlama));
  ASSERT_TRUE(r.ok());
  Recipe recipe = *r.recipe;
  AdviceChange c;
  recipe.parallel.tp = 1;
  recipe.parallel.pp = 1;
  recipe.parallel.cp = 1;
  recipe.training.recompute = Recompute::kNone;
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kLessTp, &c));
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kLessPp, &c));
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kLessCp, &c));
  EXPECT_FALSE(ApplyMove(recipe, AdviceMove::kLessRecompute, &c));
  auto bigger = ApplyMove(recipe, AdviceMove::kLargerMicroBatch, &c);
  ASSERT_TRUE(bigger);
  EXPECT_EQ(bigger->training.micro_batch, 2 * recipe.training.micro_batch);
  EXPECT_EQ(c.key, "training.micro_batch");
}

}  // namespace
}  // namespace preflight::advice_fit_test

// training.recompute_method / recompute_layers: which layers full recompute
// checkpoints in each model chunk (Megatron recompute.py). Llama 3 8B on pp 4
// holds 8 transformer layers (attention + MLP) a stage; the figures come
// from LayerActivations under no recompute and under full recompute (one
// checkpoint a transformer layer, Korthikanti's 2sbh), counted by hand.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::recompute_method_test {
namespace {

LoadResult Load(const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const char* s : {"parallel.pp=4", "parallel.tp=1", "training.recompute=full"}) {
    overrides.push_back(*ParseOverride(s));
  }
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

struct Planned {
  Recipe recipe;
  Plan plan;
};

Planned PlanOf(const std::vector<std::string>& sets) {
  const LoadResult loaded = Load(sets);
  EXPECT_TRUE(loaded.ok()) << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  return {*loaded.recipe, *MakePlan(BuildInventory(*loaded.recipe), LayoutOf(*loaded.recipe)).plan};
}

/// One transformer layer's activations for one micro-batch: under full
/// recompute (its checkpoint) and without recompute (A + D).
struct Rates {
  int64_t checkpoint = 0, stored = 0;
};
Rates RatesOf(const Recipe& r) {
  Layout l = LayoutOf(r);
  const int64_t checkpoint = LayerActivations(r, l, BlockKind::kAttention).count();
  l.recompute = Recompute::kNone;
  return {checkpoint,
          LayerActivations(r, l, BlockKind::kAttention).count() + LayerActivations(r, l, BlockKind::kDenseMlp).count()};
}

int64_t LayerActivationSum(const RankMemory& m) {
  int64_t sum = 0;
  for (const Bytes& b : m.activations_by_family) sum += b.count();
  return sum;
}

TEST(RecomputeMethod, BlockCheckpointsTheFirstLayersAndKeepsTheRest) {
  const Planned p = PlanOf({"training.recompute_method=block", "training.recompute_layers=2"});
  const Rates rates = RatesOf(p.recipe);
  EXPECT_EQ(rates.checkpoint, int64_t{8192} * 4096 * 2);  // the layer input, s*b*h*2 B
  const RankMemory& m = p.plan.memory->stages.front();
  ASSERT_EQ(m.in_flight_microbatches, 4);  // 1F1B on pp 4: stage 0 holds p micro-batches
  // 2 checkpoints and 6 whole layers, for each of 4 micro-batches.
  EXPECT_EQ(LayerActivationSum(m), 4 * (2 * rates.checkpoint + 6 * rates.stored));
  // The rerun layer holds its whole set once in backward, as under uniform 1.
  const Planned every = PlanOf({});
  EXPECT_EQ(m.activations_transient, every.plan.memory->stages.front().activations_transient);
  EXPECT_EQ(LayerActivationSum(every.plan.memory->stages.front()), 4 * 8 * rates.checkpoint);
}

TEST(RecomputeMethod, UniformGroupsShareOneCheckpointAndRerunTogether) {
  const Planned one = PlanOf({});
  const Planned four = PlanOf({"training.recompute_layers=4"});
  const Rates rates = RatesOf(four.recipe);
  const RankMemory& m = four.plan.memory->stages.front();
  EXPECT_EQ(LayerActivationSum(m), 4 * 2 * rates.checkpoint);  // layers 0 and 4 of the stage
  // The group of four reruns at once: four layers' whole sets, not one.
  const Bytes one_transient = one.plan.memory->stages.front().activations_transient;
  EXPECT_EQ((m.activations_transient - one_transient).count(), 3 * rates.stored);
}

TEST(RecomputeMethod, BlockRerunsOnlyItsLayers) {
  const Planned all = PlanOf({});
  const Planned block = PlanOf({"training.recompute_method=block", "training.recompute_layers=2"});
  for (size_t r = 0; r < 4; ++r) {
    const StageTime& a = all.plan.time.stages[r];
    const StageTime& b = block.plan.time.stages[r];
    EXPECT_NEAR(b.recompute_s, a.recompute_s * 2.0 / 8.0, 1e-12 * a.recompute_s) << r;
    EXPECT_DOUBLE_EQ(b.forward_s, a.forward_s);
    EXPECT_DOUBLE_EQ(b.backward_s, a.backward_s);
  }
}

TEST(RecomputeMethod, OnlyUnderFullRecompute) {
  EXPECT_NE(testing::FirstErrorText(Load({"training.recompute=selective", "training.recompute_method=block"}))
                .find("applies only under training.recompute: full"),
            std::string::npos);
  EXPECT_NE(testing::FirstErrorText(Load({"training.recompute=none", "training.recompute_layers=2"}))
                .find("training.recompute_layers"),
            std::string::npos);
}

TEST(RecomputeMethod, ImportAndEmitAgreeWithMegatron) {
  const std::string args =
      "pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
      "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1000 --recompute-granularity full "
      "--recompute-method block --recompute-num-layers 3";
  const MegatronImport in = ImportMegatronArgs(args, "args.txt");
  EXPECT_TRUE(in.ok());
  std::string method, layers;
  for (const YamlEntry& e : in.layout) {
    if (e.key_path == "training.recompute_method") method = e.value;
    if (e.key_path == "training.recompute_layers") layers = e.value;
  }
  EXPECT_EQ(method, "block");
  EXPECT_EQ(layers, "3");
  const Planned p = PlanOf({"training.recompute_method=block", "training.recompute_layers=3"});
  const std::string text = EmitMegatron(p.recipe, p.plan).text;
  EXPECT_NE(text.find("--recompute-method block \\\n--recompute-num-layers 3"), std::string::npos) << text;
}

}  // namespace
}  // namespace preflight::recompute_method_test

// parallel.microbatch_group: Megatron's --microbatch-group-size-per-virtual-
// pipeline-stage. The interleaved schedule's warm-up runs 2(p - r - 1) +
// (v - 1) g forwards (schedules.py get_pp_rank_microbatches), so a larger
// group holds more chunk-micro-batches at the peak; Megatron refuses a group
// outside [p, m] and a last group shorter than p. Hand-worked counts, the
// refusals, the import and the Megatron flag; the executor's schedule against
// fit is in simulator_pipeline_test.cc.
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

namespace preflight::microbatch_group_test {
namespace {

// Llama 3 8B on 32 GPUs at pp 4, vpp 2: dp 8, 512 / 8 = 64 micro-batches.
LoadResult Load(const std::vector<std::string>& extra) {
  std::vector<Override> overrides;
  for (const std::string& s : {std::string("parallel.pp=4"), std::string("parallel.vpp=2")}) {
    overrides.push_back(*ParseOverride(s));
  }
  for (const std::string& s : extra) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

std::vector<Diagnostic> PlanErrors(const std::vector<std::string>& extra) {
  const LoadResult loaded = Load(extra);
  EXPECT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
  std::vector<Diagnostic> errors;
  for (const Diagnostic& d : ValidateForPlan(*loaded.recipe, LayoutOf(*loaded.recipe))) {
    if (d.severity == Severity::kError) errors.push_back(d);
  }
  return errors;
}

TEST(MicrobatchGroup, WarmupGrowsWithTheGroup) {
  // p 4, v 3, m 5 (the Megatron CI case below): the last rank warms up
  // 0 + 2 x 5 = 10 forwards and holds 11 of its 15 chunk-micro-batches; with
  // Megatron's default group (p) 2 x 4 = 8 and 9. Rank 0 with g 5 warms up
  // 6 + 10 = 16 >= 15: all of them.
  EXPECT_EQ(InterleavedLive(4, 3, 5, 3, 5), 11);
  EXPECT_EQ(InterleavedLive(4, 3, 5, 3, 4), 9);
  EXPECT_EQ(InterleavedLive(4, 3, 5, 0, 5), 15);
}

TEST(MicrobatchGroup, MegatronsBoundsAreRefused) {
  EXPECT_TRUE(PlanErrors({"parallel.microbatch_group=48"}).empty());  // 64 = 48 + 16, 16 >= 4
  EXPECT_TRUE(PlanErrors({"parallel.microbatch_group=20"}).empty());  // 64 = 3 x 20 + 4
  for (const char* bad : {"parallel.microbatch_group=3", "parallel.microbatch_group=65"}) {
    const std::vector<Diagnostic> e = PlanErrors({bad});
    ASSERT_EQ(e.size(), 1u) << bad;
    EXPECT_EQ(e[0].key_path, "parallel.microbatch_group");
    EXPECT_NE(e[0].message.find("within [pp, micro-batches per step] = [4, 64]"), std::string::npos) << e[0].message;
  }
  // 64 = 3 x 21 + 1: a last group of 1 < pp.
  const std::vector<Diagnostic> ragged = PlanErrors({"parallel.microbatch_group=21"});
  ASSERT_EQ(ragged.size(), 1u);
  EXPECT_NE(ragged[0].message.find("leave a last group of 1 after groups of 21"), std::string::npos)
      << ragged[0].message;
  // Megatron's default group (pp) is held to the same rule: 528 / 8 = 66
  // micro-batches leave 2 after groups of 4.
  const std::vector<Diagnostic> by_default = PlanErrors({"training.global_batch=528"});
  ASSERT_EQ(by_default.size(), 1u);
  EXPECT_NE(by_default[0].message.find("leave a last group of 2 after groups of 4"), std::string::npos)
      << by_default[0].message;
  // 1F1B does not read it.
  EXPECT_TRUE(PlanErrors({"parallel.vpp=1", "parallel.schedule=1f1b", "parallel.microbatch_group=3"}).empty());
}

// A larger group holds more on every rank that was not already holding all:
// fit's activations on the first stage grow, the static bytes do not.
TEST(MicrobatchGroup, TheFirstStageHoldsTheLargerWarmup) {
  const auto stage0 = [](const char* group) {
    const LoadResult loaded = Load({std::string("parallel.microbatch_group=") + group});
    EXPECT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
    const Recipe& r = *loaded.recipe;
    return MakePlan(BuildInventory(r), LayoutOf(r)).plan->memory->stages.front();
  };
  const RankMemory by_default = stage0("0"), pp = stage0("4"), sixteen = stage0("16");
  EXPECT_EQ(by_default.of(Category::kActivations), pp.of(Category::kActivations));
  // Stage 0: warm-up 2 x 3 + 1 x g, so 12 chunk-micro-batches more at g 16.
  const Bytes per_chunk = (sixteen.of(Category::kActivations) - pp.of(Category::kActivations)) / 12;
  EXPECT_GT(per_chunk.count(), 0);
  EXPECT_EQ(per_chunk * 12, sixteen.of(Category::kActivations) - pp.of(Category::kActivations));
  EXPECT_EQ(sixteen.allocated_static, pp.allocated_static);
}

TEST(MicrobatchGroup, ImportedFromMegatronAndEmittedBack) {
  const std::string args =
      "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
      "--micro-batch-size 4 --global-batch-size 40 --pipeline-model-parallel-size 4 "
      "--num-layers-per-virtual-pipeline-stage 1 --microbatch-group-size-per-virtual-pipeline-stage 5 --bf16 "
      "--vocab-size 50257";
  const MegatronImport imported = ImportMegatronArgs(args, "args.txt");
  ASSERT_TRUE(imported.ok());
  std::string group;
  for (const YamlEntry& e : imported.layout) {
    if (e.key_path == "parallel.microbatch_group") group = e.value;
  }
  EXPECT_EQ(group, "5");
  for (const std::string& flag : imported.unrepresented) {
    EXPECT_NE(flag, "--microbatch-group-size-per-virtual-pipeline-stage");
  }
  // And back: the Megatron emitter writes the flag for the recipe's group.
  const LoadResult loaded = Load({"parallel.microbatch_group=16"});
  ASSERT_TRUE(loaded.ok()) << testing::FirstErrorText(loaded);
  const Recipe& r = *loaded.recipe;
  const PlanResult plan = MakePlan(BuildInventory(r), LayoutOf(r));
  ASSERT_TRUE(plan.plan.has_value());
  const Emission megatron = EmitMegatron(r, *plan.plan);
  EXPECT_NE(megatron.text.find("--microbatch-group-size-per-virtual-pipeline-stage 16"), std::string::npos)
      << megatron.text;
}

}  // namespace
}  // namespace preflight::microbatch_group_test

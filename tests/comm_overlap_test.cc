// Communication overlap keys (parallel.overlap_grad_reduce,
// overlap_param_gather, tp_comm_overlap, ep_comm_overlap): off as Megatron-LM
// defaults them, each hides its traffic under the compute it runs beside,
// and they round-trip through `import megatron` and `plan --emit megatron`.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::comm_overlap_test {
namespace {

using testing::SourcePath;

Recipe Load(const std::string& recipe, const std::vector<Override>& sets) {
  const LoadResult r = LoadRecipeFile(SourcePath("recipes/" + recipe + ".yaml"), sets);
  EXPECT_TRUE(r.ok()) << (r.diagnostics.empty() ? "" : Format(r.diagnostics.front()));
  return *r.recipe;
}

Plan PlanOf(const Recipe& r) {
  PlanResult p = MakePlan(BuildInventory(r), LayoutOf(r));
  EXPECT_TRUE(p.plan.has_value());
  return *p.plan;
}

double Exposed(const Plan& p, Axis a) { return p.time.exposed_by_axis[static_cast<size_t>(a)]; }

// ZeRO 1 on 32 GPUs: without overlap the gradient reduce-scatter and the
// parameter gather both run whole after the backward; with both flags only
// a bucket of each stays exposed.
TEST(CommOverlap, DataParallelBucketsHideOnlyWhenAsked) {
  const Plan off = PlanOf(Load("llama3-8b-h200", {{"training.optimizer.matrices", "adamw"}}));
  const Plan on = PlanOf(Load("llama3-8b-h200", {{"training.optimizer.matrices", "adamw"},
                                                 {"parallel.overlap_grad_reduce", "true"},
                                                 {"parallel.overlap_param_gather", "true"}}));
  double total = 0;
  for (const CommItem& i : off.comm.front().items) {
    if (i.axis == Axis::kDpCp) total += i.seconds;
  }
  EXPECT_NEAR(off.time.dp_exposed_s, total, 1e-9 * total);  // all of it
  EXPECT_LT(on.time.dp_exposed_s, 0.5 * off.time.dp_exposed_s);
  EXPECT_GT(on.time.dp_exposed_s, 0.0);  // the last / first bucket
  EXPECT_LT(on.time.step_s, off.time.step_s);
}

// Megatron asserts --overlap-param-gather needs --overlap-grad-reduce.
TEST(CommOverlap, ParamGatherNeedsGradReduce) {
  const LoadResult r =
      LoadRecipeFile(SourcePath("recipes/llama3-8b-h200.yaml"), {{"parallel.overlap_param_gather", "true"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Format(r.diagnostics.front()).find("parallel.overlap_param_gather"), std::string::npos);
}

// TE's TP overlap hides the TP collectives under the GEMMs, under SP only.
TEST(CommOverlap, TensorParallelOverlapNeedsSequenceParallelism) {
  const std::vector<Override> tp = {{"parallel.tp", "8"}, {"parallel.sp", "true"}};
  std::vector<Override> tp_on = tp, no_sp = {{"parallel.tp", "8"}, {"parallel.sp", "false"}};
  tp_on.push_back({"parallel.tp_comm_overlap", "true"});
  std::vector<Override> no_sp_on = no_sp;
  no_sp_on.push_back({"parallel.tp_comm_overlap", "true"});
  const Plan off = PlanOf(Load("llama3-8b-h200", tp)), on = PlanOf(Load("llama3-8b-h200", tp_on));
  EXPECT_GT(Exposed(off, Axis::kTp), 0.0);
  EXPECT_LT(Exposed(on, Axis::kTp), 0.25 * Exposed(off, Axis::kTp));
  EXPECT_DOUBLE_EQ(Exposed(PlanOf(Load("llama3-8b-h200", no_sp_on)), Axis::kTp),
                   Exposed(PlanOf(Load("llama3-8b-h200", no_sp)), Axis::kTp));
}

// Megatron's EP overlap hides the dispatch and combine all-to-alls under
// another micro-batch's compute; not with full recompute (Megatron refuses).
TEST(CommOverlap, ExpertParallelOverlapWhereMegatronRunsIt) {
  const Plan off = PlanOf(Load("qwen3-30b-a3b-h200", {}));
  ASSERT_GT(Exposed(off, Axis::kEp), 0.0);
  const Plan on = PlanOf(Load("qwen3-30b-a3b-h200", {{"parallel.ep_comm_overlap", "true"}}));
  EXPECT_LT(Exposed(on, Axis::kEp), Exposed(off, Axis::kEp));
  const Plan full =
      PlanOf(Load("qwen3-30b-a3b-h200", {{"parallel.ep_comm_overlap", "true"}, {"training.recompute", "full"}}));
  const Plan full_off = PlanOf(Load("qwen3-30b-a3b-h200", {{"training.recompute", "full"}}));
  EXPECT_DOUBLE_EQ(Exposed(full, Axis::kEp), Exposed(full_off, Axis::kEp));
}

// Import maps Megatron's flags to the keys; emit writes them back.
TEST(CommOverlap, MegatronFlagsRoundTrip) {
  const std::string args =
      "MODEL_ARGS:\n  --num-layers: 4\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 64\n  --tensor-model-parallel-size: 2\n  --sequence-parallel: true\n"
      "  --use-distributed-optimizer: true\n  --overlap-grad-reduce: true\n  --overlap-param-gather: true\n"
      "  --tp-comm-overlap: true\n";
  const MegatronImport imported = ImportMegatronArgs(args, "m.yaml");
  ASSERT_TRUE(imported.ok());
  std::vector<Diagnostic> errors;
  const std::string yaml =
      EmitMegatronRecipe(imported, {{"cluster.gpus_per_node", "4"}, {"cluster.nodes", "1"}}, "rt", "m.yaml", &errors);
  const LoadResult r = LoadRecipeFromString(yaml, "rt.yaml");
  ASSERT_TRUE(r.ok()) << yaml;
  EXPECT_TRUE(r.recipe->parallel.overlap_grad_reduce);
  EXPECT_TRUE(r.recipe->parallel.overlap_param_gather);
  EXPECT_TRUE(r.recipe->parallel.tp_comm_overlap);
  EXPECT_FALSE(r.recipe->parallel.ep_comm_overlap);
  const Plan p = PlanOf(*r.recipe);
  const std::string text = Emit(EmitTarget::kMegatron, *r.recipe, p).text;
  for (const char* flag : {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"}) {
    EXPECT_NE(text.find(flag), std::string::npos) << flag << "\n" << text;
  }
  EXPECT_EQ(text.find("--overlap-moe-expert-parallel-comm"), std::string::npos);
}

}  // namespace
}  // namespace preflight::comm_overlap_test

// Planner validation beyond the recipe parser (docs/plan.md): CP on Mamba
// and R layers, DualPipe shapes, pinned boundaries.
#include <gtest/gtest.h>

#include "planner_tiny_model.h"

namespace preflight::planner_validate_test {
namespace {

using testing::TinyInventory;
using testing::TinyLayout;

bool HasError(const std::vector<Diagnostic>& ds, const std::string& key, const std::string& needle) {
  for (const Diagnostic& d : ds) {
    if (d.severity == Severity::kError && d.key_path == key && d.message.find(needle) != std::string::npos) return true;
  }
  return false;
}

// R blocks split their 4 gate blocks over tp*cp (docs/formulas.md §7.2 [OURS]): cp 8 does not divide 4.
TEST(PlannerValidate, ContextParallelOnRecurrentNeedsDivisibleGateBlocks) {
  const auto inv = TinyInventory("AR");
  const auto ds = ValidateForPlan(inv.recipe, TinyLayout(1, 8, 1, 1, 1));
  EXPECT_TRUE(HasError(ds, "parallel.cp", "gate blocks")) << (ds.empty() ? "" : Format(ds[0]));
  EXPECT_FALSE(MakePlan(inv, TinyLayout(1, 8, 1, 1, 1)).plan.has_value());
  EXPECT_TRUE(ValidateForPlan(inv.recipe, TinyLayout(1, 4, 1, 1, 1)).empty());
}

// Mamba all-to-all CP (docs/formulas.md §1.4): 8 heads, 2 groups. cp 4: 8 % 4 == 0 and
// cp % groups == 0, priced; cp 3: 8 % 3 != 0, rejected.
TEST(PlannerValidate, ContextParallelOnMamba) {
  const auto inv = TinyInventory("MD");
  EXPECT_TRUE(MakePlan(inv, TinyLayout(1, 4, 1, 1, 1)).plan.has_value());
  const auto ds = ValidateForPlan(inv.recipe, TinyLayout(1, 3, 1, 1, 1));
  EXPECT_TRUE(HasError(ds, "parallel.cp", "Mamba heads"));
}

TEST(PlannerValidate, DualPipeShapes) {
  const auto inv = TinyInventory("DDDDDDDD");
  auto l = TinyLayout(1, 1, 1, 3, 6);
  l.schedule = Schedule::kDualPipe;
  EXPECT_TRUE(HasError(ValidateForPlan(inv.recipe, l), "parallel.pp", "even"));
  l.pp = 4;
  l.micro_batches = 9;
  EXPECT_TRUE(HasError(ValidateForPlan(inv.recipe, l), "training.global_batch", "even"));
  l.micro_batches = 8;
  EXPECT_TRUE(ValidateForPlan(inv.recipe, l).empty());
}

TEST(PlannerValidate, PinnedBoundaries) {
  auto inv = TinyInventory("DDDDDDDD");
  inv.recipe.parallel.pp = 4;
  inv.recipe.parallel.stage_boundaries = {3, 6};
  EXPECT_TRUE(HasError(ValidateForPlan(inv.recipe, TinyLayout(1, 1, 1, 4, 4)), "parallel.stage_boundaries", "needs 3"));
  inv.recipe.parallel.stage_boundaries = {3, 2, 7};
  EXPECT_TRUE(HasError(ValidateForPlan(inv.recipe, TinyLayout(1, 1, 1, 4, 4)), "parallel.stage_boundaries[1]",
                       "must not decrease"));
  inv.recipe.parallel.stage_boundaries = {3, 6, 7};
  const PlanResult ok = MakePlan(inv, TinyLayout(1, 1, 1, 4, 4));
  ASSERT_TRUE(ok.plan.has_value());
  EXPECT_TRUE(ok.plan->stages_pinned);
  EXPECT_EQ(ok.plan->stages.chunks[2].first_layer, 6);
  EXPECT_EQ(ok.plan->stages.chunks[2].end_layer, 7);
}

// DualPipeV: 2*pp V-shaped chunks, device i holds chunks i and 2p-1-i; the
// two chunks on the turning device exchange no message. pp 2, 4 chunks: rank
// 1 holds chunks 1 and 2, so its forward sends come from chunk 2 only (m = 4).
TEST(PlannerValidate, DualPipeVPlacement) {
  const auto inv = TinyInventory("DDDDDDDD", 0);
  auto l = TinyLayout(1, 1, 1, 2, 4);
  l.schedule = Schedule::kDualPipeV;
  const PlanResult r = MakePlan(inv, l);
  ASSERT_TRUE(r.plan.has_value());
  const auto& chunks = r.plan->stages.chunks;
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].pipeline_rank, 0);
  EXPECT_EQ(chunks[1].pipeline_rank, 1);
  EXPECT_EQ(chunks[2].pipeline_rank, 1);
  EXPECT_EQ(chunks[3].pipeline_rank, 0);
  int64_t sends = 0;
  for (const CommItem& i : r.plan->comm[1].items) {
    if (i.axis == Axis::kPp && i.pass == Pass::kForward) sends += i.calls;
  }
  EXPECT_EQ(sends, 4);
}

}  // namespace
}  // namespace preflight::planner_validate_test

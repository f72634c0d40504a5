// The memory view (the estimator) and the traffic view (the planner) read one
// per-rank geometry (include/preflight/estimator/geometry.h). Over every
// shipped recipe and a grid of layouts: the planner's MoE dispatch payload is
// the token copies the estimator's --explain prices (N_send), and its CP
// exchange is sized on the same per-CP-rank tokens.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/geometry.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::geometry_agreement_test {
namespace {

using testing::SourcePath;

std::vector<std::string> ShippedRecipes() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(SourcePath("recipes"))) {
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  }
  return out;
}

/// The value of `key=` in an explain line's inputs, or -1.
int64_t InputOf(const std::string& inputs, const std::string& key) {
  const std::string needle = key + "=";
  size_t at = 0;
  while ((at = inputs.find(needle, at)) != std::string::npos) {
    if (at == 0 || inputs[at - 1] == ' ') return std::strtoll(inputs.c_str() + at + needle.size(), nullptr, 10);
    ++at;
  }
  return -1;
}

bool HasMoe(const Recipe& r) {
  for (BlockKind k : r.model.layers) {
    if (k == BlockKind::kMoe) return true;
  }
  return false;
}

/// Checks one valid layout; returns whether it had MoE traffic to compare.
bool CheckLayout(const Recipe& recipe, const std::string& label) {
  const Inventory inv = BuildInventory(recipe);
  const PlanResult result = MakePlan(inv, LayoutOf(recipe));
  if (!result.plan) return false;
  const Plan& plan = *result.plan;
  const MoeRouting routing = RouteMoeOn(recipe, plan.layout);
  const int64_t row = recipe.model.hidden * SizeOf(recipe.training.precision.activations);
  bool compared = false;
  for (const StageComm& sc : plan.comm) {
    for (const CommItem& i : sc.items) {
      if (i.what == CommWhat::kMoeDispatch) {
        EXPECT_EQ(i.payload.count(), routing.send_tokens * row) << label << " stage " << sc.pipeline_rank;
        compared = true;
      }
      if (i.axis == Axis::kCp && i.what == CommWhat::kAttentionKv && i.kind == Collective::kAllGather) {
        // The gathered K,V of the whole sequence: cp * (tokens per CP rank) rows.
        EXPECT_EQ(i.payload.count() % TokensOf(recipe, plan.layout).cp_rank, 0) << label;
      }
    }
  }
  if (!compared) return false;
  // The estimator's MoE activation line names the N_send it priced.
  for (int64_t r = 0; r < plan.layout.pp; ++r) {
    for (const Explanation& e : ExplainRank(inv, plan.layout, plan.stages, r)) {
      const int64_t n_send = InputOf(e.inputs, "N_send");
      if (n_send >= 0) {
        EXPECT_EQ(n_send, routing.send_tokens) << label << " " << e.item;
      }
    }
  }
  return true;
}

TEST(GeometryAgreement, EveryShippedRecipeOnAGridOfLayouts) {
  int64_t compared = 0;
  for (const std::string& path : ShippedRecipes()) {
    for (const char* tp : {"1", "2"}) {
      for (const char* ep : {"1", "2", "8"}) {
        for (const char* cf : {"0.5", "1.25"}) {
          for (const char* dropless : {"true", "false"}) {
            for (const char* micro : {"1", "2"}) {
              const std::vector<Override> overrides = {{"parallel.tp", tp},
                                                       {"parallel.sp", std::string(tp) == "1" ? "false" : "true"},
                                                       {"parallel.ep", ep},
                                                       {"model.moe.capacity_factor", cf},
                                                       {"model.moe.dropless", dropless},
                                                       {"training.micro_batch", micro}};
              const LoadResult loaded = LoadRecipeFile(path, overrides);
              if (!loaded.recipe || !HasMoe(*loaded.recipe)) continue;
              const std::string label =
                  path + " tp" + tp + " ep" + ep + " cf" + cf + " dropless " + dropless + " micro " + micro;
              if (CheckLayout(*loaded.recipe, label)) ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 50);  // the grid reaches MoE layouts of several recipes
}

// The drift this module removed: Mixtral with capacity factor 0.5 and token
// dropping. T = s*b = 4096 router tokens, k = 2, E = 8: C = ceil(4096*2/8 *
// 0.5) = 512 per expert, E*C = 4096 slots < k*T = 8192 copies, so 4096 token
// copies leave the rank (Megatron drops the rest), in plan and fit alike.
TEST(GeometryAgreement, MixtralCapacityHalfDispatchesTheCapacityNotEveryCopy) {
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/mixtral-8x7b-h200.yaml"),
                                           {{"model.moe.capacity_factor", "0.5"}, {"model.moe.dropless", "false"}});
  ASSERT_TRUE(loaded.recipe);
  const Recipe& r = *loaded.recipe;
  ASSERT_EQ(r.training.seq_len * r.training.micro_batch, 4096);
  const MoeRouting routing = RouteMoeOn(r, LayoutOf(r));
  EXPECT_EQ(routing.capacity, 512);
  EXPECT_EQ(routing.send_tokens, 4096);
  EXPECT_TRUE(CheckLayout(r, "mixtral cf 0.5"));
}

}  // namespace
}  // namespace preflight::geometry_agreement_test

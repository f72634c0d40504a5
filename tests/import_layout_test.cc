// The default H200 layout rule of `import hf` (default_layout.h), worked by
// hand on imported public models. Budget: half of 143771 MiB = 75.38e9 B of
// model state per GPU at 6 + 12/D bytes per parameter.
#include "preflight/inventory/default_layout.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/recipe/import.h"
#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::import_layout_test {
namespace {

using testing::ReadFile;
using testing::SourcePath;

Inventory ImportedInventory(const std::string& fixture) {
  const std::string path = "tests/data/hf/" + fixture;
  const HfImport imported = ImportHfConfig(ReadFile(SourcePath(path)), path);
  const LoadResult loaded = LoadRecipeFromString(EmitRecipeYaml(imported, {}, path, ""), "imported.yaml");
  EXPECT_TRUE(loaded.ok());
  return BuildInventory(*loaded.recipe);
}

TEST(DefaultLayout, SmallDenseModelTakesOneNodeWithoutModelParallelism) {
  // Llama-3.1-8B: 8.03e9 x (6 + 12/8) = 60.2e9 B <= 75.38e9 B at tp 1, pp 1, dp 8 on 1 node.
  const auto l = DefaultH200Layout(ImportedInventory("llama-3.1-8b.json"));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->nodes, 1);
  EXPECT_EQ(l->tp, 1);
  EXPECT_EQ(l->pp, 1);
  EXPECT_EQ(l->ep, 1);
  EXPECT_EQ(l->dp, 8);
  EXPECT_EQ(l->global_batch, 512);
  // 8,030,261,248 x 7.5 = 60,226,959,360 B (the inventory's exact Llama-3 8B count, see
  // tests/inventory_published_test.cc, times the rule's bytes per parameter).
  EXPECT_NEAR(static_cast<double>(l->static_bytes_per_gpu), 60'226'959'360.0, 1.0);
}

TEST(DefaultLayout, PinnedNodesAreKept) {
  // Mixtral 8x7B pinned to 4 nodes: tp 1, pp 1, dp 32, ep 8 (8 experts), expert dp 4:
  // experts 45.10e9/8 x (6 + 12/4) = 50.7e9 B + rest 1.61e9 x (6 + 12/32) = 10.2e9 B = 60.9e9 B: fits.
  LayoutPins pins;
  pins.nodes = 4;
  const auto l = DefaultH200Layout(ImportedInventory("mixtral-8x7b.json"), pins);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->nodes, 4);
  EXPECT_EQ(l->tp, 1);
  EXPECT_EQ(l->pp, 1);
  EXPECT_EQ(l->ep, 8);
  EXPECT_EQ(l->dp, 32);
}

TEST(DefaultLayout, CandidatesComeInPreferenceOrder) {
  // Mixtral 8x7B (routed experts 45.10e9, the rest 1.61e9), by hand:
  // 1 node: pp x ep <= 8 and expert dp 1 in every layout: 45.10e9/8 x 18 = 101.5e9 B > 75.38e9. None.
  // 2 nodes, tp 1 pp 1 (dp 16, ep 8, expert dp 2): 5.64e9 x 12 + 1.61e9 x 6.75 = 78.5e9 B. No.
  // 2 nodes, tp 2 pp 1 (dp 8, ep 8, expert dp 2): 5.64e9 x 12 + 0.80e9 x 7.5 = 73.7e9 B. Yes, tp*pp 2.
  // 2 nodes, tp 1 pp 2 (dp 8, ep 8, expert dp 1): 2.82e9 x 18 + 0.80e9 x 7.5 = 56.8e9 B. Yes, tp*pp 2.
  // The tie at tp*pp 2 goes to the larger tp.
  const std::vector<DefaultLayout> c = H200LayoutCandidates(ImportedInventory("mixtral-8x7b.json"));
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[0].nodes, 2);
  EXPECT_EQ(c[0].tp, 2);
  EXPECT_EQ(c[0].pp, 1);
  EXPECT_EQ(c[0].ep, 8);
  EXPECT_EQ(c[1].nodes, 2);
  EXPECT_EQ(c[1].tp, 1);
  EXPECT_EQ(c[1].pp, 2);
  for (size_t i = 1; i < c.size(); ++i) EXPECT_LE(c[i - 1].nodes, c[i].nodes);
}

TEST(DefaultLayout, OneMambaGroupForbidsTensorParallelism) {
  // Jamba's Mamba stand-in has 1 B/C group: groups % tp == 0 only for tp 1 (docs/formulas.md §1.4).
  const auto l = DefaultH200Layout(ImportedInventory("jamba-v0.1.json"));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->tp, 1);
  EXPECT_GT(l->nodes, 1);  // 45.1e9 expert params x 18 B / 8 ranks = 101e9 B: not on one node
}

TEST(DefaultLayout, NothingFitsWhenPinnedTooSmall) {
  // DeepSeek-V3 on one node: 654e9 expert parameters x 18 B / 8 ranks = 1.47e12 B per GPU.
  LayoutPins pins;
  pins.nodes = 1;
  EXPECT_FALSE(DefaultH200Layout(ImportedInventory("deepseek-v3.json"), pins).has_value());
}

}  // namespace
}  // namespace preflight::import_layout_test

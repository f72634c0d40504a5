// The recipe option added for imported models: model.mlp.activation: relu2
// (Nemotron-H's squared ReLU, a non-gated MLP of two matrices). Parsed,
// counted and priced like the other non-gated MLP; hand counts below.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"

namespace preflight::import_schema_test {
namespace {

std::string TinyDense(const std::string& activation) {
  return "name: tiny\n"
         "model:\n"
         "  pattern: \"D\"\n"
         "  repeat: 2\n"
         "  hidden: 64\n"
         "  vocab: 1000\n"
         "  mlp: {ffn_hidden: 256, activation: " + activation + "}\n"
         "cluster: {nodes: 1}\n";
}

TEST(RecipeRelu2, ParsesAsItsOwnActivation) {
  const LoadResult r = LoadRecipeFromString(TinyDense("relu2"), "tiny.yaml");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.recipe->model.mlp.activation, FfnActivation::kRelu2);
}

TEST(RecipeRelu2, MisspelledActivationStillListsTheChoices) {
  const LoadResult r = LoadRecipeFromString(TinyDense("relu3"), "tiny.yaml");
  ASSERT_FALSE(r.ok());
  std::string all;
  for (const auto& d : r.diagnostics) all += Format(d) + "\n";
  EXPECT_THAT(all, ::testing::HasSubstr("relu2"));
}

TEST(RecipeRelu2, DenseLayerHasTwoMatrices) {
  const LoadResult r = LoadRecipeFromString(TinyDense("relu2"), "tiny.yaml");
  ASSERT_TRUE(r.ok());
  const Inventory inv = BuildInventory(*r.recipe);
  ASSERT_EQ(inv.layers.size(), 2u);
  // Hand count per D layer: pre-norm 64 + up 64 x 256 + down 256 x 64 = 64 + 16384 + 16384 = 32832.
  EXPECT_EQ(inv.layers[0].totals.total(), 32'832);
  // Whole model: 2 layers + embedding 1000 x 64 + final norm 64 + head 1000 x 64.
  EXPECT_EQ(inv.total_params, 2 * 32'832 + 64'000 + 64 + 64'000);
}

}  // namespace
}  // namespace preflight::import_schema_test

// Determinism (issue 9): the same input gives the same answer, byte for byte,
// run after run and from several threads at once (sweeps load and price
// recipes in parallel). Library level here; the CLI's `validate`/`fit` get
// the same check through the built binary (hardening_cli_test.cc).
#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::hardening_determinism_test {
namespace {

/// Every checked-in recipe, sorted (directory order is not).
std::vector<std::string> CheckedInRecipes() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(testing::SourcePath("recipes"))) {
    if (entry.path().extension() == ".yaml") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

/// Everything observable about a load: diagnostics, derived degrees, and the
/// whole inventory (every tensor with shape, split, optimizer and dtype).
std::string Render(const std::string& yaml, const std::vector<Override>& overrides) {
  const LoadResult r = LoadRecipeFromString(yaml, "recipe.yaml", overrides);
  std::string out;
  for (const Diagnostic& d : r.diagnostics) out += Format(d) + "\n";
  if (!r.ok()) return out;
  const Recipe& recipe = *r.recipe;
  out += fmt::format("world {} dp {} expert_dp {} m {}\n", recipe.world(), recipe.dp(), recipe.expert_dp(),
                     recipe.micro_batches());
  const Inventory inv = BuildInventory(recipe);
  const auto tensor = [&out](const ParamTensor& t) {
    out += fmt::format("{} [{}] {} {} {}\n", t.name, fmt::join(t.shape, ","), Name(t.split), Name(t.optimizer),
                       Name(t.dtype));
  };
  for (const Layer& layer : inv.layers) {
    for (const ParamTensor& t : layer.params) tensor(t);
  }
  tensor(inv.embedding);
  for (const ParamTensor& t : inv.final_norms) tensor(t);
  for (const ParamTensor& t : inv.head) tensor(t);
  out += fmt::format("total {} active {} muon_max {}\n", inv.total_params, inv.active_params,
                     inv.max_muon_matrix_elements);
  return out;
}

struct Input {
  std::string yaml;
  std::vector<Override> overrides;
};

std::vector<Input> Inputs() {
  std::vector<Input> inputs;
  for (const std::string& path : CheckedInRecipes()) {
    const std::string yaml = testing::ReadFile(path);
    inputs.push_back({yaml, {}});
    inputs.push_back({yaml, {*ParseOverride("parallel.tp=2"), *ParseOverride("training.recompute=full")}});
    inputs.push_back({yaml, {*ParseOverride("parallel.tp=3")}});  // usually invalid: diagnostics
  }
  inputs.push_back({"model: {pattern: AXE, hidden: -1}\nparallel: {tp: 0, foo: 1}\n", {}});
  inputs.push_back({"name: \xff\n", {}});
  return inputs;
}

TEST(HardeningDeterminism, RecipesFound) { EXPECT_GE(CheckedInRecipes().size(), 5u); }

TEST(HardeningDeterminism, SameInputSameOutputTwice) {
  for (const Input& input : Inputs()) {
    EXPECT_EQ(Render(input.yaml, input.overrides), Render(input.yaml, input.overrides));
  }
}

TEST(HardeningDeterminism, ThreadsAgreeWithOneThread) {
  const std::vector<Input> inputs = Inputs();
  std::vector<std::string> serial;
  for (const Input& input : inputs) serial.push_back(Render(input.yaml, input.overrides));

  constexpr int kThreads = 4;
  std::vector<std::vector<std::string>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&inputs, &results, t] {
      // Each thread walks the inputs from a different start, so loads overlap.
      std::vector<std::string>& mine = results[static_cast<size_t>(t)];
      mine.resize(inputs.size());
      for (size_t k = 0; k < inputs.size(); ++k) {
        const size_t i = (k + static_cast<size_t>(t)) % inputs.size();
        mine[i] = Render(inputs[i].yaml, inputs[i].overrides);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ(results[static_cast<size_t>(t)][i], serial[i]) << "thread " << t << ", input " << i;
    }
  }
}

}  // namespace
}  // namespace preflight::hardening_determinism_test

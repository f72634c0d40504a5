// A sweep validates each layout once, at the recipe's own ZeRO stage, and
// varies the stage per row: rows at a stage the recipe check refuses (FSDP2
// CPU offload below ZeRO 3, Megatron's layer-wise optimizer off ZeRO 1) must
// be invalid, and only those. The independent figure is `fit` on the same
// layout, which loads the recipe at that stage and exits 2 or not.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::sweep_zero_rules_test {
namespace {

// Every row of a one-layout sweep over ZeRO 0..3, checked against `fit` with
// the same edits; returns how many rows were invalid.
int CheckRowsAgainstFit(const std::vector<std::string>& edits, const std::string& key) {
  std::vector<std::string> sweep = {"sweep",         "recipes/llama3-8b-h200.yaml",
                                    "--gpus",        "32",
                                    "--tp",          "1",
                                    "--cp",          "1",
                                    "--pp",          "1",
                                    "--vpp",         "1",
                                    "--micro-batch", "1",
                                    "--recompute",   "full",
                                    "--zero",        "0,1,2,3",
                                    "--format",      "json"};
  std::vector<std::string> fit = {"fit",   "recipes/llama3-8b-h200.yaml", "--set", "training.recompute=full",
                                  "--set", "training.micro_batch=1"};
  for (const std::string& e : edits) {
    for (auto* args : {&sweep, &fit}) {
      args->push_back("--set");
      args->push_back(e);
    }
  }
  const testing::CommandResult r = testing::RunPreflight(sweep);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return -1;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  int invalid = 0;
  for (const auto& row : j["layouts"]) {
    std::vector<std::string> at = fit;
    at.push_back("--set");
    std::string zero = "parallel.zero=";  // not literal + to_string: GCC 12's -Wrestrict false positive
    zero += std::to_string(row["zero"].get<int>());
    at.push_back(zero);
    const testing::CommandResult f = testing::RunPreflight(at);
    const bool refused = f.exit_code == 2;
    EXPECT_EQ(row["status"] == "invalid", refused) << row.dump() << "\nfit: " << f.err;
    if (row["status"] == "invalid") {
      ++invalid;
      EXPECT_NE(row["reason"].get<std::string>().find(key), std::string::npos) << row.dump();
      EXPECT_NE(f.err.find(key), std::string::npos) << f.err;
    }
  }
  EXPECT_EQ(j["layouts"].size(), 4u);
  return invalid;
}

TEST(SweepZeroRules, FsdpCpuOffloadRowsBelowZero3AreInvalid) {
  EXPECT_EQ(
      CheckRowsAgainstFit({"parallel.zero=3", "parallel.fsdp_cpu_offload=true", "training.optimizer.matrices=adamw"},
                          "parallel.fsdp_cpu_offload"),
      3);
}

TEST(SweepZeroRules, LayerWiseOptimizerRowsOffZero1AreInvalid) {
  EXPECT_EQ(CheckRowsAgainstFit({"parallel.optimizer_sharding=layer_wise"}, "parallel.optimizer_sharding"), 3);
}

}  // namespace
}  // namespace preflight::sweep_zero_rules_test

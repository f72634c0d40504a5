// End-to-end tests of `preflight validate` and `preflight fit` through the
// built binary: exit codes for every branch, JSON keys, overrides.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::cli_fit_test {
namespace {

using ::testing::HasSubstr;
using testing::RunPreflight;

constexpr const char* kDefault = "recipes/nam56r-h200.yaml";

TEST(CliValidate, DefaultRecipeIsValid) {
  const auto r = RunPreflight({"validate", kDefault});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("valid (48 layers, world 64)"));
}

TEST(CliValidate, BadOverrideIsExit2WithKeyAndValidValues) {
  const auto r = RunPreflight({"validate", kDefault, "--set", "parallel.tp=6"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("parallel.tp = 6"));
}

TEST(CliValidate, MissingFileIsExit2) {
  const auto r = RunPreflight({"validate", "recipes/does-not-exist.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("does-not-exist.yaml"));
}

TEST(CliValidate, MalformedSetArgumentIsExit2) {
  const auto r = RunPreflight({"validate", kDefault, "--set", "parallel.tp"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("expected KEY.PATH=VALUE"));
}

TEST(CliFit, DefaultRecipeFits) {
  const auto r = RunPreflight({"fit", kDefault});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("verdict   fits"));
  EXPECT_THAT(r.out, HasSubstr("replicated params"));
  EXPECT_THAT(r.out, HasSubstr("allocator overhead"));
}

TEST(CliFit, OverCapacityIsExit1) {
  // 2 GPUs cannot hold the default recipe's ~30 B parameters with 14-18 bytes of
  // model state each (docs/formulas.md §2.1): > 200 GiB per GPU against 140 GiB.
  const auto r = RunPreflight({"fit", kDefault, "--set", "cluster.nodes=1", "--set", "cluster.gpus_per_node=2",
                               "--set", "parallel.tp=2", "--set", "parallel.pp=1", "--set", "parallel.ep=2",
                               "--set", "training.global_batch=8"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("DOES NOT FIT"));
}

TEST(CliFit, BadRecipeIsExit2) {
  const auto r = RunPreflight({"fit", kDefault, "--set", "model.pattern=AXM"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("model.pattern"));
}

TEST(CliFit, JsonHasEveryCategoryForEveryStage) {
  const auto r = RunPreflight({"fit", kDefault, "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"]["total"].get<int64_t>() > 0, true);
  ASSERT_EQ(j["stages"].size(), 4u);  // pp = 4
  for (const auto& stage : j["stages"]) {
    for (const char* key : {"replicated_params", "tp_sharded_params", "ep_sharded_params", "gradients",
                            "optimizer_muon", "optimizer_adamw", "activations", "routing_scratch", "serving_state",
                            "runtime_reserve", "allocator_overhead"}) {
      EXPECT_TRUE(stage["memory_bytes"].contains(key)) << key;
    }
  }
  EXPECT_TRUE(j["verdict"]["fits"].get<bool>());
}

TEST(CliFit, ExplainPrintsFormulas) {
  const auto r = RunPreflight({"fit", kDefault, "--explain"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("explain (stage"));
}

TEST(CliFit, UnknownFormatIsUsageError) {
  const auto r = RunPreflight({"fit", kDefault, "--format", "xml"});
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace preflight::cli_fit_test

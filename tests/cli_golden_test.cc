// Golden files for `fit` and `plan`, table and JSON, on example recipes: a
// golden diff in review shows exactly what a change does to what users see
// (docs/architecture.md). PREFLIGHT_UPDATE_GOLDEN=1 rewrites them. The figures inside
// are pinned against independent sources by the estimator_*/planner_* tests;
// these files pin the rendering and catch any unintended movement.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace preflight::cli_golden_test {
namespace {

struct GoldenCase {
  const char* name;
  std::vector<std::string> args;
  int exit_code;
};

class CliGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(CliGolden, MatchesGolden) {
  const GoldenCase& c = GetParam();
  const auto r = testing::RunPreflight(c.args);
  EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
  testing::ExpectMatchesGolden(r.out, c.name);
}

const GoldenCase kCases[] = {
    {"fit_nam56r_table.txt", {"fit", "recipes/nam56r-h200.yaml"}, 0},
    {"fit_nam56r.json", {"fit", "recipes/nam56r-h200.yaml", "--format", "json"}, 0},
    {"fit_nam56r_explain.txt", {"fit", "recipes/nam56r-h200.yaml", "--explain"}, 0},
    {"fit_mixtral_table.txt", {"fit", "recipes/mixtral-8x7b-h200.yaml"}, 0},
    {"fit_nam56r_over_capacity_table.txt",
     {"fit", "recipes/nam56r-h200.yaml", "--set", "cluster.nodes=1", "--set", "parallel.pp=1", "--set", "parallel.ep=2",
      "--set", "training.global_batch=16"},
     1},
    {"plan_nam56r_table.txt", {"plan", "recipes/nam56r-h200.yaml"}, 0},
    {"plan_nam56r.json", {"plan", "recipes/nam56r-h200.yaml", "--format", "json"}, 0},
    {"plan_llama3_405b_table.txt", {"plan", "recipes/llama3-405b-h200.yaml"}, 0},
    {"emit_megatron_nam56r.txt", {"plan", "recipes/nam56r-h200.yaml", "--emit", "megatron"}, 1},
    {"emit_megatron_llama3_8b_adamw.txt",
     {"plan", "recipes/llama3-8b-h200.yaml", "--emit", "megatron", "--set", "training.optimizer.matrices=adamw"},
     0},
    {"emit_torchtitan_nam56r.py", {"plan", "recipes/nam56r-h200.yaml", "--emit", "torchtitan"}, 1},
    {"emit_torchtitan_llama3_405b_fsdp.py",
     {"plan", "recipes/llama3-405b-h200.yaml", "--emit", "torchtitan", "--set", "parallel.zero=3", "--set",
      "parallel.order=tp-cp-dp-pp", "--set", "training.recompute=full", "--set", "training.transformer_engine=false",
      "--set", "training.cross_entropy=fp32_upcast"},
     0},
};

INSTANTIATE_TEST_SUITE_P(All, CliGolden, ::testing::ValuesIn(kCases), [](const auto& test_info) {
  std::string name = test_info.param.name;
  for (char& ch : name) {
    if (ch == '.' || ch == '-') ch = '_';
  }
  return name;
});

}  // namespace
}  // namespace preflight::cli_golden_test

// Defects from the hostile-input sweep (issue "Hostile input, full disks and
// huge layouts"), one test each, named after the defect's number there.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "preflight/recipe/import.h"
#include "support/test_support.h"

namespace preflight {
namespace {

using testing::RunPreflight;

const char* kRecipe = "recipes/llama3-8b-h200.yaml";

// 7: a JSON config that gives a key twice (a reader keeps either) is refused,
// with the key and where its second copy is.
TEST(HostileInput, Defect7DuplicateJsonKeyIsRefused) {
  const HfImport r = ImportHfConfig(
      "{\"architectures\": [\"LlamaForCausalLM\"],\n \"hidden_size\": 4096,\n \"hidden_size\": 8192}", "c.json");
  ASSERT_FALSE(r.diagnostics.empty());
  EXPECT_EQ(r.diagnostics.front().severity, Severity::kError);
  EXPECT_EQ(r.diagnostics.front().key_path, "hidden_size");
  EXPECT_EQ(r.diagnostics.front().mark.line, 3);
  EXPECT_NE(r.diagnostics.front().message.find("twice"), std::string::npos);
}

// 8: nan passes a range check (every comparison with it is false); the
// numeric options refuse it as bad input.
TEST(HostileInput, Defect8NanOptionsAreBadInput) {
  EXPECT_EQ(RunPreflight({"check", kRecipe, "--max-regression-gib", "nan"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"check", kRecipe, "--max-regression-gib", "inf"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"plan", kRecipe, "--compute-efficiency", "nan"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"plan", kRecipe, "--latency-us", "nan"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"check", kRecipe, "--max-regression-gib", "0.5"}).exit_code, 0);
}

// 10: a number beyond double range is a located input error (exit 2), not an
// internal error (exit 3).
TEST(HostileInput, Defect10NumberOverflowInHfConfigIsBadInput) {
  const HfImport r = ImportHfConfig("{\"architectures\": [\"LlamaForCausalLM\"],\n \"hidden_size\": 1e400}", "c.json");
  ASSERT_FALSE(r.diagnostics.empty());
  EXPECT_EQ(r.diagnostics.front().mark.line, 2);
  EXPECT_NE(r.diagnostics.front().message.find("out of range"), std::string::npos);
  const std::string path = ::testing::TempDir() + "overflow.json";
  std::ofstream(path) << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 1e400}";
  const auto run = RunPreflight({"import", "hf", path});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("1e400"), std::string::npos) << run.err;
  std::remove(path.c_str());
}

// 13: an unknown command is named (with the valid ones), not "A subcommand
// is required"; control characters in it stay escaped.
TEST(HostileInput, Defect13UnknownCommandIsNamed) {
  const auto run = RunPreflight({"frobnicate"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("unknown command 'frobnicate'"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("plan"), std::string::npos);
  const auto ctrl = RunPreflight({"bad\x1b[31mred"});
  EXPECT_EQ(ctrl.exit_code, 2);
  EXPECT_EQ(ctrl.err.find('\x1b'), std::string::npos) << ctrl.err;
}

}  // namespace
}  // namespace preflight

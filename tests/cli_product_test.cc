// The command line as a user coming from git or Megatron-LM expects it (issue
// "A product to install, read and look at"): `preflight help [COMMAND]`, a
// recipe piped in as `-`, and a bad --format named with the valid ones.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight {
namespace {

using ::testing::HasSubstr;
using testing::RunPreflight;

TEST(CliProduct, HelpIsACommand) {
  const auto all = RunPreflight({"help"});
  EXPECT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(all.out, RunPreflight({"--help"}).out);
  EXPECT_THAT(all.out, HasSubstr("Usage: preflight"));
  const auto fit = RunPreflight({"help", "fit"});
  EXPECT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_EQ(fit.out, RunPreflight({"fit", "--help"}).out);
  const auto unknown = RunPreflight({"help", "fitt"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("unknown command 'fitt'"));
}

// `import hf c.json | preflight fit -`: the recipe read from stdin, named
// <stdin> in diagnostics, priced exactly as the same file.
TEST(CliProduct, RecipeFromStandardInput) {
  const std::string path = testing::SourcePath("recipes/llama3-8b-h200.yaml");
  const std::string text = testing::ReadFile(path);
  const auto piped = RunPreflight({"fit", "-", "--format", "json"}, text);
  const auto file = RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "--format", "json"});
  EXPECT_EQ(piped.exit_code, file.exit_code) << piped.err;
  nlohmann::json a = nlohmann::json::parse(piped.out), b = nlohmann::json::parse(file.out);
  EXPECT_EQ(a["recipe"]["file"], "-");
  a["recipe"].erase("file");
  b["recipe"].erase("file");
  EXPECT_EQ(a, b);
  const auto bad = RunPreflight({"validate", "-"}, "model: {\n");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("<stdin>:"));
}

TEST(CliProduct, BadFormatNamesTheValidOnes) {
  const auto fit = RunPreflight({"fit", "recipes/nam56r-h200.yaml", "--format", "md"});
  EXPECT_EQ(fit.exit_code, 2);
  EXPECT_THAT(fit.err, HasSubstr("'md': expected one of table, json"));
  EXPECT_THAT(fit.err, ::testing::Not(HasSubstr("->")));  // not the transformer's mapping
  const auto check = RunPreflight({"check", "recipes/nam56r-h200.yaml", "--format", "md"});
  EXPECT_EQ(check.exit_code, 0) << check.err;
}

}  // namespace
}  // namespace preflight

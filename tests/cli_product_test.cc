// The command line as a user coming from git or Megatron-LM expects it (issue
// "A product to install, read and look at"): `preflight help [COMMAND]`, a
// recipe piped in as `-`, and a bad --format named with the valid ones.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::cli_product_test {
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

// -o/--out on every command that prints a report or a recipe: the file gets
// exactly what stdout would, and the run's own inputs are never overwritten.
TEST(CliProduct, OutputFlagOnEveryCommand) {
  const std::string dir = ::testing::TempDir() + "preflight-out-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string hf = "tests/data/hf/llama-3.1-8b.json";
  const std::vector<std::vector<std::string>> commands = {
      {"fit", "recipes/llama3-8b-h200.yaml"},
      {"fit", "recipes/llama3-8b-h200.yaml", "--format", "json"},
      {"plan", "recipes/llama3-8b-h200.yaml"},
      {"plan", "recipes/llama3-8b-h200.yaml", "--emit", "megatron"},
      {"check", "recipes/llama3-8b-h200.yaml"},
      {"diff", "recipes/llama3-8b-h200.yaml", "--set", "parallel.tp=2"},
      {"sweep", "recipes/llama3-8b-h200.yaml", "--gpus", "8", "--top", "3", "--threads", "1"},
      {"import", "hf", hf},
  };
  for (const auto& command : commands) {
    const auto printed = RunPreflight(command);
    ASSERT_NE(printed.exit_code, 2) << command[0] << printed.err;
    for (const char* flag : {"-o", "--out"}) {
      const std::string file = dir + "/" + command[0] + flag;
      std::vector<std::string> args = command;
      args.push_back(flag);
      args.push_back(file);
      const auto written = RunPreflight(args);
      EXPECT_EQ(written.exit_code, printed.exit_code) << command[0] << " " << flag << written.err;
      EXPECT_EQ(written.out, "") << command[0] << " " << flag;
      EXPECT_EQ(testing::ReadFile(file), printed.out) << command[0] << " " << flag;
    }
  }
  const auto onto_input = RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "-o", "recipes/llama3-8b-h200.yaml"});
  EXPECT_EQ(onto_input.exit_code, 2);
  EXPECT_THAT(onto_input.err, HasSubstr("is an input of this run"));
  std::filesystem::remove_all(dir);
}

// check --set overrides every recipe and its baseline alike: against an
// unchanged baseline directory the delta is zero, and the peak is fit's
// with the same override.
TEST(CliProduct, CheckTakesSetLikeEveryRecipeReader) {
  const auto fit = nlohmann::json::parse(
      RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "--set", "parallel.tp=2", "--format", "json"}).out);
  const auto check = RunPreflight(
      {"check", "recipes/llama3-8b-h200.yaml", "--baseline", "recipes", "--set", "parallel.tp=2", "--format", "json"});
  ASSERT_EQ(check.exit_code, 0) << check.err;
  const auto j = nlohmann::json::parse(check.out);
  const auto& entry = j["recipes"][0];
  EXPECT_EQ(entry["peak_bytes"], fit["stages"][fit["worst_stage"].get<size_t>()]["peak_bytes"]) << entry;
  EXPECT_EQ(entry["baseline"]["delta_peak_bytes"], 0) << entry;
  // A piped recipe, as every recipe reader takes it.
  const auto piped = RunPreflight({"check", "-", "--set", "parallel.tp=2", "--format", "json"},
                                  testing::ReadFile(testing::SourcePath("recipes/llama3-8b-h200.yaml")));
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(nlohmann::json::parse(piped.out)["recipes"][0]["peak_bytes"], entry["peak_bytes"]);
  const auto bad = RunPreflight({"check", "recipes/llama3-8b-h200.yaml", "--set", "parallel.tp"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("expected KEY.PATH=VALUE"));
}

// validate counts layers in the framework's unit: Llama 3 8B has 32
// transformer layers (Meta's model card), not 64 sublayers.
TEST(CliProduct, ValidateCountsFrameworkLayers) {
  EXPECT_THAT(RunPreflight({"validate", "recipes/llama3-8b-h200.yaml"}).out, HasSubstr("valid (32 layers, world 32)"));
}

}  // namespace
}  // namespace preflight::cli_product_test

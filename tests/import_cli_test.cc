// `preflight import hf` on the command line: exit codes, warnings on stderr,
// --layout, -o, and the default H200 layout rule worked by hand.
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::import_cli_test {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::RunPreflight;

std::string TempYaml(const char* stem) {
  return (std::filesystem::temp_directory_path() / (std::string(stem) + "-" + std::to_string(::getpid()) + ".yaml"))
      .string();
}

TEST(ImportCli, WritesAValidRecipeAndWarnsOnStderr) {
  const std::string out = TempYaml("import-llama");
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/llama-3.1-8b.json", "-o", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("warning: rope_scaling"));
  const LoadResult loaded = LoadRecipeFile(out);
  ASSERT_TRUE(loaded.ok()) << ReadFile(out);
  EXPECT_EQ(loaded.recipe->name, "llama-3.1-8b-h200");
  EXPECT_EQ(loaded.recipe->model.repeat, 32);
  // Default rule, by hand: 8.03e9 params x (6 + 12/8) B = 60.2e9 B = 56.1 GiB <= 70.2 GiB (half of
  // 143771 MiB) on 1 node with tp 1, pp 1, dp 8, the smallest model-parallel size.
  EXPECT_EQ(loaded.recipe->cluster.nodes, 1);
  EXPECT_EQ(loaded.recipe->parallel.tp, 1);
  EXPECT_EQ(loaded.recipe->parallel.pp, 1);
  // The header tells one story: the layout written, how the rule chose it, what the estimate says.
  const std::string text = ReadFile(out);
  EXPECT_THAT(text, HasSubstr("# Layout: 1 node(s) x 8 h200 GPUs, tp 1, pp 1, ep 1, dp 8."));
  EXPECT_THAT(text, HasSubstr("# Chosen by the default H200 rule"));
  EXPECT_THAT(text, HasSubstr("# Memory estimate of `preflight fit` for this layout: worst stage"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("--layout")));
  EXPECT_THAT(text, HasSubstr("  matrices: adamw"));  // the optimizer is stated, not left to the default
  std::filesystem::remove(out);
}

// Every fixture imports to a recipe whose stage split Megatron-LM builds:
// DeepSeek-V3's 61 layers on pp 2 take the uneven first/last stage (30 + 31),
// as no even split exists.
TEST(ImportCli, EveryFixtureWritesASplitTheFrameworkRuns) {
  for (const auto& entry : std::filesystem::directory_iterator(testing::SourcePath("tests/data/hf"))) {
    const auto r = RunPreflight({"import", "hf", entry.path().string()});
    ASSERT_EQ(r.exit_code, 0) << entry.path() << r.err;
    const LoadResult loaded = LoadRecipeFromString(r.out, "stdout.yaml");
    ASSERT_TRUE(loaded.ok()) << entry.path() << r.out;
    if (entry.path().filename() == "deepseek-v3.json") {
      EXPECT_EQ(loaded.recipe->parallel.pp, 2);
      EXPECT_EQ(loaded.recipe->parallel.first_stage_layers, 30);
      EXPECT_EQ(loaded.recipe->parallel.last_stage_layers, 31);
    }
  }
}

// Zamba2's stand-in (A, D, M a hybrid layer) is a recipe the other verbs take: fit and plan run on it
// (exit 0 or 1, never 2) and the scaled simulation agrees with the estimate's memory and bytes.
TEST(ImportCli, ZambaTwoRecipeFitsPlansAndSimulates) {
  const std::string out = TempYaml("import-zamba2");
  const auto imported = RunPreflight({"import", "hf", "tests/data/hf/zamba2-1.2b.json", "-o", out});
  ASSERT_EQ(imported.exit_code, 0) << imported.err;
  EXPECT_THAT(imported.err, HasSubstr("num_mem_blocks = 1: imported as the nearest recipe block"));
  EXPECT_THAT(ReadFile(out), HasSubstr("the recipe counts 419,450,880 more parameters than the model"));
  const auto fit = RunPreflight({"fit", out});
  EXPECT_TRUE(fit.exit_code == 0 || fit.exit_code == 1) << fit.exit_code << fit.err;
  const auto plan = RunPreflight({"plan", out});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  const auto simulated = RunPreflight({"simulate", out});
  EXPECT_EQ(simulated.exit_code, 0) << simulated.out << simulated.err;
  EXPECT_THAT(simulated.out, HasSubstr("verdict: agree"));
  std::filesystem::remove(out);
}

// An MoE model with every size within the importer's and the recipe's bounds
// (2^20 experts of ffn 2^24 on hidden 2^24) has 3 x 2^68 expert parameters:
// sizing its layout leaves int64. Exit 2 naming the config, not a wrapped count.
TEST(ImportCli, MoeSizesPastInt64AreAnErrorNamingTheConfig) {
  const std::string config =
      (std::filesystem::temp_directory_path() / ("import-moe-bounds-" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream out(config);
    out << R"({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 1, "hidden_size": 16777216,
               "vocab_size": 1000, "num_attention_heads": 1, "head_dim": 64, "intermediate_size": 16777216,
               "num_local_experts": 1048576, "num_experts_per_tok": 1})";
  }
  const auto r = RunPreflight({"import", "hf", config});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(config + ": the model's sizes are too large to count its parameters"));
  EXPECT_EQ(r.out, "");
  std::filesystem::remove(config);
}

TEST(ImportCli, DefaultRuleGrowsTheClusterForLargeModels) {
  // Mixtral 8x7B, by hand. Routed experts 32 x 8 x 3 x 4096 x 14336 = 45.10e9, the rest 1.61e9;
  // budget half of 143771 MiB = 75.38e9 B.
  // 1 node: every tp/pp gives pp x ep <= 8 and expert dp 1: 45.10e9/8 x 18 B = 101.5e9 B. No fit.
  // 2 nodes, tp 1 pp 1 (dp 16, ep 8, expert dp 2): 5.64e9 x 12 + 1.61e9 x 6.75 = 78.5e9 B. No fit.
  // 2 nodes, tp 1 pp 2 (dp 8, ep 8, expert dp 1): 2.82e9 x 18 + 0.80e9 x 7.5 = 56.8e9 B. Fits, tp*pp 2.
  // 2 nodes, tp 2 pp 1 (dp 8, ep 8, expert dp 2): 5.64e9 x 12 + 0.80e9 x 7.5 = 73.7e9 B. Fits, tp*pp 2,
  // and the tie goes to the larger TP (NVLink) over a pipeline stage.
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/mixtral-8x7b.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LoadResult loaded = LoadRecipeFromString(r.out, "stdout.yaml");
  ASSERT_TRUE(loaded.ok()) << r.out;
  EXPECT_EQ(loaded.recipe->cluster.nodes, 2);
  EXPECT_EQ(loaded.recipe->parallel.tp, 2);
  EXPECT_EQ(loaded.recipe->parallel.pp, 1);
  EXPECT_EQ(loaded.recipe->parallel.ep, 8);
}

TEST(ImportCli, DefaultLayoutIsCheckedWithTheMemoryEstimate) {
  // Jamba v0.1: the model-state rule alone would pick 2 nodes (tp 1, pp 2, ep 8, expert dp 1:
  // 45.10e9/16 x 18 + 6.36e9/2 x 7.5 = 74.6e9 B <= 75.38e9 B), which leaves no room for the
  // activations; the written layout must be one the estimator says fits, on more nodes.
  const std::string out = TempYaml("import-jamba");
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/jamba-v0.1.json", "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LoadResult loaded = LoadRecipeFile(out);
  ASSERT_TRUE(loaded.ok()) << ReadFile(out);
  EXPECT_GT(loaded.recipe->cluster.nodes, 2);
  EXPECT_EQ(loaded.recipe->parallel.tp, 1);  // one Mamba group
  EXPECT_THAT(ReadFile(out), HasSubstr("the first that the memory estimate fits"));
  // And `fit` agrees: exit 0 is "fits, with the headroom floor".
  const auto fit = RunPreflight({"fit", out});
  EXPECT_EQ(fit.exit_code, 0) << fit.out << fit.err;
  std::filesystem::remove(out);
}

TEST(ImportCli, LayoutKeysOverrideTheDefault) {
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/llama-3.1-8b.json", "--layout", "parallel.tp=8",
                               "--layout", "cluster.nodes=2", "--layout", "training.seq_len=4096"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LoadResult loaded = LoadRecipeFromString(r.out, "stdout.yaml");
  ASSERT_TRUE(loaded.ok()) << r.out;
  EXPECT_EQ(loaded.recipe->parallel.tp, 8);
  EXPECT_EQ(loaded.recipe->cluster.nodes, 2);
  EXPECT_EQ(loaded.recipe->training.seq_len, 4096);
  EXPECT_THAT(r.out, HasSubstr("tp: 8  # set by --layout"));
  // The header names the given keys and says the rule filled in only the others.
  EXPECT_THAT(r.out, HasSubstr("# Layout: 2 node(s) x 8 h200 GPUs, tp 8, pp 1, ep 1, dp 2."));
  EXPECT_THAT(r.out, HasSubstr("# Given with --layout (marked 'set by --layout' below): parallel.tp=8, "
                               "cluster.nodes=2, training.seq_len=4096."));
  EXPECT_THAT(r.out, HasSubstr("# The other keys follow the default H200 rule"));
  EXPECT_THAT(r.out, HasSubstr("keeping the given degrees"));
}

TEST(ImportCli, TheNameComesFromTheConfigItsFileOrName) {
  // A config without _name_or_path is named by its file; a bare config.json by its directory (a
  // Hugging Face cache's models--org--name above snapshots/<commit>); --name wins; the device follows
  // cluster.gpu. Two Llamas no longer share a name.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("import-names-" + std::to_string(::getpid()));
  const std::filesystem::path cache =
      dir / "models--meta-llama--Llama-3.2-1B" / "snapshots" / "4e20de362430cd3b72f300e6b0f18e50e7166e08";
  std::filesystem::create_directories(cache);
  const std::string body = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "vocab_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128})";
  const auto write = [](const std::filesystem::path& p, const std::string& text) {
    FILE* f = std::fopen(p.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  write(dir / "tiny-llama-a.json", body);
  write(cache / "config.json", body);
  const auto name_of = [](const std::vector<std::string>& args) {
    const auto r = RunPreflight(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const LoadResult loaded = LoadRecipeFromString(r.out, "stdout.yaml");
    return loaded.ok() ? loaded.recipe->name : std::string("(invalid)");
  };
  EXPECT_EQ(name_of({"import", "hf", (dir / "tiny-llama-a.json").string()}), "tiny-llama-a-h200");
  EXPECT_EQ(name_of({"import", "hf", (cache / "config.json").string()}), "llama-3.2-1b-h200");
  EXPECT_EQ(name_of({"import", "hf", (cache / "config.json").string(), "--name", "my-run"}), "my-run");
  EXPECT_EQ(name_of({"import", "hf", (dir / "tiny-llama-a.json").string(), "--layout", "cluster.gpu=h100"}),
            "tiny-llama-a-h100");
  // _name_or_path, where the config has it, names the model.
  EXPECT_EQ(name_of({"import", "hf", "tests/data/hf/mixtral-8x7b.json"}), "mixtral-8x7b-v0.1-h200");
  std::filesystem::remove_all(dir);
}

TEST(ImportCli, MambaSsmConfigImportsAndFits) {
  // state-spaces/mamba2-2.7b's own config.json (no architectures): exit 0, no warning, and `fit` passes.
  const std::string out = TempYaml("import-mamba2-ssm");
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/mamba2-2.7b-ssm.json", "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  const LoadResult loaded = LoadRecipeFile(out);
  ASSERT_TRUE(loaded.ok()) << ReadFile(out);
  EXPECT_EQ(loaded.recipe->name, "mamba2-2.7b-ssm-h200");
  EXPECT_THAT(ReadFile(out), HasSubstr("(mamba_ssm MambaLMHeadModel)"));
  EXPECT_EQ(RunPreflight({"fit", out}).exit_code, 0);
  std::filesystem::remove(out);
}

TEST(ImportCli, GivenDegreesAreKeptEvenWhenTheModelStateExceedsTheBudget) {
  // DeepSeek-V3 on 2 nodes: 654e9 routed-expert parameters over at most 16 ranks are > 40e9 a rank,
  // x 6 B alone > 75.38e9 B. The user asked for it: written as given, with a warning; `fit` judges.
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/deepseek-v3.json", "--layout", "cluster.nodes=2",
                               "--layout", "parallel.ep=16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("warning: with the --layout degrees the model state exceeds half of each H200"));
  const LoadResult loaded = LoadRecipeFromString(r.out, "stdout.yaml");
  ASSERT_TRUE(loaded.ok()) << r.out;
  EXPECT_EQ(loaded.recipe->cluster.nodes, 2);
  EXPECT_EQ(loaded.recipe->parallel.ep, 16);
}

TEST(ImportCli, UnsupportedArchitectureExitsTwo) {
  const std::string cfg = TempYaml("bert-config");
  {
    FILE* f = std::fopen(cfg.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"architectures\": [\"BertForMaskedLM\"], \"hidden_size\": 768}\n", f);
    std::fclose(f);
  }
  const auto r = RunPreflight({"import", "hf", cfg});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unsupported architecture; supported: BambaForCausalLM, DeepseekV3ForCausalLM"));
  EXPECT_TRUE(r.out.empty());
  std::filesystem::remove(cfg);
}

TEST(ImportCli, BadLayoutKeyOrValueExitsTwoAndWritesNothing) {
  const std::string out = TempYaml("import-bad");
  const auto bad_key = RunPreflight({"import", "hf", "tests/data/hf/llama-3.1-8b.json", "--layout", "model.hidden=8",
                                     "-o", out});
  EXPECT_EQ(bad_key.exit_code, 2);
  EXPECT_THAT(bad_key.err, HasSubstr("model.hidden = 8: not a layout key"));
  EXPECT_FALSE(std::filesystem::exists(out));
  // tp 3 does not divide 32 heads: the parser's validation rejects the written recipe.
  const auto bad_value = RunPreflight({"import", "hf", "tests/data/hf/llama-3.1-8b.json", "--layout", "parallel.tp=3",
                                       "-o", out});
  EXPECT_EQ(bad_value.exit_code, 2);
  EXPECT_THAT(bad_value.err, HasSubstr("parallel.tp"));
  // Errors on a --layout key name the argument, not a line of a recipe that was never written.
  EXPECT_THAT(bad_value.err, HasSubstr("--layout parallel.tp=3: parallel.tp = 3: must divide"));
  EXPECT_THAT(bad_value.err, ::testing::Not(HasSubstr("<stdout>")));
  EXPECT_FALSE(std::filesystem::exists(out));
  const auto no_equals = RunPreflight({"import", "hf", "tests/data/hf/llama-3.1-8b.json", "--layout", "parallel.tp"});
  EXPECT_EQ(no_equals.exit_code, 2);
}

TEST(ImportCli, MalformedJsonAndMissingFieldsExitTwo) {
  const std::string cfg = TempYaml("broken-config");
  const auto write = [&](const char* text) {
    FILE* f = std::fopen(cfg.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  write("{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 4096,,\n}\n");
  const auto malformed = RunPreflight({"import", "hf", cfg});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_THAT(malformed.err, HasSubstr(cfg + ":3:"));
  EXPECT_THAT(malformed.err, HasSubstr("malformed JSON"));
  EXPECT_TRUE(malformed.out.empty());
  write("{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, \"num_hidden_layers\": 2,\n"
        " \"num_attention_heads\": 4, \"intermediate_size\": 128}\n");
  const auto missing = RunPreflight({"import", "hf", cfg});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("hidden_size: missing required field for LlamaForCausalLM"));
  EXPECT_TRUE(missing.out.empty());
  std::filesystem::remove(cfg);
}

TEST(ImportCli, MissingFileExitsTwo) {
  const auto r = RunPreflight({"import", "hf", "tests/data/hf/no-such-model.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no-such-model.json: cannot read the file"));
}

}  // namespace
}  // namespace preflight::import_cli_test

// `preflight import megatron` on the command line: stdin, -o, --name,
// --layout, warnings on stderr with file:line, and exit 2 on malformed input.
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::import_megatron_cli_test {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::RunPreflight;

const char kCommandLine[] =
    "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
    "  --num-layers 4 --hidden-size 512 --num-attention-heads 8 \\\n"
    "  --vocab-file ${DATA_PATH}/bpe/vocab.json \\\n"
    "  --seq-length 1024 --micro-batch-size 4 --global-batch-size 32 \\\n"
    "  --cuda-graph-impl local \\\n"
    "  --bf16 --use-distributed-optimizer --disable-bias-linear --position-embedding-type rope\n";

TEST(ImportMegatronCli, ReadsStdinAndWritesAValidRecipe) {
  const auto r = RunPreflight({"import", "megatron", "-", "--name", "tiny"}, kCommandLine);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("<stdin>:5:1: warning: --cuda-graph-impl"));
  const LoadResult loaded = LoadRecipeFromString(r.out, "out.yaml");
  ASSERT_TRUE(loaded.ok()) << r.out;
  EXPECT_EQ(loaded.recipe->name, "tiny");
  EXPECT_EQ(loaded.recipe->cluster.gpus_per_node, 8);
  EXPECT_EQ(loaded.recipe->model.vocab, 50257);
  EXPECT_THAT(r.out, HasSubstr("# Imported by `preflight import megatron`"));
}

TEST(ImportMegatronCli, LayoutKeysAndOutputFile) {
  const std::string in =
      (std::filesystem::temp_directory_path() / ("mg-args-" + std::to_string(::getpid()) + ".yaml")).string();
  const std::string out = in + ".recipe.yaml";
  {
    std::FILE* f = std::fopen(in.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 256\n  --num-attention-heads: 4\n"
        "  --seq-length: 256\n  --tokenizer-type: NullTokenizer\n  --vocab-size: 999\n"
        "  --tensor-model-parallel-size: 2\n  --global-batch-size: 8\n",
        f);
    std::fclose(f);
  }
  const auto r = RunPreflight({"import", "megatron", in, "-o", out, "--layout", "cluster.nodes=2", "--layout",
                               "cluster.gpus_per_node=4", "--layout", "cluster.gpu=h200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LoadResult loaded = LoadRecipeFile(out);
  ASSERT_TRUE(loaded.ok()) << ReadFile(out);
  EXPECT_EQ(loaded.recipe->world(), 8);
  EXPECT_EQ(loaded.recipe->dp(), 4);  // world 8 / tp 2
  EXPECT_EQ(loaded.recipe->cluster.gpu, "h200");
  const auto bad = RunPreflight({"import", "megatron", in, "--layout", "model.hidden=3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("not a layout key"));
  // A bad value of a layout key names the --layout argument, not a line of the unwritten recipe.
  const auto bad_value = RunPreflight({"import", "megatron", in, "--layout", "parallel.tp=3"});
  EXPECT_EQ(bad_value.exit_code, 2);
  EXPECT_THAT(bad_value.err, HasSubstr("--layout parallel.tp=3: parallel.tp = 3"));
  std::filesystem::remove(in);
  std::filesystem::remove(out);
}

TEST(ImportMegatronCli, MalformedInputExitsTwoWithLineAndFlag) {
  const auto r =
      RunPreflight({"import", "megatron", "-"}, "pretrain_gpt.py \\\n  --num-layers 4 \\\n  --hidden-size 5x12\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("<stdin>:3:1: --hidden-size = 5x12: must be an integer"));
  EXPECT_TRUE(r.out.empty());
  const auto missing = RunPreflight({"import", "megatron", "no-such-file.yaml"});
  EXPECT_EQ(missing.exit_code, 2);
}

}  // namespace
}  // namespace preflight::import_megatron_cli_test

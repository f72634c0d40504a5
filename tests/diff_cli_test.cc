// End-to-end tests of `preflight diff`: attribution of memory moves to the
// recipe keys that differ (hand-computed), comm axes, exit codes, goldens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/test_support.h"

namespace preflight::diff_cli_test {
namespace {

namespace fs = std::filesystem;
using testing::ExpectMatchesGolden;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::RunPreflight;
using testing::SourcePath;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr const char* kMixtral = "recipes/mixtral-8x7b-h200.yaml";
constexpr const char* kDefault = "recipes/nam56r-h200.yaml";

// Hand count for Mixtral 8x7B (recipes/mixtral-8x7b-h200.yaml: hidden 4096,
// 32 "AE" layers, SwiGLU experts of ffn 14336, ep 8, pp 1, bf16 params, fp32
// grads): one routed expert is 3 * 4096 * 14336 = 176,160,768 parameters.
// experts 8 -> 16 at ep 8 puts 2 experts on a rank instead of 1, i.e. one
// more expert in each of the 32 MoE layers on every rank.
constexpr int64_t kExpertParams = int64_t{3} * 4096 * 14336;
constexpr int64_t kExtraExpertParamsPerRank = 32 * kExpertParams;      // 5,637,144,576
constexpr int64_t kExtraEpParamBytes = 2 * kExtraExpertParamsPerRank;  // bf16: 11,274,289,152 = 10.50 GiB
// The router (hidden x experts per MoE layer, replicated on every rank) grows
// by 8 columns: 32 * 4096 * 8 = 1,048,576 parameters, 2 MiB in bf16.
constexpr int64_t kExtraRouterParams = int64_t{32} * 4096 * 8;
constexpr int64_t kExtraRouterBytes = 2 * kExtraRouterParams;  // 2,097,152
// fp32 gradients (4 bytes) of both, ZeRO-1 does not shard gradients.
constexpr int64_t kExtraGradBytes = 4 * (kExtraExpertParamsPerRank + kExtraRouterParams);  // 22,552,772,608

TEST(DiffAttribution, MoreExpertsMoveEpShardedParamsByHandCount) {
  const auto r = RunPreflight({"diff", kMixtral, "--set", "model.moe.experts=16", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["changed_keys"].size(), 1u);
  EXPECT_EQ(j["changed_keys"][0]["key"], "model.moe.experts");
  EXPECT_EQ(j["changed_keys"][0]["before"], "8");
  EXPECT_EQ(j["changed_keys"][0]["after"], "16");
  EXPECT_EQ(j["memory_delta_bytes"]["ep_sharded_params"].get<int64_t>(), kExtraEpParamBytes);
  EXPECT_EQ(j["memory_delta_bytes"]["gradients"].get<int64_t>(), kExtraGradBytes);
  EXPECT_EQ(j["memory_delta_bytes"]["replicated_params"].get<int64_t>(), kExtraRouterBytes);
  EXPECT_EQ(j["memory_delta_bytes"]["tp_sharded_params"].get<int64_t>(), 0);
  const auto& at = j["attribution"][0];
  EXPECT_TRUE(at["applied"].get<bool>());
  EXPECT_EQ(at["memory_delta_bytes"]["ep_sharded_params"].get<int64_t>(), kExtraEpParamBytes);
  // One key changed: its effect alone is the whole change, nothing is left to interaction.
  EXPECT_TRUE(j["interaction"]["memory_delta_bytes"].empty()) << j["interaction"].dump();
}

TEST(DiffAttribution, TableNamesTheKeyAndItsEffect) {
  const auto r = RunPreflight({"diff", kMixtral, "--set", "model.moe.experts=16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Largest first: fp32 gradients (4 bytes) move twice the bf16 parameters (2 bytes).
  EXPECT_THAT(r.out, HasSubstr("model.moe.experts 8 -> 16: gradients +21.00 GiB, ep_sharded_params +10.50 GiB"));
}

TEST(DiffAttribution, TwoFilesTwoKeysEachAttributed) {
  const fs::path dir = fs::temp_directory_path() / ("preflight-diff-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string text = ReadFile(SourcePath(kMixtral));
  text.replace(text.find("experts: 8,"), 11, "experts: 16,");
  text.replace(text.find("reserve_gib: 3.0"), 16, "reserve_gib: 6.0");
  const std::string b = (dir / "b.yaml").string();
  std::ofstream(b) << text;
  const auto r = RunPreflight({"diff", kMixtral, b, "--format", "json"});
  fs::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["changed_keys"].size(), 2u);
  EXPECT_EQ(j["attribution"][0]["key"], "model.moe.experts");  // schema order: model before cluster
  EXPECT_EQ(j["attribution"][0]["memory_delta_bytes"]["ep_sharded_params"].get<int64_t>(), kExtraEpParamBytes);
  EXPECT_EQ(j["attribution"][1]["key"], "cluster.reserve_gib");
  // 6.0 - 3.0 GiB of reserve, a fixed per-GPU figure.
  EXPECT_EQ(j["attribution"][1]["memory_delta_bytes"]["runtime_reserve"].get<int64_t>(), 3 * kGiB);
  EXPECT_FALSE(j["attribution"][1]["memory_delta_bytes"].contains("ep_sharded_params"));
}

TEST(DiffAttribution, KeyInvalidAloneGoesToInteraction) {
  // ep 16 alone cannot shard 8 experts; with experts 16 it holds one expert a
  // rank, as A does, so the EP-sharded params do not move in total: the
  // experts key alone adds 10.50 GiB and the pair takes it back (interaction).
  const auto r =
      RunPreflight({"diff", kMixtral, "--set", "model.moe.experts=16", "--set", "parallel.ep=16", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["memory_delta_bytes"]["ep_sharded_params"].get<int64_t>(), 0);
  ASSERT_EQ(j["attribution"].size(), 2u);
  EXPECT_EQ(j["attribution"][1]["key"], "parallel.ep");
  EXPECT_FALSE(j["attribution"][1]["applied"].get<bool>());
  EXPECT_THAT(j["attribution"][1]["note"].get<std::string>(), HasSubstr("not valid alone"));
  EXPECT_EQ(j["interaction"]["memory_delta_bytes"]["ep_sharded_params"].get<int64_t>(), -kExtraEpParamBytes);
}

TEST(DiffComm, TensorParallelChangeMovesTheTpAxis) {
  const auto r = RunPreflight({"diff", kDefault, "--set", "parallel.tp=8", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["changed_keys"][0]["key"], "parallel.tp");
  EXPECT_NE(j["comm_delta_bytes"]["tp"].get<int64_t>(), 0);
  EXPECT_TRUE(j["attribution"][0]["comm_delta_bytes"].contains("tp"));
  // Twice the TP degree halves the TP-sharded parameters of a rank (each
  // column/row shard is 1/t of the matrix; vocab padding aside).
  EXPECT_LT(j["b"]["worst_memory_bytes"]["tp_sharded_params"].get<int64_t>(),
            j["a"]["worst_memory_bytes"]["tp_sharded_params"].get<int64_t>());
}

TEST(DiffExit, IdenticalRecipesMoveNothing) {
  const auto r = RunPreflight({"diff", kDefault, kDefault});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("nothing differs"));
  EXPECT_THAT(r.out, HasSubstr("no axis moved"));
}

TEST(DiffExit, BadInputIsExit2) {
  auto r = RunPreflight({"diff", kDefault, "recipes/does-not-exist.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("does-not-exist.yaml"));
  r = RunPreflight({"diff", kDefault, "--set", "parallel.tp=6"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("parallel.tp"));
  r = RunPreflight({"diff", kDefault, "--set", "parallel.tp"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunPreflight({"diff", kDefault});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("second recipe"));
  r = RunPreflight({"diff", kDefault, "--set", "parallel.tp=8", "--format", "csv"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(DiffGolden, TableRecomputeFull) {
  const auto r = RunPreflight({"diff", kDefault, "--set", "training.recompute=full"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "diff_recompute_table.txt");
}

TEST(DiffGolden, JsonMoreExperts) {
  const auto r = RunPreflight({"diff", kMixtral, "--set", "model.moe.experts=16", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "diff_experts.json");
}

TEST(DiffGolden, MarkdownTp) {
  const auto r = RunPreflight({"diff", kDefault, "--set", "parallel.tp=8", "--format", "md"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "diff_tp.md");
}

}  // namespace
}  // namespace preflight::diff_cli_test

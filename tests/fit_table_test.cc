// The `fit` table as a person reads it: 100 columns at any pipeline depth,
// identical stages grouped, the worst stage marked, and the activation
// line's parts adding up to it (checked on the JSON's exact bytes).
#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::fit_table_test {
namespace {

using ::testing::HasSubstr;
using testing::RunPreflight;

std::vector<std::string> ShippedRecipes() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(testing::SourcePath("recipes"))) {
    out.push_back("recipes/" + e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t WidestLine(const std::string& text) {
  std::istringstream in(text);
  size_t widest = 0;
  for (std::string line; std::getline(in, line);) {
    // Display width: UTF-8 continuation bytes take no column (the × and · of the header).
    const auto width = static_cast<size_t>(
        std::count_if(line.begin(), line.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
    widest = std::max(widest, width);
  }
  return widest;
}

// Every stage's activation parts (per family, embedding/head, the one-layer
// transient, offloaded tensors still on the device) sum to its activations.
void ExpectActivationPartsAddUp(const nlohmann::json& fit, const std::string& what) {
  for (const auto& stage : fit["stages"]) {
    int64_t parts = 0;
    for (const auto& [key, bytes] : stage["activations_by_family_bytes"].items()) parts += bytes.get<int64_t>();
    EXPECT_EQ(parts, stage["memory_bytes"]["activations"].get<int64_t>())
        << what << " stage " << stage["pipeline_rank"];
  }
}

TEST(FitTable, EveryShippedRecipeFitsOneHundredColumnsAndItsPartsAddUp) {
  for (const std::string& recipe : ShippedRecipes()) {
    const auto table = RunPreflight({"fit", recipe});
    ASSERT_NE(table.exit_code, 2) << recipe << table.err;
    EXPECT_LE(WidestLine(table.out.substr(0, table.out.find("\nverdict"))), 100u) << recipe << "\n" << table.out;
    EXPECT_THAT(table.out, HasSubstr("* the worst stage")) << recipe;
    const auto json = RunPreflight({"fit", recipe, "--format", "json"});
    const nlohmann::json fit = nlohmann::json::parse(json.out);
    ExpectActivationPartsAddUp(fit, recipe);
    // The table's last-global-rank line shows the JSON's two figures.
    const nlohmann::json& last = fit["last_global_rank"];
    const auto gib = [&](const char* key) {
      return fmt::format("{:.2f}", static_cast<double>(last[key].get<int64_t>()) / (1024.0 * 1024.0 * 1024.0));
    };
    EXPECT_THAT(table.out, HasSubstr(fmt::format("last global rank (stage {}, logged by Megatron): allocated {} "
                                                 "between steps, {} at peak\n",
                                                 last["pipeline_rank"].get<int64_t>(), gib("allocated_static_bytes"),
                                                 gib("allocated_peak_bytes"))))
        << recipe;
  }
}

// Full recompute and activation offloading add the two parts that are not a
// family's: the layer being recomputed and the offloaded tensors kept.
TEST(FitTable, TransientAndOffloadedPartsAddUp) {
  const auto full =
      RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "--format", "json", "--set", "training.recompute=full"});
  const auto fit = nlohmann::json::parse(full.out);
  EXPECT_GT(fit["stages"][0]["activations_by_family_bytes"]["transient"].get<int64_t>(), 0);
  ExpectActivationPartsAddUp(fit, "full recompute");
  // The recipe reruns core_attn, whose group then does not exist: attn_proj offloads.
  const auto offload = RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "--format", "json", "--set",
                                     "training.activation_offload=[core_attn, attn_proj]"});
  ASSERT_EQ(offload.exit_code, 0) << offload.err;
  const auto off = nlohmann::json::parse(offload.out);
  EXPECT_GT(off["stages"][0]["activations_by_family_bytes"]["offloaded_on_device"].get<int64_t>(), 0);
  ExpectActivationPartsAddUp(off, "activation offload");
}

// Llama 3 405B at pp 16, vpp 2 (the Llama 3 paper's layout): the first eight
// stages hold 32 micro-batches each under the interleaved schedule (pp x vpp
// = 32 chunks' warm-up), and stages 1-7 hold 8 layers with neither end:
// identical, so one column. Stage 0 holds the embedding and 7 layers, the
// ends differ, so 10 columns in two blocks of at most five.
TEST(FitTable, DeepPipelineGroupsIdenticalStagesAndMarksTheWorst) {
  const auto r = RunPreflight({"fit", "recipes/llama3-405b-h200.yaml"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stages 1-7*"));
  EXPECT_THAT(r.out, HasSubstr("verdict   fits: worst stage 1 "));
  // Two header rows (blocks): columns 0, 1-7, 8, 9, 10 | 11, 12, 13, 14, 15.
  EXPECT_EQ(testing::CountOccurrences(r.out, "memory per rank (GiB)"), 2);
  EXPECT_THAT(r.out, HasSubstr("stage 15"));
  // The ranges that do not fit a cell are listed under the table, inclusive.
  EXPECT_THAT(r.out, HasSubstr("stage 0: 0-2,63-66;"));
  EXPECT_THAT(r.out, HasSubstr("stage 15: 59-62,123-125\n"));
  // pp 32 (vpp 1) on the same model: still within 100 columns.
  const auto deep = RunPreflight({"fit", "recipes/llama3-405b-h200.yaml", "--set", "parallel.pp=32", "--set",
                                  "parallel.vpp=1", "--set", "parallel.schedule=1f1b"});
  ASSERT_NE(deep.exit_code, 2) << deep.err;
  EXPECT_LE(WidestLine(deep.out.substr(0, deep.out.find("\nverdict"))), 100u) << deep.out;
}

}  // namespace
}  // namespace preflight::fit_table_test

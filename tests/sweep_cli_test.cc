// `preflight sweep` through the built binary: exit codes, CSV/JSON with
// invalid layouts and reasons, golden table and JSON on a small space.
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::sweep_cli_test {
namespace {

using ::testing::HasSubstr;
using testing::ExpectMatchesGolden;
using testing::RunPreflight;

constexpr const char* kLlama = "recipes/llama3-8b-h200.yaml";

// The hand-counted space of sweep_space_test.cc: 128 rows, 48 valid.
std::vector<std::string> Small(std::vector<std::string> extra) {
  std::vector<std::string> args = {"sweep", kLlama, "--gpus", "8", "--tp", "1..4", "--cp", "1", "--pp", "1,2",
                                   "--vpp", "1", "--micro-batch", "1,3", "--recompute", "none,full", "--zero", "0..3"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliSweep, TableGolden) {
  const auto r = RunPreflight(Small({"--top", "5"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // not a terminal: no progress
  ExpectMatchesGolden(r.out, "sweep_llama3_8b_table.txt");
}

TEST(CliSweep, JsonGoldenHasEveryLayoutWithReasons) {
  const auto r = RunPreflight(Small({"--format", "json", "--top", "3"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "sweep_llama3_8b.json");
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["evaluated"], 128);
  EXPECT_EQ(j["layouts"].size(), 128u);
  EXPECT_EQ(j["counts"]["invalid"], 80);
  int invalid_with_reason = 0;
  for (const auto& row : j["layouts"]) {
    if (row["status"] == "invalid") {
      EXPECT_TRUE(row["step_s"].is_null());
      invalid_with_reason += row["reason"].get<std::string>().empty() ? 0 : 1;
    }
  }
  EXPECT_EQ(invalid_with_reason, 80);
}

// HSDP replicas as an axis: on 8 GPUs at tp 1, 2, 4, 8 (dp 8, 4, 2, 1) with
// replicas 1, 2, 4, an item is valid when the replicas divide dp (8: 1, 2, 4;
// 4: 1, 2, 4; 2: 1, 2; 1: 1): 9 of 12; a zero-0 row with replicas is invalid
// with its reason.
TEST(CliSweep, VariesReplicasAndSaysWhyZeroZeroCannot) {
  const auto r =
      RunPreflight({"sweep",  kLlama, "--gpus",         "8",     "--tp",          "1,2,4,8", "--cp",        "1",
                    "--pp",   "1",    "--vpp",          "1",     "--micro-batch", "1",       "--recompute", "full",
                    "--zero", "0,1",  "--dp-replicate", "1,2,4", "--format",      "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["evaluated"], 4 * 3 * 2);
  int valid_items = 0, zero_zero_refused = 0;
  for (const auto& row : j["layouts"]) {
    const int64_t dp = row["dp"], rep = row["dp_replicate"], zero = row["zero"];
    const bool divides = dp % rep == 0;
    if (zero == 1 && row["status"] != "invalid") ++valid_items;
    if (zero == 1) {
      EXPECT_EQ(row["status"] != "invalid", divides) << row.dump();
    }
    if (zero == 0 && rep > 1 && divides) {
      EXPECT_EQ(row["status"], "invalid");
      EXPECT_NE(row["reason"].get<std::string>().find("needs parallel.zero >= 1"), std::string::npos);
      ++zero_zero_refused;
    }
  }
  EXPECT_EQ(valid_items, 9);  // dp 8: 3, dp 4: 3, dp 2: 2, dp 1: 1
  EXPECT_EQ(zero_zero_refused, 9 - 4);
  // Varied, so not listed as held fixed.
  for (const auto& held : j["held_fixed"]) {
    EXPECT_EQ(held.get<std::string>().find("dp_replicate"), std::string::npos);
  }
}

TEST(CliSweep, CsvHasEveryLayoutAndStableHeader) {
  const auto r = RunPreflight(Small({"--format", "csv", "--threads", "3"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream in(r.out);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line,
            "tp,sp,cp,pp,vpp,dp,dp_replicate,ep,expert_tp,micro_batch,micro_batches,recompute,zero,schedule,status,"
            "peak_bytes,"
            "headroom_bytes,worst_stage,step_s,compute_s,exposed_comm_s,bubble_s,optimizer_s,tokens_per_s,mfu,reason");
  int rows = 0;
  int invalid = 0;
  while (std::getline(in, line)) {
    ++rows;
    if (line.find(",invalid,") != std::string::npos) {
      ++invalid;
      EXPECT_THAT(line, ::testing::AnyOf(HasSubstr("parallel.tp (3) with sequence parallelism"),
                                         HasSubstr("training.global_batch = 512")));
    }
  }
  EXPECT_EQ(rows, 128);
  EXPECT_EQ(invalid, 80);
}

TEST(CliSweep, ThreadCountDoesNotChangeOutput) {
  const auto one = RunPreflight(Small({"--format", "csv", "--threads", "1"}));
  const auto four = RunPreflight(Small({"--format", "csv", "--threads", "4"}));
  ASSERT_EQ(one.exit_code, 0);
  EXPECT_EQ(one.out, four.out);
}

TEST(CliSweep, BadRangesAreExit2) {
  const std::vector<std::string> base = {"sweep", kLlama, "--gpus", "8"};
  auto with = [&base](const std::string& option, const std::string& value) {
    std::vector<std::string> args = base;
    args.push_back(option);
    args.push_back(value);
    return RunPreflight(args);
  };
  auto r = with("--tp", "3..x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--tp '3..x': 'x' is not an integer"));
  r = with("--pp", "4..2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--pp '4..2': range 4..2 is empty"));
  r = with("--zero", "2..4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--zero '2..4': 4 is above the largest valid value 3"));
  r = with("--cp", "0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("below the smallest valid value 1"));
  r = with("--recompute", "some");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("valid: none, selective, full, selective_op"));
  // Accepted: Llama 3 8B's dense blocks take the per-op policy at tp 1.
  r = with("--recompute", "selective_op");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(" selective_op "));
  r = with("--format", "svg");
  EXPECT_EQ(r.exit_code, 2);
  r = RunPreflight({"sweep", kLlama, "--gpus", "12"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("multiple of cluster.gpus_per_node"));
  r = RunPreflight({"sweep", kLlama});  // --gpus is required
  EXPECT_EQ(r.exit_code, 2);
  r = RunPreflight({"sweep", "recipes/missing.yaml", "--gpus", "8"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(CliSweep, NothingFitsIsStillExit0) {
  // Llama 3 8B on one GPU: 8B params of weights, grads and optimizer state
  // (~115 GiB) plus activations exceed 140 GiB at tp 1 without recompute.
  const auto r = RunPreflight({"sweep", kLlama, "--gpus", "1", "--recompute", "none", "--zero", "0",
                               "--micro-batch", "8"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("no layout fits. Why:"));
  EXPECT_THAT(r.out, HasSubstr("over capacity or under the headroom floor; the closest"));
}

// The JSON says why too, and its counts are the rows' own reasons summed:
// on 8 GPUs Llama 3 405B is invalid or over capacity everywhere.
TEST(CliSweep, NothingFitsJsonGroupsTheRowsReasons) {
  const auto r = RunPreflight({"sweep", "recipes/llama3-405b-h200.yaml", "--gpus", "8", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("nothing_fits"));
  std::map<std::string, int64_t> by_key;
  int64_t invalid = 0, over = 0;
  for (const auto& row : j["layouts"]) {
    const std::string reason = row["reason"];
    if (row["status"] == "invalid") {
      ++invalid;
      ++by_key[reason.substr(0, reason.find_first_of(" :"))];
    } else {
      ++over;
    }
  }
  const auto& why = j["nothing_fits"];
  EXPECT_EQ(why["invalid_rows"], invalid);
  EXPECT_EQ(why["over_rows"], over);
  ASSERT_FALSE(why["invalid"].empty());
  int64_t previous = INT64_MAX;
  for (const auto& g : why["invalid"]) {
    EXPECT_EQ(g["rows"].get<int64_t>(), by_key[g["key"].get<std::string>()]) << g.dump();
    EXPECT_LE(g["rows"].get<int64_t>(), previous);
    previous = g["rows"].get<int64_t>();
  }
  EXPECT_NE(j["layouts"][why["closest"].get<size_t>()]["status"], "invalid");
}

TEST(CliSweep, OutWritesTheFile) {
  const std::string path = ::testing::TempDir() + "/sweep_out.csv";
  const auto r = RunPreflight(Small({"--format", "csv", "--out", path}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(testing::ReadFile(path), HasSubstr("tp,sp,cp,pp"));
}

}  // namespace
}  // namespace preflight::sweep_cli_test

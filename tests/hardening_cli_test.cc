// The CLI at the edges (issue 9): the same command twice gives the same
// bytes on stdout and stderr and the same exit code; hostile `--set` values
// and sizes past int64 end in exit 2 with a short message, never a crash
// (exit 3 or a signal) and never a wrapped number.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace preflight::hardening_cli_test {
namespace {

using testing::CommandResult;
using testing::RunPreflight;

void ExpectSameTwice(const std::vector<std::string>& args) {
  const CommandResult first = RunPreflight(args);
  const CommandResult second = RunPreflight(args);
  std::string command;
  for (const std::string& a : args) command += a + " ";
  EXPECT_EQ(first.exit_code, second.exit_code) << command;
  EXPECT_EQ(first.out, second.out) << command;
  EXPECT_EQ(first.err, second.err) << command;
  EXPECT_TRUE(first.exit_code == 0 || first.exit_code == 1 || first.exit_code == 2)
      << command << " exited " << first.exit_code << "\n" << first.err;
}

TEST(HardeningCliDeterminism, ValidateFitPlanTwiceAreByteIdentical) {
  for (const char* recipe : {"recipes/nam56r-h200.yaml", "recipes/deepseek-v3-h200.yaml"}) {
    ExpectSameTwice({"validate", recipe});
    ExpectSameTwice({"fit", recipe});
    ExpectSameTwice({"fit", recipe, "--format", "json"});
    ExpectSameTwice({"fit", recipe, "--explain"});
    ExpectSameTwice({"plan", recipe});
    ExpectSameTwice({"plan", recipe, "--format", "json"});
  }
  // Rejections too: the diagnostics come out in the same order every time.
  ExpectSameTwice({"validate", "recipes/nam56r-h200.yaml", "--set", "parallel.tp=6", "--set", "model.hidden=-1",
                   "--set", "parallel.foo=1"});
  ExpectSameTwice({"fit", "recipes/nam56r-h200.yaml", "--set", "parallel.tp=3"});
}

/// Runs `args`, expects exit 2 and a short stderr containing `needle`.
void ExpectBadInput(const std::vector<std::string>& args, const std::string& needle) {
  const CommandResult r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 16u * 1024) << "stderr echoes too much";
  EXPECT_TRUE(r.out.empty()) << "no figures for bad input: " << r.out;
}

TEST(HardeningCliHostile, HugeOverrideValues) {
  // 100,000 bad letters (argv strings are limited to 128 KiB on Linux).
  ExpectBadInput({"validate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=" + std::string(100'000, 'x')},
                 "(and 99999 more bad letters)");
  ExpectBadInput({"fit", "recipes/nam56r-h200.yaml", "--set", "model.hidden=99999999999999999999"},
                 "model.hidden = 99999999999999999999: out of range");
  ExpectBadInput({"fit", "recipes/nam56r-h200.yaml", "--set", "model.hidden=1e30"}, "out of range");
  ExpectBadInput({"fit", "recipes/nam56r-h200.yaml", "--set", "cluster.reserve_gib=.nan"}, "must be a number");
  ExpectBadInput({"fit", "recipes/nam56r-h200.yaml", "--set", "name=\xff\xfe"}, "is not valid UTF-8");
  ExpectBadInput({"fit", "recipes/nam56r-h200.yaml", "--set", "model.layers=" + std::string(50'000, '[')},
                 "not valid YAML");
}

TEST(HardeningCliHostile, SizesPastInt64AreExitTwo) {
  // One GPU, seq_len 2^32 x micro_batch 2^20 x hidden 2^24 activations: 2^76
  // elements, past int64: a clear error, not a number.
  ExpectBadInput({"fit", "recipes/nam56r-h200.yaml", "--set", "model={pattern: D, repeat: 1, hidden: 16777216, "
                  "vocab: 1024, mlp: {ffn_hidden: 16777216}}",
                  "--set", "training.seq_len=4294967296", "--set", "training.micro_batch=1048576", "--set",
                  "training.global_batch=1048576", "--set", "parallel={tp: 1, pp: 1}", "--set",
                  "cluster.nodes=1", "--set", "cluster.gpus_per_node=1"},
                 "64-bit");
}

}  // namespace
}  // namespace preflight::hardening_cli_test

// Exit codes (issue "Hostile input"): every command's failure paths end in one
// of the codes the README's table documents (0 success, 1 a negative verdict,
// 2 bad input or a failed read/write), never 3, which only an internal error
// gives; exit 2 says why on stderr, exit 1 prints its verdict.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace preflight::exit_codes_test {
namespace {

using testing::RunPreflight;

struct Case {
  std::string what;
  std::vector<std::string> args;
  int code;
};

// Scratch inputs the cases refer to: a recipe that does not parse, a directory
// and a file the tests may not write over.
const std::string kDefault = "recipes/nam56r-h200.yaml";
const std::string kLlama = "recipes/llama3-8b-h200.yaml";

class ExitCodes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(Dir());
    std::ofstream(Dir() + "/bad.yaml") << "model:\n  hidden: [\n";
    std::ofstream(Dir() + "/bad.json") << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": }";
    std::ofstream(Dir() + "/args.txt") << "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                                          "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
                                          "--vocab-size 1024\n";
    // Outputs aimed at an input go to this copy, so a regression cannot clobber the source tree.
    std::ofstream(Dir() + "/copy.yaml") << testing::ReadFile(testing::SourcePath(kDefault));
    // Llama 3 8B with micro-batch 4 and no recompute: over capacity (issue "Launch configs").
    std::string llama = testing::ReadFile(testing::SourcePath(kLlama));
    llama.replace(llama.find("micro_batch: 1"), 14, "micro_batch: 4");
    llama.replace(llama.find("recompute: selective"), 20, "recompute: none");
    std::ofstream(Dir() + "/too-big.yaml") << llama;
  }
  static std::string Dir() { return ::testing::TempDir() + "preflight_exit_codes"; }
};

const std::string kHf = "tests/data/hf/llama-3.1-8b.json";
// A copy of the default recipe small enough for the executor to run in seconds.
const std::vector<std::string> kTinySimulate = {"--set",   "model.pattern=AD", "--set",   "parallel.pp=1",
                                                "--scale", "hidden=16",        "--scale", "seq=8",
                                                "--scale", "max_world=8"};

std::vector<std::string> Join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<Case> Cases(const std::string& dir) {
  const std::string bad = dir + "/bad.yaml";
  const std::string too_big = dir + "/too-big.yaml", copy = dir + "/copy.yaml";
  return {
      // The program itself.
      {"no command", {}, 2},
      {"unknown command", {"fitt", kDefault}, 2},
      {"help", {"--help"}, 0},
      {"version", {"--version"}, 0},
      // validate
      {"validate ok", {"validate", kDefault}, 0},
      {"validate missing file", {"validate", dir + "/none.yaml"}, 2},
      {"validate a directory", {"validate", dir}, 2},
      {"validate unparsable", {"validate", bad}, 2},
      {"validate unknown key", {"validate", kDefault, "--set", "model.hiden=4"}, 2},
      {"validate malformed --set", {"validate", kDefault, "--set", "model.hidden"}, 2},
      {"validate unknown option", {"validate", kDefault, "--bogus"}, 2},
      // fit
      {"fit fits", {"fit", kDefault}, 0},
      {"fit does not fit", {"fit", too_big}, 1},
      {"fit unparsable", {"fit", bad}, 2},
      {"fit out-of-range value", {"fit", kDefault, "--set", "parallel.tp=0"}, 2},
      {"fit bad --format", {"fit", kDefault, "--format", "xml"}, 2},
      {"fit --svg to a full disk", {"fit", kDefault, "--svg", "/dev/full"}, 2},
      {"fit --svg into no directory", {"fit", kDefault, "--svg", dir + "/no/such/dir/f.svg"}, 2},
      {"fit --svg onto its recipe", {"fit", copy, "--svg", copy}, 2},
      // plan
      {"plan ok", {"plan", kDefault}, 0},
      {"plan json ok", {"plan", kDefault, "--format", "json"}, 0},
      {"plan efficiency out of range", {"plan", kDefault, "--compute-efficiency", "5"}, 2},
      {"plan efficiency nan", {"plan", kDefault, "--compute-efficiency", "nan"}, 2},
      {"plan unknown emitter", {"plan", kDefault, "--emit", "deepspeed"}, 2},
      {"plan --emit with --format", {"plan", kLlama, "--emit", "megatron", "--format", "json"}, 2},
      {"plan --svg onto its recipe", {"plan", copy, "--svg", copy}, 2},
      {"check --summary onto a recipe", {"check", copy, "--summary", copy}, 2},
      {"plan --emit of a plan that fits", {"plan", kLlama, "--emit", "megatron"}, 0},
      {"plan --emit of a plan that does not fit", {"plan", too_big, "--emit", "megatron"}, 1},
      {"plan --emit --force of a plan that does not fit", {"plan", too_big, "--emit", "megatron", "--force"}, 0},
      {"plan --force without --emit", {"plan", kLlama, "--force"}, 2},
      {"plan invalid layout", {"plan", kDefault, "--set", "parallel.tp=3"}, 2},
      // check
      {"check passes", {"check", kDefault}, 0},
      {"check fails", {"check", too_big}, 1},
      {"check unparsable", {"check", bad}, 2},
      {"check missing baseline", {"check", kDefault, "--baseline", dir + "/no-baseline"}, 2},
      {"check --junit to a full disk", {"check", kDefault, "--junit", "/dev/full"}, 2},
      {"check --max-regression-gib nan", {"check", kDefault, "--max-regression-gib", "nan"}, 2},
      // diff
      {"diff ok", {"diff", kDefault, kDefault, "--set", "parallel.tp=2"}, 0},
      {"diff missing B", {"diff", kDefault, dir + "/none.yaml"}, 2},
      {"diff unparsable A", {"diff", bad, kDefault}, 2},
      {"diff one recipe", {"diff", kDefault}, 2},
      // sweep
      {"sweep ok", {"sweep", kLlama, "--gpus", "64", "--tp", "1,2", "--pp", "1", "--cp", "1"}, 0},
      {"sweep without --gpus", {"sweep", kLlama}, 2},
      {"sweep zero gpus", {"sweep", kLlama, "--gpus", "0"}, 2},
      {"sweep bad list", {"sweep", kLlama, "--gpus", "64", "--tp", "two"}, 2},
      {"sweep --out onto its recipe", {"sweep", copy, "--gpus", "64", "--tp", "1", "--out", copy}, 2},
      {"sweep --svg onto its recipe", {"sweep", copy, "--gpus", "64", "--tp", "1", "--svg", copy}, 2},
      {"sweep --out to a full disk", {"sweep", kLlama, "--gpus", "64", "--tp", "1", "--out", "/dev/full"}, 2},
      {"sweep space too large", {"sweep", kLlama, "--gpus", "1048576", "--tp", "1..1024", "--pp", "1..1024"}, 2},
      // import
      {"import without a format", {"import"}, 2},
      {"import hf ok", {"import", "hf", kHf}, 0},
      {"import hf missing", {"import", "hf", dir + "/none.json"}, 2},
      {"import hf malformed", {"import", "hf", dir + "/bad.json"}, 2},
      {"import hf a device", {"import", "hf", "/dev/zero"}, 2},
      {"import hf -o to a full disk", {"import", "hf", kHf, "-o", "/dev/full"}, 2},
      {"import hf bad --layout", {"import", "hf", kHf, "--layout", "parallel.tp=x"}, 2},
      {"import megatron ok", {"import", "megatron", dir + "/args.txt"}, 0},
      {"import megatron unknown flag value",
       {"import", "megatron", dir + "/args.txt", "--layout", "cluster.gpu=tpu"},
       2},
      // simulate
      {"simulate agrees", Join({"simulate", kDefault}, kTinySimulate), 0},
      {"simulate bad --scale key", {"simulate", kDefault, "--scale", "width=8"}, 2},
      {"simulate bad --stage", Join({"simulate", kDefault, "--stage", "9"}, kTinySimulate), 2},
      {"simulate bad --precision", {"simulate", kDefault, "--precision", "fp16"}, 2},
      {"simulate unparsable", {"simulate", bad}, 2},
  };
}

TEST_F(ExitCodes, EveryFailurePathEndsInADocumentedCodeAndSaysWhy) {
  for (const Case& c : Cases(Dir())) {
    const testing::CommandResult r = RunPreflight(c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.what << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << c.what << ": " << r.err;
    // A bad input says why on stderr; a negative verdict is the output itself.
    if (c.code == 2) {
      EXPECT_FALSE(r.err.empty()) << c.what << ": exit 2 must say why on stderr";
    }
    if (c.code == 1) {
      EXPECT_FALSE(r.out.empty()) << c.what << ": exit 1 must print its verdict";
    }
  }
  // No output landed on an input.
  EXPECT_EQ(testing::ReadFile(Dir() + "/copy.yaml"), testing::ReadFile(testing::SourcePath(kDefault)));
}

// Every command's failure classes are covered: a change that adds a command
// adds its cases here.
TEST_F(ExitCodes, EveryCommandHasItsFailurePathsListed) {
  std::set<std::string> with_failure;
  for (const Case& c : Cases(Dir())) {
    if (!c.args.empty() && c.code == 2) with_failure.insert(c.args.front());
  }
  for (const char* verb : {"validate", "fit", "plan", "check", "diff", "sweep", "import", "simulate"}) {
    EXPECT_TRUE(with_failure.count(verb)) << verb;
  }
}

// The README documents exactly the codes the program uses, in one table.
TEST(ExitCodesReadme, TableListsZeroOneTwoAndThree) {
  const std::string readme = testing::ReadFile(testing::SourcePath("README.md"));
  const size_t section = readme.find("## Exit codes");
  ASSERT_NE(section, std::string::npos) << "README.md has no '## Exit codes' section";
  const size_t end = readme.find("\n## ", section + 1);
  const std::string table = readme.substr(section, end == std::string::npos ? std::string::npos : end - section);
  // Rows read "| `N` | meaning |".
  std::set<int> codes;
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > 6 && line.compare(0, 3, "| `") == 0 && line.compare(4, 3, "` |") == 0)
      codes.insert(line[3] - '0');
  }
  EXPECT_EQ(codes, (std::set<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace preflight::exit_codes_test

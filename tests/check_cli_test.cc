// End-to-end tests of `preflight check` (the CI gate) through the built
// binary: every exit-code branch, baselines from a directory and from a git
// commit made here, JUnit XML structure, the Markdown summary and goldens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace preflight::check_cli_test {
namespace {

namespace fs = std::filesystem;
using testing::ExpectMatchesGolden;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;
using testing::RunPreflight;
using testing::SourcePath;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr const char* kDefault = "recipes/nam56r-h200.yaml";
// The default recipe's cluster line; tests edit copies of it.
constexpr const char* kClusterLine = "reserve_gib: 3.0, min_headroom_gib: 4.0}";

/// A fresh directory under the system temp dir, removed with the fixture.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ =
        fs::temp_directory_path() / ("preflight-check-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void WriteText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

/// The default recipe with its cluster line's tail replaced by `cluster_tail`.
std::string DefaultWith(const std::string& cluster_tail) {
  std::string text = ReadFile(SourcePath(kDefault));
  const auto at = text.find(kClusterLine);
  EXPECT_NE(at, std::string::npos) << "the default recipe's cluster line changed; update kClusterLine";
  if (at != std::string::npos) text.replace(at, std::string(kClusterLine).size(), cluster_tail);
  return text;
}

std::string Original() { return DefaultWith(kClusterLine); }
// reserve_gib 3.0 -> 6.0: runtime_reserve grows by exactly 3 GiB on every rank
// (the reserve is a fixed per-GPU figure, docs/formulas.md §2.4).
std::string LargerReserve() { return DefaultWith("reserve_gib: 6.0, min_headroom_gib: 4.0}"); }
std::string InvalidTp() {
  std::string text = Original();
  text.replace(text.find("tp: 4,"), 6, "tp: 6,");  // 32 heads are not divisible by 6
  return text;
}

TEST(CheckExit, EveryRecipeInTheRepositoryPasses) {
  std::vector<std::string> args = {"check"};
  for (const auto& entry : fs::directory_iterator(SourcePath("recipes"))) {
    if (entry.path().extension() == ".yaml") args.push_back("recipes/" + entry.path().filename().string());
  }
  std::sort(args.begin() + 1, args.end());
  ASSERT_GE(args.size(), 2u);
  const auto r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(CheckExit, DefaultRecipePasses) {
  const auto r = RunPreflight({"check", kDefault});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("all 1 recipes pass"));
}

TEST(CheckExit, BelowHeadroomFloorIsExit1) {
  // The H200 reports 143771 MiB = 140.40 GiB; the 3 GiB runtime reserve alone
  // leaves at most 137.40 GiB of headroom, below a 139 GiB floor.
  TempDir dir;
  WriteText(dir / "floor.yaml", DefaultWith("reserve_gib: 3.0, min_headroom_gib: 139.0}"));
  const auto r = RunPreflight({"check", dir / "floor.yaml", "--format", "json"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["recipes"][0]["status"], "fail");
  EXPECT_TRUE(j["recipes"][0]["fits"].get<bool>());
  EXPECT_FALSE(j["recipes"][0]["headroom_ok"].get<bool>());
  EXPECT_THAT(j["recipes"][0]["failures"][0].get<std::string>(), HasSubstr("below the floor cluster.min_headroom_gib"));
}

TEST(CheckExit, OverCapacityIsExit1) {
  // capacity_mib 2048 (2 GiB) is below the 3 GiB runtime reserve alone.
  TempDir dir;
  WriteText(dir / "small.yaml", DefaultWith("reserve_gib: 3.0, min_headroom_gib: 4.0, capacity_mib: 2048}"));
  const auto r = RunPreflight({"check", dir / "small.yaml"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAIL"));
  EXPECT_THAT(r.out, HasSubstr("does not fit"));
}

TEST(CheckExit, RegressionAgainstBaselineDirectory) {
  TempDir base, head;
  WriteText(base / "r.yaml", Original());
  WriteText(head / "r.yaml", LargerReserve());
  // Default budget 1 GiB: +3 GiB fails.
  auto r = RunPreflight({"check", head / "r.yaml", "--baseline", base.str(), "--format", "json"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& b = j["recipes"][0]["baseline"];
  EXPECT_EQ(b["state"], "compared");
  // Hand count: only the reserve changed, by 6.0 - 3.0 GiB.
  EXPECT_EQ(b["delta_bytes"]["runtime_reserve"].get<int64_t>(), 3 * kGiB);
  EXPECT_EQ(b["delta_bytes"]["activations"].get<int64_t>(), 0);
  EXPECT_EQ(b["delta_bytes"]["ep_sharded_params"].get<int64_t>(), 0);
  EXPECT_GE(b["delta_total_bytes"].get<int64_t>(), 3 * kGiB);
  EXPECT_THAT(j["recipes"][0]["failures"][0].get<std::string>(), HasSubstr("regressed by +3"));

  // A 5 GiB budget passes; a 2 GiB budget on runtime_reserve alone fails again.
  r = RunPreflight({"check", head / "r.yaml", "--baseline", base.str(), "--max-regression-gib", "5"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunPreflight({"check", head / "r.yaml", "--baseline", base.str(), "--max-regression-gib", "5",
                    "--max-regression-gib-category", "runtime_reserve=2"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("runtime_reserve regressed by +3.00 GiB"));
  r = RunPreflight({"check", head / "r.yaml", "--baseline", base.str(), "--max-regression-gib", "5",
                    "--max-regression-gib-category", "runtime_reserve=3.5", "--max-regression-gib-category",
                    "activations=0"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(CheckExit, ImprovementPassesWithNegativeDelta) {
  TempDir base, head;
  WriteText(base / "r.yaml", LargerReserve());
  WriteText(head / "r.yaml", Original());
  const auto r = RunPreflight({"check", head / "r.yaml", "--baseline", base.str(), "--max-regression-gib", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("runtime_reserve -3.00"));
}

TEST(CheckExit, RecipeMissingFromBaselineIsNew) {
  TempDir base, head;
  WriteText(head / "added.yaml", LargerReserve());
  const auto r = RunPreflight(
      {"check", head / "added.yaml", "--baseline", base.str(), "--max-regression-gib", "0", "--format", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["recipes"][0]["baseline"]["state"], "new");
}

TEST(CheckExit, InvalidRecipeIsExit2AndOthersAreStillChecked) {
  TempDir dir;
  WriteText(dir / "bad.yaml", InvalidTp());
  WriteText(dir / "floor.yaml", DefaultWith("reserve_gib: 3.0, min_headroom_gib: 139.0}"));
  const auto r = RunPreflight({"check", dir / "bad.yaml", kDefault, dir / "floor.yaml", "--format", "json"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("parallel.tp"));
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["recipes"].size(), 3u);
  EXPECT_EQ(j["recipes"][0]["status"], "invalid");
  EXPECT_THAT(j["recipes"][0]["errors"][0].get<std::string>(), HasSubstr("bad.yaml"));
  EXPECT_EQ(j["recipes"][1]["status"], "pass");
  EXPECT_EQ(j["recipes"][2]["status"], "fail");
  EXPECT_EQ(j["summary"]["exit_code"], 2);
}

// Check prices the job the framework will run, so a stage split Megatron-LM
// refuses is invalid: 5 layers on the first of 4 stages leaves 43 of the 48
// for 3 middle stages, which do not divide them.
TEST(CheckExit, RecipeThePlannerRejectsIsExit2) {
  TempDir dir;
  std::string text = Original();
  const std::string schedule = "schedule: 1f1b}";
  text.replace(text.find(schedule), schedule.size(), "schedule: 1f1b, first_stage_layers: 5}");
  WriteText(dir / "pinned.yaml", text);
  const auto r = RunPreflight({"check", dir / "pinned.yaml", kDefault, "--format", "json"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("parallel.first_stage_layers"));
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["recipes"][0]["status"], "invalid");
  EXPECT_THAT(j["recipes"][0]["errors"][0].get<std::string>(), HasSubstr("leaves 43 layers for 3 middle stages"));
  EXPECT_EQ(j["recipes"][1]["status"], "pass");
}

TEST(CheckExit, MissingRecipeFileIsExit2) {
  const auto r = RunPreflight({"check", "recipes/does-not-exist.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("does-not-exist.yaml"));
  EXPECT_THAT(r.out, HasSubstr("INVALID"));
}

TEST(CheckArgs, BadCategoryBudgetIsExit2WithValidNames) {
  auto r = RunPreflight({"check", kDefault, "--max-regression-gib-category", "activation=1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("activation=1"));
  EXPECT_THAT(r.err, HasSubstr("activations"));
  r = RunPreflight({"check", kDefault, "--max-regression-gib-category", "activations=-1"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunPreflight({"check", kDefault, "--max-regression-gib-category", "activations=1x"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(CheckArgs, BaselineMustBeADirectoryAndExclusiveWithRef) {
  auto r = RunPreflight({"check", kDefault, "--baseline", "recipes/no-such-dir"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not a directory"));
  r = RunPreflight({"check", kDefault, "--baseline", "recipes", "--baseline-ref", "HEAD"});
  EXPECT_EQ(r.exit_code, 2);
  r = RunPreflight({"check", kDefault, "--max-regression-gib", "-1"});
  EXPECT_EQ(r.exit_code, 2);
}

/// Runs a shell command in `dir`; true on exit 0.
bool Sh(const std::string& dir, const std::string& command) {
  return std::system(("cd '" + dir + "' && " + command + " >/dev/null 2>&1").c_str()) == 0;
}

bool HaveGit() { return std::system("git --version >/dev/null 2>&1") == 0; }

TEST(CheckGit, BaselineRefReadsTheCommittedRecipe) {
  if (!HaveGit()) GTEST_SKIP() << "git is not installed";
  TempDir repo;
  WriteText(repo / "recipes/r.yaml", Original());
  ASSERT_TRUE(Sh(repo.str(),
                 "git init -q . && git add recipes/r.yaml && "
                 "git -c user.name=t -c user.email=t@example.com commit -q -m base"));
  // The working copy grows by 3 GiB; a second recipe was never committed.
  WriteText(repo / "recipes/r.yaml", LargerReserve());
  WriteText(repo / "recipes/added.yaml", Original());
  for (const char* ref : {"HEAD~0", "HEAD"}) {
    const auto r = RunPreflight(
        {"check", repo / "recipes/r.yaml", repo / "recipes/added.yaml", "--baseline-ref", ref, "--format", "json"});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["baseline"], std::string("git ") + ref);
    EXPECT_EQ(j["recipes"][0]["baseline"]["state"], "compared");
    EXPECT_EQ(j["recipes"][0]["baseline"]["delta_bytes"]["runtime_reserve"].get<int64_t>(), 3 * kGiB);
    EXPECT_EQ(j["recipes"][0]["status"], "fail");
    EXPECT_EQ(j["recipes"][1]["baseline"]["state"], "new");
    EXPECT_EQ(j["recipes"][1]["status"], "pass");
  }
  // After committing the change, the same check against the new commit passes.
  ASSERT_TRUE(Sh(repo.str(), "git add -A && git -c user.name=t -c user.email=t@example.com commit -q -m head"));
  auto r = RunPreflight({"check", repo / "recipes/r.yaml", "--baseline-ref", "HEAD"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunPreflight({"check", repo / "recipes/r.yaml", "--baseline-ref", "HEAD~1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // An unknown ref is bad input.
  r = RunPreflight({"check", repo / "recipes/r.yaml", "--baseline-ref", "no-such-branch"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no-such-branch"));
}

TEST(CheckGit, InvalidBaselineIsReportedNotCompared) {
  if (!HaveGit()) GTEST_SKIP() << "git is not installed";
  TempDir repo;
  WriteText(repo / "r.yaml", InvalidTp());
  ASSERT_TRUE(Sh(repo.str(),
                 "git init -q . && git add r.yaml && "
                 "git -c user.name=t -c user.email=t@example.com commit -q -m base"));
  WriteText(repo / "r.yaml", Original());
  const auto r = RunPreflight({"check", repo / "r.yaml", "--baseline-ref", "HEAD", "--format", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["recipes"][0]["baseline"]["state"], "unreadable");
  EXPECT_THAT(j["recipes"][0]["baseline"]["note"].get<std::string>(), HasSubstr("parallel.tp"));
}

/// Minimal XML well-formedness: balanced tags, no raw '<' or '&' outside
/// markup/entities, attribute values quoted. Returns an error or "".
std::string XmlProblem(const std::string& xml) {
  std::vector<std::string> stack;
  size_t i = 0;
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const auto semi = xml.find(';', i);
      const std::string entity = xml.substr(i, semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" && entity != "&apos;") {
        return "bad entity at " + std::to_string(i);
      }
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const auto close = xml.find('>', i);
    if (close == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(i + 1, close - i - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag";
    if (testing::CountOccurrences(tag, "\"") % 2 != 0) return "unbalanced quotes in <" + tag + ">";
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      stack.pop_back();
    } else if (tag.back() != '/') {
      stack.push_back(tag.substr(0, tag.find(' ')));
    }
    i = close + 1;
  }
  return stack.empty() ? "" : "unclosed <" + stack.back() + ">";
}

TEST(CheckJUnit, OneTestcasePerRecipeWithFailuresAndErrors) {
  TempDir dir;
  // A file name with XML metacharacters must come out escaped.
  WriteText(dir / "a&b<c>'q\".yaml", Original());
  WriteText(dir / "floor.yaml", DefaultWith("reserve_gib: 3.0, min_headroom_gib: 139.0}"));
  WriteText(dir / "bad.yaml", InvalidTp());
  const std::string junit = dir / "out/junit.xml";
  fs::create_directories(dir / "out");
  const auto r =
      RunPreflight({"check", dir / "a&b<c>'q\".yaml", dir / "floor.yaml", dir / "bad.yaml", "--junit", junit});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const std::string xml = ReadFile(junit);
  EXPECT_EQ(XmlProblem(xml), "") << xml;
  EXPECT_EQ(testing::CountOccurrences(xml, "<testcase "), 3);
  EXPECT_EQ(testing::CountOccurrences(xml, "<failure "), 1);
  EXPECT_EQ(testing::CountOccurrences(xml, "<error "), 1);
  EXPECT_THAT(xml, HasSubstr("tests=\"3\" failures=\"1\" errors=\"1\""));
  EXPECT_THAT(xml, HasSubstr("a&amp;b&lt;c&gt;&apos;q&quot;.yaml"));
  EXPECT_THAT(xml, HasSubstr("below the floor"));
  EXPECT_THAT(xml, HasSubstr("parallel.tp"));
}

TEST(CheckSummary, MarkdownTableHasVerdictTotalsDeltaAndMovedCategories) {
  TempDir base, head;
  WriteText(base / "r.yaml", Original());
  WriteText(head / "r.yaml", LargerReserve());
  const std::string summary = head / "summary.md";
  const auto r = RunPreflight({"check", head / "r.yaml", "--baseline", base.str(), "--summary", summary});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::string md = ReadFile(summary);
  EXPECT_THAT(md, HasSubstr("## preflight check: 1 of 1 recipes failing"));
  EXPECT_THAT(
      md, HasSubstr("| recipe | verdict | peak (worst stage) | headroom | delta vs baseline | top moved categories |"));
  EXPECT_THAT(md, HasSubstr("| **FAIL** |"));
  EXPECT_THAT(md, HasSubstr("+3.00 GiB"));
  EXPECT_THAT(md, HasSubstr("runtime_reserve +3.00"));
  EXPECT_THAT(md, HasSubstr("### Details"));
  EXPECT_THAT(md, Not(HasSubstr(base.str() + "/")));  // recipe paths only, the baseline dir in the header
}

// Goldens pin the user-visible output on the example recipes (paths relative
// to the source dir, so they are stable). Comparing with "recipes" as its own
// baseline pins the compared-but-unchanged rendering.
const std::vector<std::string> kGoldenRecipes = {"recipes/llama3-8b-h200.yaml", "recipes/mixtral-8x7b-h200.yaml",
                                                 "recipes/nam56r-h200.yaml"};

TEST(CheckGolden, Table) {
  std::vector<std::string> args = {"check"};
  args.insert(args.end(), kGoldenRecipes.begin(), kGoldenRecipes.end());
  const auto r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "check_table.txt");
}

TEST(CheckGolden, JsonWithBaseline) {
  std::vector<std::string> args = {"check", "--baseline", "recipes", "--format", "json"};
  args.insert(args.end(), kGoldenRecipes.begin(), kGoldenRecipes.end());
  const auto r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "check_baseline.json");
}

TEST(CheckGolden, Markdown) {
  std::vector<std::string> args = {"check", "--baseline", "recipes", "--format", "md"};
  args.insert(args.end(), kGoldenRecipes.begin(), kGoldenRecipes.end());
  const auto r = RunPreflight(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectMatchesGolden(r.out, "check_summary.md");
}

}  // namespace
}  // namespace preflight::check_cli_test

// `preflight --version` names the release and the git commit it was built
// from, and every JSON output carries preflight_version and schema_version.
// The release is read from CMakeLists.txt's project() line and the commit
// from git itself, not from the code under test.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::version_test {
namespace {

using ::testing::HasSubstr;
using testing::RunPreflight;
using ::testing::StartsWith;

std::string ProjectVersion() {
  const std::string cmake = testing::ReadFile(testing::SourcePath("CMakeLists.txt"));
  const std::string marker = "project(preflight VERSION ";
  const size_t at = cmake.find(marker);
  if (at == std::string::npos) return "";
  const size_t begin = at + marker.size();
  return cmake.substr(begin, cmake.find(' ', begin) - begin);
}

/// `git rev-parse --short=12 HEAD` in the source tree; "" outside git.
std::string GitHead() {
  const std::string command = "git -C '" + testing::SourcePath(".") + "' rev-parse --short=12 HEAD 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return "";
  char buffer[64] = {};
  const size_t n = fread(buffer, 1, sizeof buffer - 1, pipe.get());
  std::string out(buffer, n);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

TEST(Version, NamesTheReleaseAndTheCommit) {
  const std::string version = ProjectVersion();
  ASSERT_FALSE(version.empty());
  const auto r = RunPreflight({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, StartsWith("preflight " + version + " (git "));
  const std::string head = GitHead();
  // Built from a git checkout (CI's clone is one): the commit is HEAD's, with
  // -dirty when the tree had local changes at build time.
  if (!head.empty()) {
    EXPECT_THAT(r.out, HasSubstr("(git " + head)) << r.out;
  }
}

TEST(Version, EveryJsonOutputCarriesTheVersionAndSchema) {
  const std::string version = ProjectVersion();
  const std::vector<std::vector<std::string>> commands = {
      {"fit", "recipes/llama3-8b-h200.yaml", "--format", "json"},
      {"plan", "recipes/llama3-8b-h200.yaml", "--format", "json"},
      {"check", "recipes/llama3-8b-h200.yaml", "--format", "json"},
      {"diff", "recipes/llama3-8b-h200.yaml", "--set", "parallel.tp=2", "--format", "json"},
      {"sweep", "recipes/llama3-8b-h200.yaml", "--gpus", "8", "--top", "2", "--threads", "1", "--format", "json"},
      {"simulate", "recipes/llama3-8b-h200.yaml", "--scale", "max_world=8", "--format", "json"},
  };
  for (const auto& command : commands) {
    const auto r = RunPreflight(command);
    ASSERT_NE(r.exit_code, 2) << command[0] << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["preflight_version"], version) << command[0];
    EXPECT_EQ(j["schema_version"], 1) << command[0];
  }
}

}  // namespace
}  // namespace preflight::version_test

#include "support/test_support.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

namespace preflight::testing {

std::string SourcePath(const std::string& relative) { return std::string(PREFLIGHT_SOURCE_DIR) + "/" + relative; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}
std::string TempPath(const char* stem) {
  return (std::filesystem::temp_directory_path() / (std::string(stem) + "-" + std::to_string(getpid()) + "-" +
                                                     std::to_string(std::rand()))).string();
}
}  // namespace

CommandResult RunPreflight(const std::vector<std::string>& args, const std::string& stdin_text) {
  const std::string out_path = TempPath("preflight-out");
  const std::string err_path = TempPath("preflight-err");
  const std::string in_path = TempPath("preflight-in");
  {
    std::ofstream in(in_path);
    in << stdin_text;
  }
  std::string cmd = "cd ";
  cmd += ShellQuote(PREFLIGHT_SOURCE_DIR);
  cmd += " && ";
  cmd += ShellQuote(PREFLIGHT_BINARY);
  for (const auto& a : args) cmd.append(" ").append(ShellQuote(a));
  cmd.append(" <").append(ShellQuote(in_path)).append(" >").append(ShellQuote(out_path));
  cmd.append(" 2>").append(ShellQuote(err_path));
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  std::filesystem::remove(in_path);
  return r;
}

void ExpectMatchesGolden(const std::string& actual, const std::string& name) {
  const std::string path = SourcePath("tests/golden/" + name);
  const char* update = std::getenv("PREFLIGHT_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream out(path, std::ios::binary);
    out << actual;
    return;
  }
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "golden file " << path << " is missing; run with PREFLIGHT_UPDATE_GOLDEN=1";
    return;
  }
  EXPECT_EQ(actual, ReadFile(path)) << "output differs from " << path
                                    << "; if the change is intended, rerun with PREFLIGHT_UPDATE_GOLDEN=1";
}

bool RelativelyClose(double a, double b, double rel) {
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
}

std::string FirstErrorText(const LoadResult& loaded) {
  for (const Diagnostic& d : loaded.diagnostics) {
    if (d.severity == Severity::kError) return Format(d);
  }
  return "";
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

}  // namespace preflight::testing

// Shared test helpers: paths into the source tree, running the CLI, golden files.
#pragma once

#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"

namespace preflight::testing {

/// Absolute path of `relative` inside the source tree ("recipes/nam56r-h200.yaml").
std::string SourcePath(const std::string& relative);
/// Reads a whole file; fails the test when it cannot.
std::string ReadFile(const std::string& path);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
/// Runs the built `preflight` binary with `args` (shell-quoted here), in the source dir.
CommandResult RunPreflight(const std::vector<std::string>& args, const std::string& stdin_text = "");

/// Compares `actual` with tests/golden/`name`; PREFLIGHT_UPDATE_GOLDEN=1 rewrites it.
void ExpectMatchesGolden(const std::string& actual, const std::string& name);

/// The first error of a load, formatted ("file:line:col: key = value: message"); "" when none.
std::string FirstErrorText(const LoadResult& loaded);

/// How many times `needle` occurs in `text`, without overlaps.
int CountOccurrences(const std::string& text, const std::string& needle);

/// |a - b| <= rel * max(|a|, |b|): relative closeness, symmetric in a and b.
bool RelativelyClose(double a, double b, double rel);

}  // namespace preflight::testing

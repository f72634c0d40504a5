// Options and helpers shared by verbs: the recipe argument with --set
// overrides, --format, and loading with diagnostics printed to stderr.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/recipe.h"

namespace preflight::cli {

/// Reads an input file whole, bounded: regular files only (a device, FIFO
/// or directory would hang or never end), at most `max_bytes`; `-` reads
/// standard input under the same bound. nullopt after printing why (path
/// and reason) on stderr.
std::optional<std::string> ReadInputFile(const std::string& path, int64_t max_bytes = int64_t{16} << 20);

/// Rejects nan and infinities: CLI::Range lets nan through (every comparison
/// with it is false). Put before the range check.
CLI::Validator FiniteNumber();

struct RecipeArgs {
  std::string path;
  std::vector<std::string> sets;  // "key.path=value"
};

/// Adds the positional RECIPE and repeatable --set KEY=VALUE.
void AddRecipeArgs(CLI::App& command, RecipeArgs& args);

/// The --set texts as overrides; nullopt after printing which is malformed.
std::optional<std::vector<Override>> ParseOverridesOrReport(const std::vector<std::string>& sets);
/// Loads the recipe at `path`, or from stdin when it is `-` (named <stdin>);
/// nullopt when stdin cannot be read (ReadInputFile printed why).
std::optional<LoadResult> LoadRecipeFrom(const std::string& path, const std::vector<Override>& overrides);
/// Loads the recipe; prints every diagnostic to stderr (errors and warnings).
/// nullopt means bad input: the caller exits with ExitCode::kBadInput.
std::optional<Recipe> LoadRecipeOrReport(const RecipeArgs& args);

/// The stage plan a command prices: the one `plan` takes (MakePlan: the
/// recipe's pinned boundaries, or the time-balanced partition with memory as
/// a constraint), so fit, check and plan always price the same stages.
StagePlan StagesFor(const Inventory& inventory, const Layout& layout);

/// Plans the layout with MakePlan and prints the planner's errors and
/// warnings to stderr; nullopt means bad input (ExitCode::kBadInput).
std::optional<Plan> PlanOrReport(const Inventory& inventory, const Layout& layout);

/// Text from the command line or an input file as it may reach the terminal:
/// control characters escaped (EscapeControl), line breaks kept.
inline std::string Shown(std::string_view text) { return EscapeControl(text, /*keep_newlines=*/true); }

/// Writes `text` to `path` atomically (a temporary file beside it, renamed
/// over it: a failed write leaves the old file whole); never through a
/// symbolic link, never onto one of `inputs` (every file the run reads: a
/// caller must name them, so an output can never clobber its own input). Prints an error naming the path
/// and the system's reason and returns false on failure.
bool WriteTextFile(const std::string& path, const std::string& text, const std::vector<std::string>& inputs);

/// Adds -o/--out FILE: the command's output to FILE instead of stdout (the
/// same flag on every command that prints a report or a recipe).
void AddOutputOption(CLI::App& command, std::string& path);
/// The command's output: to stdout (written and flushed), or to `path` with
/// WriteTextFile's rules (never onto one of `inputs`). False after printing why.
bool EmitOutput(const std::string& path, const std::string& text, const std::vector<std::string>& inputs);

enum class OutputFormat { kTable, kJson, kCsv, kMd };
/// Adds --format with the given choices (the first is the default).
void AddFormatOption(CLI::App& command, OutputFormat& format, const std::vector<OutputFormat>& allowed);
const char* Name(OutputFormat f);

}  // namespace preflight::cli

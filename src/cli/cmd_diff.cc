// preflight diff A [B] [--set ...]: which memory categories and communication
// axes moved from A to B, and which differing keys moved them. --set applies
// to B (B defaults to A, so `diff R --set parallel.tp=8` is a what-if).
// Exit 0, or 2 on bad input.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/report/diff.h"
#include "verbs.h"

namespace preflight::cli {
namespace {

struct DiffArgs {
  std::string a;
  std::string b;
  std::vector<std::string> sets;
  OutputFormat format = OutputFormat::kTable;
  std::string out_path;
};

int RunDiff(const DiffArgs& args) {
  if (args.b.empty() && args.sets.empty()) {
    std::fprintf(stderr, "preflight diff: give a second recipe B or --set overrides for B, e.g. --set parallel.tp=8\n");
    return static_cast<int>(ExitCode::kBadInput);
  }
  DiffInput a, b;
  a.file = a.label = args.a;
  b.file = b.label = args.b.empty() ? args.a : args.b;
  for (const std::string& text : args.sets) {
    auto o = ParseOverride(text);
    if (!o) {
      std::fprintf(stderr, "--set %s: expected KEY.PATH=VALUE on one line, e.g. --set parallel.tp=8\n",
                   Shown(text).c_str());
      return static_cast<int>(ExitCode::kBadInput);
    }
    b.overrides.push_back(*o);
    b.label += " --set " + text;
  }
  const auto text_a = ReadInputFile(a.file);
  const auto text_b = ReadInputFile(b.file);
  if (!text_a || !text_b) return static_cast<int>(ExitCode::kBadInput);
  a.text = *text_a;
  b.text = *text_b;
  const DiffResult result = MakeDiff(a, b);
  for (const auto& d : result.diagnostics) std::fprintf(stderr, "%s\n", Format(d).c_str());
  if (!result.report) return static_cast<int>(ExitCode::kBadInput);
  std::string text;
  switch (args.format) {
    case OutputFormat::kJson: text = DiffJson(*result.report).dump(2) + "\n"; break;
    case OutputFormat::kMd: text = RenderDiffMarkdown(*result.report); break;
    default: text = RenderDiffTable(*result.report); break;
  }
  return static_cast<int>(EmitOutput(args.out_path, text, {a.file, b.file}) ? ExitCode::kOk : ExitCode::kBadInput);
}

}  // namespace

void SetupDiff(CLI::App& command, int& exit_code) {
  auto args = std::make_shared<DiffArgs>();
  command.add_option("a", args->a, "Recipe A (the reference)")->required();
  command.add_option("b", args->b, "Recipe B (default: A with the --set overrides)");
  AddOutputOption(command, args->out_path);
  command.add_option("--set", args->sets, "Override a key of B, e.g. --set parallel.tp=8 (repeatable)")
      ->type_name("KEY=VALUE");
  AddFormatOption(command, args->format, {OutputFormat::kTable, OutputFormat::kJson, OutputFormat::kMd});
  command.callback([args, &exit_code] { exit_code = RunDiff(*args); });
}

}  // namespace preflight::cli

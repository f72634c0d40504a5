// The table of verbs (docs/architecture.md, ninja's Tool table). Each verb lives in its
// own cmd_<verb>.cc and registers its options on a CLI11 subcommand; its run
// callback stores the process exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace preflight::cli {

using VerbSetup = void (*)(CLI::App& command, int& exit_code);

struct Verb {
  const char* name;
  const char* help;
  VerbSetup setup;
};

void SetupPlan(CLI::App& command, int& exit_code);

void SetupValidate(CLI::App& command, int& exit_code);
void SetupFit(CLI::App& command, int& exit_code);
void SetupCheck(CLI::App& command, int& exit_code);
void SetupDiff(CLI::App& command, int& exit_code);
void SetupSweep(CLI::App& command, int& exit_code);
/// `preflight import hf CONFIG.json [--layout KEY=VALUE ...] [-o FILE]` (cmd_import.cc).
void SetupImport(CLI::App& command, int& exit_code);
void SetupSimulate(CLI::App& command, int& exit_code);

}  // namespace preflight::cli

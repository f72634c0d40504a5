// preflight: the command-line entry point. Only dispatch lives here; each
// verb is its own file (docs/architecture.md).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

#include <CLI/CLI.hpp>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/units.h"
#include "verbs.h"

namespace {

using preflight::cli::Verb;

// One line a verb: name, one-line help, setup function (in cmd_<verb>.cc).
const std::vector<Verb> kVerbs = {
    {"validate", "Check a recipe without estimating (exit 0 valid, 2 invalid)", preflight::cli::SetupValidate},
    {"fit", "Memory geometry of every stage and the worst rank (exit 0 fits, 1 does not, 2 bad recipe)",
     preflight::cli::SetupFit},
    {"plan", "Mesh placement, stage partition, communication per axis and step time (exit 0 / 2)", preflight::cli::SetupPlan},
    {"check", "CI gate: validate, fit, headroom floor, regression vs a baseline; JUnit and Markdown (exit 0 pass, 1 fail, 2 bad input)",
     preflight::cli::SetupCheck},
    {"diff", "Which memory categories and communication axes moved between two recipes, and why (exit 0 / 2)",
     preflight::cli::SetupDiff},
    {"sweep", "Every valid layout for N GPUs: best by tokens/s and the memory/time Pareto front (exit 0 / 2)",
     preflight::cli::SetupSweep},
    {"import", "Write a recipe from a model's published config: import hf CONFIG.json (exit 0 / 2)",
     preflight::cli::SetupImport},
    {"simulate",
     "Run a scaled copy on simulated ranks; numerics vs unsharded, bytes vs plan, memory vs fit "
     "(exit 0 agree, 1 disagree, 2 bad input)",
     preflight::cli::SetupSimulate},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"preflight: plan hybrid-model training launches and estimate per-GPU memory", "preflight"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "preflight 0.1.0");
  int exit_code = static_cast<int>(preflight::ExitCode::kOk);
  for (const Verb& verb : kVerbs) verb.setup(*app.add_subcommand(verb.name, verb.help), exit_code);
  // `preflight help [COMMAND]`, as git and cargo users type it: the same text as --help.
  if (argc > 1 && std::string(argv[1]) == "help") {
    if (argc == 2) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    for (const Verb& v : kVerbs) {
      if (argv[2] == std::string(v.name)) {
        std::fputs(app.get_subcommand(v.name)->help(app.get_name()).c_str(), stdout);
        return 0;
      }
    }
    std::fprintf(stderr, "preflight help: unknown command '%s' (preflight help lists them)\n",
                 preflight::EscapeControl(argv[2]).c_str());
    return static_cast<int>(preflight::ExitCode::kBadInput);
  }
  // CLI11 reports an unknown first word only as "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-' && std::none_of(std::begin(kVerbs), std::end(kVerbs), [&](const Verb& v) {
        return argv[1] == std::string(v.name);
      })) {
    std::string names;
    for (const Verb& v : kVerbs) names += std::string(names.empty() ? "" : ", ") + v.name;
    const std::string word = preflight::EscapeControl(argv[1]);  // control characters stay off the terminal
    std::fprintf(stderr, "preflight: unknown command '%s'; commands: %s (preflight --help)\n", word.c_str(),
                 names.c_str());
    return static_cast<int>(preflight::ExitCode::kBadInput);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int cli_code = app.exit(e);
    // Help and version are successes; every other usage error is bad input.
    return cli_code == 0 ? 0 : static_cast<int>(preflight::ExitCode::kBadInput);
  } catch (const preflight::ArithmeticOverflow& e) {
    std::fprintf(stderr, "preflight: %s: the recipe's sizes exceed 64-bit byte arithmetic\n", e.what());
    return static_cast<int>(preflight::ExitCode::kBadInput);
  } catch (const std::bad_alloc&) {
    // A size inside the documented limits that still exhausts this machine.
    std::fprintf(stderr, "preflight: out of memory; the recipe or the sweep is too large for this machine\n");
    return static_cast<int>(preflight::ExitCode::kBadInput);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preflight: internal error: %s\n", e.what());
    return 3;
  }
  // Output that did not reach its destination (a full disk, a closed pipe)
  // is a failure, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::fprintf(stderr, "preflight: writing standard output failed: %s\n", std::strerror(errno));
    return static_cast<int>(preflight::ExitCode::kBadInput);
  }
  return exit_code;
}

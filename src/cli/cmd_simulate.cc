// preflight simulate R: run a scaled copy of the recipe on simulated ranks and
// compare numerics with an unsharded run, counted bytes with the planner and
// measured memory with the estimator. Exit 0 agree, 1 disagree, 2 bad input.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/simulator/sim.h"
#ifdef PREFLIGHT_WITH_MPI
#include "preflight/simulator/mpi.h"
#endif
#include "preflight/report/sim_report.h"
#include "verbs.h"

namespace preflight::cli {
namespace {

struct SimulateArgs {
  RecipeArgs recipe;
  std::vector<std::string> scale;  // "hidden=32"
  std::string stage = "all";
  std::string precision = "fp64";
  OutputFormat format = OutputFormat::kTable;
  std::string out_path;
  std::string runtime = "auto";  // threads, mpi, or auto: mpi when mpirun started us
  double hang_timeout = 300;     // seconds a rank may wait in one operation under MPI
};

/// Applies "--scale key=value" items; false (with a message) on a bad one.
bool ApplyScale(const std::vector<std::string>& items, ScaleOptions* s) {
  const std::map<std::string, int64_t*> keys = {
      {"hidden", &s->hidden},         {"head_dim", &s->head_dim}, {"ffn", &s->ffn_hidden},
      {"moe_ffn", &s->moe_ffn_hidden}, {"vocab", &s->vocab},       {"seq", &s->seq_len},
      {"repeat", &s->repeat},         {"max_world", &s->max_world}, {"micro_batches", &s->microbatches}};
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const auto it = keys.find(key);
    if (eq == std::string::npos || it == keys.end()) {
      std::fprintf(stderr,
                   "--scale %s: expected KEY=VALUE with KEY one of hidden, head_dim, ffn, moe_ffn, vocab, seq, repeat, "
                   "max_world, micro_batches\n",
                   Shown(item).c_str());
      return false;
    }
    const std::string value = item.substr(eq + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    // Sizes stay small: the executor runs dense fp64 math on one machine.
    // max_world counts ranks, which the MPI runtime spreads over processes
    // and hosts (a 16,384-GPU layout keeps its dp).
    const long long most = key == "max_world" ? 65536 : 1024;
    if (used != value.size() || v < 1 || v > most) {
      std::fprintf(stderr, "--scale %s = %s: must be an integer in 1..%lld\n", Shown(key).c_str(), Shown(value).c_str(),
                   most);
      return false;
    }
    *it->second = v;
  }
  if (s->head_dim % 2 != 0) {
    std::fprintf(stderr, "--scale head_dim = %lld: must be even (RoPE rotates half-dimensions)\n",
                 static_cast<long long>(s->head_dim));
    return false;
  }
  return true;
}

/// Prints why the run did not finish; the exit code. The thread runtime's
/// exceptions and the MPI runtime's reports from rank 0 come here alike.
int ReportRunFailure(const std::string& path, SimFailure kind, const std::string& what) {
  switch (kind) {
    case SimFailure::kUnsupported:
      std::fprintf(stderr, "%s: cannot simulate: %s\n", Shown(path).c_str(), what.c_str());
      return static_cast<int>(ExitCode::kBadInput);
    case SimFailure::kOutOfMemory:
      // A resource limit of this machine, not a verdict on the plan.
      std::fprintf(stderr, "%s: out of memory simulating at this scale; lower --scale\n", Shown(path).c_str());
      return static_cast<int>(ExitCode::kBadInput);
    case SimFailure::kFailed: break;
  }
  // A deadlock or a mismatched collective: the sharded program itself is
  // inconsistent, which is a disagreement, not bad input.
  std::fprintf(stderr, "%s: the simulated ranks failed: %s\n", Shown(path).c_str(), what.c_str());
  return static_cast<int>(ExitCode::kVerdictFail);
}

/// Open MPI's mpirun (or another PMIx launcher) started this process.
bool StartedByMpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr; }

int MpirunRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

/// Under MPI only rank 0 speaks: the other ranks' stdout and stderr go to
/// /dev/null. Returns their original stderr (for a last-resort message), or -1.
int SilenceOtherRanks() {
  if (MpirunRank() == 0) return -1;
  const int saved = dup(STDERR_FILENO);
  const int null = open("/dev/null", O_WRONLY);
  if (null >= 0) {
    std::fflush(stdout);
    std::fflush(stderr);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    close(null);
  }
  return saved;
}

/// The scaled recipe's run and its report; `options.transport` picks the runtime.
int SimulateAndReport(const SimulateArgs& args, const Recipe& scaled, const SimOptions& options) {
  SimulationReport report;
  try {
    report = Simulate(scaled, options);
  } catch (const SimUnsupported& e) {
    return ReportRunFailure(args.recipe.path, SimFailure::kUnsupported, e.what());
  } catch (const std::bad_alloc&) {
    return ReportRunFailure(args.recipe.path, SimFailure::kOutOfMemory, "");
  } catch (const std::exception& e) {
    return ReportRunFailure(args.recipe.path, SimFailure::kFailed, e.what());
  }
  if (options.transport != nullptr && report.ranks == 0) return static_cast<int>(ExitCode::kOk);  // not rank 0
  std::optional<int64_t> shown;
  if (args.stage != "all") {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(args.stage, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != args.stage.size() || v < 0 || v >= scaled.parallel.pp) {
      std::fprintf(stderr, "--stage %s: must be a pipeline stage in 0..%lld or 'all'\n", Shown(args.stage).c_str(),
                   static_cast<long long>(scaled.parallel.pp - 1));
      return static_cast<int>(ExitCode::kBadInput);
    }
    shown = v;
  }
  const SimComparison comparison = CompareWithModels(scaled, report, options.precision);
  const bool agree = comparison.agrees();
  const std::string text = args.format == OutputFormat::kJson ? RenderSimulationJson(scaled, report, comparison)
                                                              : RenderSimulationTable(scaled, report, comparison, shown);
  if (!EmitOutput(args.out_path, text, {args.recipe.path})) return static_cast<int>(ExitCode::kBadInput);
  if (!agree) std::fprintf(stderr, "simulate: the sharded run disagrees with the reference or the models (see DISAGREE)\n");
  return static_cast<int>(agree ? ExitCode::kOk : ExitCode::kVerdictFail);
}

int RunSimulate(const SimulateArgs& args) {
  const bool mpirun = StartedByMpirun();
  const bool mpi = args.runtime == "mpi" || (args.runtime == "auto" && mpirun);
  const int fallback_fd = mpi && mpirun ? SilenceOtherRanks() : -1;
  auto recipe = LoadRecipeOrReport(args.recipe);
  if (!recipe) return static_cast<int>(ExitCode::kBadInput);
  ScaleOptions scale;
  if (!ApplyScale(args.scale, &scale)) return static_cast<int>(ExitCode::kBadInput);
  const Recipe scaled = ScaleRecipe(*recipe, scale);
  SimOptions options;
  options.precision = args.precision == "fp32" ? SimPrecision::kFp32 : SimPrecision::kFp64;
  if (!mpi) return SimulateAndReport(args, scaled, options);
  // A refused recipe says why before asking for processes it would not use.
  try {
    CheckExecutorSupports(scaled, /*in_process=*/false);
  } catch (const SimUnsupported& e) {
    return ReportRunFailure(args.recipe.path, SimFailure::kUnsupported, e.what());
  }
  const std::string how = fmt::format("mpirun -np {}", scaled.world());
#ifdef PREFLIGHT_WITH_MPI
  if (!mpirun) {
    std::fprintf(stderr,
                 "--runtime mpi: preflight was not started by mpirun (no OMPI_COMM_WORLD_SIZE or PMIX_RANK in the "
                 "environment); the scaled layout has %lld ranks: start it with %s\n",
                 static_cast<long long>(scaled.world()), how.c_str());
    return static_cast<int>(ExitCode::kBadInput);
  }
  const std::string path = args.recipe.path;
  MpiRuntime runtime(
      args.hang_timeout,
      [path](SimFailure kind, const std::string& what) { return ReportRunFailure(path, kind, what); }, fallback_fd);
  if (runtime.size() != scaled.world()) {
    std::fprintf(stderr,
                 "--runtime mpi: mpirun started %d processes; the scaled layout has %lld ranks: start it with %s\n",
                 runtime.size(), static_cast<long long>(scaled.world()), how.c_str());
    return static_cast<int>(ExitCode::kBadInput);
  }
  options.transport = runtime.transport();
  return runtime.ShareExitCode(SimulateAndReport(args, scaled, options));
#else
  (void)fallback_fd;
  std::fprintf(stderr,
               "--runtime mpi: this preflight was built without MPI (PREFLIGHT_WITH_MPI=OFF): rebuild it with MPI "
               "and start it with %s, or use --runtime threads\n",
               how.c_str());
  return static_cast<int>(ExitCode::kBadInput);
#endif
}

}  // namespace

void SetupSimulate(CLI::App& command, int& exit_code) {
  auto args = std::make_shared<SimulateArgs>();
  AddRecipeArgs(command, args->recipe);
  command.add_option("--scale", args->scale,
                     "Scaled size, repeatable: hidden, head_dim, ffn, moe_ffn, vocab, seq, repeat, max_world "
                     "(ranks), micro_batches (defaults 32, 8, 32, 16, 64, 16, 1, 64, 2 x pp)")
      ->type_name("KEY=VALUE");
  command.add_option("--stage", args->stage, "Pipeline stage whose comparison the table shows, or 'all'")
      ->default_str("all");
  AddOutputOption(command, args->out_path);
  command.add_option("--precision", args->precision, "Numerics of the run")
      ->check(CLI::IsMember({"fp64", "fp32"}))
      ->default_str("fp64");
  AddFormatOption(command, args->format, {OutputFormat::kTable, OutputFormat::kJson});
  command
      .add_option("--runtime", args->runtime,
                  "Where the simulated ranks run: threads of this process, or mpi (one MPI process each, under "
                  "mpirun); auto picks mpi when mpirun started preflight")
      ->check(CLI::IsMember({"auto", "threads", "mpi"}))
      ->default_str("auto");
  command
      .add_option("--hang-timeout", args->hang_timeout,
                  "MPI runtime: seconds a rank may wait in one operation before the run ends as hung")
      ->check(CLI::Range(0.1, 86400.0))
      ->default_str("300");
  command.callback([args, &exit_code] { exit_code = RunSimulate(*args); });
}

}  // namespace preflight::cli

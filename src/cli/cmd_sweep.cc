// preflight sweep R --gpus N: every valid layout for N GPUs, priced for
// memory and step time; the best by tokens/s and the Pareto front (table), or
// every evaluated layout with its reason (csv, json). Exit 0, or 2 for a bad
// recipe or bad ranges. docs/sweep.md documents options, columns and keys.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "common.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/sweep.h"
#include "preflight/report/sweep_report.h"
#include "verbs.h"

#include "html_output.h"

namespace preflight::cli {
namespace {

struct SweepArgs {
  RecipeArgs recipe;
  int64_t gpus = 0;
  std::string sp = "on";
  // Axis texts as typed; empty = the default for that axis.
  std::string tp, cp, pp, vpp, ep, expert_tp, micro_batch, recompute, zero, dp_replicate;
  int64_t top = 10;
  int64_t threads = 0;  // 0 = every hardware thread
  OutputFormat format = OutputFormat::kTable;
  std::string out_path;
  std::string svg_path;
  HtmlArgs html;
};

bool ParseAxis(const char* option, const std::string& text, int64_t min_value, int64_t max_value,
               std::vector<int64_t>* values) {
  if (text.empty()) return true;
  std::string error;
  const std::optional<std::vector<int64_t>> parsed = ParseAxisList(text, min_value, &error);
  if (!parsed) {
    std::fprintf(stderr, "preflight sweep: %s %s\n", option, Shown(error).c_str());
    return false;
  }
  if (parsed->back() > max_value) {
    std::fprintf(stderr, "preflight sweep: %s '%s': %lld is above the largest valid value %lld\n", option,
                 Shown(text).c_str(), static_cast<long long>(parsed->back()), static_cast<long long>(max_value));
    return false;
  }
  *values = *parsed;
  return true;
}

/// The row of the recipe's own degrees, or nullopt when they cannot be laid
/// out on the swept GPUs (tp·cp·pp does not divide them: no row has them, and
/// the recipe's data-parallel degree and micro-batch count are not defined).
std::optional<int64_t> OwnRow(const SweepResult& result, const Recipe& recipe) {
  const int64_t model_parallel = recipe.parallel.tp * recipe.parallel.cp * recipe.parallel.pp;
  if (model_parallel <= 0 || recipe.world() % model_parallel != 0) return std::nullopt;
  return result.RowOf(LayoutOf(recipe));
}

int RunSweepVerb(const SweepArgs& args) {
  const int bad = static_cast<int>(ExitCode::kBadInput);
  if (!HtmlStdoutFree(args.html, !args.out_path.empty())) return bad;
  SweepSpace space;
  space.gpus = args.gpus;
  // Upper bounds are the recipe schema's ranges for these keys; larger values
  // could only be rejected one by one.
  constexpr int64_t kDegreeMax = int64_t{1} << 24;
  if (!ParseAxis("--tp", args.tp, 1, kDegreeMax, &space.tp) || !ParseAxis("--cp", args.cp, 1, kDegreeMax, &space.cp) ||
      !ParseAxis("--pp", args.pp, 1, kDegreeMax, &space.pp) ||
      !ParseAxis("--vpp", args.vpp, 1, kDegreeMax, &space.vpp) ||
      !ParseAxis("--ep", args.ep, 1, kDegreeMax, &space.ep) ||
      !ParseAxis("--expert-tp", args.expert_tp, 1, kDegreeMax, &space.expert_tp) ||
      !ParseAxis("--micro-batch", args.micro_batch, 1, kDegreeMax, &space.micro_batch) ||
      !ParseAxis("--zero", args.zero, 0, 3, &space.zero) ||
      !ParseAxis("--dp-replicate", args.dp_replicate, 1, kDegreeMax, &space.dp_replicate)) {
    return bad;
  }
  if (!args.recompute.empty()) {
    std::string error;
    auto parsed = ParseRecomputeList(args.recompute, &error);
    if (!parsed) {
      std::fprintf(stderr, "preflight sweep: --recompute %s\n", Shown(error).c_str());
      return bad;
    }
    space.recompute = *parsed;
  }
  auto loaded = LoadRecipeOrReport(args.recipe);
  if (!loaded) return bad;
  std::string error;
  auto recipe = SweepRecipe(*loaded, args.gpus, &error, args.sp == "on");
  if (!recipe) {
    std::fprintf(stderr, "preflight sweep: %s\n", Shown(error).c_str());
    return bad;
  }
  // A cluster no layout can be priced on (nodes beyond the recipe's range)
  // is refused here, not once per layout.
  for (const Diagnostic& d : ValidateRecipe(*recipe)) {
    if (d.severity != Severity::kError || d.key_path.rfind("cluster.", 0) != 0) continue;
    std::fprintf(stderr, "preflight sweep: --gpus %lld: %s: %s\n", static_cast<long long>(args.gpus),
                 Shown(d.key_path).c_str(), Shown(d.message).c_str());
    return bad;
  }
  space = DefaultSweepSpace(*recipe, space);
  // The space is counted in checked arithmetic and bounded before anything
  // is sized by it (each row holds a priced layout).
  const std::optional<int64_t> size = CheckedSweepSize(space);
  if (!size || *size > kMaxSweepLayouts) {
    std::fprintf(stderr,
                 "preflight sweep: the space has %s layouts, more than the %lld a sweep prices; narrow the axes "
                 "(--tp, --cp, --pp, --vpp, --ep, --expert-tp, --micro-batch, --recompute, --zero)\n",
                 size ? std::to_string(*size).c_str() : "more than 2^63", static_cast<long long>(kMaxSweepLayouts));
    return bad;
  }
  const Inventory inventory = BuildInventory(*recipe);

  SweepOptions options;
  options.top = args.top;
  options.threads = args.threads > 0 ? args.threads : std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (isatty(fileno(stderr))) {
    options.progress = [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\rsweep: %lld / %lld layouts", static_cast<long long>(done), static_cast<long long>(total));
      if (done == total) std::fputc('\n', stderr);
    };
  }
  const SweepResult result = RunSweep(inventory, space, options);
  std::string text;
  switch (args.format) {
    case OutputFormat::kCsv: text = SweepCsv(result); break;
    case OutputFormat::kJson: text = SweepJson(result, args.recipe.path); break;
    default: text = RenderSweepTable(result, args.recipe.path); break;
  }
  const std::optional<int64_t> own =
      args.svg_path.empty() && args.html.path.empty() ? std::nullopt : OwnRow(result, *recipe);
  if (!args.svg_path.empty() &&
      !WriteTextFile(args.svg_path, RenderSweepSvg(result, args.recipe.path, own), {args.recipe.path})) {
    return bad;
  }
  if (!args.html.path.empty()) {
    HtmlPage page{"sweep", fmt::format("preflight sweep: {} on {} GPUs", recipe->name, args.gpus)};
    page.sweep = HtmlSweepPart(result, args.recipe.path, own);
    if (!WriteHtml(args.html, page, {args.recipe.path})) return bad;
    if (HtmlOnStdout(args.html) && args.out_path.empty()) return static_cast<int>(ExitCode::kOk);
  }
  return EmitOutput(args.out_path, text, {args.recipe.path}) ? static_cast<int>(ExitCode::kOk) : bad;
}

}  // namespace

void SetupSweep(CLI::App& command, int& exit_code) {
  auto args = std::make_shared<SweepArgs>();
  AddRecipeArgs(command, args->recipe);
  command.add_option("--gpus", args->gpus, "GPUs to lay out (nodes = gpus / cluster.gpus_per_node)")->required();
  const char* list = " (list 1,2,4 or range a..b; default: powers of two the model allows)";
  command.add_option("--tp", args->tp, std::string("Tensor-parallel degrees") + list);
  command.add_option("--cp", args->cp, std::string("Context-parallel degrees") + list);
  command.add_option("--pp", args->pp, std::string("Pipeline degrees") + list);
  command.add_option("--vpp", args->vpp, std::string("Virtual pipeline stages") + list);
  command.add_option("--ep", args->ep, std::string("Expert-parallel degrees") + list);
  command.add_option("--expert-tp", args->expert_tp, std::string("Expert tensor-parallel degrees") + list);
  command.add_option("--micro-batch", args->micro_batch, std::string("Micro-batch sizes") + list);
  command.add_option("--recompute", args->recompute,
                     "Recompute modes: none,selective,full,selective_op (default the first three, and selective_op "
                     "when the recipe runs it)");
  command.add_option("--zero", args->zero, "ZeRO stages within 0..3 (default all)");
  command.add_option("--dp-replicate", args->dp_replicate,
                     std::string("HSDP replica counts (default: the recipe's parallel.dp_replicate)") + list);
  command
      .add_option("--sp", args->sp,
                  "Sequence parallelism: on wherever tp > 1 (default), or off in every row (whatever the recipe says)")
      ->check(CLI::IsMember({"on", "off"}));
  command.add_option("--top", args->top, "Best layouts to show")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  command.add_option("--threads", args->threads, "Worker threads (default: all hardware threads)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  AddFormatOption(command, args->format, {OutputFormat::kTable, OutputFormat::kJson, OutputFormat::kCsv});
  AddOutputOption(command, args->out_path);
  command.add_option("--svg", args->svg_path,
                     "Write the fitting layouts' step time against peak memory, the Pareto front and the recipe's "
                     "own layout as an SVG chart");
  AddHtmlOption(command, args->html);
  command.callback([args, &exit_code] { exit_code = RunSweepVerb(*args); });
}

}  // namespace preflight::cli

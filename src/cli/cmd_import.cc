// `preflight import hf CONFIG.json [--layout KEY=VALUE ...] [-o FILE]`:
// writes a recipe for a Hugging Face model (issue 8). The model section comes
// from the config (ImportHfConfig); the layout from --layout, and every key
// not given there from the default H200 rule (DefaultH200Layout). The written
// recipe is parsed and validated before it is written; if it does not
// validate, nothing is written and the exit code is 2.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/default_layout.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/import.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"
#include "verbs.h"

namespace preflight::cli {
namespace {

struct ImportHfOptions {
  std::string config;
  std::vector<std::string> layout;
  std::string output;
  std::string name;
};

constexpr int kBadInput = static_cast<int>(ExitCode::kBadInput);

void Print(const std::vector<Diagnostic>& ds) {
  for (const Diagnostic& d : ds) std::fprintf(stderr, "%s\n", Format(d).c_str());
}

/// The layout entries of the default rule (keys the user did not set keep these).
/// Parses each `--layout KEY=VALUE` into `out`; false (with the reason on
/// stderr, `example` showing the form) at the first malformed one.
bool ParseLayout(const std::vector<std::string>& layout, const char* example, std::vector<Override>* out) {
  for (const std::string& kv : layout) {
    const std::optional<Override> parsed = ParseOverride(kv);
    if (!parsed) {
      std::fprintf(stderr, "--layout %s: expected KEY=VALUE on one line, e.g. %s\n", Shown(kv).c_str(), example);
      return false;
    }
    out->push_back(*parsed);
  }
  return true;
}

std::vector<YamlEntry> DefaultEntries(const DefaultLayout& l) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  std::vector<YamlEntry> out = {
      {"training.seq_len", n(l.seq_len), "tokens per sequence"},
      {"training.micro_batch", "1", ""},
      {"training.global_batch", n(l.global_batch), "sequences per step"},
      {"training.recompute", "selective", ""},
      {"training.precision.params", "bf16", ""},
      {"training.precision.grads", "fp32", ""},
      {"training.precision.master", "fp32", ""},
      {"training.optimizer.matrices", "adamw", "how the public checkpoints were trained"},
      {"training.optimizer.other", "adamw", ""},
      {"parallel.tp", n(l.tp), "inside a node (NVLink)"},
      {"parallel.sp", l.tp > 1 ? "true" : "false", ""},
      {"parallel.cp", "1", ""},
      {"parallel.pp", n(l.pp), ""},
      {"parallel.vpp", "1", ""},
      {"parallel.ep", n(l.ep), ""},
      {"parallel.expert_tp", "1", ""},
      {"parallel.zero", "1", "distributed optimizer"},
      {"parallel.schedule", "1f1b", ""},
      {"cluster.gpu", "h200", ""},
      {"cluster.nodes", n(l.nodes), fmt::format("dp = {}", l.dp)},
      {"cluster.gpus_per_node", "8", ""},
  };
  if (l.first_stage_layers > 0) {  // MergeLayout puts them in schema order
    out.push_back({"parallel.first_stage_layers", n(l.first_stage_layers),
                   "Megatron's uneven split: pp does not divide the layers"});
    out.push_back({"parallel.last_stage_layers", n(l.last_stage_layers), ""});
  }
  return out;
}

/// Candidates the memory estimate checks before giving up (in the rule's order).
constexpr size_t kMaxCandidatesChecked = 64;

struct Choice {
  size_t index = 0;   // into the candidates
  bool fits = false;  // per EstimateMemory, with the recipe's headroom floor
};

/// The memory estimate of `preflight fit` on a written recipe.
MemoryEstimate EstimateOf(const Recipe& recipe) {
  const Inventory inventory = BuildInventory(recipe);
  const Layout layout = LayoutOf(recipe);
  return EstimateMemory(inventory, layout, StagesFor(inventory, layout));
}

/// The first candidate whose written recipe fits every pipeline stage with
/// the headroom floor, per the estimator on the stages `fit` prices; the first
/// candidate when none of the first kMaxCandidatesChecked does. The rule
/// itself prices only model state; this adds activations, transients,
/// the runtime reserve and the allocator overhead.
Choice FirstThatFits(const HfImport& imported, const std::vector<DefaultLayout>& candidates,
                     const std::vector<Override>& overrides, const std::string& config, const std::string& file) {
  const size_t n = std::min(candidates.size(), kMaxCandidatesChecked);
  for (size_t i = 0; i < n; ++i) {
    std::vector<Diagnostic> ignored;
    const std::string yaml =
        EmitRecipeYaml(imported, MergeLayout(DefaultEntries(candidates[i]), overrides, &ignored), config, "");
    const LoadResult loaded = LoadRecipeFromString(yaml, file);
    if (!loaded.ok()) continue;
    const MemoryEstimate estimate = EstimateOf(*loaded.recipe);
    if (estimate.verdict.fits && estimate.verdict.headroom_ok) return {i, true};
  }
  return {0, false};
}

/// The degrees fixed on the command line, so the default rule fills in the rest
/// around them. Values that are not positive integers are left to the parser's
/// validation of the written recipe.
LayoutPins PinsOf(const std::vector<Override>& overrides) {
  LayoutPins pins;
  for (const Override& o : overrides) {
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(o.value, &used);
      if (used != o.value.size() || v <= 0) continue;
    } catch (const std::exception&) {
      continue;
    }
    if (o.key_path == "cluster.nodes") pins.nodes = v;
    if (o.key_path == "parallel.tp") pins.tp = v;
    if (o.key_path == "parallel.pp") pins.pp = v;
    if (o.key_path == "parallel.ep") pins.ep = v;
  }
  return pins;
}

/// The degrees the user pinned, 1 for the others: the layout written when the
/// pins leave no candidate of the default rule.
DefaultLayout AsGiven(const LayoutPins& pins) {
  DefaultLayout l;
  l.nodes = pins.nodes.value_or(1);
  l.tp = pins.tp.value_or(1);
  l.pp = pins.pp.value_or(1);
  l.ep = pins.ep.value_or(1);
  const int64_t world = 8 * l.nodes;
  l.dp = world % (l.tp * l.pp) == 0 ? std::max<int64_t>(1, world / (l.tp * l.pp)) : 1;
  l.global_batch = RoundUp(512, l.dp);
  return l;
}

/// "models--meta-llama--Llama-3.1-8B/snapshots/<hash>/config.json" and
/// "Llama-3.1-8B/config.json" -> "llama-3.1-8b"; "qwen3-8b.json" ->
/// "qwen3-8b": the model's name from the config's path, empty when the path
/// names none (a bare "config.json").
std::string NameFromConfigPath(const std::string& path) {
  const auto slug = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      const unsigned char u = static_cast<unsigned char>(c);
      out += std::isalnum(u) || c == '.' || c == '-' || c == '_' ? static_cast<char>(std::tolower(u)) : '-';
    }
    return out;
  };
  const std::filesystem::path p(path);
  if (p.stem() != "config" && !p.stem().empty()) return slug(p.stem().string());
  const auto is_hash = [](const std::string& s) {
    return s.size() == 40 &&
           std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  };
  // Walk up past a Hugging Face cache's snapshots/<commit> to its models--org--name.
  for (std::filesystem::path dir = std::filesystem::absolute(p).parent_path(); !dir.empty() && dir != dir.parent_path();
       dir = dir.parent_path()) {
    const std::string name = dir.filename().string();
    if (is_hash(name) || name == "snapshots") continue;
    const size_t cache = name.rfind("--");
    return slug(name.rfind("models--", 0) == 0 && cache != std::string::npos ? name.substr(cache + 2) : name);
  }
  return "";
}

/// The recipe's name: --name as given; else the model's name (the config's
/// _name_or_path, else the config's file or directory name, else its
/// model_type) with the device it is laid out for: "llama-3.1-8b-h200".
std::string RecipeNameFor(const ImportHfOptions& o, const HfImport& imported, const std::string& gpu) {
  if (!o.name.empty()) return o.name;
  std::string model = imported.name_from_config ? imported.name : NameFromConfigPath(o.config);
  if (model.empty()) model = imported.name;
  return model + "-" + gpu;
}

/// The value of `key` among the layout entries ("" when absent).
std::string EntryValue(const std::vector<YamlEntry>& entries, const std::string& key) {
  for (const YamlEntry& e : entries) {
    if (e.key_path == key) return e.value;
  }
  return "";
}

/// Diagnostics about a key the user set with --layout name that argument, not
/// a line of a recipe they have not seen.
void NameLayoutArguments(const std::vector<Override>& overrides, std::vector<Diagnostic>* ds) {
  for (Diagnostic& d : *ds) {
    for (const Override& o : overrides) {
      if (d.key_path == o.key_path) {
        d.file = "--layout " + o.key_path + "=" + o.value;
        d.mark = {};
        d.source_line.clear();
      }
    }
  }
}

/// `text` broken at spaces into lines of at most 110 characters (a longer word stays whole).
std::string Wrapped(const std::string& text) {
  constexpr size_t kWidth = 110;
  std::string out, line;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

/// The header comment's account of the layout, in one order: what the layout
/// is, which degrees the command line gave, how the rule chose the others,
/// and what the memory estimate says of the layout written.
std::string LayoutStory(const Recipe& recipe, const std::vector<Override>& overrides, const DefaultLayout* rule,
                        const Choice& choice) {
  std::string story = fmt::format("Layout: {} node(s) x {} {} GPUs, tp {}, pp {}, ep {}, dp {}", recipe.cluster.nodes,
                                  recipe.cluster.gpus_per_node, DeviceLabel(recipe.cluster), recipe.parallel.tp,
                                  recipe.parallel.pp, recipe.parallel.ep, recipe.dp());
  if (recipe.parallel.first_stage_layers > 0) {
    story += fmt::format(" (Megatron's uneven split: {} layers on the first stage, {} on the last)",
                         recipe.parallel.first_stage_layers, recipe.parallel.last_stage_layers);
  }
  story += ".";
  if (!overrides.empty()) {
    std::string given;
    for (const Override& ov : overrides) given += (given.empty() ? "" : ", ") + ov.key_path + "=" + ov.value;
    story += "\n" + Wrapped("Given with --layout (marked 'set by --layout' below): " + given + ".");
  }
  if (rule != nullptr) {
    story += "\n" + Wrapped(fmt::format(
                        "{} the default H200 rule{}: of the layouts on 1, 2, 4, ... 128 nodes of 8 GPUs whose model "
                        "state (bf16 params, fp32 grads, ZeRO-1 AdamW: 6 + 12/D bytes a parameter) fits half of an "
                        "H200 ({:.1f} GiB a GPU here), ordered by fewest nodes, then smallest tp*pp, then larger tp, "
                        "{}; tp divides every head count, ep is the largest power of two (<= 64) dividing the "
                        "experts and tp*dp.",
                        overrides.empty() ? "Chosen by" : "The other keys follow",
                        overrides.empty() ? "" : ", keeping the given degrees",
                        static_cast<double>(rule->static_bytes_per_gpu) / 1073741824.0,
                        choice.fits ? fmt::format("the first that the memory estimate fits with the headroom floor "
                                                  "({} earlier in that order do not)",
                                                  choice.index)
                                    : fmt::format("the first (the memory estimate fits none of the first {})",
                                                  kMaxCandidatesChecked)));
  } else {
    story += "\n" + Wrapped(
                        "Written with the given degrees: with them the model state exceeds the default H200 "
                        "rule's budget (half of each GPU), so no rule applies.");
  }
  const MemoryEstimate estimate = EstimateOf(recipe);
  const RankMemory& worst = estimate.stages[static_cast<size_t>(estimate.worst_stage)];
  story += "\n" + Wrapped(fmt::format("Memory estimate of `preflight fit` for this layout: worst stage {:.1f} of "
                                      "{:.1f} GiB, {:.1f} GiB headroom{}.",
                                      worst.total().gib(), worst.capacity.gib(), worst.headroom().gib(),
                                      estimate.verdict.fits && estimate.verdict.headroom_ok
                                          ? ""
                                          : "; it does NOT fit with the headroom floor: change it with --layout"));
  return story;
}

/// The import of a config the importer accepted: the layout, the written
/// recipe's checks, the output.
int WriteImportedRecipe(const ImportHfOptions& o, HfImport imported) {
  std::vector<Override> overrides;
  if (!ParseLayout(o.layout, "parallel.tp=8", &overrides)) return kBadInput;
  std::vector<Diagnostic> layout_errors;
  const std::vector<YamlEntry> user_layout = MergeLayout({}, overrides, &layout_errors);
  Print(layout_errors);
  if (HasErrors(layout_errors)) return kBadInput;
  const std::string gpu = EntryValue(user_layout, "cluster.gpu");
  imported.name = RecipeNameFor(o, imported, gpu.empty() ? "h200" : gpu);

  // Diagnostics on the written recipe name it, or the config it came from;
  // those on a --layout key name the argument.
  const std::string recipe_file = o.output.empty() ? o.config + " (as a recipe)" : o.output;
  const auto load = [&](const std::string& yaml) {
    LoadResult loaded = LoadRecipeFromString(yaml, recipe_file);
    NameLayoutArguments(overrides, &loaded.diagnostics);
    return loaded;
  };
  // The model with only the user's keys (the schema defaults elsewhere: one
  // rank of every kind) gives the inventory the default rule sizes.
  const LoadResult provisional = load(EmitRecipeYaml(imported, user_layout, o.config, ""));
  if (!provisional.ok()) {
    Print(provisional.diagnostics);
    return kBadInput;
  }
  std::vector<DefaultLayout> candidates = H200LayoutCandidates(BuildInventory(*provisional.recipe), PinsOf(overrides));
  if (candidates.empty() && overrides.empty()) {
    std::fprintf(stderr,
                 "%s: no H200 layout of up to 128 nodes holds the model state in half of each GPU; "
                 "give the layout with --layout\n",
                 Shown(o.config).c_str());
    return kBadInput;
  }
  const bool as_given = candidates.empty();
  Choice choice;
  if (as_given) {
    // The user fixed degrees with which the model state does not fit the
    // rule's budget: write what they asked for; `fit` gives the verdict.
    std::fprintf(stderr,
                 "%s: warning: with the --layout degrees the model state exceeds half of each H200; "
                 "written as given (check it with the memory estimate)\n",
                 Shown(o.config).c_str());
    candidates.push_back(AsGiven(PinsOf(overrides)));
  } else {
    choice = FirstThatFits(imported, candidates, overrides, o.config, recipe_file);
    if (!choice.fits) {
      std::fprintf(stderr,
                   "%s: warning: none of the first %zu default layouts fits per the memory estimate; "
                   "writing the smallest by model state (check it with the estimator, or pass --layout)\n",
                   Shown(o.config).c_str(), std::min(candidates.size(), kMaxCandidatesChecked));
    }
  }
  const std::vector<YamlEntry> layout =
      MergeLayout(DefaultEntries(candidates[choice.index]), overrides, &layout_errors);

  // The written recipe must validate with the parser, or nothing is written;
  // its header tells how the layout it holds was chosen.
  const LoadResult unannotated = load(EmitRecipeYaml(imported, layout, o.config, ""));
  if (!unannotated.ok()) {
    Print(unannotated.diagnostics);
    return kBadInput;
  }
  const std::string note =
      LayoutStory(*unannotated.recipe, overrides, as_given ? nullptr : &candidates[choice.index], choice);
  const std::string yaml = EmitRecipeYaml(imported, layout, o.config, note);
  const LoadResult final_check = load(yaml);
  Print(final_check.diagnostics);
  if (!final_check.ok()) return kBadInput;

  if (o.output.empty()) {
    std::fwrite(yaml.data(), 1, yaml.size(), stdout);
    return 0;
  }
  return WriteTextFile(o.output, yaml, {o.config}) ? 0 : kBadInput;
}

int RunImportHf(const ImportHfOptions& o) {
  // Configs are a few KiB; anything past 16 MiB is not one (and is not read whole).
  const std::optional<std::string> text = ReadInputFile(o.config);
  if (!text) return kBadInput;
  HfImport imported = ImportHfConfig(*text, o.config);
  Print(imported.diagnostics);
  if (!imported.ok()) return kBadInput;
  try {
    return WriteImportedRecipe(o, std::move(imported));
  } catch (const ArithmeticOverflow& e) {
    // Sizes each within the recipe's bounds whose products (the parameters
    // of 2^20 experts of 2^24 x 2^24) leave int64 when the layout is sized.
    std::fprintf(stderr, "%s: the model's sizes are too large to count its parameters and bytes (%s)\n",
                 Shown(o.config).c_str(), e.what());
    return kBadInput;
  }
}

struct ImportMegatronOptions {
  std::string input;
  std::vector<std::string> layout;
  std::string output;
  std::string name;
};

/// "gpt3_7b.yaml" -> "gpt3_7b"; stdin -> "megatron".
std::string NameFromPath(const std::string& path) {
  if (path == "-") return "megatron";
  std::string base = std::filesystem::path(path).stem().string();
  std::string out;
  for (char c : base) {
    const unsigned char u = static_cast<unsigned char>(c);
    out += std::isalnum(u) || c == '.' || c == '-' || c == '_' ? c : '-';
  }
  return out.empty() ? "megatron" : out;
}

/// `preflight import megatron FILE`: Megatron-LM arguments (MODEL_ARGS YAML
/// or a command line, `-` for stdin) -> recipe. Nothing is written unless
/// the recipe validates.
int RunImportMegatron(const ImportMegatronOptions& o) {
  const std::optional<std::string> text = ReadInputFile(o.input);
  if (!text) return kBadInput;
  const std::string file = o.input == "-" ? "<stdin>" : o.input;
  const MegatronImport imported = ImportMegatronArgs(*text, file);
  Print(imported.diagnostics);
  if (!imported.ok()) return kBadInput;
  std::vector<Override> overrides;
  if (!ParseLayout(o.layout, "cluster.nodes=2", &overrides)) return kBadInput;
  std::vector<Diagnostic> layout_errors;
  const std::string yaml =
      EmitMegatronRecipe(imported, overrides, o.name.empty() ? NameFromPath(o.input) : o.name, file, &layout_errors);
  Print(layout_errors);
  if (HasErrors(layout_errors)) return kBadInput;
  // Diagnostics on the written recipe name it, or the config it came from.
  const std::string recipe_file = o.output.empty() ? file + " (as a recipe)" : o.output;
  LoadResult check = LoadRecipeFromString(yaml, recipe_file);
  NameLayoutArguments(overrides, &check.diagnostics);
  if (!check.ok()) {
    Print(check.diagnostics);
    return kBadInput;
  }
  if (o.output.empty()) {
    std::fwrite(yaml.data(), 1, yaml.size(), stdout);
    return 0;
  }
  return WriteTextFile(o.output, yaml, {o.input}) ? 0 : kBadInput;
}

}  // namespace

void SetupImport(CLI::App& command, int& exit_code) {
  command.require_subcommand(1);
  CLI::App* hf = command.add_subcommand("hf", "write a recipe from a Hugging Face config.json");
  auto options = std::make_shared<ImportHfOptions>();
  hf->add_option("CONFIG", options->config, "the model's config.json")->required();
  hf->add_option("--layout", options->layout,
                 "KEY=VALUE for a training.*, parallel.* or cluster.* key (repeatable); keys not given follow "
                 "the default H200 rule");
  hf->add_option("-o,--out,--output", options->output, "write the recipe to this file (default: stdout)");
  hf->add_option("--name", options->name,
                 "recipe name (default: the model's name from the config, its file or directory name, with the "
                 "GPU: llama-3.1-8b-h200)");
  hf->callback([options, &exit_code] { exit_code = RunImportHf(*options); });

  CLI::App* mg = command.add_subcommand("megatron", "write a recipe from Megatron-LM arguments");
  auto mg_options = std::make_shared<ImportMegatronOptions>();
  mg->add_option("FILE", mg_options->input,
                 "MODEL_ARGS YAML (functional-test form) or a launch command line; - for stdin")
      ->required();
  mg->add_option("--layout", mg_options->layout,
                 "KEY=VALUE for keys the arguments do not hold (cluster.nodes, cluster.gpus_per_node, "
                 "cluster.gpu) or any training.*, parallel.* key (repeatable)");
  mg->add_option("-o,--out,--output", mg_options->output, "write the recipe to this file (default: stdout)");
  mg->add_option("--name", mg_options->name, "recipe name (default: the file name)");
  mg->callback([mg_options, &exit_code] { exit_code = RunImportMegatron(*mg_options); });
}

}  // namespace preflight::cli

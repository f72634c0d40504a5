// Import of Megatron-LM training arguments into a recipe (issue 15): the
// functional-test form (a YAML map with a MODEL_ARGS section) or a launch
// command line (`torchrun ... pretrain_gpt.py --flag value ...`). Every
// argument that changes memory or time is mapped onto existing recipe keys;
// one the recipe cannot represent is a located warning, an argument the
// importer does not know is listed as unknown, and arguments that change
// nothing priced (logging, paths, checkpointing, the lr schedule) are ignored
// from a known list. Plain structs only; yaml-cpp stays inside preflight_recipe.
#pragma once

#include <string>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/import.h"
#include "preflight/recipe/recipe.h"

namespace preflight {

/// One argument as written: "--num-layers" = "12" at line 7 (value "true"
/// for a store flag written without a value).
struct MegatronArg {
  std::string flag;
  std::string value;
  int line = 0;
};

/// What ImportMegatronArgs read and wrote.
struct MegatronImport {
  std::string model_kind;                  // "GPTModel" or "HybridModel" (Megatron's model classes)
  std::vector<MegatronArg> args;           // as read, in input order
  std::vector<YamlEntry> model;            // model.* entries in schema order
  std::vector<YamlEntry> layout;           // training.*, parallel.*, cluster.* entries the arguments set
  std::vector<std::string> unrepresented;  // flags with a warning: not representable
  std::vector<std::string> unknown;        // flags the importer does not know
  std::vector<Diagnostic> diagnostics;     // warnings (file:line) and errors
  bool ok() const { return !HasErrors(diagnostics); }
};

/// Reads `text` (MODEL_ARGS YAML or a command line; `file` names it in
/// diagnostics) and maps it. Errors (the caller exits 2): malformed YAML or
/// quoting, a flag value of the wrong type, a missing shape argument, a bad
/// --moe-layer-freq expression or hybrid pattern; each names file, line and flag.
MegatronImport ImportMegatronArgs(const std::string& text, const std::string& file);

/// The recipe YAML of an import: a header (source, warnings as comments),
/// `name`, the model, then the layout with `overrides` (`--layout`, any key
/// of LayoutKeyPaths()) applied over what the arguments set. Bad overrides
/// are error diagnostics.
std::string EmitMegatronRecipe(const MegatronImport& imported, const std::vector<Override>& overrides,
                               const std::string& name, const std::string& source_file,
                               std::vector<Diagnostic>* diagnostics);

/// "([0]*3+[1]*9)" -> {0,0,0,1,...}; "2" -> {} with *period = 2. False when
/// the text is neither an integer nor a list expression of + and * over
/// integer lists (Megatron evaluates it with Python's eval).
bool ParseMoeLayerFreq(const std::string& text, std::vector<int>* list, int64_t* period);

}  // namespace preflight

// Import of a Hugging Face `config.json` into a recipe (issue 8): the model
// section is mapped field by field; every field the recipe cannot represent
// becomes a warning, never a silent drop. nlohmann-json stays inside
// preflight_recipe; this header shows plain structs only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/recipe.h"

namespace preflight {

/// One scalar of the recipe YAML: "model.attention.heads" = "32", with an
/// optional trailing comment. Values are written as YAML scalars verbatim.
struct YamlEntry {
  std::string key_path;
  std::string value;
  std::string comment;
};

/// A block of the model that the recipe holds as the nearest letter instead
/// (Mamba-1 as a Mamba-2 M, Gemma's extra norms, ...): the config key that
/// names it and the parameters the recipe counts minus the model's (negative:
/// the recipe counts fewer). Its warning states the same figure.
struct StandIn {
  std::string key;
  int64_t param_difference = 0;
};

/// The model part of a recipe imported from a Hugging Face config.
struct HfImport {
  std::string architecture;       // "LlamaForCausalLM"
  std::string name;               // the model's name: "llama-3.1-8b" (_name_or_path), else "llama" (model_type)
  bool name_from_config = false;  // name is the config's _name_or_path
  std::vector<YamlEntry> model;   // model.* entries in schema order
  std::vector<Diagnostic> diagnostics;  // warnings for unrepresented fields; errors
  std::vector<StandIn> stand_ins;       // one per nearest-letter stand-in, with its warning in diagnostics
  bool ok() const { return !HasErrors(diagnostics); }
};

/// Maps `json_text` (the contents of a config.json; `file` names it in
/// diagnostics): a Hugging Face config (by its `architectures`) or a
/// mamba_ssm config (`d_model`, `n_layer`, `ssm_cfg`; no `architectures`).
/// Errors: malformed JSON (line and column), a missing or ill-typed required
/// field (named), an unsupported architecture (the supported ones listed).
HfImport ImportHfConfig(const std::string& json_text, const std::string& file);

/// The `architectures` values ImportHfConfig accepts.
std::vector<std::string> SupportedHfArchitectures();

/// Key paths `--layout` may set: the parallel, cluster and training keys.
std::vector<std::string> LayoutKeyPaths();

/// Merges `overrides` over `defaults` (both parallel/cluster/training keys),
/// keeping the order of LayoutKeyPaths(). An override of a key outside
/// LayoutKeyPaths() is an error diagnostic naming the valid keys.
std::vector<YamlEntry> MergeLayout(const std::vector<YamlEntry>& defaults, const std::vector<Override>& overrides,
                                   std::vector<Diagnostic>* diagnostics);

/// The recipe YAML: a header comment (source file, architecture, the
/// warnings as comment lines), name, model, then the layout entries.
std::string EmitRecipeYaml(const HfImport& imported, const std::vector<YamlEntry>& layout,
                           const std::string& source_file, const std::string& layout_note);

}  // namespace preflight

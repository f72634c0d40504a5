// Import of a Hugging Face `config.json` into a recipe (issue 8): the model
// section is mapped field by field; every field the recipe cannot represent
// becomes a warning, never a silent drop. nlohmann-json stays inside
// preflight_recipe; this header shows plain structs only.
#pragma once

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

/// The model part of a recipe imported from a Hugging Face config.
struct HfImport {
  std::string architecture;       // "LlamaForCausalLM"
  std::string name;               // recipe name, "<model>-h200"
  std::vector<YamlEntry> model;   // model.* entries in schema order
  std::vector<Diagnostic> diagnostics;  // warnings for unrepresented fields; errors
  bool ok() const { return !HasErrors(diagnostics); }
};

/// Maps `json_text` (the contents of a config.json; `file` names it in
/// diagnostics). Errors: malformed JSON (line and column), a missing or
/// ill-typed required field (named), an unsupported architecture (the
/// supported ones listed).
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

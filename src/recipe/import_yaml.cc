// The YAML side of `preflight import hf`: the layout keys --layout may set,
// merging them over the default layout, and writing the recipe text. The
// text is plain nested block mappings with trailing comments, so it is
// written directly (yaml-cpp's emitter cannot place comments after values).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "preflight/recipe/import.h"

namespace preflight {

std::vector<std::string> LayoutKeyPaths() {
  return {"training.seq_len",
          "training.micro_batch",
          "training.global_batch",
          "training.recompute",
          "training.precision.params",
          "training.precision.grads",
          "training.precision.master",
          "training.optimizer.matrices",
          "training.optimizer.other",
          "parallel.tp",
          "parallel.sp",
          "parallel.cp",
          "parallel.pp",
          "parallel.vpp",
          "parallel.ep",
          "parallel.expert_tp",
          "parallel.zero",
          "parallel.schedule",
          "parallel.partition",
          "parallel.first_stage_layers",
          "parallel.last_stage_layers",
          "parallel.embedding_in_split",
          "parallel.loss_in_split",
          "cluster.gpu",
          "cluster.nodes",
          "cluster.gpus_per_node",
          "cluster.reserve_gib",
          "cluster.min_headroom_gib"};
}

std::vector<YamlEntry> MergeLayout(const std::vector<YamlEntry>& defaults, const std::vector<Override>& overrides,
                                   std::vector<Diagnostic>* diagnostics) {
  const std::vector<std::string> keys = LayoutKeyPaths();
  std::map<std::string, YamlEntry> by_key;
  for (const auto& e : defaults) by_key[e.key_path] = e;
  for (const auto& o : overrides) {
    if (std::find(keys.begin(), keys.end(), o.key_path) == keys.end()) {
      std::string valid;
      for (const auto& k : keys) valid += (valid.empty() ? "" : ", ") + k;
      diagnostics->push_back({Severity::kError, "--layout", {}, o.key_path, o.value,
                              "not a layout key; valid: " + valid, ""});
      continue;
    }
    by_key[o.key_path] = {o.key_path, o.value, "set by --layout"};
  }
  std::vector<YamlEntry> out;
  for (const auto& k : keys) {
    const auto it = by_key.find(k);
    if (it != by_key.end()) out.push_back(it->second);
  }
  return out;
}

namespace {

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

/// Writes entries as nested block mappings; entries sharing a prefix must be adjacent.
void EmitEntries(const std::vector<YamlEntry>& entries, std::string* out) {
  std::vector<std::string> open;  // the mapping keys currently open
  for (const auto& e : entries) {
    const std::vector<std::string> parts = SplitPath(e.key_path);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      *out += std::string(2 * i, ' ') + parts[i] + ":\n";
      open.push_back(parts[i]);
    }
    std::string line = std::string(2 * (parts.size() - 1), ' ') + parts.back() + ": " + e.value;
    if (!e.comment.empty()) line += "  # " + e.comment;
    *out += line + "\n";
  }
}

}  // namespace

std::string EmitRecipeYaml(const HfImport& imported, const std::vector<YamlEntry>& layout,
                           const std::string& source_file, const std::string& layout_note) {
  std::string out = fmt::format("# Imported by `preflight import hf` from {} ({}).\n", source_file,
                                imported.architecture);
  bool any_warning = false;
  for (const auto& d : imported.diagnostics) {
    if (d.severity != Severity::kWarning) continue;
    if (!any_warning) out += "# Warnings at import (not represented, or imported as the nearest recipe block):\n";
    any_warning = true;
    out += "# - " + (d.key_path.empty() ? std::string() : d.key_path + ": ") + d.message + "\n";
  }
  size_t start = 0;
  while (start < layout_note.size()) {
    const size_t end = layout_note.find('\n', start);
    out += "# " + layout_note.substr(start, end == std::string::npos ? std::string::npos : end - start) + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  out += "name: " + imported.name + "\n";
  EmitEntries(imported.model, &out);
  EmitEntries(layout, &out);
  return out;
}

}  // namespace preflight

// Recipe loading: YAML text -> overrides applied to the tree -> typed Recipe
// (every map read against its exact key set) -> layer expansion -> semantic
// validation. yaml-cpp stays inside this library (docs/architecture.md).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "preflight/recipe/fields.h"
#include "preflight/recipe/recipe.h"
#include "reader.h"
#include "recipe_bounds.h"
#include "schema.h"
#include "suggest.h"
#include "text_check.h"
#include "validate.h"
#include "yaml_load.h"

namespace preflight {

namespace recipe_internal {
namespace {

// ---- model ---------------------------------------------------------------

/// Reads every key of the map `r` that the field table reads (RecipeField::read),
/// and each sub-map through its own reader, in table order.
void ReadFields(MapReader& r, Recipe* recipe) {
  for (const RecipeField& f : RecipeFields()) {
    if (f.parent() != r.path()) continue;
    if (f.kind != FieldKind::kSection) {
      if (f.read) f.read(r, *recipe);
      continue;
    }
    auto sub = r.Section(std::string(f.key()));
    if (!sub) continue;
    if (f.open) f.open(*recipe);
    if (sub->ok()) ReadFields(*sub, recipe);
  }
}

/// model.moe.layer_offset must name a slot of the layer_freq period.
void CheckMoeOffset(Context& ctx, const MoeConfig& m) {
  if (ctx.IsBad("model.moe.layer_freq") || ctx.IsBad("model.moe.layer_offset") || m.layer_offset < m.layer_freq) return;
  ctx.MarkBad("model.moe.layer_offset");
  ctx.ErrorAt("model.moe.layer_offset", std::to_string(m.layer_offset),
              fmt::format("must be less than model.moe.layer_freq ({}); valid range is [0, {}]", m.layer_freq,
                          m.layer_freq - 1));
}

/// "line 7", or the override that set the key ("--set model.pattern=AEM").
std::string WhereIs(const Context& ctx, const MapReader& map, const std::string& key) {
  if (const std::string* text = ctx.source().OverrideFor(map.PathOf(key))) return *text;
  return fmt::format("line {}", map.KeyMark(key).line);
}

bool IsLayerLetter(char c) {
  return std::any_of(std::begin(kAllBlockKinds), std::end(kAllBlockKinds), [c](BlockKind k) { return Letter(k) == c; });
}

constexpr const char* kValidLetters =
    "valid letters: A (attention), M (Mamba-2), E (MoE), R (recurrent), D (dense MLP)";

/// Mark of the `index`-th character of a one-line scalar, so the caret sits
/// under the bad letter; falls back to the scalar's own mark.
SourceMark LetterMark(const Context& ctx, const YAML::Node& node, size_t index, char letter) {
  const SourceMark mark = Context::ToMark(node.Mark());
  const std::string line = ctx.SourceLine(mark.line);
  size_t column = static_cast<size_t>(mark.column - 1);
  if (column < line.size() && (line[column] == '"' || line[column] == '\'')) ++column;
  column += index;
  if (column < line.size() && line[column] == letter) return {mark.line, static_cast<int>(column) + 1};
  return mark;
}

/// Checks the letters of a pattern string; appends the blocks to `out`.
/// Reports the first bad letter and how many more there are: one
/// diagnostic per letter would repeat the (possibly 100k-letter) line.
bool ReadLetters(Context& ctx, const std::string& key_path, const YAML::Node& node, std::vector<BlockKind>* out) {
  const std::string& text = node.Scalar();
  size_t first_bad = text.size();
  size_t bad_count = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (IsLayerLetter(text[i])) {
      out->push_back(static_cast<BlockKind>(text[i]));
      continue;
    }
    if (bad_count++ == 0) first_bad = i;
  }
  if (bad_count == 0) return true;
  const char letter = text[first_bad];
  // A letter outside ASCII is shown by its position only (one byte of it is not a character).
  const std::string shown = static_cast<unsigned char>(letter) < 0x80 ? fmt::format("'{}'", letter) : "(not ASCII)";
  const std::string more = bad_count > 1 ? fmt::format(" (and {} more bad letters)", bad_count - 1) : "";
  ctx.Error(key_path, LetterMark(ctx, node, first_bad, letter), text.size() <= 60 ? text : Abbreviate(text, 57),
            fmt::format("bad layer letter {} at position {}{}; {}", shown, first_bad + 1, more, kValidLetters));
  return false;
}

/// model.layers: an explicit list, either one string or a list of letters.
bool ReadExplicitLayers(MapReader& model, Context& ctx, std::vector<BlockKind>* layers) {
  const YAML::Node& node = model.Value("layers");
  const std::string path = model.PathOf("layers");
  if (model.Has("pattern") || model.Has("repeat")) {
    const std::string other = model.Has("pattern") ? "pattern" : "repeat";
    ctx.Error(path, model.KeyMark("layers"), "",
              fmt::format("mutually exclusive with model.{} ({}); give either an explicit layer list or "
                          "pattern and repeat",
                          other, WhereIs(ctx, model, other)));
    return false;
  }
  if (node.IsScalar()) {
    if (node.Scalar().empty()) {
      ctx.Error(path, model.ValueMark("layers"), "", "must not be empty; give at least one layer letter");
      return false;
    }
    if (static_cast<int64_t>(node.Scalar().size()) > kMaxLayers) {
      ctx.Error(path, model.ValueMark("layers"), "",
                fmt::format("{} layers; at most {} are supported", node.Scalar().size(), kMaxLayers));
      return false;
    }
    return ReadLetters(ctx, path, node, layers);
  }
  if (!node.IsSequence() || node.size() == 0) {
    ctx.Error(path, model.ValueMark("layers"), "",
              fmt::format("must be a non-empty list of layer letters or one string of them ({}), got {}",
                          kValidLetters, node.IsSequence() ? "an empty list" : std::string("a ") + KindName(node)));
    return false;
  }
  if (static_cast<int64_t>(node.size()) > kMaxLayers) {
    ctx.Error(path, model.ValueMark("layers"), "",
              fmt::format("{} layers; at most {} are supported", node.size(), kMaxLayers));
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < node.size(); ++i) {
    if (!ctx.Visit()) return false;
    const YAML::Node item = node[i];
    const std::string item_path = fmt::format("{}[{}]", path, i);
    if (!item.IsScalar() || item.Scalar().size() != 1 || !IsLayerLetter(item.Scalar()[0])) {
      ok = false;
      ctx.Error(item_path, Context::ToMark(item.Mark()), item.IsScalar() ? item.Scalar() : "",
                fmt::format("layer {} must be one letter; {}", i + 1, kValidLetters));
      continue;
    }
    layers->push_back(static_cast<BlockKind>(item.Scalar()[0]));
  }
  return ok;
}

/// model.pattern times model.repeat.
bool ReadPatternLayers(MapReader& model, Context& ctx, ModelConfig* m) {
  bool ok = model.Int("repeat", &m->repeat);
  if (model.Has("pattern")) {
    const YAML::Node& node = model.Value("pattern");
    const std::string path = model.PathOf("pattern");
    if (!node.IsScalar() || node.Scalar().empty()) {
      ctx.Error(path, model.ValueMark("pattern"), "",
                fmt::format("must be a non-empty string of layer letters ({})", kValidLetters));
      return false;
    }
    if (static_cast<int64_t>(node.Scalar().size()) > kMaxLayers) {
      ctx.Error(path, model.ValueMark("pattern"), "",
                fmt::format("{} letters; at most {} layers are supported", node.Scalar().size(), kMaxLayers));
      return false;
    }
    std::vector<BlockKind> letters;
    if (!ReadLetters(ctx, path, node, &letters)) return false;
    m->pattern = node.Scalar();
  }
  if (!ok) return false;
  const auto total = Mul(static_cast<int64_t>(m->pattern.size()), m->repeat);
  if (!total || *total > kMaxLayers) {
    ctx.ErrorAt("model.repeat", std::to_string(m->repeat),
                fmt::format("gives {} x {} layers; at most {} are supported; try repeat <= {}", m->pattern.size(),
                            m->repeat, kMaxLayers, kMaxLayers / static_cast<int64_t>(m->pattern.size())));
    return false;
  }
  m->layers.clear();
  for (int64_t r = 0; r < m->repeat; ++r) {
    for (char c : m->pattern) m->layers.push_back(static_cast<BlockKind>(c));
  }
  return true;
}

/// The MoE layout rule (docs/recipe.md): E slots are counted j = 0, 1, ...
/// in layer order; slot j stays MoE iff j >= first_k_dense and
/// (j - first_k_dense) % layer_freq == layer_offset, otherwise it becomes a
/// dense MLP (D). DeepSeek-V3's first_k_dense_replace and Megatron's
/// moe_layer_freq are both expressed this way.
void ApplyMoeLayout(const MoeConfig& moe, std::vector<BlockKind>* layers) {
  int64_t slot = 0;
  for (BlockKind& kind : *layers) {
    if (kind != BlockKind::kMoe) continue;
    const bool moe_slot = slot >= moe.first_k_dense && (slot - moe.first_k_dense) % moe.layer_freq == moe.layer_offset;
    if (!moe_slot) kind = BlockKind::kDenseMlp;
    ++slot;
  }
}

bool ParseModel(MapReader& top, Context& ctx, Recipe* recipe) {
  ModelConfig* m = &recipe->model;
  auto r = top.Section("model");
  if (!r) {  // all defaults: the default pattern
    for (int64_t i = 0; i < m->repeat; ++i) {
      for (char c : m->pattern) m->layers.push_back(static_cast<BlockKind>(c));
    }
    ApplyMoeLayout(m->moe, &m->layers);
    return true;
  }
  if (!r->ok()) return false;
  if (r->Has("attention") && r->Has("mla")) {
    const bool mla_later = r->KeyMark("mla").line >= r->KeyMark("attention").line;
    const std::string later = mla_later ? "mla" : "attention";
    const std::string earlier = mla_later ? "attention" : "mla";
    ctx.Error(r->PathOf(later), r->KeyMark(later), "",
              fmt::format("mutually exclusive with model.{} ({}): with mla, A layers are MLA; keep one", earlier,
                          WhereIs(ctx, *r, earlier)));
  }
  ReadFields(*r, recipe);
  if (r->Has("moe")) CheckMoeOffset(ctx, m->moe);
  const bool ok = r->Has("layers") ? ReadExplicitLayers(*r, ctx, &m->layers) : ReadPatternLayers(*r, ctx, m);
  if (!ok) {
    ctx.MarkBad("model.layers");
    m->layers.clear();
    return false;
  }
  if (r->Has("layers")) {
    // Keep pattern/repeat consistent with the list: the list is one period.
    m->pattern.clear();
    for (BlockKind k : m->layers) m->pattern.push_back(Letter(k));
    m->repeat = 1;
  }
  if (ctx.IsBad("model.moe")) return false;
  ApplyMoeLayout(m->moe, &m->layers);
  return true;
}

// ---- training, parallel, cluster, serving ---------------------------------

/// parallel.stage_boundaries: a list of layer indices (checked in Validate).
void ReadStageBoundaries(MapReader& r, Context& ctx, std::vector<int64_t>* out) {
  if (!r.Has("stage_boundaries")) return;
  const YAML::Node& node = r.Value("stage_boundaries");
  const std::string path = r.PathOf("stage_boundaries");
  if (node.IsNull()) return;
  if (!node.IsSequence() || static_cast<int64_t>(node.size()) > kMaxLayers) {
    ctx.MarkBad(path);
    ctx.Error(path, r.ValueMark("stage_boundaries"), "",
              node.IsSequence() ? fmt::format("has {} entries; at most {}", node.size(), kMaxLayers)
                                : fmt::format("must be a list of layer indices, got a {}", KindName(node)));
    return;
  }
  for (size_t i = 0; i < node.size(); ++i) {
    if (!ctx.Visit()) return;
    const YAML::Node item = node[i];
    const std::string item_path = fmt::format("{}[{}]", path, i);
    ctx.source().marks[item_path] = Context::ToMark(item.Mark());
    bool overflow = false;
    const auto value = item.IsScalar() && item.Tag() != "!" ? ParseInteger(item.Scalar(), &overflow) : std::nullopt;
    if (!value) {
      ctx.MarkBad(path);
      ctx.Error(item_path, Context::ToMark(item.Mark()), item.IsScalar() ? item.Scalar() : "",
                fmt::format("must be a layer index (an integer in [1, {}])", kMaxLayers - 1));
      continue;
    }
    out->push_back(*value);
  }
}

/// A top-level map read through the field table; nullopt when absent.
std::optional<MapReader> ReadSection(MapReader& top, const std::string& key, Recipe* recipe) {
  auto r = top.Section(key);
  if (!r) return r;
  if (const RecipeField* f = FindRecipeField(key); f && f->open) f->open(*recipe);
  if (r->ok()) ReadFields(*r, recipe);
  return r;
}

/// Keys of cluster.device a device without based_on may leave out: 0 reads
/// as no fp8 or fp4 tensor cores, no host link or memory figure (needed only
/// to offload, checked below) and an NVLink domain of one node. rates.gemm_fp8
/// is needed only with fp8 tensor cores or fp4 GEMMs (checked after filling).
constexpr std::string_view kOptionalDeviceKeys[] = {"based_on",       "fp8_dense_tflops",       "fp4_dense_tflops",
                                                    "nvlink_domain",  "host_link_gbps_per_dir", "host_memory_gib",
                                                    "rates.gemm_fp8", "rates.gemm_tile_k"};

/// cluster.device (read through the field table, based_on first): without
/// based_on every figure pricing needs must be given; either way fp8 tensor
/// cores need their GEMM rate and offloading needs the host link and memory.
bool CheckDevice(Context& ctx, const Recipe& recipe, const CustomDevice& device) {
  const std::string prefix = "cluster.device.";
  const auto given = [&ctx](const std::string& path) { return ctx.source().marks.count(path) > 0; };
  if (device.based_on.empty()) {
    std::vector<std::string> missing;
    for (const RecipeField& f : RecipeFields()) {
      if (f.kind == FieldKind::kSection || f.path.substr(0, prefix.size()) != prefix) continue;
      const std::string_view key = f.path.substr(prefix.size());
      if (std::find(std::begin(kOptionalDeviceKeys), std::end(kOptionalDeviceKeys), key) !=
          std::end(kOptionalDeviceKeys)) {
        continue;
      }
      if (!given(std::string(f.path))) missing.emplace_back(key);
    }
    if (!missing.empty()) {
      ctx.MarkBad("cluster.device");
      ctx.ErrorAt(prefix + missing.front(), "",
                  fmt::format("missing: a device without based_on gives every figure the step is priced with (missing "
                              "here: {}); add them, or start from a preset with based_on: one of {}",
                              JoinNames(missing), JoinNames(GpuPresetNames())));
      return false;
    }
  }
  bool ok = true;
  const GpuSpec& spec = device.spec;
  if (spec.fp8_dense_tflops > 0 && spec.rates.gemm_fp8 <= 0) {
    ok = false;
    ctx.ErrorAt(prefix + "rates.gemm_fp8", "",
                fmt::format("missing: the device has fp8 tensor cores (fp8_dense_tflops {}), so fp8 GEMMs need their "
                            "achieved fraction of that peak, a number in (0, 1]",
                            spec.fp8_dense_tflops));
  } else if (recipe.training.precision.fp4 != Fp4Format::kNone && spec.fp4_dense_tflops > 0 &&
             spec.rates.gemm_fp8 <= 0) {
    // FP4 GEMMs run at fp4_dense_tflops x rates.gemm_fp8 (docs/formulas.md §2.5).
    ok = false;
    ctx.ErrorAt(prefix + "rates.gemm_fp8", "",
                fmt::format("missing: training.precision.fp4 runs the GEMMs at fp4_dense_tflops ({}) times this "
                            "fraction, a number in (0, 1]",
                            spec.fp4_dense_tflops));
  }
  // Offloaded optimizer state crosses the host link and lives in host memory.
  const double offload = recipe.training.optimizer.offload_fraction;
  const auto need_for_offload = [&](const std::string& key, double figure, const char* also) {
    if (offload <= 0 || figure > 0) return;
    ok = false;
    ctx.ErrorAt(prefix + key, "",
                fmt::format("missing: training.optimizer.offload_fraction {} keeps optimizer state in host memory, "
                            "which needs the device's {}{}, a positive number",
                            offload, key, also));
  };
  need_for_offload("host_link_gbps_per_dir", spec.host_link_gbps_per_dir, "");
  need_for_offload("host_memory_gib", std::max(spec.host_memory_gib, recipe.cluster.host_memory_gib),
                   " (or cluster.host_memory_gib)");
  return ok;
}

/// cluster.gpu names a preset, or cluster.device describes the device; its
/// figures fill cluster.spec, with the cluster's capacity and host overrides.
void ReadDevice(std::optional<MapReader>& r, Context& ctx, Recipe* recipe) {
  ClusterConfig* c = &recipe->cluster;
  if (r && r->ok() && !r->String("gpu", &c->gpu, kMaxNameLength)) return;
  if (c->device) {
    if (r && r->Has("gpu")) {
      ctx.MarkBad("cluster.device");
      ctx.Error("cluster.device", r->KeyMark("device"), "",
                fmt::format("mutually exclusive with cluster.gpu ({}): name a preset or describe the device; to start "
                            "from a preset, write cluster.device.based_on: {}",
                            WhereIs(ctx, *r, "gpu"), c->gpu));
      return;
    }
    c->gpu.clear();
    if (ctx.IsBad("cluster.device") || !CheckDevice(ctx, *recipe, *c->device)) return;
    c->spec = c->device->spec;
  } else {
    const auto preset = GpuPreset(c->gpu);
    if (!preset) {
      std::string message = "unknown GPU; valid presets: " + JoinNames(GpuPresetNames()) +
                            " (or describe the device under cluster.device)";
      if (const auto close = ClosestName(c->gpu, GpuPresetNames()))
        message += fmt::format("; did you mean '{}'?", *close);
      ctx.MarkBad("cluster.gpu");
      ctx.ErrorAt("cluster.gpu", c->gpu, message);
      return;
    }
    c->spec = *preset;
  }
  if (c->capacity_mib > 0) c->spec.capacity_mib = c->capacity_mib;
  if (c->host_memory_gib > 0) c->spec.host_memory_gib = c->host_memory_gib;
}

// ---- overrides -------------------------------------------------------------

std::vector<std::string> SplitPath(const std::string& key_path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key_path.find('.', start);
    parts.push_back(key_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

/// Sets `o.key_path` in the YAML tree, creating maps on the way.
void ApplyOverride(YAML::Node& root, const Override& o, Context& ctx) {
  // Diagnostics name the override as typed; a huge or non-UTF-8 value is
  // shown shortened or with its bad bytes as '?', never echoed raw.
  const std::string typed = o.key_path + "=" + o.value;
  const std::optional<TextProblem> problem = CheckRecipeText(typed);
  constexpr size_t kShownBytes = 80;
  const std::string text = "--set " + (problem ? Sanitize(Abbreviate(typed, kShownBytes)) : Abbreviate(typed, kShownBytes));
  ctx.AddOverride(o.key_path, text);
  if (problem) {
    ctx.MarkBad(o.key_path);
    const std::string where = problem->mark.line == 1
                                  ? fmt::format("column {}", problem->mark.column)
                                  : fmt::format("line {}, column {}", problem->mark.line, problem->mark.column);
    ctx.Error(o.key_path, {}, "", fmt::format("at {} of the override: {}", where, problem->message));
    return;
  }
  // Recipe keys are at most four levels deep ("training.optimizer.other");
  // a longer path can only be a mistake, and creating its maps would cost
  // memory in proportion to the path.
  constexpr size_t kMaxKeyPathBytes = 200;
  constexpr size_t kMaxKeyPathParts = 8;
  const std::vector<std::string> parts =
      o.key_path.size() > kMaxKeyPathBytes ? std::vector<std::string>{} : SplitPath(o.key_path);
  if (o.key_path.size() > kMaxKeyPathBytes || parts.size() > kMaxKeyPathParts) {
    ctx.MarkBad(o.key_path);
    // Named by the override itself (the shortened path would not match it).
    ctx.diagnostics().push_back(Diagnostic{
        Severity::kError, text, {}, Abbreviate(o.key_path, kShownBytes), "",
              fmt::format("the key path is {} bytes in {} parts; recipe keys are at most {} bytes in {} parts "
                          "(e.g. parallel.tp)",
                          o.key_path.size(), std::count(o.key_path.begin(), o.key_path.end(), '.') + 1,
                          kMaxKeyPathBytes, kMaxKeyPathParts),
        ""});
    return;
  }
  YAML::Node value;
  try {
    value = YAML::Load(o.value);
  } catch (const YAML::Exception& e) {
    ctx.MarkBad(o.key_path);
    ctx.Error(o.key_path, {}, Abbreviate(o.value, kShownBytes), fmt::format("the value is not valid YAML: {}", e.msg));
    return;
  }
  YAML::Node node;
  node.reset(root);
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + parts[i];
    YAML::Node child = node[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    } else if (!child.IsMap()) {
      ctx.Error(o.key_path, {}, Abbreviate(o.value, kShownBytes),
                fmt::format("cannot set a key under '{}': it is a {}, not a map", walked, KindName(child)));
      return;
    }
    YAML::Node next = node[parts[i]];
    node.reset(next);
  }
  node[parts.back()] = value;
}

// ---- the whole recipe ------------------------------------------------------

void ParseRecipe(const YAML::Node& root, Context& ctx, Recipe* recipe) {
  MapReader top(ctx, root, "");
  if (!top.ok()) return;
  top.String("name", &recipe->name, kMaxNameLength);
  const bool layers_ok = ParseModel(top, ctx, recipe);
  ReadSection(top, "training", recipe);
  if (auto parallel = ReadSection(top, "parallel", recipe); parallel && parallel->ok()) {
    ReadStageBoundaries(*parallel, ctx, &recipe->parallel.stage_boundaries);
  }
  // Megatron runs 1F1B with virtual stages as its interleaved schedule.
  if (recipe->parallel.schedule == Schedule::k1F1B && recipe->parallel.vpp > 1) {
    recipe->parallel.schedule = Schedule::kInterleaved;
  }
  auto cluster = ReadSection(top, "cluster", recipe);
  ReadDevice(cluster, ctx, recipe);
  ReadSection(top, "serving", recipe);
  recipe->source = ctx.source();
  Reporter reporter(ctx.source(), &ctx.diagnostics(), &ctx);
  Validate(*recipe, layers_ok, reporter);
}

LoadResult Finish(Context& ctx, std::optional<Recipe> recipe) {
  LoadResult result;
  result.diagnostics = std::move(ctx.diagnostics());
  SortDiagnostics(ctx.source(), &result.diagnostics);
  if (ctx.dropped() > 0) {
    result.diagnostics.push_back(Diagnostic{
        ctx.dropped_errors() ? Severity::kError : Severity::kWarning, ctx.file(), {}, "", "",
        fmt::format("{} more problems not shown (at most {} are listed); fix the ones above first", ctx.dropped(),
                    kMaxDiagnostics),
        ""});
  }
  if (!HasErrors(result.diagnostics)) result.recipe = std::move(recipe);
  return result;
}

std::string KeyList() { return JoinNames(KeysOf("")); }

LoadResult Load(const std::string& yaml, const std::string& file, const std::vector<Override>& overrides) {
  if (static_cast<int64_t>(yaml.size()) > kMaxFileBytes) {
    Context ctx(file, "");
    ctx.Error("", {}, "",
              fmt::format("the file is {} bytes; recipes are limited to {} bytes (4 MiB)", yaml.size(), kMaxFileBytes));
    return Finish(ctx, std::nullopt);
  }
  Context ctx(file, yaml);
  if (const std::optional<TextProblem> problem = CheckRecipeText(yaml)) {
    ctx.Error("", problem->mark, "", problem->message);
    std::string& shown = ctx.diagnostics().back().source_line;
    shown = Sanitize(shown);
    return Finish(ctx, std::nullopt);
  }
  const auto separators = std::count_if(yaml.begin(), yaml.end(), [](char c) {
    return c == ',' || c == ':' || c == '-' || c == '[' || c == '{' || c == '\n';
  });
  if (separators > kMaxSeparators) {
    ctx.Error("", {}, "",
              fmt::format("the file has {} YAML separators (',', ':', '-', '[', '{{', newlines); recipes are limited "
                          "to {}",
                          separators, kMaxSeparators));
    return Finish(ctx, std::nullopt);
  }
  YAML::Node root;
  std::optional<YAML::Mark> second_document;
  try {
    root = YAML::Load(yaml);  // the first document only
    second_document = SecondDocument(yaml);
    if (!second_document) second_document = AfterDocumentEnd(yaml);
  } catch (const YAML::ParserException& e) {
    ctx.Error("", Context::ToMark(e.mark), "", fmt::format("not valid YAML: {}", e.msg));
    return Finish(ctx, std::nullopt);
  }
  if (root.IsNull()) {
    if (const auto content = FirstContent(yaml)) {
      // yaml-cpp reads some malformed text (a leading ',') as an empty document.
      ctx.Error("", Context::ToMark(*content), "",
                "not a recipe: the document reads as null (malformed YAML?); expected a map with keys " + KeyList());
    } else {
      ctx.Error("", {}, "", "the recipe is empty; expected a map with keys " + KeyList());
    }
    return Finish(ctx, std::nullopt);
  }
  if (second_document) {
    ctx.Error("", Context::ToMark(*second_document), "",
              "a second YAML document, or text after the document end '...'; a recipe is one document (remove the "
              "separator and what follows it)");
    return Finish(ctx, std::nullopt);
  }
  if (!root.IsMap()) {
    ctx.Error("", Context::ToMark(root.Mark()), root.IsScalar() ? root.Scalar().substr(0, 40) : "",
              fmt::format("the top level must be a map with keys {}, got a {}", KeyList(), KindName(root)));
    return Finish(ctx, std::nullopt);
  }
  for (const Override& o : overrides) ApplyOverride(root, o, ctx);
  Recipe recipe;
  ParseRecipe(root, ctx, &recipe);
  return Finish(ctx, std::move(recipe));
}

}  // namespace
}  // namespace recipe_internal

LoadResult LoadRecipeFromString(const std::string& yaml, const std::string& file,
                                const std::vector<Override>& overrides) {
  try {
    return recipe_internal::Load(yaml, file, overrides);
  } catch (const std::exception& e) {
    // No exception crosses the library boundary (docs/architecture.md).
    LoadResult result;
    result.diagnostics.push_back(Diagnostic{Severity::kError, file, {}, "", "", std::string("cannot read the recipe: ") + e.what(), ""});
    return result;
  }
}

LoadResult LoadRecipeFile(const std::string& path, const std::vector<Override>& overrides) {
  auto fail = [&path](const std::string& message) {
    LoadResult result;
    result.diagnostics.push_back(Diagnostic{Severity::kError, path, {}, "", "", message, ""});
    return result;
  };
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return fail("cannot open the recipe: no such file");
  if (!std::filesystem::is_regular_file(status)) return fail("cannot read the recipe: not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("cannot open the recipe: permission denied or unreadable");
  // Read at most one byte past the limit, so a huge file is refused cheaply.
  std::string text(static_cast<size_t>(recipe_internal::kMaxFileBytes + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return LoadRecipeFromString(text, path, overrides);
}

std::optional<Override> ParseOverride(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos) return std::nullopt;
  std::string key = text.substr(0, eq);
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  key.erase(key.begin(), std::find_if(key.begin(), key.end(), not_space));
  key.erase(std::find_if(key.rbegin(), key.rend(), not_space).base(), key.end());
  if (key.empty()) return std::nullopt;
  // An empty part ("a..b", ".a", "a."), checked without splitting a possibly huge path.
  if (key.front() == '.' || key.back() == '.' || key.find("..") != std::string::npos) return std::nullopt;
  // One line: a line break could open another YAML document ("---") or
  // section in the text the value is spliced into.
  if (text.find_first_of("\r\n", eq + 1) != std::string::npos) return std::nullopt;
  return Override{key, text.substr(eq + 1)};
}

}  // namespace preflight

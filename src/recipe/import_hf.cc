// Hugging Face config.json -> recipe model section (issue 8).
//
// Each architecture maps its config keys onto the recipe schema (recipe.h;
// YAML keys == field names). Layer letters follow the block convention of
// docs/formulas.md §0: one letter per pre-norm residual sublayer, so a Llama
// decoder layer is "AD", a Mixtral layer "AE", and Nemotron-H's
// hybrid_override_pattern maps letter for letter (M->M, *->A, -->D, E->E).
// Keys the recipe cannot represent are reported as warnings with the key,
// its value and what the recipe does instead.
#include "preflight/recipe/import.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "preflight/recipe/units.h"
#include "recipe_bounds.h"

namespace preflight {
namespace {

using Json = nlohmann::json;

// Keys that describe tokenization, initialization, numerics of inference or
// bookkeeping; none changes a parameter shape, a tensor saved for backward or
// a collective, so they are read and dropped without a warning.
const std::set<std::string> kIrrelevantKeys = {
    "_name_or_path", "architectures", "model_type", "auto_map", "bos_token_id", "eos_token_id",
    "pad_token_id", "eod_token_id", "tokenizer_class", "initializer_range", "rms_norm_eps",
    "layer_norm_epsilon", "layer_norm_eps", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "max_position_embeddings", "rope_theta", "attention_dropout", "hidden_dropout", "output_router_logits",
    "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "num_logits_to_keep", "use_mamba_kernels",
    "rescale_prenorm_residual", "residual_in_fp32", "pretraining_tp", "is_decoder", "max_window_layers",
    "mamba_dt_min", "mamba_dt_max", "mamba_dt_init_floor", "time_step_min", "time_step_max",
    "time_step_floor", "time_step_init_scheme", "time_step_scale", "time_step_limit", "mamba_dt_limit",
    "initial_context_length", "norm_topk_prob", "mamba_hidden_act", "ep_size", "tie_word_embeddings",
};

/// Line and column (1-based) of the first `"key"` in `text`; {0,0} when absent.
SourceMark KeyMark(const std::string& text, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  const size_t at = text.find(quoted);
  if (at == std::string::npos) return {};
  SourceMark mark{1, 1};
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') {
      ++mark.line;
      mark.column = 1;
    } else {
      ++mark.column;
    }
  }
  return mark;
}

/// Python's json module writes the non-standard tokens Infinity, -Infinity and
/// NaN (Nemotron-H's time_step_limit is [0.0, Infinity]); they become null so
/// that a strict JSON parser reads the file. Strings are left untouched.
std::string NeutralizePythonFloats(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    bool replaced = false;
    for (const std::string token : {"-Infinity", "Infinity", "NaN"}) {
      if (text.compare(i, token.size(), token) == 0) {
        out += "null";
        i += token.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

/// Deepest nesting of [ and { outside strings, with the byte offset where it
/// first passes `limit` (npos when it does not). Configs nest a few levels;
/// a JSON value nested thousands deep would exhaust the stack of the
/// recursive JSON library routines, so it is refused before parsing.
size_t FirstTooDeep(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}

/// Line and column (1-based) of byte `offset` in `text`.
SourceMark MarkOfOffset(const std::string& text, size_t offset) {
  SourceMark mark{1, 1};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++mark.line;
      mark.column = 1;
    } else {
      ++mark.column;
    }
  }
  return mark;
}

/// 1234567 -> "1,234,567".
std::string Grouped(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// A product of config sizes or a parameter count, with every step checked
/// (units.h CheckedAdd, CheckedSub, CheckedMul): each size is bounded (2^24,
/// a vocabulary 2^32), but three sizes at their bounds pass 2^63, where a
/// plain int64 product is undefined behaviour. Operators are members, so an
/// expression compiles only with a Count on the left of each step:
/// Count(hidden) * heads * head_dim is checked throughout. An overflow throws
/// ArithmeticOverflow: ConfigReader::StandIn reports it at the stand-in's key,
/// ImportHfConfig any other at the file.
class Count {
 public:
  explicit Count(int64_t n) : n_(n) {}
  int64_t value() const { return n_; }
  Count operator+(Count b) const { return Count(CheckedAdd(n_, b.n_)); }
  Count operator-(Count b) const { return Count(CheckedSub(n_, b.n_)); }
  Count operator*(Count b) const { return Count(CheckedMul(n_, b.n_)); }
  Count operator+(int64_t b) const { return *this + Count(b); }
  Count operator-(int64_t b) const { return *this - Count(b); }
  Count operator*(int64_t b) const { return *this * Count(b); }
  Count operator/(int64_t b) const { return Count(n_ / b); }  // a positive divisor: cannot overflow
  Count operator-() const { return Count(CheckedSub(0, n_)); }

 private:
  int64_t n_;
};

/// Model state a parameter costs before sharding with the import's default
/// training setup: bf16 weight 2, fp32 gradient 4, fp32 master 4, AdamW m and v 8.
constexpr int64_t kModelStateBytesPerParam = 18;

/// "the recipe counts 4,307,520 fewer parameters than the model (0.07 GiB less
/// model state ...)": what a stand-in's warning says about its size.
std::string DifferenceText(int64_t recipe_minus_model) {
  if (recipe_minus_model == 0) return "the parameter count is exact";
  const int64_t n = recipe_minus_model < 0 ? -recipe_minus_model : recipe_minus_model;
  const double gib = static_cast<double>(n) * kModelStateBytesPerParam / 1073741824.0;
  return fmt::format(
      "the recipe counts {} {} parameters than the model ({:.2f} GiB {} model state at {} B a "
      "parameter: bf16 weights, fp32 gradients, fp32 master weights and AdamW moments, before "
      "sharding)",
      Grouped(n), recipe_minus_model < 0 ? "fewer" : "more", gib, recipe_minus_model < 0 ? "less" : "more",
      kModelStateBytesPerParam);
}

/// Reads fields of one config object, recording which keys were used and
/// collecting diagnostics.
class ConfigReader {
 public:
  ConfigReader(const Json& config, std::string file, const std::string& text, std::string architecture, HfImport* out,
               std::string prefix = "")
      : config_(config),
        file_(std::move(file)),
        text_(text),
        architecture_(std::move(architecture)),
        diagnostics_(&out->diagnostics),
        out_(out),
        prefix_(std::move(prefix)) {}

  /// A reader of the object under `key` (mamba_ssm's ssm_cfg and attn_cfg),
  /// whose diagnostics name "key.field"; an empty object when absent or null,
  /// an error when it is not an object.
  ConfigReader Sub(const std::string& key) {
    used_.insert(key);
    static const Json kEmpty = Json::object();
    if (Has(key) && !config_.at(key).is_object()) {
      Error(key, config_.at(key).dump(), "must be an object ({\"field\": value, ...})");
    }
    const Json& sub = Has(key) && config_.at(key).is_object() ? config_.at(key) : kEmpty;
    return ConfigReader(sub, file_, text_, architecture_, out_, prefix_ + key + ".");
  }

  bool Has(const std::string& key) const { return config_.contains(key) && !config_.at(key).is_null(); }
  const Json& At(const std::string& key) const { return config_.at(key); }

  /// A positive integer that must be present.
  int64_t RequireInt(const std::string& key) {
    used_.insert(key);
    if (!Has(key)) {
      Error(key, "", fmt::format("missing required field for {} (a positive integer)", architecture_));
      return 1;
    }
    return CheckedPositive(key);
  }
  /// The first present key of `keys`, which must be a positive integer; else an error naming all.
  int64_t RequireIntOf(const std::vector<std::string>& keys) {
    for (const auto& k : keys) used_.insert(k);
    for (const auto& k : keys) {
      if (Has(k)) return CheckedPositive(k);
    }
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : " or ") + k;
    Error(keys.front(), "", fmt::format("missing required field for {} ({}; a positive integer)", architecture_, names));
    return 1;
  }
  /// A positive integer, or `fallback` when absent or null.
  int64_t OptInt(const std::string& key, int64_t fallback) {
    used_.insert(key);
    return Has(key) ? CheckedPositive(key) : fallback;
  }
  /// A non-negative integer, or `fallback` when absent or null.
  int64_t OptCount(const std::string& key, int64_t fallback) {
    used_.insert(key);
    if (!Has(key)) return fallback;
    const Json& v = config_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      Error(key, v.dump(), "must be a non-negative integer");
      return fallback;
    }
    return WithinBounds(key) ? v.get<int64_t>() : fallback;
  }
  bool OptBool(const std::string& key, bool fallback) {
    used_.insert(key);
    if (!Has(key)) return fallback;
    const Json& v = config_.at(key);
    if (!v.is_boolean()) {
      Error(key, v.dump(), "must be true or false");
      return fallback;
    }
    return v.get<bool>();
  }
  std::string OptString(const std::string& key, const std::string& fallback) {
    used_.insert(key);
    if (!Has(key)) return fallback;
    const Json& v = config_.at(key);
    if (!v.is_string()) {
      Error(key, v.dump(), "must be a string");
      return fallback;
    }
    return v.get<std::string>();
  }
  /// Marks `key` as handled without reading it.
  void Use(const std::string& key) { used_.insert(key); }

  /// A warning: `key` (with its value) is not represented; `what` says what the recipe does instead.
  void Unrepresented(const std::string& key, const std::string& what) {
    WarnAbout(key, "not represented in the recipe: " + what);
  }
  /// Warns about `key` only when it is present, not null and not equal to `neutral`.
  void UnrepresentedUnless(const std::string& key, const Json& neutral, const std::string& what) {
    used_.insert(key);
    if (Has(key) && config_.at(key) != neutral) Unrepresented(key, what);
  }

  /// A block imported as the nearest letter: the warning says what stands in
  /// for what and the parameter and model-state difference, and the figure is
  /// kept in HfImport::stand_ins. `difference` returns the recipe's count
  /// minus the model's as a Count; sizes whose count leaves int64 are an
  /// error at `key`.
  template <typename Difference>
  void StandIn(const std::string& key, const std::string& what, Difference difference) {
    int64_t param_difference = 0;
    try {
      param_difference = difference().value();
      // The warning prints its magnitude, which -2^63 has not in int64.
      if (param_difference == std::numeric_limits<int64_t>::min()) {
        throw ArithmeticOverflow("int64 overflow in negation");
      }
    } catch (const ArithmeticOverflow& e) {
      Error(key, config_.contains(key) ? Abbreviated(config_.at(key).dump()) : "",
            fmt::format("the sizes are too large to count the parameters of this stand-in ({}); no model this large "
                        "can be trained",
                        e.what()));
      return;
    }
    out_->stand_ins.push_back({prefix_ + key, param_difference});
    WarnAbout(key, "imported as the nearest recipe block: " + what + "; " + DifferenceText(param_difference));
  }

  void Error(const std::string& key, const std::string& value, const std::string& message) {
    // A key read twice (Jamba's intermediate_size feeds the MLP and the experts) is reported once.
    if (!reported_.insert(key + "\n" + message).second) return;
    Diagnostic d;
    d.severity = Severity::kError;
    d.file = file_;
    d.mark = MarkOf(key);
    d.key_path = prefix_ + key;
    d.value = value;
    d.message = message;
    diagnostics_->push_back(std::move(d));
  }

  /// One warning naming every key that no mapping read and that is not known
  /// to be irrelevant, so nothing is dropped silently.
  void WarnUnread() {
    std::vector<std::string> unread;
    for (const auto& [key, value] : config_.items()) {
      if (used_.count(key) == 0 && kIrrelevantKeys.count(key) == 0 && !value.is_null()) {
        unread.push_back(prefix_ + key);
      }
    }
    if (unread.empty()) return;
    constexpr size_t kListed = 30;  // the rest are counted, so a huge config gives a readable message
    std::string names;
    for (size_t i = 0; i < unread.size() && i < kListed; ++i) names += (names.empty() ? "" : ", ") + unread[i];
    if (unread.size() > kListed) names += fmt::format(" and {} more", unread.size() - kListed);
    Diagnostic d;
    d.severity = Severity::kWarning;
    d.file = file_;
    d.message = fmt::format("keys not imported (no counterpart in the recipe for {}): {}", architecture_, names);
    diagnostics_->push_back(std::move(d));
  }

 private:
  int64_t CheckedPositive(const std::string& key) {
    const Json& v = config_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      Error(key, v.dump(), "must be a positive integer");
      return 1;
    }
    return WithinBounds(key) ? v.get<int64_t>() : 1;
  }
  /// Whether the integer at `key` is within the recipe's bounds; an error
  /// when not. Every size the importer reads is a width, count or vocabulary;
  /// bounding them as the recipe does keeps a product of two within int64
  /// (the products of more go through Count). Layer counts have their own
  /// bound (kMaxLayers, LayerCount); layer periods and offsets only index.
  bool WithinBounds(const std::string& key) {
    const Json& v = config_.at(key);
    const bool vocab = key.find("vocab") != std::string::npos;
    const int64_t most = vocab ? recipe_internal::kMaxVocab : recipe_internal::kMaxWidth;
    if (key.find("layer") == std::string::npos && v.get<int64_t>() > most) {
      Error(key, v.dump(),
            fmt::format("must be at most {} (the recipe's largest {})", most, vocab ? "vocabulary" : "size"));
      return false;
    }
    return true;
  }
  /// A warning located at `key`, with its value.
  void WarnAbout(const std::string& key, const std::string& message) {
    used_.insert(key);
    Diagnostic d;
    d.severity = Severity::kWarning;
    d.file = file_;
    d.mark = MarkOf(key);
    d.key_path = prefix_ + key;
    if (config_.contains(key)) d.value = Abbreviated(config_.at(key).dump());
    d.message = message;
    diagnostics_->push_back(std::move(d));
  }
  /// Where `key` is written; for a key a nested object leaves out, where the object is.
  SourceMark MarkOf(const std::string& key) const {
    const SourceMark mark = KeyMark(text_, key);
    if (mark.line > 0 || prefix_.empty() || config_.contains(key)) return mark;
    return KeyMark(text_, prefix_.substr(0, prefix_.size() - 1));
  }
  static std::string Abbreviated(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 77) + "..."; }

  const Json& config_;
  std::string file_;
  const std::string& text_;
  std::string architecture_;
  std::vector<Diagnostic>* diagnostics_;
  HfImport* out_;
  std::string prefix_;  // "ssm_cfg." for a nested object
  std::set<std::string> used_;
  std::set<std::string> reported_;
};

/// Appends model entries in schema order.
class ModelWriter {
 public:
  void Add(const std::string& key_path, const std::string& value, const std::string& comment = "") {
    entries_.push_back({"model." + key_path, value, comment});
  }
  void Add(const std::string& key_path, int64_t value, const std::string& comment = "") {
    Add(key_path, std::to_string(value), comment);
  }
  void AddBool(const std::string& key_path, bool value, const std::string& comment = "") {
    Add(key_path, std::string(value ? "true" : "false"), comment);
  }
  std::vector<YamlEntry> Take() { return std::move(entries_); }

 private:
  std::vector<YamlEntry> entries_;
};

/// A per-layer letter string written as pattern x repeat: the shortest prefix
/// whose repetition gives the whole string.
struct PatternRepeat {
  std::string pattern;
  int64_t repeat = 1;
};
PatternRepeat Compress(const std::string& letters) {
  const size_t n = letters.size();
  for (size_t p = 1; p <= n; ++p) {
    if (n % p != 0) continue;
    bool periodic = true;
    for (size_t i = p; i < n && periodic; ++i) periodic = letters[i] == letters[i - p];
    if (periodic) return {letters.substr(0, p), static_cast<int64_t>(n / p)};
  }
  return {letters, 1};
}

void WriteLayers(const std::string& letters, const std::string& comment, ModelWriter* w) {
  const PatternRepeat pr = Compress(letters);
  w->Add("pattern", "\"" + pr.pattern + "\"", comment);
  w->Add("repeat", pr.repeat, fmt::format("{} sublayers", letters.size()));
}

/// num_hidden_layers, bounded like the recipe's expanded layer list.
int64_t LayerCount(ConfigReader& r) {
  const int64_t layers = r.RequireInt("num_hidden_layers");
  if (layers > recipe_internal::kMaxLayers) {
    r.Error("num_hidden_layers", std::to_string(layers),
            fmt::format("at most {} layers are supported", recipe_internal::kMaxLayers));
    return 1;
  }
  return layers;
}

/// Common head of every decoder: hidden size, vocabulary, tied embeddings.
int64_t ReadTrunk(ConfigReader& r, bool tie_default, ModelWriter* w) {
  const int64_t hidden = r.RequireInt("hidden_size");
  w->Add("hidden", hidden);
  w->Add("vocab", r.RequireInt("vocab_size"));
  w->AddBool("tie_embeddings", r.OptBool("tie_word_embeddings", tie_default));
  return hidden;
}

/// Attention head counts as imported.
struct AttentionShape {
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 1;
  Count QkvWidth() const { return (Count(kv_heads) * 2 + heads) * head_dim; }
};

/// Attention with separate Q, K, V heads (GQA/MQA/MHA).
AttentionShape ReadAttention(ConfigReader& r, int64_t hidden, ModelWriter* w, bool qk_norm = false) {
  AttentionShape a;
  a.heads = r.RequireInt("num_attention_heads");
  a.kv_heads = r.OptInt("num_key_value_heads", a.heads);
  r.Use("head_dim");
  r.Use("attention_head_dim");
  a.head_dim = hidden / a.heads;
  if (r.Has("head_dim"))
    a.head_dim = r.OptInt("head_dim", a.head_dim);
  else if (r.Has("attention_head_dim"))
    a.head_dim = r.OptInt("attention_head_dim", a.head_dim);
  w->Add("attention.heads", a.heads);
  w->Add("attention.kv_heads", a.kv_heads);
  w->Add("attention.head_dim", a.head_dim);
  if (qk_norm) w->AddBool("attention.qk_norm", true, "per-head RMSNorm on q and k");
  return a;
}

/// Checks that the gated MLP activation is SiLU (SwiGLU); warns otherwise.
void ExpectSilu(ConfigReader& r, const std::string& key) {
  const std::string act = r.OptString(key, "silu");
  if (act != "silu" && act != "swish") {
    r.Unrepresented(key, "gated MLP activation other than SiLU; imported as swiglu (same parameter shapes)");
  }
}

void WarnRopeScaling(ConfigReader& r) {
  r.UnrepresentedUnless("rope_scaling", Json(), "RoPE has no parameters and no saved tensors of its own; "
                                                "the scaling only changes positions, so it is dropped");
}

void WarnBiases(ConfigReader& r) {
  r.UnrepresentedUnless("attention_bias", Json(false),
                        "bias vectors on the attention projections are not counted "
                        "(recipe linears are bias-free, docs/formulas.md §1)");
  r.UnrepresentedUnless("mlp_bias", Json(false), "bias vectors on the MLP projections are not counted");
}

void WarnSlidingWindow(ConfigReader& r, bool enabled) {
  if (enabled) {
    r.UnrepresentedUnless("sliding_window", Json(), "sliding-window attention; the recipe models full causal "
                                                    "attention (activations of flash attention do not depend on "
                                                    "the window)");
  }
}

/// Comments an importer attaches to the model.mamba entries it writes.
struct Mamba2Comments {
  std::string expand;
  std::string head_dim;
  std::string groups;
};
/// The recipe's model.mamba entries (its Mamba-2 mixer); every importer sets
/// all six, so MambaConfig's defaults never reach the recipe. The inner width
/// is written as the head count when it is set (a width that is not a whole
/// multiple of hidden), else as expand.
void WriteMamba2(const MambaConfig& m, ModelWriter* w, const Mamba2Comments& c = {}) {
  w->Add("mamba.d_state", m.d_state);
  w->Add("mamba.d_conv", m.d_conv);
  if (m.heads > 0) {
    w->Add("mamba.heads", m.heads, c.expand);
  } else {
    w->Add("mamba.expand", m.expand, c.expand);
  }
  w->Add("mamba.head_dim", m.head_dim, c.head_dim);
  w->Add("mamba.groups", m.groups, c.groups);
  w->Add("mamba.chunk", m.chunk);
}

// ---- Mamba-1 as the nearest M ----------------------------------------------

/// Parameters of the recipe's Mamba-2 mixer (inventory AddMamba: in_proj [z,
/// x, B, C, dt], conv1d over [x, B, C] with bias, dt_bias, A_log and D per
/// head, the gated norm, out_proj), its pre-norm excluded.
Count Mamba2MixerParams(int64_t hidden, int64_t d_inner, int64_t head_dim, int64_t groups, int64_t d_state,
                        int64_t d_conv) {
  const int64_t heads = d_inner / head_dim;
  const Count bc = Count(2) * groups * d_state;
  const Count in_proj = (Count(d_inner) * 2 + bc + heads) * hidden;
  const Count conv = (bc + d_inner) * (Count(d_conv) + 1);
  const Count rest = Count(heads) * 3 + d_inner + Count(d_inner) * hidden;
  return in_proj + conv + rest;
}

/// A Mamba-1 mixer (mamba_ssm mamba_simple.py Mamba; Jamba's JambaMambaMixer).
struct Mamba1Shape {
  int64_t hidden = 1;
  int64_t d_inner = 2;
  int64_t d_state = 16;
  int64_t d_conv = 4;
  int64_t dt_rank = 1;
  bool conv_bias = true;
  bool proj_bias = false;
  int64_t extra = 0;  // Jamba's dt/B/C RMSNorms: dt_rank + 2 d_state
};

/// in_proj [h, 2 d_inner], depthwise conv1d over d_inner, x_proj [d_inner,
/// dt_rank + 2 d_state], dt_proj [dt_rank, d_inner] with bias, A_log
/// [d_inner, d_state], D [d_inner], out_proj [d_inner, h].
Count Mamba1MixerParams(const Mamba1Shape& m) {
  const int64_t di = m.d_inner;
  const Count x_proj = Count(m.d_state) * 2 + m.dt_rank;
  const Count per_channel = Count(m.hidden) * 3 + m.d_conv + x_proj + m.dt_rank + m.d_state + 2;
  Count n = Count(di) * per_channel + m.extra;  // in_proj 2h + out_proj h per channel
  if (m.conv_bias) n = n + di;
  if (m.proj_bias) n = n + Count(di) * 2 + m.hidden;
  return n;
}

/// The Mamba-2 head width that stands in for Mamba-1's per-channel scan: 64
/// channels (Mamba-2's default) when d_inner allows, else the largest
/// power-of-two divisor below it.
int64_t StandInHeadDim(int64_t d_inner) {
  int64_t head_dim = 64;
  while (head_dim > 1 && d_inner % head_dim != 0) head_dim /= 2;
  return head_dim;
}

/// Writes the Mamba-2 stand-in for `layers` Mamba-1 mixers (same d_inner,
/// d_state and conv, one B/C group) and warns with the difference.
void WriteMamba1StandIn(ConfigReader& r, const std::string& key, const Mamba1Shape& m1, int64_t expand, int64_t layers,
                        ModelWriter* w) {
  const int64_t head_dim = StandInHeadDim(m1.d_inner);
  WriteMamba2(
      {.d_state = m1.d_state, .d_conv = m1.d_conv, .expand = expand, .head_dim = head_dim, .groups = 1, .chunk = 256},
      w,
      {.expand = "",
       .head_dim = "Mamba-1 has no heads: the Mamba-2 stand-in, see the warning",
       .groups = "Mamba-1 shares B and C across all channels"});
  r.StandIn(
      key,
      fmt::format("the mixer is Mamba-1 (x_proj to dt_rank {} + 2 x d_state, dt_proj, A_log of [d_inner, {}]{}) "
                  "and the recipe's M block is Mamba-2: written as Mamba-2 with head_dim {} and 1 group "
                  "(same d_inner {}, d_state and conv), {} layers; activations are priced as Mamba-2's "
                  "chunked scan saves them (Mamba-1's selective scan keeps dt for every channel, not one "
                  "per head)",
                  m1.dt_rank, m1.d_state, m1.extra > 0 ? ", dt/B/C RMSNorms" : "", head_dim, m1.d_inner, layers),
      [&] {
        return (Mamba2MixerParams(m1.hidden, m1.d_inner, head_dim, 1, m1.d_state, m1.d_conv) - Mamba1MixerParams(m1)) *
               layers;
      });
}

// ---- Architectures ---------------------------------------------------------

void ImportLlama(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) letters += "AD";
  WriteLayers(letters, "Llama decoder layer = attention sublayer + dense SwiGLU MLP sublayer", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  ReadAttention(r, hidden, w);
  w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"));
  w->Add("mlp.activation", "swiglu");
  ExpectSilu(r, "hidden_act");
  WarnRopeScaling(r);
  WarnBiases(r);
}

/// MoE block shared by Mixtral-like routers: softmax router, dropless.
void WriteSoftmaxMoe(int64_t experts, int64_t top_k, int64_t ffn_hidden, ModelWriter* w) {
  w->Add("moe.experts", experts);
  w->Add("moe.top_k", top_k);
  w->Add("moe.ffn_hidden", ffn_hidden, "per routed expert");
  w->Add("moe.shared_experts", 0);
  w->AddBool("moe.dropless", true, "Hugging Face MoE blocks drop no tokens");
  w->Add("moe.router", "softmax");
}

void ImportMixtral(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) letters += "AE";
  WriteLayers(letters, "Mixtral decoder layer = attention + MoE FFN", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  ReadAttention(r, hidden, w);
  WriteSoftmaxMoe(r.RequireInt("num_local_experts"), r.RequireInt("num_experts_per_tok"),
                  r.RequireInt("intermediate_size"), w);
  ExpectSilu(r, "hidden_act");
  WarnRopeScaling(r);
  WarnSlidingWindow(r, true);
  r.Use("router_jitter_noise");
  if (r.Has("router_jitter_noise") && r.At("router_jitter_noise") != Json(0) &&
      r.At("router_jitter_noise") != Json(0.0)) {
    r.Unrepresented("router_jitter_noise", "router input noise has no parameters; dropped");
  }
}

/// Which layers of a Qwen3-MoE-style model have the sparse FFN
/// (Qwen3MoeDecoderLayer, Qwen3NextDecoderLayer): not in mlp_only_layers,
/// num_experts > 0 and (layer_idx + 1) % decoder_sparse_step == 0.
std::vector<bool> Qwen3SparseLayers(ConfigReader& r, int64_t layers, int64_t experts) {
  const int64_t sparse_step = r.OptInt("decoder_sparse_step", 1);
  std::set<int64_t> mlp_only;
  r.Use("mlp_only_layers");
  if (r.Has("mlp_only_layers")) {
    const Json& v = r.At("mlp_only_layers");
    if (!v.is_array()) {
      r.Error("mlp_only_layers", v.dump(), "must be a list of layer indices");
    } else {
      for (const Json& i : v) {
        if (!i.is_number_integer()) r.Error("mlp_only_layers", v.dump(), "must be a list of layer indices");
        else mlp_only.insert(i.get<int64_t>());
      }
    }
  }
  std::vector<bool> sparse(static_cast<size_t>(layers));
  for (int64_t i = 0; i < layers; ++i) {
    sparse[static_cast<size_t>(i)] = mlp_only.count(i) == 0 && experts > 0 && (i + 1) % sparse_step == 0;
  }
  return sparse;
}

void ImportQwen3Moe(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const int64_t experts = r.OptCount("num_experts", 0);
  const std::vector<bool> sparse = Qwen3SparseLayers(r, layers, experts);
  std::string letters;
  for (const bool s : sparse) letters += s ? "AE" : "AD";
  WriteLayers(letters, "Qwen3-MoE decoder layer = attention (q/k norm) + MoE FFN", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  ReadAttention(r, hidden, w, /*qk_norm=*/true);
  if (letters.find('D') != std::string::npos) {
    w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"), "dense layers (mlp_only_layers / sparse step)");
    w->Add("mlp.activation", "swiglu");
  } else {
    r.Use("intermediate_size");
  }
  if (experts > 0) {
    WriteSoftmaxMoe(experts, r.RequireInt("num_experts_per_tok"), r.RequireInt("moe_intermediate_size"), w);
  }
  ExpectSilu(r, "hidden_act");
  WarnRopeScaling(r);
  WarnSlidingWindow(r, r.OptBool("use_sliding_window", false));
  WarnBiases(r);
}

/// DeepSeek-V3-style routing keys without parameters (group-limited routing,
/// the routed-output scale), the MTP modules the recipe leaves out, and the
/// checkpoint's quantization: each named and dropped.
void WarnDeepSeekRoutingAndMtp(ConfigReader& r) {
  r.UnrepresentedUnless("n_group", Json(1),
                        "group-limited routing (experts in n_group groups) only restricts "
                        "which experts a token may pick; no parameters, dropped");
  r.UnrepresentedUnless("topk_group", Json(1), "group-limited routing: groups a token may pick from; dropped");
  r.UnrepresentedUnless("routed_scaling_factor", Json(1.0), "scale on routed-expert outputs; no parameters, dropped");
  r.UnrepresentedUnless("num_nextn_predict_layers", Json(0),
                        "multi-token-prediction (MTP) modules are not part of the recipe; their parameters "
                        "(one extra decoder layer, embedding-sized projections) are not counted");
  r.UnrepresentedUnless("quantization_config", Json(),
                        "checkpoint quantization; the recipe's storage dtypes come "
                        "from training.precision");
}

void ImportDeepseekV3(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const int64_t first_dense = r.OptCount("first_k_dense_replace", 0);
  const int64_t freq = r.OptInt("moe_layer_freq", 1);
  const int64_t routed = r.OptCount("n_routed_experts", 0);
  // DeepseekV3DecoderLayer: MoE iff n_routed_experts and layer_idx >=
  // first_k_dense_replace and layer_idx % moe_layer_freq == 0.
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) letters += (routed > 0 && i >= first_dense && i % freq == 0) ? "AE" : "AD";
  if (freq == 1 && routed > 0 && first_dense < layers) {
    // The recipe's own dense prefix: pattern "AE" with the first k E slots dense.
    w->Add("pattern", "\"AE\"", "MLA attention + MoE FFN; the first k FFN slots are dense (moe.first_k_dense)");
    w->Add("repeat", layers, fmt::format("{} sublayers", 2 * layers));
  } else {
    WriteLayers(letters, "MLA attention + MoE or dense FFN per moe_layer_freq", w);
  }
  ReadTrunk(r, false, w);
  const int64_t heads = r.RequireInt("num_attention_heads");
  r.Use("num_key_value_heads");
  w->Add("mla.heads", heads);
  w->Add("mla.q_lora_rank", r.OptCount("q_lora_rank", 0), "0 = no query compression");
  w->Add("mla.kv_lora_rank", r.RequireInt("kv_lora_rank"));
  w->Add("mla.qk_rope_head_dim", r.RequireInt("qk_rope_head_dim"));
  w->Add("mla.qk_nope_head_dim", r.RequireInt("qk_nope_head_dim"));
  w->Add("mla.v_head_dim", r.RequireInt("v_head_dim"));
  if (letters.find('D') != std::string::npos) {
    w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"), "dense FFN layers");
    w->Add("mlp.activation", "swiglu");
  } else {
    r.Use("intermediate_size");
  }
  if (routed > 0) {
    const std::string scoring = r.OptString("scoring_func", "softmax");
    const std::string topk_method = r.OptString("topk_method", "greedy");
    w->Add("moe.experts", routed);
    w->Add("moe.top_k", r.RequireInt("num_experts_per_tok"));
    w->Add("moe.ffn_hidden", r.RequireInt("moe_intermediate_size"), "per routed expert");
    w->Add("moe.shared_experts", r.OptCount("n_shared_experts", 0), "each as wide as a routed expert");
    w->AddBool("moe.dropless", true, "Hugging Face MoE blocks drop no tokens");
    w->Add("moe.router", scoring == "sigmoid" ? "sigmoid" : "softmax");
    w->AddBool("moe.router_bias", topk_method == "noaux_tc",
               "e_score_correction_bias: aux-loss-free balancing bias per expert");
    if (freq == 1) w->Add("moe.first_k_dense", first_dense, "first_k_dense_replace");
    if (scoring != "sigmoid" && scoring != "softmax") {
      r.Unrepresented("scoring_func", "router scoring other than softmax or sigmoid; imported as softmax");
    }
  }
  WarnDeepSeekRoutingAndMtp(r);
  ExpectSilu(r, "hidden_act");
  WarnRopeScaling(r);
  WarnBiases(r);
}

/// Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air): GQA attention with q/k/v
/// biases and optional per-head q/k norms, then DeepSeek-V3's FFN: dense for
/// the first first_k_dense_replace layers, else routed experts with shared
/// experts of the same width and a sigmoid router with a correction bias.
void ImportGlm4Moe(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const int64_t first_dense = r.OptCount("first_k_dense_replace", 1);
  w->Add("pattern", "\"AE\"", "attention + MoE FFN; the first k FFN slots are dense (moe.first_k_dense)");
  w->Add("repeat", layers, fmt::format("{} sublayers", 2 * layers));
  const int64_t hidden = ReadTrunk(r, false, w);
  const AttentionShape a = ReadAttention(r, hidden, w, r.OptBool("use_qk_norm", false));
  if (r.OptBool("attention_bias", false)) {
    // Glm4MoeAttention: q_proj, k_proj and v_proj with bias=attention_bias, o_proj without.
    r.StandIn("attention_bias",
              "GLM's bias vectors on q, k and v (o_proj has none; the recipe's linear_bias would add them to o_proj "
              "and the MLP as well) are left out",
              [&] { return -(a.QkvWidth() * layers); });
  }
  r.UnrepresentedUnless("mlp_bias", Json(false), "bias vectors on the MLP projections are not counted");
  if (first_dense > 0) {
    w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"), "dense FFN layers");
    w->Add("mlp.activation", "swiglu");
  } else {
    r.Use("intermediate_size");
  }
  w->Add("moe.experts", r.RequireInt("n_routed_experts"));
  w->Add("moe.top_k", r.RequireInt("num_experts_per_tok"));
  w->Add("moe.ffn_hidden", r.RequireInt("moe_intermediate_size"), "per routed expert");
  w->Add("moe.shared_experts", r.OptCount("n_shared_experts", 1), "each as wide as a routed expert");
  w->AddBool("moe.dropless", true, "Hugging Face MoE blocks drop no tokens");
  w->Add("moe.router", "sigmoid");
  w->AddBool("moe.router_bias", true, "e_score_correction_bias: aux-loss-free balancing bias per expert");
  w->Add("moe.first_k_dense", first_dense, "first_k_dense_replace");
  r.Use("partial_rotary_factor");  // RoPE width: no parameters
  r.Use("rope_parameters");
  WarnDeepSeekRoutingAndMtp(r);
  ExpectSilu(r, "hidden_act");
  WarnRopeScaling(r);
}

void ImportJamba(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const int64_t attn_period = r.OptInt("attn_layer_period", 8);
  const int64_t attn_offset = r.OptCount("attn_layer_offset", 4);
  const int64_t expert_period = r.OptInt("expert_layer_period", 2);
  const int64_t expert_offset = r.OptCount("expert_layer_offset", 1);
  const int64_t experts = r.OptInt("num_experts", 16);
  // JambaModel: layer i mixes with attention iff i % attn_layer_period ==
  // attn_layer_offset (else Mamba), and its FFN is MoE iff num_experts > 1
  // and i % expert_layer_period == expert_layer_offset (else dense MLP).
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) {
    letters += (i % attn_period == attn_offset) ? 'A' : 'M';
    letters += (experts > 1 && i % expert_period == expert_offset) ? 'E' : 'D';
  }
  WriteLayers(letters, "Jamba layer = attention or Mamba mixer + dense or MoE FFN (attn/expert periods)", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  ReadAttention(r, hidden, w);
  w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"));
  w->Add("mlp.activation", "swiglu");
  if (experts > 1) {
    WriteSoftmaxMoe(experts, r.RequireInt("num_experts_per_tok"), r.RequireInt("intermediate_size"), w);
  }
  const int64_t expand = r.OptInt("mamba_expand", 2);
  const int64_t d_state = r.OptInt("mamba_d_state", 16);
  Mamba1Shape m1;
  m1.hidden = hidden;
  m1.d_inner = (Count(expand) * hidden).value();
  m1.d_state = d_state;
  m1.d_conv = r.OptInt("mamba_d_conv", 4);
  m1.dt_rank = (hidden + 15) / 16;  // JambaConfig's "auto": ceil(hidden_size / 16)
  r.Use("mamba_dt_rank");
  if (r.Has("mamba_dt_rank") && !(r.At("mamba_dt_rank").is_string() && r.At("mamba_dt_rank") == "auto")) {
    m1.dt_rank = r.OptInt("mamba_dt_rank", m1.dt_rank);
  }
  m1.conv_bias = r.OptBool("mamba_conv_bias", true);
  m1.proj_bias = r.OptBool("mamba_proj_bias", false);
  m1.extra = (Count(d_state) * 2 + m1.dt_rank).value();  // JambaMambaMixer's dt, B and C RMSNorms
  WriteMamba1StandIn(r, "mamba_dt_rank", m1, expand,
                     static_cast<int64_t>(std::count(letters.begin(), letters.end(), 'M')), w);
  ExpectSilu(r, "hidden_act");
  WarnSlidingWindow(r, true);
  WarnBiases(r);
}

void ImportNemotronH(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const std::string hybrid = r.OptString("hybrid_override_pattern", "");
  if (hybrid.empty()) {
    r.Error("hybrid_override_pattern", "", "missing required field for NemotronHForCausalLM (letters M, *, -, E)");
    return;
  }
  std::string letters;
  for (char c : hybrid) {
    switch (c) {
      case 'M': letters += 'M'; break;
      case '*': letters += 'A'; break;
      case '-': letters += 'D'; break;
      case 'E': letters += 'E'; break;
      default:
        r.Error("hybrid_override_pattern", "\"" + hybrid + "\"",
                fmt::format("letter '{}' is not one of M (Mamba-2), * (attention), - (MLP), E (MoE)", c));
        return;
    }
  }
  if (static_cast<int64_t>(letters.size()) != layers) {
    r.Error("hybrid_override_pattern", "\"" + hybrid + "\"",
            fmt::format("has {} letters but num_hidden_layers is {}", letters.size(), layers));
    return;
  }
  WriteLayers(letters, "hybrid_override_pattern with M->M, *->A, -->D, E->E", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  if (letters.find('A') != std::string::npos) ReadAttention(r, hidden, w);
  const std::string act = r.OptString("mlp_hidden_act", "relu2");
  if (letters.find('D') != std::string::npos) {
    w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"));
    if (act == "relu2") {
      w->Add("mlp.activation", "relu2", "squared ReLU: non-gated, two matrices (up, down)");
    } else {
      // Nemotron-H's MLP is never gated: the two-matrix gelu MLP has its shapes.
      w->Add("mlp.activation", "gelu", "stands in for " + act + ": non-gated, two matrices");
      r.Unrepresented("mlp_hidden_act", "the recipe has relu2, gelu and swiglu; this non-gated MLP is imported "
                                        "as gelu (same parameter shapes)");
    }
  }
  if (letters.find('E') != std::string::npos) {
    w->Add("moe.experts", r.RequireInt("n_routed_experts"));
    w->Add("moe.top_k", r.RequireInt("num_experts_per_tok"));
    w->Add("moe.ffn_hidden", r.RequireInt("moe_intermediate_size"), "per routed expert");
    const int64_t shared = r.OptCount("n_shared_experts", 0);
    w->Add("moe.shared_experts", shared);
    if (shared > 0) w->Add("moe.shared_ffn_hidden", r.RequireInt("moe_shared_expert_intermediate_size"));
    w->AddBool("moe.dropless", true, "Hugging Face MoE blocks drop no tokens");
    w->Add("moe.router", "sigmoid");
    w->AddBool("moe.router_bias", true, "e_score_correction_bias");
    // NemotronHMOE's experts and shared expert are the layer's non-gated MLP (mlp_hidden_act).
    w->Add("moe.activation", act == "relu2" ? "relu2" : "gelu", "non-gated experts, two matrices, as the MLP");
  }
  if (letters.find('M') != std::string::npos) {
    const int64_t mheads = r.RequireInt("mamba_num_heads");
    const int64_t mhead_dim = r.RequireInt("mamba_head_dim");
    const int64_t inner = (Count(mheads) * mhead_dim).value();
    if (inner % hidden != 0) {
      r.Error("mamba_num_heads", std::to_string(mheads),
              fmt::format("mamba_num_heads * mamba_head_dim = {} must be a multiple of hidden_size ({}) to be "
                          "written as model.mamba.expand",
                          inner, hidden));
    }
    r.Use("expand");
    r.Use("mamba_expand");
    WriteMamba2({.d_state = r.RequireIntOf({"ssm_state_size", "mamba_d_state"}),
                 .d_conv = r.Has("conv_kernel") ? r.OptInt("conv_kernel", 4) : r.OptInt("mamba_d_conv", 4),
                 .expand = inner / hidden,
                 .head_dim = mhead_dim,
                 .groups = r.RequireIntOf({"n_groups", "mamba_n_groups"}),
                 .chunk = r.Has("chunk_size") ? r.OptInt("chunk_size", 256) : r.OptInt("mamba_chunk_size", 256)},
                w,
                {.expand = fmt::format("mamba_num_heads {} x mamba_head_dim {} / hidden", mheads, mhead_dim),
                 .head_dim = "",
                 .groups = ""});
    r.Use("conv_kernel");
    r.Use("mamba_d_conv");
  }
  r.UnrepresentedUnless("use_bias", Json(false), "biases on the Mamba in/out projections are not counted");
  r.UnrepresentedUnless("use_conv_bias", Json(true), "the recipe always counts the conv1d bias");
  r.UnrepresentedUnless("mamba_proj_bias", Json(false), "biases on the Mamba in/out projections are not counted");
  r.Use("time_step_rank");  // a Mamba-1 width; Mamba-2 has one dt per head
  WarnRopeScaling(r);
  WarnSlidingWindow(r, true);
  WarnBiases(r);
}

/// The config keys of a Hugging Face Mamba-2 mixer: Mamba2Config's, and the
/// mamba_-prefixed ones of the hybrids (BambaConfig).
struct Mamba2Keys {
  const char* heads;
  const char* head_dim;
  const char* expand;
  const char* d_state;
  const char* d_conv;
  const char* groups;
  const char* chunk;
  const char* proj_bias;
  const char* conv_bias;
};
constexpr Mamba2Keys kMamba2ConfigKeys = {"num_heads", "head_dim",   "expand",   "state_size",   "conv_kernel",
                                          "n_groups",  "chunk_size", "use_bias", "use_conv_bias"};
constexpr Mamba2Keys kPrefixedMamba2Keys = {"mamba_n_heads",    "mamba_d_head",    "mamba_expand",
                                            "mamba_d_state",    "mamba_d_conv",    "mamba_n_groups",
                                            "mamba_chunk_size", "mamba_proj_bias", "mamba_conv_bias"};

/// A Hugging Face Mamba-2 mixer (Mamba2Mixer, BambaMixer: in_proj, conv1d,
/// dt_bias, A_log, D, gated RMSNorm, out_proj) under `k`'s names. An absent
/// (or "auto") head width is d_inner / heads, the only one that fits.
void ReadMamba2(ConfigReader& r, const Mamba2Keys& k, int64_t hidden, ModelWriter* w) {
  const int64_t expand = r.OptInt(k.expand, 2);
  const int64_t d_inner = (Count(expand) * hidden).value();
  const int64_t heads = r.RequireInt(k.heads);
  r.Use(k.head_dim);
  int64_t head_dim = d_inner / heads;
  if (r.Has(k.head_dim) && !(r.At(k.head_dim).is_string() && r.At(k.head_dim) == "auto")) {
    head_dim = r.OptInt(k.head_dim, head_dim);
  }
  const int64_t width = (Count(heads) * head_dim).value();
  if (width != d_inner) {
    r.Error(
        k.heads, std::to_string(heads),
        fmt::format("{} x {} = {} must equal {} x hidden_size = {}", k.heads, k.head_dim, width, k.expand, d_inner));
  }
  WriteMamba2({.d_state = r.RequireInt(k.d_state),
               .d_conv = r.OptInt(k.d_conv, 4),
               .expand = expand,
               .head_dim = head_dim,
               .groups = r.OptInt(k.groups, 1),
               .chunk = r.OptInt(k.chunk, 256)},
              w);
  r.UnrepresentedUnless(k.proj_bias, Json(false), "biases on the Mamba in/out projections are not counted");
  r.UnrepresentedUnless(k.conv_bias, Json(true), "the recipe always counts the conv1d bias");
}

void ImportMamba2(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  WriteLayers(std::string(static_cast<size_t>(layers), 'M'), "Mamba-2 only: one mixer sublayer per layer", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  ReadMamba2(r, kMamba2ConfigKeys, hidden, w);
  r.UnrepresentedUnless("rms_norm", Json(true), "the gated norm is always RMSNorm in the recipe");
  r.UnrepresentedUnless("norm_before_gate", Json(false), "the recipe's gated norm is RMSNorm(y * SiLU(z)) "
                                                         "(norm after the gate, as in Mamba-2)");
  r.Use("time_step_rank");  // a Mamba-1 width; Mamba-2 has one dt per head
  r.UnrepresentedUnless("hidden_act", Json("silu"), "the Mamba-2 gate is always SiLU in the recipe");
}

void ImportGptOss(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) letters += "AE";
  WriteLayers(letters, "gpt-oss decoder layer = attention + MoE FFN", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  ReadAttention(r, hidden, w);
  const int64_t top_k =
      r.Has("num_experts_per_tok") ? r.RequireInt("num_experts_per_tok") : r.RequireInt("experts_per_token");
  r.Use("experts_per_token");
  WriteSoftmaxMoe(r.RequireInt("num_local_experts"), top_k, r.RequireInt("intermediate_size"), w);
  r.Unrepresented("sinks", "gpt-oss attention sinks (one learned logit per head per layer) and the router "
                            "bias (one per expert) are not counted");
  r.Unrepresented("attention_bias", "q/k/v/o projection biases are not counted");
  r.Unrepresented("num_local_experts", "per-expert biases of gate_up_proj and down_proj (3 * hidden per expert) "
                                       "are not counted");
  r.UnrepresentedUnless("swiglu_limit", Json(), "gpt-oss clamps the SwiGLU inputs (and uses alpha 1.702); the "
                                                "recipe's swiglu has the same shapes");
  r.UnrepresentedUnless("layer_types", Json(), "alternating sliding-window / full attention; the recipe models "
                                               "full causal attention everywhere");
  r.UnrepresentedUnless("quantization_config", Json(), "MXFP4 expert weights in the checkpoint; storage dtypes "
                                                       "come from training.precision");
  WarnSlidingWindow(r, true);
  WarnRopeScaling(r);
  r.Use("hidden_act");
}

// ---- Dense decoders of the Llama family -------------------------------------

/// Llama-shaped decoder: "AD" per layer, GQA, gated MLP. Returns the layer
/// count and the attention shape for the family's own extras.
struct DenseDecoder {
  int64_t layers = 1;
  int64_t hidden = 1;
  AttentionShape attention;
};
DenseDecoder ReadDenseDecoder(ConfigReader& r, ModelWriter* w, const std::string& comment, bool tie_default,
                              bool qk_norm) {
  DenseDecoder d;
  d.layers = LayerCount(r);
  std::string letters;
  for (int64_t i = 0; i < d.layers; ++i) letters += "AD";
  WriteLayers(letters, comment, w);
  d.hidden = ReadTrunk(r, tie_default, w);
  d.attention = ReadAttention(r, d.hidden, w, qk_norm);
  w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"));
  w->Add("mlp.activation", "swiglu");
  WarnRopeScaling(r);
  return d;
}

void ImportQwen2(ConfigReader& r, ModelWriter* w) {
  const DenseDecoder d =
      ReadDenseDecoder(r, w, "Qwen2 decoder layer = attention (q/k/v biases) + SwiGLU MLP", false, false);
  ExpectSilu(r, "hidden_act");
  // Qwen2Attention: q_proj, k_proj and v_proj with bias=True, o_proj and the
  // MLP without; there is no config key for it.
  r.StandIn("architectures",
            "Qwen2 has bias vectors on q, k and v only (the recipe's linear_bias would add them to o_proj and the "
            "MLP as well), so they are left out",
            [&] { return -(d.attention.QkvWidth() * d.layers); });
  WarnSlidingWindow(r, r.OptBool("use_sliding_window", false));
  r.Use("sliding_window");
  r.Use("use_mrope");
}

void ImportQwen3(ConfigReader& r, ModelWriter* w) {
  ReadDenseDecoder(r, w, "Qwen3 decoder layer = attention (q/k norm) + SwiGLU MLP", false, /*qk_norm=*/true);
  ExpectSilu(r, "hidden_act");
  WarnBiases(r);
  WarnSlidingWindow(r, r.OptBool("use_sliding_window", false));
  r.Use("sliding_window");
}

void ImportMistral(ConfigReader& r, ModelWriter* w) {
  ReadDenseDecoder(r, w, "Mistral decoder layer = attention sublayer + dense SwiGLU MLP sublayer", false, false);
  ExpectSilu(r, "hidden_act");
  WarnSlidingWindow(r, true);
  WarnBiases(r);
}

/// Gemma 2 and Gemma 3 (text): tied embeddings by default, head_dim 256,
/// GeGLU, four norms a layer, alternating sliding-window layers.
void ImportGemma(ConfigReader& r, ModelWriter* w, bool gemma3) {
  const DenseDecoder d = ReadDenseDecoder(r, w,
                                          gemma3 ? "Gemma 3 decoder layer = attention (q/k norm) + GeGLU MLP"
                                                 : "Gemma 2 decoder layer = attention + GeGLU MLP",
                                          /*tie_default=*/true, /*qk_norm=*/gemma3);
  // Gemma2Config names the activation hidden_activation (hidden_act is the legacy key).
  const std::string act = r.OptString("hidden_activation", r.OptString("hidden_act", "gelu_pytorch_tanh"));
  if (act.rfind("gelu", 0) != 0) {
    r.Unrepresented(r.Has("hidden_activation") ? "hidden_activation" : "hidden_act",
                    "gated MLP activation other than GeLU; imported as swiglu (same parameter shapes)");
  } else {
    r.Unrepresented(r.Has("hidden_activation") ? "hidden_activation" : "hidden_act",
                    "GeGLU (GeLU-gated MLP) is imported as swiglu: the same three matrices and saved tensors; "
                    "the parameter count is exact");
  }
  // Gemma2DecoderLayer: input, post_attention, pre_feedforward and
  // post_feedforward RMSNorms; the recipe's A and D blocks have one pre-norm each.
  r.StandIn("architectures",
            "Gemma's post-attention and post-feedforward RMSNorms (two more [hidden] weights a layer) are not "
            "counted, and each keeps its [s, b, hidden] input for backward: 2 x s x b x hidden activations a layer "
            "more than priced",
            [&] { return -(Count(2) * d.hidden * d.layers); });
  WarnSlidingWindow(r, true);
  r.Use("sliding_window_pattern");
  r.UnrepresentedUnless("layer_types", Json(),
                        "alternating sliding-window / full attention; the recipe models "
                        "full causal attention everywhere");
  r.UnrepresentedUnless("attn_logit_softcapping", Json(),
                        "tanh soft-capping of attention logits has no "
                        "parameters; the recipe prices fused attention");
  r.UnrepresentedUnless("final_logit_softcapping", Json(), "soft-capping of the output logits has no parameters");
  r.Use("query_pre_attn_scalar");  // a softmax scale
  r.Use("rope_local_base_freq");   // RoPE base of the sliding layers
  r.Use("cache_implementation");   // inference cache
  r.Use("final_logit_softcapping");
  WarnBiases(r);
}
void ImportGemma2(ConfigReader& r, ModelWriter* w) { ImportGemma(r, w, false); }
void ImportGemma3(ConfigReader& r, ModelWriter* w) { ImportGemma(r, w, true); }

/// `key` as a list of layer indices in [0, layers); errors name bad entries.
std::set<int64_t> LayerIndexList(ConfigReader& r, const std::string& key, int64_t layers) {
  std::set<int64_t> out;
  r.Use(key);
  if (!r.Has(key)) return out;
  const Json& v = r.At(key);
  if (!v.is_array()) {
    r.Error(key, v.dump(), "must be a list of layer indices");
    return out;
  }
  for (const Json& i : v) {
    if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= layers) {
      r.Error(key, i.dump(), fmt::format("must be a list of layer indices in 0..{}", layers - 1));
      return {};
    }
    out.insert(i.get<int64_t>());
  }
  return out;
}

/// A present list of two layer kinds under `key` (layer_types), one entry a
/// layer: true where the entry is `yes`; an error naming the list or entry
/// otherwise (all false).
std::vector<bool> LayerTypeFlags(ConfigReader& r, const std::string& key, int64_t layers, const std::string& yes,
                                 const std::string& no) {
  std::vector<bool> flags(static_cast<size_t>(layers));
  const Json& v = r.At(key);
  if (!v.is_array() || static_cast<int64_t>(v.size()) != layers) {
    r.Error(key, v.dump(), fmt::format("must list num_hidden_layers ({}) layer types", layers));
    return flags;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != yes && v[i] != no) {
      r.Error(key, v[i].dump(), fmt::format("each layer type must be \"{}\" or \"{}\"", yes, no));
      return std::vector<bool>(static_cast<size_t>(layers));
    }
    flags[i] = v[i] == yes;
  }
  return flags;
}

// ---- Hybrids with mamba_* keys (Bamba) -----------------------------------------

/// BambaForCausalLM (BambaDecoderLayer): attention at attn_layer_indices,
/// Mamba-2 elsewhere, each followed by a SwiGLU MLP.
void ImportBamba(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const std::set<int64_t> attention = LayerIndexList(r, "attn_layer_indices", layers);
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) letters += attention.count(i) > 0 ? "AD" : "MD";
  WriteLayers(letters, "Bamba layer = attention (attn_layer_indices) or Mamba-2 mixer + SwiGLU MLP", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  if (!attention.empty()) ReadAttention(r, hidden, w);
  w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"));
  w->Add("mlp.activation", "swiglu");
  ExpectSilu(r, "hidden_act");
  if (static_cast<int64_t>(attention.size()) < layers) ReadMamba2(r, kPrefixedMamba2Keys, hidden, w);
  r.Use("attn_rotary_emb");     // rotary width: no parameters
  r.Use("z_loss_coefficient");  // a loss term
  r.Use("rope_parameters");
  WarnRopeScaling(r);
}

// ---- Granite-4.0-H -------------------------------------------------------------

/// Whether each layer of a GraniteMoeHybrid model mixes with attention
/// (layer_types: "attention" / "mamba", one a layer; GraniteMoeHybridConfig).
std::vector<bool> GraniteAttentionLayers(ConfigReader& r, int64_t layers) {
  r.Use("layer_types");
  if (!r.Has("layer_types")) {
    r.Error("layer_types", "",
            "missing required field for GraniteMoeHybridForCausalLM (\"mamba\" or \"attention\" "
            "for each of the num_hidden_layers layers)");
    return std::vector<bool>(static_cast<size_t>(layers));
  }
  return LayerTypeFlags(r, "layer_types", layers, "attention", "mamba");
}

/// GraniteMoeHybridForCausalLM (Granite-4.0-H): a Mamba-2 or attention mixer
/// per layer_types, then the FFN: the routed experts with the shared MLP beside
/// them (GraniteMoeHybridMoE + shared_mlp), or the shared MLP alone when
/// num_local_experts is 0 (H-Micro). The muP multipliers scale activations and
/// have no parameters.
void ImportGraniteMoeHybrid(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const std::vector<bool> attention = GraniteAttentionLayers(r, layers);
  const int64_t experts = r.OptCount("num_local_experts", 0);
  std::string letters;
  for (const bool a : attention) {
    letters += a ? 'A' : 'M';
    letters += experts > 0 ? 'E' : 'D';
  }
  WriteLayers(letters,
              experts > 0 ? "Granite-4.0-H layer = Mamba-2 or attention (layer_types) + MoE FFN with a shared MLP"
                          : "Granite-4.0-H layer = Mamba-2 or attention (layer_types) + the shared SwiGLU MLP",
              w);
  const int64_t hidden = ReadTrunk(r, true, w);
  const int64_t attention_layers = std::count(attention.begin(), attention.end(), true);
  if (attention_layers > 0) ReadAttention(r, hidden, w);
  const int64_t shared = r.OptCount("shared_intermediate_size", 0);
  if (experts > 0) {
    w->Add("moe.experts", experts);
    w->Add("moe.top_k", r.RequireInt("num_experts_per_tok"));
    w->Add("moe.ffn_hidden", r.RequireInt("intermediate_size"), "per routed expert");
    w->Add("moe.shared_experts", shared > 0 ? 1 : 0, "shared_mlp, beside the experts, ungated");
    if (shared > 0) w->Add("moe.shared_ffn_hidden", shared);
    w->AddBool("moe.dropless", true, "Hugging Face MoE blocks drop no tokens");
    w->Add("moe.router", "softmax");
  } else {
    if (shared == 0) {
      r.Error("shared_intermediate_size", "0",
              "without experts (num_local_experts 0) the shared MLP is the layer's FFN and needs a width");
    }
    w->Add("mlp.ffn_hidden", shared, "shared_intermediate_size: the dense model's MLP (no experts)");
    w->Add("mlp.activation", "swiglu");
    r.Use("intermediate_size");
    r.Use("num_experts_per_tok");
  }
  ExpectSilu(r, "hidden_act");
  if (attention_layers < layers) ReadMamba2(r, kPrefixedMamba2Keys, hidden, w);
  r.UnrepresentedUnless("normalization_function", Json("rmsnorm"), "the recipe's norms are RMSNorm here");
  // muP multipliers, the position embedding kind (NoPE or RoPE) and init: no parameters.
  for (const char* k : {"embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier",
                        "position_embedding_type", "init_method"}) {
    r.Use(k);
  }
  WarnRopeScaling(r);
  WarnBiases(r);
}

// ---- Qwen3-Next -------------------------------------------------------------

/// FalconH1ForCausalLM (modeling_falcon_h1.py FalconH1DecoderLayer): one
/// input RMSNorm feeds attention and a Mamba-2 mixer side by side, their
/// outputs (each scaled by a muP multiplier) are summed into the residual,
/// then pre_ff_layernorm and a SwiGLU MLP. The recipe's letters are
/// sequential sublayers with a pre-norm each, so a layer stands in as A, M,
/// D: the same matrices and mixer, one more norm. The Mamba width is
/// mamba_d_ssm (else mamba_expand x hidden) in mamba_n_heads heads: 1.5 x
/// hidden on Falcon-H1-0.5B, written as model.mamba.heads.
void ImportFalconH1(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  // attn_layer_indices (null: every layer) lists the layers that run attention.
  std::set<int64_t> attention;
  if (r.Has("attn_layer_indices") && !r.At("attn_layer_indices").is_null()) {
    attention = LayerIndexList(r, "attn_layer_indices", layers);
  } else {
    r.Use("attn_layer_indices");
    for (int64_t i = 0; i < layers; ++i) attention.insert(i);
  }
  const bool mlp = r.OptBool("mamba_use_mlp", true);
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) letters += std::string(attention.count(i) != 0 ? "AM" : "M") + (mlp ? "D" : "");
  WriteLayers(letters, "Falcon-H1 layer = attention and Mamba-2 side by side (stand-in: A then M) + SwiGLU MLP", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  if (!attention.empty()) ReadAttention(r, hidden, w);
  if (mlp) {
    w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"));
    w->Add("mlp.activation", "swiglu");
  } else {
    r.Use("intermediate_size");
  }
  ExpectSilu(r, "hidden_act");
  const int64_t heads = r.RequireInt("mamba_n_heads");
  const int64_t d_inner = r.Has("mamba_d_ssm") && !r.At("mamba_d_ssm").is_null()
                              ? r.RequireInt("mamba_d_ssm")
                              : (Count(r.OptInt("mamba_expand", 2)) * hidden).value();
  r.Use("mamba_expand");
  r.Use("mamba_d_head");
  int64_t head_dim = heads > 0 ? d_inner / heads : 1;
  if (r.Has("mamba_d_head") && !(r.At("mamba_d_head").is_string() && r.At("mamba_d_head") == "auto")) {
    head_dim = r.OptInt("mamba_d_head", head_dim);
  }
  const int64_t width = (Count(heads) * head_dim).value();
  if (width != d_inner) {
    r.Error("mamba_n_heads", std::to_string(heads),
            fmt::format("mamba_n_heads x mamba_d_head = {} must equal the Mamba width (mamba_d_ssm, else "
                        "mamba_expand x hidden_size) = {}",
                        width, d_inner));
    return;
  }
  const int64_t groups = r.OptInt("mamba_n_groups", 1);
  const int64_t d_state = r.RequireInt("mamba_d_state");
  const int64_t d_conv = r.OptInt("mamba_d_conv", 4);
  const bool whole = d_inner % hidden == 0;
  WriteMamba2({.d_state = d_state,
               .d_conv = d_conv,
               .expand = whole ? d_inner / hidden : 2,
               .head_dim = head_dim,
               .groups = groups,
               .chunk = r.OptInt("mamba_chunk_size", 256),
               .heads = whole ? 0 : heads},
              w,
              {.expand = whole ? "" : "mamba_d_ssm / mamba_d_head: not a whole multiple of hidden",
               .head_dim = "",
               .groups = ""});
  // The stand-in's extra parameters: M's own pre-norm a layer that has
  // attention too; the recipe's gated RMSNorm where mamba_rms_norm is off.
  const int64_t side_by_side = static_cast<int64_t>(attention.size());
  const bool gated_norm = r.OptBool("mamba_rms_norm", false);
  const bool conv_bias = r.OptBool("mamba_conv_bias", true);
  r.StandIn("architectures",
            fmt::format("attention and the Mamba-2 mixer run side by side on one normed input; the recipe runs "
                        "them one after the other, each with its own pre-norm ({} layers: one more RMSNorm of "
                        "hidden a layer, whose saved input, output and statistics add about 2 x hidden x 2 B + 4 B "
                        "a token a layer in bf16){}{}; the FLOPs are the same",
                        side_by_side,
                        gated_norm ? ""
                                   : "; the recipe's Mamba-2 always has the gated RMSNorm that "
                                     "mamba_rms_norm: false leaves out",
                        conv_bias ? "" : "; the recipe always counts the conv1d bias"),
            [&] {
              const Count norms = Count(hidden) * side_by_side + (gated_norm ? Count(0) : Count(d_inner) * layers);
              const Count conv = conv_bias ? Count(0) : (Count(groups) * 2 * d_state + d_inner) * layers;
              return norms - conv;
            });
  r.UnrepresentedUnless("mamba_proj_bias", Json(false), "biases on the Mamba in/out projections are not counted");
  r.UnrepresentedUnless("projectors_bias", Json(false), "biases on the projections are not counted");
  r.Use("mamba_norm_before_gate");
  // muP multipliers scale activations and outputs: no parameters, no saved tensors.
  for (const char* k :
       {"attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier",
        "ssm_multipliers", "mlp_multipliers", "key_multiplier", "embedding_multiplier", "lm_head_multiplier"}) {
    r.Use(k);
  }
  WarnRopeScaling(r);
  WarnBiases(r);
}

// ---- Zamba2 -----------------------------------------------------------------

/// The key a Zamba2 config names a field by: Zamba2Config's (transformers >=
/// 4.48), else the older name of Zyphra's transformers fork, whose config.json
/// files (transformers_version 4.43.0.dev0) still circulate.
std::string Zamba2Key(ConfigReader& r, const std::string& current, const std::string& legacy) {
  r.Use(current);
  r.Use(legacy);
  return r.Has(current) || !r.Has(legacy) ? current : legacy;
}

/// The shape of a Zamba2 model's shared transformer blocks, their uses and
/// the per-use modules around them (modeling_zamba2.py).
struct Zamba2Shape {
  int64_t hidden = 1;
  int64_t uses = 0;    // hybrid layers: one use of a shared block each
  int64_t blocks = 1;  // shared blocks that exist: num_mem_blocks, at most one per use
  AttentionShape attention;
  int64_t ffn = 1;
  int64_t rank = 0;
  bool attention_adapters = false;
};

/// Parameters of the recipe's A block as imported (its pre-norm, q/k/v read
/// from hidden, o back to hidden) and of its gated D block.
Count RecipeAttentionParams(int64_t hidden, const AttentionShape& a) {
  return a.QkvWidth() * hidden + hidden + Count(a.heads) * a.head_dim * hidden;
}
Count RecipeGatedMlpParams(int64_t hidden, int64_t ffn) { return Count(hidden) * 3 * ffn + hidden; }

/// The four ways the A, D and M letters of a hybrid layer differ from
/// Zamba2's shared block, each a warning with its parameter difference.
void WarnZamba2StandIns(ConfigReader& r, const Zamba2Shape& z, const std::string& rank_key) {
  const int64_t h = z.hidden;
  r.StandIn(
      "num_mem_blocks",
      fmt::format("the shared transformer block (attention + gated MLP; {} block{}, used round-robin at {} "
                  "hybrid layers) is written as an A and a D letter at every use: the recipe has no shared "
                  "weights, so it counts them once per use where the model holds them once per block; the "
                  "model state of the {} extra copies is not there in the model, while the activations are "
                  "per use in both",
                  z.blocks, z.blocks == 1 ? "" : "s", z.uses, z.uses - z.blocks),
      [&] { return (RecipeAttentionParams(h, z.attention) + RecipeGatedMlpParams(h, z.ffn)) * (z.uses - z.blocks); });
  r.StandIn("num_attention_heads",
            fmt::format("the shared attention reads concat(hidden, the input embeddings), 2 x hidden = {} wide: its "
                        "input RMSNorm and its q, k and v projections ({} heads of {}) are twice as wide as the "
                        "recipe's A, which reads hidden; the q/k/v FLOPs are half the model's and its saved "
                        "[s, b, 2 x hidden] input is priced at hidden (about s x b x hidden x 2 B a use less in bf16)",
                        2 * h, z.attention.heads, z.attention.head_dim),
            [&] { return -((z.attention.QkvWidth() * h + h) * z.blocks); });
  r.StandIn("layers_block_type",
            fmt::format("each hybrid layer's linear [hidden, hidden] projection of the shared block's output into the "
                        "Mamba layer's input ({} layers, unshared) has no letter: not counted, nor its saved "
                        "[s, b, hidden] input",
                        z.uses),
            [&] { return -(Count(z.uses) * h * h); });
  r.StandIn(rank_key,
            fmt::format("the per-use LoRA adapters (rank {}: gate_up_proj's hidden -> rank -> 2 x ffn{}) are not "
                        "counted, nor their rank-wide intermediates ({} x s x b x rank a use)",
                        z.rank, z.attention_adapters ? "; q, k and v's 2 x hidden -> rank -> 2 x hidden" : "",
                        z.attention_adapters ? 4 : 1),
            [&] {
              const Count mlp_adapter = Count(h) * z.rank + Count(z.rank) * 2 * z.ffn;
              // q, k and v each: 2 x hidden -> rank -> 2 x hidden.
              const Count attention_adapter = z.attention_adapters ? Count(h) * 4 * z.rank * 3 : Count(0);
              return -((mlp_adapter + attention_adapter) * z.uses);
            });
}

/// Zamba2ForCausalLM (modeling_zamba2.py): a Mamba-2 layer per
/// layers_block_type entry; at the "hybrid" ones a shared transformer block
/// (num_mem_blocks of them, round-robin) first reads concat(hidden,
/// embeddings), its output goes through the layer's own linear into the
/// Mamba layer's input. A hybrid layer stands in as A, D, M at the real
/// widths the recipe can express; the warnings state the rest.
void ImportZamba2(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  r.Use("hybrid_layer_ids");  // derived from layers_block_type
  if (!r.Has("layers_block_type")) {
    r.Error("layers_block_type", "",
            "missing required field for Zamba2ForCausalLM (\"mamba\" or \"hybrid\" for each of the "
            "num_hidden_layers layers)");
    return;
  }
  r.Use("layers_block_type");
  const std::vector<bool> hybrid = LayerTypeFlags(r, "layers_block_type", layers, "hybrid", "mamba");
  std::string letters;
  for (const bool h : hybrid) letters += h ? "ADM" : "M";
  WriteLayers(letters, "Zamba2 layer = Mamba-2 (M); a hybrid layer runs the shared block first (stand-in: A, D)", w);
  Zamba2Shape z;
  z.hidden = ReadTrunk(r, /*tie_default=*/true, w);
  const int64_t h = z.hidden;
  z.uses = std::count(hybrid.begin(), hybrid.end(), true);
  if (z.uses > 0) {
    z.blocks = std::min(r.OptInt("num_mem_blocks", 1), z.uses);
    z.attention.heads = r.OptInt("num_attention_heads", 32);
    z.attention.kv_heads = r.OptInt("num_key_value_heads", z.attention.heads);
    // Zamba2Config: attention_head_dim = 2 x hidden_size / num_attention_heads, whatever the file says.
    for (const char* k : {"attention_head_dim", "attention_hidden_size", "kv_channels", "num_query_groups"}) r.Use(k);
    const int64_t width = (Count(h) * 2).value();  // concat(hidden, embeddings)
    if (width % z.attention.heads != 0) {
      r.Error("num_attention_heads", std::to_string(z.attention.heads),
              fmt::format("must divide 2 x hidden_size = {} (the shared attention's width)", width));
      return;
    }
    z.attention.head_dim = width / z.attention.heads;
    w->Add("attention.heads", z.attention.heads);
    w->Add("attention.kv_heads", z.attention.kv_heads);
    w->Add("attention.head_dim", z.attention.head_dim, "attention_head_dim = 2 x hidden / heads");
    z.ffn = r.OptInt(Zamba2Key(r, "intermediate_size", "ffn_hidden_size"), (Count(h) * 4).value());
    w->Add("mlp.ffn_hidden", z.ffn);
    w->Add("mlp.activation", "swiglu", "gated: gate_up_proj to 2 x ffn");
    const std::string act = r.OptString("hidden_act", "gelu");  // Zamba2Config's default
    if (act != "silu" && act != "swish") {
      r.Unrepresented("hidden_act", fmt::format("the gated MLP's activation ({}{}) is imported as swiglu: the same "
                                                "three matrices and saved tensors; the parameter count is exact",
                                                act, r.Has("hidden_act") ? "" : ", Zamba2Config's default"));
    }
    if (!r.OptBool("gated_linear_unit", true)) {
      r.Error("gated_linear_unit", "false",
              "Zamba2's shared MLP is gated (gate_up_proj); a non-gated one is not "
              "supported");
    }
    const std::string rank_key = Zamba2Key(r, "adapter_rank", "lora_rank");
    z.rank = r.OptInt(rank_key, 128);
    z.attention_adapters = r.OptBool(Zamba2Key(r, "use_shared_attention_adapter", "use_shared_attention_lora"), false);
    // transformers builds gate_up_proj's adapters whatever use_shared_mlp_adapter says.
    const std::string mlp_flag = Zamba2Key(r, "use_shared_mlp_adapter", "use_shared_block_lora");
    if (!r.OptBool(mlp_flag, true)) {
      r.Unrepresented(mlp_flag,
                      "transformers' Zamba2MLP has gate_up_proj adapters at every use whatever this "
                      "flag says; they are counted in the difference stated");
    }
    WarnZamba2StandIns(r, z, rank_key);
  } else {
    for (const char* k :
         {"num_mem_blocks", "num_attention_heads", "num_key_value_heads", "intermediate_size", "ffn_hidden_size",
          "hidden_act", "adapter_rank", "lora_rank", "use_shared_attention_adapter", "use_shared_attention_lora",
          "use_shared_mlp_adapter", "use_shared_block_lora", "attention_head_dim", "attention_hidden_size",
          "kv_channels", "num_query_groups", "gated_linear_unit"}) {
      r.Use(k);
    }
  }
  // The Mamba-2 mixer (Zamba2MambaMixer): the recipe's M, conv1d bias and gated norm included.
  const int64_t expand = r.OptInt(Zamba2Key(r, "mamba_expand", "expansion_factor"), 2);
  const int64_t d_inner = (Count(expand) * h).value();
  // Zamba2Config derives mamba_headdim from n_mamba_heads (default 8); the fork's config gives mamba_headdim alone.
  r.Use("mamba_headdim");
  const bool by_heads = r.Has("n_mamba_heads") || !r.Has("mamba_headdim");
  const std::string width_key = by_heads ? "n_mamba_heads" : "mamba_headdim";
  const int64_t split = r.OptInt(width_key, by_heads ? 8 : 64);
  if (d_inner % split != 0) {
    r.Error(width_key, std::to_string(split),
            fmt::format("must divide the Mamba width mamba_expand x hidden_size = {}", d_inner));
    return;
  }
  const int64_t head_dim = by_heads ? d_inner / split : split;
  WriteMamba2({.d_state = r.OptInt(Zamba2Key(r, "mamba_d_state", "state_size"), 64),
               .d_conv = r.OptInt(Zamba2Key(r, "mamba_d_conv", "conv_dimension"), 4),
               .expand = expand,
               .head_dim = head_dim,
               .groups = r.OptInt("mamba_ngroups", 1),
               .chunk = r.OptInt("chunk_size", 256)},
              w, {.expand = "", .head_dim = "mamba_expand x hidden / n_mamba_heads", .groups = ""});
  r.Use("use_conv_bias");  // Zamba2MambaMixer's conv1d always has a bias
  r.UnrepresentedUnless("add_bias_linear", Json(false),
                        "biases on the Mamba in/out projections and the MLP are not counted");
  r.UnrepresentedUnless("ft_lora", Json(false), "fine-tuning LoRA weights are not part of the recipe");
  for (const char* k : {"use_mem_rope", "use_long_context", "use_mem_eff_path", "sliding_window"}) {
    r.Use(k);  // RoPE, its scaling and kernel choice: no parameters
  }
}

/// Whether each layer of a Qwen3-Next model is full attention: layer_types
/// ("full_attention" / "linear_attention") when given, else every
/// full_attention_interval-th layer (Qwen3NextConfig, default 4).
std::vector<bool> Qwen3NextFullAttention(ConfigReader& r, int64_t layers) {
  std::vector<bool> full(static_cast<size_t>(layers));
  r.Use("layer_types");
  r.Use("full_attention_interval");
  if (r.Has("layer_types")) return LayerTypeFlags(r, "layer_types", layers, "full_attention", "linear_attention");
  const int64_t interval = r.OptInt("full_attention_interval", 4);
  for (int64_t i = 0; i < layers; ++i) full[static_cast<size_t>(i)] = (i + 1) % interval == 0;
  return full;
}

/// Qwen3-Next's Gated DeltaNet (Qwen3NextGatedDeltaNet) as the nearest M: a
/// Mamba-2 whose C/B are its q/k (linear_num_key_heads groups of d_state
/// linear_key_head_dim) and whose x is its v (linear_num_value_heads heads of
/// linear_value_head_dim), with the same conv width.
void WriteGatedDeltaNetStandIn(ConfigReader& r, int64_t hidden, int64_t layers, ModelWriter* w) {
  const int64_t key_heads = r.OptInt("linear_num_key_heads", 16);
  const int64_t key_dim = r.OptInt("linear_key_head_dim", 128);
  const int64_t value_heads = r.OptInt("linear_num_value_heads", 32);
  const int64_t value_dim = r.OptInt("linear_value_head_dim", 128);
  const int64_t conv = r.OptInt("linear_conv_kernel_dim", 4);
  const int64_t d_inner = (Count(value_heads) * value_dim).value();
  if (d_inner % hidden != 0 || value_heads % key_heads != 0) {
    r.Error("linear_num_value_heads", std::to_string(value_heads),
            fmt::format("linear_num_value_heads x linear_value_head_dim = {} must be a multiple of hidden_size ({}) "
                        "and linear_num_value_heads of linear_num_key_heads ({}) to be written as the Mamba-2 "
                        "stand-in",
                        d_inner, hidden, key_heads));
    return;
  }
  WriteMamba2({.d_state = key_dim,
               .d_conv = conv,
               .expand = d_inner / hidden,
               .head_dim = value_dim,
               .groups = key_heads,
               .chunk = 64},
              w,
              {.expand = "linear_num_value_heads x linear_value_head_dim / hidden",
               .head_dim = "Gated DeltaNet value heads: the Mamba-2 stand-in, see the warning",
               .groups = "Gated DeltaNet key heads"});
  // in_proj_qkvz, in_proj_ba (beta and decay a head), conv1d over q, k, v
  // without bias, dt_bias and A_log a head, a gated RMSNorm of one head's
  // width, out_proj.
  r.StandIn("linear_num_value_heads",
            fmt::format("Gated DeltaNet linear attention (in_proj_qkvz, in_proj_ba with a beta and a decay a head, "
                        "a conv1d without bias over q, k and v, a gated RMSNorm of one head's width) is written as a "
                        "Mamba-2 M, {} layers: q and k as C and B ({} groups, d_state {}), v as x ({} heads of {}); "
                        "activations are priced as Mamba-2's chunked scan saves them, not as the gated delta "
                        "rule's",
                        layers, key_heads, key_dim, value_heads, value_dim),
            [&] {
              const Count qk = Count(key_heads) * 2 * key_dim;
              const Count gdn = (qk + Count(d_inner) * 2) * hidden + Count(hidden) * 2 * value_heads +
                                (qk + d_inner) * conv + Count(value_heads) * 2 + value_dim + Count(d_inner) * hidden;
              return (Mamba2MixerParams(hidden, d_inner, value_dim, key_heads, key_dim, conv) - gdn) * layers;
            });
}

/// Qwen3NextForCausalLM: gated full attention (every full_attention_interval-th
/// layer, or per layer_types) or Gated DeltaNet, then the Qwen3-MoE FFN with a
/// gated shared expert.
void ImportQwen3Next(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = LayerCount(r);
  const std::vector<bool> full = Qwen3NextFullAttention(r, layers);
  const int64_t experts = r.OptCount("num_experts", 512);
  const std::vector<bool> sparse = Qwen3SparseLayers(r, layers, experts);
  std::string letters;
  for (size_t i = 0; i < full.size(); ++i) {
    letters += full[i] ? 'A' : 'M';
    letters += sparse[i] ? 'E' : 'D';
  }
  WriteLayers(letters, "Qwen3-Next layer = gated attention or Gated DeltaNet (as M) + MoE FFN", w);
  const int64_t hidden = ReadTrunk(r, false, w);
  const int64_t attention_layers = std::count(full.begin(), full.end(), true);
  if (attention_layers > 0) {
    const AttentionShape a = ReadAttention(r, hidden, w, /*qk_norm=*/true);
    // Qwen3NextAttention: q_proj also produces a sigmoid output gate of heads x head_dim.
    r.StandIn("architectures",
              "the attention output gate (q_proj is twice as wide: a sigmoid gate of heads x head_dim multiplies "
              "the attention output) is not counted, nor its [s, b, heads x head_dim] activations",
              [&] { return -(Count(hidden) * a.heads * a.head_dim * attention_layers); });
  }
  if (letters.find('D') != std::string::npos) {
    w->Add("mlp.ffn_hidden", r.RequireInt("intermediate_size"), "dense layers (mlp_only_layers / sparse step)");
    w->Add("mlp.activation", "swiglu");
  } else {
    r.Use("intermediate_size");
  }
  if (letters.find('E') != std::string::npos) {
    const int64_t shared = r.OptCount("shared_expert_intermediate_size", 512);
    w->Add("moe.experts", experts);
    w->Add("moe.top_k", r.OptInt("num_experts_per_tok", 10));
    w->Add("moe.ffn_hidden", r.OptInt("moe_intermediate_size", 512), "per routed expert");
    w->Add("moe.shared_experts", shared > 0 ? 1 : 0);
    if (shared > 0) w->Add("moe.shared_ffn_hidden", shared);
    w->AddBool("moe.dropless", true, "Hugging Face MoE blocks drop no tokens");
    w->Add("moe.router", "softmax");
    if (shared > 0) w->AddBool("moe.shared_gate", true, "shared_expert_gate: a sigmoid gate on the shared expert");
  }
  if (attention_layers < layers) WriteGatedDeltaNetStandIn(r, hidden, layers - attention_layers, w);
  r.Use("partial_rotary_factor");  // RoPE width: no parameters
  r.Use("rope_parameters");
  ExpectSilu(r, "hidden_act");
  WarnRopeScaling(r);
  WarnBiases(r);
}

// ---- mamba_ssm (state-spaces/mamba) configs ----------------------------------

/// MHA layers of a mamba_ssm hybrid (attn_cfg; mamba_ssm modules/mha.py).
void ReadMambaSsmAttention(ConfigReader& r, int64_t hidden, int64_t attention_layers, bool mlp_layers, ModelWriter* w) {
  ConfigReader a = r.Sub("attn_cfg");
  const int64_t heads = a.RequireInt("num_heads");
  const int64_t kv_heads = a.OptInt("num_heads_kv", heads);
  if (!a.Has("head_dim") && hidden % heads != 0) {
    a.Error("num_heads", std::to_string(heads),
            fmt::format("d_model ({}) must be a multiple of num_heads without head_dim", hidden));
  }
  const int64_t head_dim = a.OptInt("head_dim", hidden / heads);
  w->Add("attention.heads", heads);
  w->Add("attention.kv_heads", kv_heads);
  w->Add("attention.head_dim", head_dim);
  const AttentionShape shape{heads, kv_heads, head_dim};
  // MHA's defaults: qkv_proj_bias and out_proj_bias true.
  const bool qkv_bias = a.OptBool("qkv_proj_bias", true);
  const bool out_bias = a.OptBool("out_proj_bias", true);
  if (qkv_bias && out_bias && !mlp_layers) {
    w->AddBool("linear_bias", true, "attn_cfg qkv_proj_bias and out_proj_bias (no MLP layers)");
  } else if (qkv_bias || out_bias) {
    a.StandIn(
        qkv_bias ? "qkv_proj_bias" : "out_proj_bias",
        "attention projection biases are left out (the recipe's linear_bias would put biases on the MLP "
        "and on both projections)",
        [&] { return -(((qkv_bias ? shape.QkvWidth() : Count(0)) + (out_bias ? hidden : 0)) * attention_layers); });
  }
  const int64_t d_conv = a.OptCount("d_conv", 0);
  if (d_conv > 0) {
    a.StandIn("d_conv",
              "a depthwise conv1d (with bias) over q, k and v before attention is not part of the recipe's A "
              "block; its input is saved for backward as well",
              [&] { return -(shape.QkvWidth() * (Count(d_conv) + 1) * attention_layers); });
  }
  const int64_t mlp_dim = a.OptCount("mlp_dim", 0);
  if (mlp_dim > 0) {
    const int64_t rounded = RoundUp(mlp_dim, 256);  // MHA rounds mlp_dim up to 256
    a.StandIn("mlp_dim",
              "the MLP fused into the attention projections (in_proj widened by mlp_dim, out_proj by mlp_dim / 2) is "
              "not part of the recipe's A block",
              [&] { return -((Count(hidden) * rounded + Count(rounded) / 2 * hidden) * attention_layers); });
  }
  for (const char* k : {"causal", "softmax_scale", "rotary_emb_dim", "rotary_emb_base", "rotary_emb_interleaved"}) {
    a.Use(k);
  }
  a.WarnUnread();
}

/// The Mamba mixers of a mamba_ssm config (ssm_cfg with `layer` Mamba1, the
/// default, or Mamba2; mamba_ssm modules/mamba_simple.py and mamba2.py).
void ReadMambaSsmMixer(ConfigReader& ssm, const std::string& layer, int64_t hidden, int64_t mamba_layers,
                       ModelWriter* w) {
  ssm.Use("layer");
  for (const char* k : {"dt_min", "dt_max", "dt_init", "dt_scale", "dt_init_floor", "dt_limit", "A_init_range",
                        "conv_init", "use_fast_path", "use_mem_eff_path"}) {
    ssm.Use(k);
  }
  const int64_t expand = ssm.OptInt("expand", 2);
  const int64_t d_inner = (Count(expand) * hidden).value();
  if (layer == "Mamba2") {
    const int64_t head_dim = ssm.OptInt("headdim", 64);
    if (d_inner % head_dim != 0) {
      ssm.Error("headdim", std::to_string(head_dim),
                fmt::format("must divide expand x d_model = {} (mamba_ssm asserts it)", d_inner));
    }
    if (ssm.Has("d_ssm") && ssm.OptInt("d_ssm", d_inner) != d_inner) {
      ssm.Error("d_ssm", ssm.At("d_ssm").dump(),
                fmt::format("the recipe's Mamba-2 runs its scan over all expand x d_model = {} channels", d_inner));
    }
    WriteMamba2({.d_state = ssm.OptInt("d_state", 128),
                 .d_conv = ssm.OptInt("d_conv", 4),
                 .expand = expand,
                 .head_dim = head_dim,
                 .groups = ssm.OptInt("ngroups", 1),
                 .chunk = ssm.OptInt("chunk_size", 256)},
                w);
    if (!ssm.OptBool("rmsnorm", true)) {
      ssm.StandIn("rmsnorm", "no gated RMSNorm; the recipe's Mamba-2 always has it",
                  [&] { return Count(d_inner) * mamba_layers; });
    }
    ssm.UnrepresentedUnless("norm_before_gate", Json(false), "the recipe's gated norm is RMSNorm(y * SiLU(z))");
    if (!ssm.OptBool("conv_bias", true)) {
      ssm.StandIn("conv_bias", "the recipe always counts the conv1d bias", [&] {
        return (Count(ssm.OptInt("ngroups", 1)) * 2 * ssm.OptInt("d_state", 128) + d_inner) * mamba_layers;
      });
    }
    ssm.UnrepresentedUnless("bias", Json(false), "biases on in_proj/out_proj are not counted");
    if (ssm.OptBool("D_has_hdim", false)) {
      ssm.StandIn("D_has_hdim", "D per channel rather than per head is not counted",
                  [&] { return -((Count(d_inner) - d_inner / head_dim) * mamba_layers); });
    }
    return;
  }
  Mamba1Shape m1;
  m1.hidden = hidden;
  m1.d_inner = d_inner;
  m1.d_state = ssm.OptInt("d_state", 16);
  m1.d_conv = ssm.OptInt("d_conv", 4);
  m1.dt_rank = (hidden + 15) / 16;  // dt_rank "auto": ceil(d_model / 16)
  ssm.Use("dt_rank");
  if (ssm.Has("dt_rank") && !(ssm.At("dt_rank").is_string() && ssm.At("dt_rank") == "auto")) {
    m1.dt_rank = ssm.OptInt("dt_rank", m1.dt_rank);
  }
  m1.conv_bias = ssm.OptBool("conv_bias", true);
  m1.proj_bias = ssm.OptBool("bias", false);
  WriteMamba1StandIn(ssm, "layer", m1, expand, mamba_layers, w);
}

/// mamba_ssm's MambaLMHeadModel config (config_mamba.py MambaConfig): no
/// `architectures`; each of n_layer blocks is a Mamba mixer, or MHA at
/// attn_layer_idx, plus a GatedMLP when d_intermediate > 0.
void ImportMambaSsm(ConfigReader& r, ModelWriter* w) {
  const int64_t layers = r.RequireInt("n_layer");
  if (layers > recipe_internal::kMaxLayers) {
    r.Error("n_layer", std::to_string(layers),
            fmt::format("at most {} layers are supported", recipe_internal::kMaxLayers));
    return;
  }
  const int64_t hidden = r.RequireInt("d_model");
  const int64_t d_intermediate = r.OptCount("d_intermediate", 0);
  const std::set<int64_t> attention = LayerIndexList(r, "attn_layer_idx", layers);
  ConfigReader ssm = r.Sub("ssm_cfg");
  const std::string layer = ssm.OptString("layer", "Mamba1");  // create_block's default
  if (layer != "Mamba1" && layer != "Mamba2") {
    ssm.Error("layer", "\"" + layer + "\"",
              "the recipe's M block is Mamba-2: Mamba2 is imported as it is, Mamba1 (the default) as the nearest "
              "Mamba-2 with a warning; other mixers are not supported");
    return;
  }
  std::string letters;
  for (int64_t i = 0; i < layers; ++i) {
    letters += attention.count(i) > 0 ? 'A' : 'M';
    if (d_intermediate > 0) letters += 'D';
  }
  WriteLayers(letters,
              fmt::format("mamba_ssm block = {} mixer{}{}", layer, attention.empty() ? "" : " (MHA at attn_layer_idx)",
                          d_intermediate > 0 ? " + gated MLP" : ""),
              w);
  w->Add("hidden", hidden);
  const int64_t vocab = r.RequireInt("vocab_size");
  const int64_t pad = r.OptInt("pad_vocab_size_multiple", 8);
  const int64_t padded = RoundUp(vocab, pad);
  w->Add("vocab", padded,
         padded == vocab ? ""
                         : fmt::format("vocab_size {} padded to a multiple of pad_vocab_size_multiple {}: the "
                                       "checkpoint's embedding rows",
                                       vocab, pad));
  w->AddBool("tie_embeddings", r.OptBool("tie_embeddings", true));
  const int64_t mamba_layers = layers - static_cast<int64_t>(attention.size());
  if (!attention.empty())
    ReadMambaSsmAttention(r, hidden, static_cast<int64_t>(attention.size()), d_intermediate > 0, w);
  else
    r.Use("attn_cfg");
  if (!r.OptBool("rms_norm", true)) w->Add("norm", "layernorm", "rms_norm false: nn.LayerNorm (weight and bias)");
  if (d_intermediate > 0) {
    // GatedMLP rounds hidden_features up to a multiple of 128 (multiple_of).
    const int64_t ffn = RoundUp(d_intermediate, 128);
    w->Add("mlp.ffn_hidden", ffn,
           ffn == d_intermediate ? "" : fmt::format("d_intermediate {} rounded up to 128", d_intermediate));
    w->Add("mlp.activation", "swiglu", "GatedMLP: fc1 to 2 x hidden, SiLU gate");
  }
  if (mamba_layers > 0) ReadMambaSsmMixer(ssm, layer, hidden, mamba_layers, w);
  ssm.WarnUnread();
  r.Use("residual_in_fp32");
  r.Use("fused_add_norm");
}

using ImportFn = void (*)(ConfigReader&, ModelWriter*);
/// The architecture name of a mamba_ssm config, which has none of its own.
constexpr const char* kMambaSsm = "mamba_ssm MambaLMHeadModel";
const std::map<std::string, ImportFn>& Importers() {
  static const std::map<std::string, ImportFn> kImporters = {
      {"LlamaForCausalLM", ImportLlama},         {"MixtralForCausalLM", ImportMixtral},
      {"Qwen3MoeForCausalLM", ImportQwen3Moe},   {"DeepseekV3ForCausalLM", ImportDeepseekV3},
      {"JambaForCausalLM", ImportJamba},         {"NemotronHForCausalLM", ImportNemotronH},
      {"Mamba2ForCausalLM", ImportMamba2},       {"GptOssForCausalLM", ImportGptOss},
      {"Qwen2ForCausalLM", ImportQwen2},         {"Qwen3ForCausalLM", ImportQwen3},
      {"MistralForCausalLM", ImportMistral},     {"Gemma2ForCausalLM", ImportGemma2},
      {"Gemma3ForCausalLM", ImportGemma3},       {"BambaForCausalLM", ImportBamba},
      {"Qwen3NextForCausalLM", ImportQwen3Next}, {"GraniteMoeHybridForCausalLM", ImportGraniteMoeHybrid},
      {"Glm4MoeForCausalLM", ImportGlm4Moe},     {"FalconH1ForCausalLM", ImportFalconH1},
      {"Zamba2ForCausalLM", ImportZamba2},
  };
  return kImporters;
}

/// "Llama-3.1 8B" -> "llama-3.1-8b": lower case, [a-z0-9._-] kept, the rest '-'.
std::string Slug(const std::string& text) {
  std::string out;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    out += std::isalnum(u) || c == '.' || c == '-' || c == '_' ? static_cast<char>(std::tolower(u)) : '-';
  }
  return out;
}

/// The model's name as the config gives it: "meta-llama/Llama-3.1-8B" ->
/// "llama-3.1-8b"; empty when the config has no _name_or_path.
std::string NameInConfig(const Json& config) {
  if (!config.contains("_name_or_path") || !config.at("_name_or_path").is_string()) return "";
  std::string base = config.at("_name_or_path").get<std::string>();
  const size_t slash = base.find_last_of('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  return Slug(base);
}

/// The model type ("llama"), else the architecture: the name of last resort.
std::string TypeName(const Json& config, const std::string& architecture) {
  if (config.contains("model_type") && config.at("model_type").is_string()) {
    std::string t = Slug(config.at("model_type").get<std::string>());
    if (!t.empty()) return t;
  }
  return architecture == kMambaSsm ? "mamba" : Slug(architecture);
}

std::string JoinSupported() {
  std::string out;
  for (const auto& a : SupportedHfArchitectures()) out += (out.empty() ? "" : ", ") + a;
  return out + " and mamba_ssm configs (" + kMambaSsm + ")";
}

}  // namespace

std::vector<std::string> SupportedHfArchitectures() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : Importers()) out.push_back(name);
  return out;
}

HfImport ImportHfConfig(const std::string& json_text, const std::string& file) {
  HfImport result;
  const std::string text = NeutralizePythonFloats(json_text);
  constexpr int kMaxNesting = 64;
  if (const size_t deep = FirstTooDeep(text, kMaxNesting); deep != std::string::npos) {
    result.diagnostics.push_back({Severity::kError, file, MarkOfOffset(text, deep), "", "",
                                  fmt::format("JSON nested deeper than {} levels; not a model config", kMaxNesting),
                                  ""});
    return result;
  }
  // A key given twice is ambiguous (the parser would keep the last): found
  // with the parser's callback, one set of keys per open object.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const Json::parser_callback_t track = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == Json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == Json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  // A number beyond double range ("1e400") throws out_of_range, with or
  // without exceptions enabled: point at the literal it names.
  const auto overflow = [&](const std::string& what) {
    const size_t open = what.find('\''), close = what.rfind('\'');
    const std::string literal =
        open != std::string::npos && close > open ? what.substr(open + 1, close - open - 1) : "";
    const size_t at = literal.empty() ? std::string::npos : text.find(literal);
    result.diagnostics.push_back(
        {Severity::kError, file, MarkOfOffset(text, at == std::string::npos ? 0 : at), "", literal,
         fmt::format("number {} out of range (beyond double precision); not a model config", literal), ""});
  };
  Json config;
  try {
    config = Json::parse(text, track, /*allow_exceptions=*/false);
  } catch (const Json::out_of_range& e) {
    overflow(e.what());
    return result;
  }
  if (!config.is_discarded() && !duplicate.empty()) {
    const size_t first = text.find("\"" + duplicate + "\"");
    const size_t second = first == std::string::npos ? first : text.find("\"" + duplicate + "\"", first + 1);
    result.diagnostics.push_back({Severity::kError, file, MarkOfOffset(text, second == std::string::npos ? 0 : second),
                                  duplicate, "",
                                  "key given twice in one object; a JSON reader keeps either one, so the config is "
                                  "ambiguous: keep one",
                                  ""});
    return result;
  }
  if (config.is_discarded()) {
    // Re-parse with exceptions to learn where it failed.
    Diagnostic d;
    d.file = file;
    try {
      const Json reparsed = Json::parse(text);
      (void)reparsed;
    } catch (const Json::parse_error& e) {
      d.message = std::string("malformed JSON: ") + e.what();
      d.mark = MarkOfOffset(text, e.byte > 0 ? e.byte - 1 : 0);
    } catch (const Json::out_of_range& e) {
      overflow(e.what());
      return result;
    }
    if (d.message.empty()) d.message = "malformed JSON";
    result.diagnostics.push_back(std::move(d));
    return result;
  }
  if (!config.is_object()) {
    result.diagnostics.push_back({Severity::kError, file, {1, 1}, "", "", "the config must be a JSON object", ""});
    return result;
  }
  const std::string supported = JoinSupported();
  ImportFn import = nullptr;
  if (!config.contains("architectures") && config.contains("d_model") && config.contains("n_layer")) {
    // mamba_ssm's MambaLMHeadModel config: no architectures, d_model/n_layer.
    result.architecture = kMambaSsm;
    import = ImportMambaSsm;
  } else if (!config.contains("architectures") || !config.at("architectures").is_array() ||
             config.at("architectures").empty() || !config.at("architectures").at(0).is_string()) {
    result.diagnostics.push_back({Severity::kError, file, KeyMark(text, "architectures"), "architectures",
                                  config.contains("architectures") ? config.at("architectures").dump() : "",
                                  "missing required field (a list naming the model class; or d_model and n_layer "
                                  "for a mamba_ssm config); supported: " +
                                      supported,
                                  ""});
    return result;
  } else {
    result.architecture = config.at("architectures").at(0).get<std::string>();
    const auto it = Importers().find(result.architecture);
    if (it == Importers().end()) {
      result.diagnostics.push_back({Severity::kError, file, KeyMark(text, "architectures"), "architectures",
                                    "\"" + result.architecture + "\"",
                                    "unsupported architecture; supported: " + supported, ""});
      return result;
    }
    import = it->second;
  }
  ConfigReader reader(config, file, text, result.architecture, &result);
  ModelWriter writer;
  try {
    import(reader, &writer);
  } catch (const ArithmeticOverflow& e) {
    // Sizes each within bounds whose products (a stand-in's parameter
    // count) still leave int64.
    const std::string message =
        std::string("the sizes are too large to count the parameters (") + e.what() + "); not a model config";
    result.diagnostics.push_back({Severity::kError, file, {1, 1}, "", "", message, ""});
    return result;
  }
  // After an error the unread keys are only its consequence: no follow-on list.
  if (result.ok()) reader.WarnUnread();
  result.model = writer.Take();
  result.name = NameInConfig(config);
  result.name_from_config = !result.name.empty();
  if (result.name.empty()) result.name = TypeName(config, result.architecture);
  // Errors first is not file order; keep diagnostics in file order (line 0 last).
  std::stable_sort(result.diagnostics.begin(), result.diagnostics.end(), [](const Diagnostic& a, const Diagnostic& b) {
    const int la = a.mark.line == 0 ? 1 << 30 : a.mark.line;
    const int lb = b.mark.line == 0 ? 1 << 30 : b.mark.line;
    return la < lb;
  });
  return result;
}

}  // namespace preflight

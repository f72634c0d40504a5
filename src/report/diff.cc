// `preflight diff`: flattening recipes to key paths, evaluating both sides
// (estimator + planner) and attributing the change to the differing keys.
#include "preflight/report/diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/fields.h"

namespace preflight {
namespace {

using Flat = std::vector<std::pair<std::string, std::string>>;

/// "{k: v, k: v}" of (key, value) pairs.
std::string FlowMap(const Flat& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    out += fmt::format("{}{}: {}", i ? ", " : "", fields[i].first, fields[i].second);
  }
  return out + "}";
}

constexpr const char* kAbsent = "(absent)";

/// `text` as a flow-map value: quoted when YAML would read it otherwise (a
/// device named "x, rev 2").
std::string FlowScalar(const std::string& text) {
  if (text.find_first_of(",:{}[]#&*!|>'\"%@`\\") == std::string::npos && text.front() != ' ' && text.back() != ' ') {
    return text;
  }
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

/// An optional section's keys as one "{k: v, ...}" value, its sub-maps nested.
std::string SectionMap(std::string_view section, const Recipe& r) {
  Flat fields;
  for (const RecipeField& field : RecipeFields()) {
    if (field.parent() != section) continue;
    if (field.kind == FieldKind::kSection) {
      fields.emplace_back(field.key(), SectionMap(field.path, r));
    } else if (field.text != nullptr && !field.text(r).empty()) {  // "": not given (cluster.device.based_on)
      fields.emplace_back(field.key(), FlowScalar(field.text(r)));
    }
  }
  return FlowMap(fields);
}

/// True for the keys of the optional sections, listed as one flow map each.
bool InOptionalSection(std::string_view path) {
  for (std::string_view section : {"model.mla", "cluster.device", "serving"}) {
    if (path.size() > section.size() && path.substr(0, section.size()) == section && path[section.size()] == '.') {
      return true;
    }
  }
  return false;
}

}  // namespace

Flat FlattenRecipe(const Recipe& r) {
  // One line per key of the field table, in its order. model.attention and
  // model.mla are mutually exclusive in a recipe, and so are cluster.gpu and
  // cluster.device: the one present is listed, MLA, the custom device and
  // serving (optional sections) as one flow map each.
  Flat f;
  for (const RecipeField& field : RecipeFields()) {
    const std::string_view parent = field.parent();
    if (field.path == "model.mla" && r.model.mla) f.emplace_back(field.path, SectionMap(field.path, r));
    if (field.path == "cluster.device" && r.cluster.device) f.emplace_back(field.path, SectionMap(field.path, r));
    if (field.path == "serving" && r.serving) f.emplace_back(field.path, SectionMap(field.path, r));
    if (field.text == nullptr || InOptionalSection(field.path)) continue;
    if (parent == "model.attention" && r.model.mla) continue;
    if (field.path == "cluster.gpu" && r.cluster.device) continue;
    f.emplace_back(field.path, field.text(r));
  }
  return f;
}

std::vector<KeyChange> DifferingKeys(const Recipe& a, const Recipe& b) {
  const Flat fa = FlattenRecipe(a);
  const Flat fb = FlattenRecipe(b);
  const std::map<std::string, std::string> mb(fb.begin(), fb.end());
  const std::map<std::string, std::string> ma(fa.begin(), fa.end());
  std::vector<KeyChange> out;
  for (const auto& [key, value] : fa) {
    const auto it = mb.find(key);
    const std::string after = it == mb.end() ? kAbsent : it->second;
    if (after != value) out.push_back({key, value, after});
  }
  for (const auto& [key, value] : fb) {
    if (ma.count(key) == 0) out.push_back({key, kAbsent, value});
  }
  return out;
}

namespace {

struct Side {
  std::optional<DiffSide> side;
  std::vector<Diagnostic> diagnostics;
  std::optional<Recipe> recipe;
};

/// Load + fit + plan one recipe text with overrides.
Side Evaluate(const std::string& file, const std::string& text, const std::vector<Override>& overrides,
              const CostModel& cost) {
  Side out;
  LoadResult loaded = LoadRecipeFromString(text, file, overrides);
  out.diagnostics = loaded.diagnostics;
  if (!loaded.ok()) return out;
  const Recipe& recipe = *loaded.recipe;
  try {
    const Inventory inventory = BuildInventory(recipe);
    PlanResult planned = MakePlan(inventory, LayoutOf(recipe), cost);
    if (!planned.plan) {
      out.diagnostics.insert(out.diagnostics.end(), planned.diagnostics.begin(), planned.diagnostics.end());
      return out;
    }
    const Plan& plan = *planned.plan;
    DiffSide side;
    side.name = recipe.name;
    side.memory = plan.memory ? *plan.memory : EstimateMemory(inventory, plan.layout, plan.stages);
    for (const StageComm& stage : plan.comm) {
      for (int x = 0; x < kNumAxes; ++x) {
        side.comm_send[static_cast<size_t>(x)] =
            std::max(side.comm_send[static_cast<size_t>(x)], stage.send_on(static_cast<Axis>(x)));
      }
    }
    out.side = std::move(side);
    out.recipe = recipe;
  } catch (const ArithmeticOverflow& e) {
    Diagnostic d;
    d.file = file;
    d.message = fmt::format("the recipe's sizes exceed 64-bit byte arithmetic ({})", e.what());
    out.diagnostics.push_back(d);
  }
  return out;
}

std::string FirstError(const std::vector<Diagnostic>& ds) {
  for (const Diagnostic& d : ds) {
    if (d.severity == Severity::kError) {
      return d.key_path.empty() ? d.message : fmt::format("{} = {}: {}", d.key_path, d.value, d.message);
    }
  }
  return "not valid";
}

}  // namespace

DiffResult MakeDiff(const DiffInput& a, const DiffInput& b, const CostModel& cost) {
  DiffResult result;
  Side sa = Evaluate(a.file, a.text, a.overrides, cost);
  Side sb = Evaluate(b.file, b.text, b.overrides, cost);
  result.diagnostics = sa.diagnostics;
  result.diagnostics.insert(result.diagnostics.end(), sb.diagnostics.begin(), sb.diagnostics.end());
  if (!sa.side || !sb.side) return result;

  DiffReport report;
  report.a = std::move(*sa.side);
  report.b = std::move(*sb.side);
  report.a.label = a.label;
  report.b.label = b.label;
  report.changes = DifferingKeys(*sa.recipe, *sb.recipe);
  for (int i = 0; i < kNumCategories; ++i) {
    report.interaction_memory[static_cast<size_t>(i)] = report.memory_delta(static_cast<Category>(i));
  }
  for (int x = 0; x < kNumAxes; ++x)
    report.interaction_comm[static_cast<size_t>(x)] = report.comm_delta(static_cast<Axis>(x));

  for (const KeyChange& change : report.changes) {
    Attribution at;
    at.change = change;
    if (change.key == "name") {
      at.applied = true;  // a name moves nothing
    } else if (change.after == kAbsent) {
      at.note = "a removed section cannot be applied alone";
    } else {
      std::vector<Override> overrides = a.overrides;
      overrides.push_back({change.key, change.after});
      const Side alone = Evaluate(a.file, a.text, overrides, cost);
      if (!alone.side) {
        at.note = fmt::format("not valid alone: {}", FirstError(alone.diagnostics));
      } else {
        at.applied = true;
        for (int i = 0; i < kNumCategories; ++i) {
          const auto c = static_cast<Category>(i);
          at.memory_delta[static_cast<size_t>(i)] = alone.side->worst().of(c) - report.a.worst().of(c);
        }
        for (int x = 0; x < kNumAxes; ++x) {
          at.comm_delta[static_cast<size_t>(x)] =
              alone.side->comm_send[static_cast<size_t>(x)] - report.a.comm_send[static_cast<size_t>(x)];
        }
      }
    }
    if (at.applied) {
      for (int i = 0; i < kNumCategories; ++i)
        report.interaction_memory[static_cast<size_t>(i)] -= at.memory_delta[static_cast<size_t>(i)];
      for (int x = 0; x < kNumAxes; ++x)
        report.interaction_comm[static_cast<size_t>(x)] -= at.comm_delta[static_cast<size_t>(x)];
    }
    report.attributions.push_back(std::move(at));
  }
  result.report = std::move(report);
  return result;
}

}  // namespace preflight

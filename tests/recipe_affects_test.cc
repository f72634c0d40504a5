// Every key's declared effect (RecipeField::affects) held against the models:
// a key that says it moves memory (time) must move some rank's memory (the
// step time) for some change of its value on some shipped recipe; a key that
// says it does not must never move it. Each key is changed to its neighbours
// (doubled, halved, +1, the other enum words, the other bool) on recipes that
// exercise it; changes the validator refuses are skipped.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/fields.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::recipe_affects_test {
namespace {

using testing::SourcePath;

struct Figures {
  std::vector<int64_t> memory;  // every stage's bytes, every category
  double step_s = 0;
};

std::optional<Figures> Price(const std::string& recipe, const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/" + recipe + ".yaml"), overrides);
  if (!loaded.ok()) return std::nullopt;
  const Inventory inv = BuildInventory(*loaded.recipe);
  const PlanResult planned = MakePlan(inv, LayoutOf(*loaded.recipe));
  if (!planned.plan) return std::nullopt;
  Figures f;
  for (const RankMemory& m : planned.plan->memory->stages) {
    for (const Bytes& b : m.bytes) f.memory.push_back(b.count());
  }
  f.step_s = planned.plan->time.step_s;
  return f;
}

/// Neighbouring values of a key's current text, as --set values.
std::vector<std::string> Neighbours(const RecipeField& f, const std::string& value) {
  switch (f.kind) {
    case FieldKind::kBool: return {value == "true" ? "false" : "true"};
    case FieldKind::kEnum: {
      std::vector<std::string> out;
      for (const std::string& n : f.names) {
        if (n != value) out.push_back(n);
      }
      return out;
    }
    case FieldKind::kInt: {
      const int64_t v = std::stoll(value);
      std::vector<std::string> out;
      for (int64_t n : {v * 2, v + 1, v / 2, v - 1, int64_t{64}, int64_t{1024}}) {
        if (n != v && n >= f.min && n <= f.max) out.push_back(std::to_string(n));
      }
      return out;
    }
    case FieldKind::kReal: {
      const double v = std::stod(value);
      std::vector<std::string> out;
      for (double n : {v * 2, v / 2, v + 0.1, 0.5}) {
        if (n != v && n >= f.real_min && (n < f.real_max || (!f.max_exclusive && n == f.real_max))) {
          out.push_back(fmt::format("{}", n));
        }
      }
      return out;
    }
    case FieldKind::kWords: {
      std::vector<std::string> out = {"[]"};
      for (const std::string& n : f.names) out.push_back("[" + n + "]");
      return out;
    }
    case FieldKind::kString:
      if (f.path == "cluster.gpu") return {value == "h100" ? "h200" : "h100"};
      return {};
    default: return {};
  }
}

// Recipes that exercise every family and option: dense, MoE, hybrid with
// Mamba and R, MLA; with a serving pool and a pipeline to move stage keys.
const std::vector<std::pair<std::string, std::vector<std::string>>>& Bases() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kBases = {
      {"llama3-8b-h200", {"parallel.pp=2", "parallel.cp=2", "training.defer_head_wgrad=true"}},
      {"nam56r-h200", {"serving.batch=8"}},
      {"nam56r-h200", {"parallel.cp=2", "model.mamba.fused_norm_out_proj=false", "training.dropout=0.1"}},
      {"mixtral-8x7b-h200", {"parallel.dp_replicate=2", "model.moe.capacity_factor=0.5"}},
      {"deepseek-v3-h200", {"model.mtp_layers=2"}},  // two depths: model.mtp_shared_layer moves them
      {"llama3-8b-h200", {"model.learned_positions=8192", "model.linear_bias=true", "parallel.tp=2"}},
      // Capacity factor away from the dropless skew (both 1.25 by default).
      {"nam56r-h200", {"model.moe.capacity_factor=2.0", "parallel.cp=4", "parallel.cp_recurrent=handoff"}},
      // Full recompute of the first 4 layers of each stage only.
      {"llama3-8b-h200",
       {"training.recompute=full", "training.recompute_method=block", "training.recompute_layers=4", "parallel.pp=4"}},
      // The interleaved schedule (64 micro-batches): parallel.microbatch_group.
      {"llama3-8b-h200", {"parallel.pp=4", "parallel.vpp=2"}},
      // Activation offloading of the unfused s x s scores: more bytes than the
      // host link moves under the compute, so the transfer shows in the step.
      {"llama3-8b-h200",
       {"training.activation_offload=[qkv_linear, core_attn, attn_proj]", "parallel.tp=4", "training.recompute=none",
        "training.flash_attention=false"}},
  };
  return kBases;
}

TEST(RecipeAffects, EveryDeclarationHoldsAgainstTheModels) {
  std::map<std::string, Figures> base_figures;
  for (const auto& [recipe, sets] : Bases()) {
    const auto f = Price(recipe, sets);
    ASSERT_TRUE(f.has_value()) << recipe;
  }
  for (const RecipeField& f : RecipeFields()) {
    if (f.kind == FieldKind::kSection || !f.text) continue;
    bool memory = false, time = false, tried = false;
    for (const auto& [recipe, sets] : Bases()) {
      const LoadResult loaded = [&] {
        std::vector<Override> o;
        for (const std::string& s : sets) o.push_back(*ParseOverride(s));
        return LoadRecipeFile(SourcePath("recipes/" + recipe + ".yaml"), o);
      }();
      const auto base = Price(recipe, sets);
      const std::string value = f.text(*loaded.recipe);
      if (value.empty()) continue;  // not in this recipe (cluster.device.* beside a preset)
      for (const std::string& v : Neighbours(f, value)) {
        std::vector<std::string> changed = sets;
        changed.push_back(std::string(f.path) + "=" + v);
        const auto moved = Price(recipe, changed);
        if (!moved) continue;
        tried = true;
        memory = memory || moved->memory != base->memory;
        time = time || std::fabs(moved->step_s - base->step_s) > 1e-12 * base->step_s;
      }
    }
    if (!tried) continue;  // every change refused: nothing to hold (the docs test covers the key)
    EXPECT_EQ(memory, (f.affects & kAffectsMemory) != 0)
        << f.path << ": memory " << (memory ? "moves" : "does not move");
    EXPECT_EQ(time, (f.affects & kAffectsTime) != 0) << f.path << ": time " << (time ? "moves" : "does not move");
  }
}

}  // namespace
}  // namespace preflight::recipe_affects_test

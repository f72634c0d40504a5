// Scaled copies of the default recipe for simulator tests: the recipe through
// the parser with `sets`, then ScaleRecipe at small sizes. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"

namespace preflight::testing_sim {

/// recipes/`file` through the parser with `sets`, scaled to h 16, head_dim 4,
/// ffn 16, expert ffn 8, vocab 40 (padded to 8 x tp), seq 8 (rounded up for
/// CP chunks), at most `max_world` ranks, `microbatches` per step (0:
/// ScaleRecipe's 2 x pp).
inline Recipe ScaledRecipe(const std::string& file, const std::vector<Override>& sets, int64_t max_world = 64,
                           int64_t microbatches = 0) {
  const LoadResult loaded = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/" + file, sets);
  EXPECT_TRUE(loaded.ok());
  if (!loaded.ok()) {
    for (const Diagnostic& d : loaded.diagnostics) ADD_FAILURE() << d.message;
    return Recipe();
  }
  ScaleOptions s;
  s.hidden = 16;
  s.head_dim = 4;
  s.ffn_hidden = 16;
  s.moe_ffn_hidden = 8;
  s.vocab = 40;
  s.seq_len = 8;
  s.max_world = max_world;
  s.microbatches = microbatches;
  return ScaleRecipe(*loaded.recipe, s);
}

/// The default recipe (nam56r-h200) scaled as ScaledRecipe.
inline Recipe ScaledDefault(const std::vector<Override>& sets, int64_t max_world = 64, int64_t microbatches = 0) {
  return ScaledRecipe("nam56r-h200.yaml", sets, max_world, microbatches);
}

/// One pipeline stage of tp 4 (the default recipe with pp 1), dp 1 where the
/// expert folding allows: ScaledDefault(sets + pp 1, at most 4 ranks).
inline Recipe OneStage(std::vector<Override> sets) {
  sets.push_back({"parallel.pp", "1"});
  return ScaledDefault(sets, /*max_world=*/4);
}

inline const StageComparison& Stage(const SimComparison& c, int64_t stage) { return c.stages.at(static_cast<size_t>(stage)); }

/// The comparison row of one typed bucket (rows carry the buckets' printed names).
inline const CommAgreement* FindComm(const StageComparison& s, Axis axis, Collective kind, Pass pass, CommWhat what) {
  for (const CommAgreement& a : s.comm) {
    if (a.axis == Key(axis) && a.kind == Key(kind) && a.pass == Key(pass) && a.what == Key(what)) return &a;
  }
  return nullptr;
}

inline const MemoryAgreement& FindMemory(const StageComparison& s, const std::string& category) {
  for (const MemoryAgreement& m : s.memory) {
    if (m.category == category) return m;
  }
  ADD_FAILURE() << "no row " << category;
  static const MemoryAgreement kNone;
  return kNone;
}

/// Every disagreement of a comparison, one line each, for failure messages.
inline std::string Disagreements(const SimComparison& c) {
  std::string out;
  for (const StageComparison& s : c.stages) {
    for (const CommAgreement& a : s.comm) {
      if (!a.agrees) {
        out += "stage " + std::to_string(s.pipeline_rank) + " " + a.axis + " " + a.kind + " " + a.pass + " " + a.what +
               ": measured " + std::to_string(a.measured_sent) + " modeled " + std::to_string(a.modeled_sent) + "\n";
      }
    }
    for (const MemoryAgreement& m : s.memory) {
      if (!m.agrees) {
        out += "stage " + std::to_string(s.pipeline_rank) + " " + m.category + ": measured " + std::to_string(m.measured) +
               " modeled " + std::to_string(m.modeled) + "\n";
      }
    }
  }
  return out;
}

/// The step agrees: fp64 numerics (losses, gradients, updates), and every
/// stage's bytes and memory against the planner and estimator. Returns the
/// comparison for further checks.
inline SimComparison ExpectStepAgrees(const Recipe& r, const SimulationReport& rep) {
  constexpr double kFp64Rel = 1e-10;  // docs/formulas.md §8
  EXPECT_LE(rep.loss.max_rel, kFp64Rel);
  EXPECT_LE(rep.worst_gradient.max_rel, kFp64Rel) << rep.worst_gradient.name;
  EXPECT_LE(rep.worst_update.max_rel, kFp64Rel) << rep.worst_update.name;
  EXPECT_FALSE(rep.updates.empty());
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_TRUE(c.numerics_ok);
  EXPECT_TRUE(c.comm_ok()) << Disagreements(c);
  EXPECT_TRUE(c.memory_ok()) << Disagreements(c);
  return c;
}
inline SimComparison ExpectStepAgrees(const Recipe& r) { return ExpectStepAgrees(r, Simulate(r)); }

}  // namespace preflight::testing_sim

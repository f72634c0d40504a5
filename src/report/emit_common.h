// Pieces shared by the launch-configuration renderers (emit_megatron.cc,
// emit_torchtitan.cc): how the frameworks see the model's layers and the
// plan's stage cuts, and a buffer for comment lines and warnings.
// Internal to preflight_report.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "preflight/planner/plan.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/partition.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"

namespace preflight::emit {

bool Has(const Recipe& r, BlockKind kind);

/// The plan's chunk starts after the first, in model order, in preflight
/// sublayers (one pattern letter each).
std::vector<int64_t> ChunkCuts(const StagePlan& stages);

/// Layers (the framework's unit, recipe/partition.h) per chunk, model order.
std::vector<int64_t> ChunkLayers(const StagePlan& stages, const std::vector<BlockKind>& sublayers);

/// "[0,7) [7,14) ..." in layers, for the header comment.
std::string ChunkRanges(const StagePlan& stages, const std::vector<BlockKind>& sublayers);

/// `{:g}` of a double ("0", "0.1", "1.25").
std::string Number(double x);

class Notes;

enum class Framework { kMegatron, kTorchtitan };

/// The field table's verdict: every key the framework has no setting for
/// (RecipeField spelling kNoCounterpart) that this recipe sets away from its
/// default, where the key matters (an MoE key with MoE layers, ...), becomes
/// a "cannot express" note and warning.
void NoteKeysWithoutCounterpart(const Recipe& r, Framework framework, Notes& notes);

/// Collects the header comment lines, the warnings and the refusals of one
/// emission.
class Notes {
 public:
  explicit Notes(const Recipe& recipe, std::string target) : recipe_(recipe), target_(std::move(target)) {}
  /// A `#` line (without the "# ").
  void Note(std::string line) { lines_.push_back(std::move(line)); }
  /// Something of the plan the target cannot run as planned: a "cannot
  /// express" note, a warning located at `key` in the recipe, and a refusal.
  void Cannot(const std::string& key, const std::string& value, const std::string& what);
  /// A refusal that is no recipe key's (the plan does not fit).
  void Refuse(std::string reason) { refusals_.push_back(std::move(reason)); }
  /// The comment block, each line prefixed with `prefix` ("# "): the
  /// `# WARNING:` block first when anything was refused.
  std::string Render(const std::string& prefix) const;
  /// The emission: the comment block, then `config`.
  Emission Finish(const std::string& config);

 private:
  const Recipe& recipe_;
  std::string target_;
  std::vector<std::string> lines_;
  std::vector<Diagnostic> warnings_;
  std::vector<std::string> refusals_;
};

/// The fit verdict as a refusal: a plan that does not fit (a stage over
/// capacity, or host memory over with an offloaded optimizer) is refused,
/// the verdict `preflight fit` gives.
void RefuseIfDoesNotFit(const Plan& plan, Notes& notes);

}  // namespace preflight::emit

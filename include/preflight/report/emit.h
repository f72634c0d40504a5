// Launch configurations for the planned layout (`preflight plan R --emit`):
// Megatron-LM command-line arguments and torchtitan TOML job-config sections
// (docs/plan.md, "Emitting a launch configuration"). Pure renderers: no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "preflight/recipe/diagnostic.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"

namespace preflight {

enum class EmitTarget { kMegatron, kTorchtitan };
/// "megatron", "torchtitan" (the values of `--emit`).
const char* Name(EmitTarget t);
/// The target named `name`, or nullopt.
std::optional<EmitTarget> ParseEmitTarget(std::string_view name);

/// What a renderer produces. `text` starts with `#` comment lines (the
/// recipe, the layout, and every deliberate omission or approximation),
/// then the configuration itself. `warnings` name the recipe key of each
/// part of the plan the framework cannot express (also said in `text`).
struct Emission {
  std::string text;
  std::vector<Diagnostic> warnings;
};

/// Megatron-LM arguments, one `--flag value \` a line (shell-ready), with the
/// flag names of megatron/training/arguments.py; the hybrid layer pattern
/// uses the symbols of examples/mamba/README.md (M Mamba, * attention,
/// - MLP, E MoE, | pipeline-stage boundary).
Emission EmitMegatron(const Recipe& recipe, const Plan& plan);

/// torchtitan TOML sections ([parallelism], [training],
/// [activation_checkpoint], [optimizer]) with the keys of
/// torchtitan/config/job_config.py.
Emission EmitTorchtitan(const Recipe& recipe, const Plan& plan);

/// Dispatch on `target`.
Emission Emit(EmitTarget target, const Recipe& recipe, const Plan& plan);

}  // namespace preflight

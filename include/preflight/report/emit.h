// Launch configurations for the planned layout (`preflight plan R --emit`):
// Megatron-LM command-line arguments and a torchtitan Python config module
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

/// What a renderer produces. `text` starts with `#` comment lines (a
/// `# WARNING:` block when refused; the recipe, the layout, the upstream
/// version targeted, and every deliberate omission or approximation), then
/// the configuration itself. `warnings` name the recipe key of each part of
/// the plan the framework cannot express (also said in `text`). `refusals`
/// say why the framework would not run the plan as priced: it does not fit,
/// or some part cannot be expressed; `plan --emit` exits 1 on any unless
/// --force.
struct Emission {
  std::string text;
  std::vector<Diagnostic> warnings;
  std::vector<std::string> refusals;
};

/// The upstream each emitter targets: repository, commit and date (docs/plan.md).
inline constexpr const char* kMegatronUpstream = "NVIDIA/Megatron-LM d98e8a6 (Megatron Core 0.20.0, 2026-08-22)";
inline constexpr const char* kTorchtitanUpstream = "pytorch/torchtitan b5bcd76 (2026-08-21)";

/// Megatron-LM arguments, one `--flag value \` a line (shell-ready), with the
/// flag names of megatron/training/arguments.py; the hybrid layer pattern
/// uses the symbols of examples/mamba/README.md (M Mamba, * attention,
/// - MLP, E MoE, | pipeline-stage boundary).
Emission EmitMegatron(const Recipe& recipe, const Plan& plan);

/// A torchtitan config module: one Python function returning a
/// `Trainer.Config` (torchtitan/trainer.py), loaded with `torchtitan.train
/// --module M --config F` (torchtitan/config/manager.py), with the model
/// from an upstream model registry flavor and only fields of
/// torchtitan/config/configs.py and the classes it names.
Emission EmitTorchtitan(const Recipe& recipe, const Plan& plan);

/// Dispatch on `target`.
Emission Emit(EmitTarget target, const Recipe& recipe, const Plan& plan);

}  // namespace preflight

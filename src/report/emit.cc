// Dispatch of `--emit` targets; the renderers are emit_megatron.cc and
// emit_torchtitan.cc.
#include "preflight/report/emit.h"

namespace preflight {

const char* Name(EmitTarget t) { return t == EmitTarget::kTorchtitan ? "torchtitan" : "megatron"; }

std::optional<EmitTarget> ParseEmitTarget(std::string_view name) {
  if (name == "megatron") return EmitTarget::kMegatron;
  if (name == "torchtitan") return EmitTarget::kTorchtitan;
  return std::nullopt;
}

Emission Emit(EmitTarget target, const Recipe& recipe, const Plan& plan) {
  return target == EmitTarget::kTorchtitan ? EmitTorchtitan(recipe, plan) : EmitMegatron(recipe, plan);
}

}  // namespace preflight

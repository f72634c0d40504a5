#include "emit_common.h"

#include <algorithm>

#include <fmt/format.h>

#include "preflight/recipe/fields.h"
#include "preflight/report/format.h"

namespace preflight::emit {

bool Has(const Recipe& r, BlockKind kind) {
  return std::find(r.model.layers.begin(), r.model.layers.end(), kind) != r.model.layers.end();
}

std::vector<int64_t> ChunkCuts(const StagePlan& stages) {
  std::vector<int64_t> cuts;
  for (size_t c = 1; c < stages.chunks.size(); ++c) cuts.push_back(stages.chunks[c].first_layer);
  return cuts;
}

std::vector<int64_t> ChunkLayers(const StagePlan& stages, const std::vector<BlockKind>& sublayers) {
  const std::vector<int64_t> starts = LayerStarts(sublayers);
  std::vector<int64_t> out;
  for (const StageChunk& c : stages.chunks) {
    const LayerRange range = LayerRangeOf(c, starts);
    out.push_back(range.end - range.first);
  }
  return out;
}

std::string ChunkRanges(const StagePlan& stages, const std::vector<BlockKind>& sublayers) {
  const std::vector<int64_t> starts = LayerStarts(sublayers);
  std::string out;
  for (const StageChunk& c : stages.chunks) {
    if (!out.empty()) out += ", ";
    out += FormatLayerRange(LayerRangeOf(c, starts));
  }
  return out;
}

std::string Number(double x) { return fmt::format("{:g}", x); }

namespace {

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

/// Whether `path` changes the job this recipe describes: a block's keys
/// matter only with that block, a knob only with what it tunes.
bool Matters(const Recipe& r, std::string_view path) {
  const bool muon = r.training.optimizer.matrices == OptimizerKind::kMuon;
  if (StartsWith(path, "model.moe.") || path == "parallel.expert_tp") return Has(r, BlockKind::kMoe);
  if (StartsWith(path, "model.mamba.")) return Has(r, BlockKind::kMamba);
  if (StartsWith(path, "model.recurrent.")) return Has(r, BlockKind::kRecurrent);
  if (StartsWith(path, "model.mla.")) return Has(r, BlockKind::kAttention) && r.model.mla.has_value();
  if (StartsWith(path, "model.attention.")) return Has(r, BlockKind::kAttention) && !r.model.mla.has_value();
  if (StartsWith(path, "model.mlp.")) return Has(r, BlockKind::kDenseMlp);
  if (path == "training.head_wgrad_deferral_limit") return r.training.defer_head_wgrad;
  if (path == "training.optimizer.muon_momentum") return muon;
  if (path == "training.optimizer.mamba_in_proj") return muon && Has(r, BlockKind::kMamba);
  if (path == "training.optimizer.router") return muon && Has(r, BlockKind::kMoe);
  if (path == "parallel.cp_load_balance") return r.parallel.cp > 1;
  if (path == "parallel.microbatch_group") return r.parallel.schedule == Schedule::kInterleaved;
  if (path == "parallel.cp_recurrent") {
    return r.parallel.cp > 1 && (Has(r, BlockKind::kMamba) || Has(r, BlockKind::kRecurrent));
  }
  return true;
}

}  // namespace

void NoteKeysWithoutCounterpart(const Recipe& r, Framework framework, Notes& notes) {
  const char* name = framework == Framework::kMegatron ? "Megatron-LM" : "torchtitan";
  for (const RecipeField& f : RecipeFields()) {
    const std::string_view spelling = framework == Framework::kMegatron ? f.megatron : f.torchtitan;
    if (spelling != kNoCounterpart || !f.text || !Matters(r, f.path)) continue;
    const std::string value = f.text(r);
    const std::string runs = DefaultText(f);
    if (value == runs) continue;
    notes.Cannot(std::string(f.path), value,
                 fmt::format("{} has no setting for {} = {} (the plan prices it; the framework runs {})", name, f.path,
                             value, runs));
  }
}

void Notes::Cannot(const std::string& key, const std::string& value, const std::string& what) {
  lines_.push_back(fmt::format("cannot express: {}", what));
  warnings_.push_back(recipe_.source.At(key, value, fmt::format("--emit {}: {}", target_, what), Severity::kWarning));
  refusals_.push_back(fmt::format("{} = {}: {}", key, value, what));
}

std::string Notes::Render(const std::string& prefix) const {
  std::string out;
  if (!refusals_.empty()) {
    out += fmt::format(
        "{}WARNING: this {} configuration does not run the plan preflight priced; `preflight plan --emit "
        "{}` exits 1 on it unless --force is given. Reasons:\n",
        prefix, target_, target_);
    for (const std::string& r : refusals_) out += fmt::format("{}WARNING: - {}\n", prefix, r);
  }
  for (const std::string& line : lines_) out += fmt::format("{}{}\n", prefix, line);
  return out;
}

Emission Notes::Finish(const std::string& config) {
  Emission out;
  out.text = Render("# ") + config;
  out.warnings = std::move(warnings_);
  out.refusals = std::move(refusals_);
  return out;
}

void RefuseIfDoesNotFit(const Plan& plan, Notes& notes) {
  if (!plan.memory || plan.memory->verdict.fits) return;
  notes.Refuse(fmt::format("the plan does not fit: {} (the verdict of `preflight fit`)", plan.memory->verdict.reason));
}

}  // namespace preflight::emit

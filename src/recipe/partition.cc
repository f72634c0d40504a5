// The framework's layer and stage split (see partition.h).
#include "preflight/recipe/partition.h"

#include <fmt/format.h>

namespace preflight {
namespace {

bool IsMlp(BlockKind k) { return k == BlockKind::kDenseMlp || k == BlockKind::kMoe; }

LayerSplit Refuse(std::string key, std::string value, std::string error) {
  LayerSplit s;
  s.key = std::move(key);
  s.value = std::move(value);
  s.error = std::move(error);
  return s;
}

std::string Str(int64_t x) { return fmt::format("{}", x); }

/// Megatron's layers per pipeline rank, or a refusal (transformer_config.py's checks).
LayerSplit MegatronPerRank(const ParallelConfig& p, int64_t layers, bool hybrid) {
  const int64_t pp = p.pp;
  const int64_t first = p.first_stage_layers;
  const int64_t last = p.last_stage_layers;
  const bool uneven = first > 0 || last > 0;
  const bool account = p.embedding_in_split || p.loss_in_split;
  if (uneven && account) {
    return Refuse("parallel.embedding_in_split", "true",
                  "Megatron-LM refuses the embedding/loss accounted in the split together with first/last stage "
                  "layer counts; use one or the other");
  }
  if (hybrid && account) {
    return Refuse(p.embedding_in_split ? "parallel.embedding_in_split" : "parallel.loss_in_split", "true",
                  "Megatron-LM's hybrid models split the pattern's symbols only; the embedding/loss accounting is a "
                  "GPT-model option");
  }
  LayerSplit s;
  if (uneven) {
    const int64_t middle_stages = pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
    const int64_t middle = layers - first - last;
    if (middle_stages < 0 || middle < 0 || (middle > 0) != (middle_stages > 0) ||
        (middle_stages > 0 && middle % middle_stages != 0)) {
      return Refuse(first > 0 ? "parallel.first_stage_layers" : "parallel.last_stage_layers",
                    Str(first > 0 ? first : last),
                    fmt::format("leaves {} layers for {} middle stages; Megatron-LM needs them to divide evenly",
                                middle, std::max<int64_t>(0, middle_stages)));
    }
    for (int64_t r = 0; r < pp; ++r) {
      s.layers.push_back(r == 0 && first > 0 ? first : r == pp - 1 && last > 0 ? last : middle / middle_stages);
    }
    return s;
  }
  const int64_t counted = layers + (p.embedding_in_split ? 1 : 0) + (p.loss_in_split ? 1 : 0);
  if (counted % pp != 0) {
    return Refuse("parallel.pp", Str(pp),
                  fmt::format("Megatron-LM splits the {} layers{} evenly over pipeline stages; {} is not a multiple of "
                              "pp = {}. Set parallel.first_stage_layers / last_stage_layers{}, pin "
                              "parallel.stage_boundaries, or use parallel.partition: balanced",
                              layers, account ? " (with the embedding/loss counted)" : "", counted, pp,
                              hybrid ? "" : ", embedding_in_split / loss_in_split"));
  }
  s.layers.assign(static_cast<size_t>(pp), counted / pp);
  return s;
}

LayerSplit Megatron(const ParallelConfig& p, int64_t layers, bool hybrid) {
  if (p.schedule == Schedule::kDualPipe || p.schedule == Schedule::kDualPipeV) {
    return Refuse("parallel.partition", "megatron",
                  fmt::format("Megatron-LM runs no {} schedule; use parallel.partition: {}balanced", Name(p.schedule),
                              p.schedule == Schedule::kDualPipeV ? "torchtitan (torchtitan runs DualPipeV) or " : ""));
  }
  const int64_t chunks = ChunkCountOf(p.schedule, p.pp, p.vpp);
  LayerSplit s;
  if (p.pp == 1) {
    if (p.first_stage_layers > 0 || p.last_stage_layers > 0 || p.embedding_in_split || p.loss_in_split) {
      return Refuse(p.first_stage_layers > 0  ? "parallel.first_stage_layers"
                    : p.last_stage_layers > 0 ? "parallel.last_stage_layers"
                    : p.embedding_in_split    ? "parallel.embedding_in_split"
                                              : "parallel.loss_in_split",
                    "", "shapes pipeline stages; it needs parallel.pp > 1");
    }
    s.layers = {layers};
    return s;
  }
  if (hybrid && p.vpp > 1) {
    return Refuse("parallel.vpp", Str(p.vpp),
                  "Megatron-LM's hybrid models need '|' cuts in the pattern for virtual stages; pin "
                  "parallel.stage_boundaries (the importer maps '|' to it)");
  }
  LayerSplit per_rank = MegatronPerRank(p, layers, hybrid);
  if (!per_rank.ok()) return per_rank;
  for (int64_t r = 0; r < p.pp; ++r) {
    const int64_t n = per_rank.layers[static_cast<size_t>(r)];
    if (n % p.vpp != 0) {
      return Refuse("parallel.vpp", Str(p.vpp),
                    fmt::format("pipeline rank {} holds {} layers (counting the embedding/loss where accounted); "
                                "Megatron-LM needs a multiple of vpp = {}",
                                r, n, p.vpp));
    }
  }
  // Chunk c = v*pp + r holds rank r's layers / vpp; the accounted embedding and
  // loss take one layer's place in the first and last chunk.
  s.layers.resize(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c)
    s.layers[static_cast<size_t>(c)] = per_rank.layers[static_cast<size_t>(c % p.pp)] / p.vpp;
  if (p.embedding_in_split) s.layers.front() -= 1;
  if (p.loss_in_split) s.layers.back() -= 1;
  if (s.layers.front() < 0 || s.layers.back() < 0) {
    return Refuse("parallel.pp", Str(p.pp), "leaves a chunk with fewer than zero layers");
  }
  return s;
}

LayerSplit Torchtitan(const ParallelConfig& p, int64_t layers) {
  if (p.schedule == Schedule::kDualPipe) {
    return Refuse("parallel.partition", "torchtitan",
                  "torchtitan runs DualPipeV, not DualPipe; use schedule dualpipev or parallel.partition: balanced");
  }
  const int64_t stages = ChunkCountOf(p.schedule, p.pp, p.vpp);
  LayerSplit s;
  if (stages == 1) {
    s.layers = {layers};
    return s;
  }
  // Embedding and norm + output weigh one layer each (input_weight,
  // output_weight = 1); the first (layers + 2) % stages stages take one more.
  const int64_t effective = layers + 2;
  const int64_t per = effective / stages;
  const int64_t extra = effective % stages;
  if (per < 1) {
    return Refuse("parallel.pp", Str(p.pp),
                  fmt::format("{} stages exceed torchtitan's {} effective layers (layers + embedding + output)", stages,
                              effective));
  }
  for (int64_t i = 0; i < stages; ++i) {
    int64_t n = per + (i < extra ? 1 : 0);
    if (i == 0) n -= 1;
    if (i == stages - 1) n -= 1;
    s.layers.push_back(n);
  }
  return s;
}

}  // namespace

bool IsTransformerStack(const std::vector<BlockKind>& sublayers) {
  if (sublayers.empty() || sublayers.size() % 2 != 0) return false;
  for (size_t i = 0; i < sublayers.size(); i += 2) {
    if (sublayers[i] != BlockKind::kAttention || !IsMlp(sublayers[i + 1])) return false;
  }
  return true;
}

std::vector<int64_t> LayerStarts(const std::vector<BlockKind>& sublayers) {
  const int64_t n = static_cast<int64_t>(sublayers.size());
  const int64_t step = IsTransformerStack(sublayers) ? 2 : 1;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n / step + 1));
  for (int64_t i = 0; i < n; i += step) out.push_back(i);
  out.push_back(n);
  return out;
}

int64_t LayerCount(const std::vector<BlockKind>& sublayers) {
  const int64_t n = static_cast<int64_t>(sublayers.size());
  return IsTransformerStack(sublayers) ? n / 2 : n;
}

std::optional<std::pair<int64_t, int64_t>> UnevenEnds(int64_t layers, int64_t pp) {
  if (pp <= 1 || layers % pp == 0) return std::pair<int64_t, int64_t>{0, 0};
  for (const int64_t middle : {(layers + pp - 1) / pp, layers / pp}) {
    const int64_t ends = layers - (pp - 2) * middle;
    if (ends < 2 || middle < 1) continue;
    return std::pair<int64_t, int64_t>{ends / 2, ends - ends / 2};
  }
  return std::nullopt;
}

ParallelConfig SplitFor(const ParallelConfig& recipe, int64_t pp, int64_t vpp, Schedule schedule, int64_t layers) {
  ParallelConfig p = recipe;
  p.pp = pp;
  p.vpp = vpp;
  p.schedule = schedule;
  const bool uneven = recipe.first_stage_layers > 0 || recipe.last_stage_layers > 0;
  if (uneven && (pp != recipe.pp || vpp != recipe.vpp)) {
    if (const auto ends = UnevenEnds(layers, pp)) {
      p.first_stage_layers = ends->first;
      p.last_stage_layers = ends->second;
    }
  }
  return p;
}

int64_t ChunkCountOf(Schedule schedule, int64_t pp, int64_t vpp) {
  if (schedule == Schedule::kDualPipe) return pp;
  if (schedule == Schedule::kDualPipeV) return 2 * pp;
  return pp * vpp;
}

LayerSplit RuleSplit(const ParallelConfig& p, int64_t layers, bool transformer_stack) {
  return p.partition == Partition::kTorchtitan ? Torchtitan(p, layers) : Megatron(p, layers, !transformer_stack);
}

LayerSplit RecipeSplit(const ParallelConfig& p, const std::vector<BlockKind>& sublayers) {
  const int64_t layers = LayerCount(sublayers);
  const std::vector<int64_t>& b = p.stage_boundaries;
  LayerSplit s;
  if (!b.empty()) {
    int64_t prev = 0;
    for (const int64_t at : b) {
      s.layers.push_back(at - prev);
      prev = at;
    }
    s.layers.push_back(layers - prev);
    return s;
  }
  if (p.partition == Partition::kBalanced) return s;
  return RuleSplit(p, layers, IsTransformerStack(sublayers));
}

}  // namespace preflight

// The default H200 layout rule for imported models (see default_layout.h).
#include "preflight/inventory/default_layout.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "preflight/recipe/partition.h"

namespace preflight {
namespace {

/// Heads of every kind the TP degree must divide (docs/formulas.md §1.2-1.4 validity rules).
std::vector<int64_t> TpDivisibilityConstraints(const ModelConfig& m, const std::vector<BlockKind>& layers) {
  std::vector<int64_t> out;
  const auto has = [&](BlockKind k) { return std::find(layers.begin(), layers.end(), k) != layers.end(); };
  if (has(BlockKind::kAttention)) {
    if (m.mla) {
      out.push_back(m.mla->heads);
    } else {
      out.push_back(m.attention.heads);
      out.push_back(m.attention.kv_heads);
    }
  }
  if (has(BlockKind::kMamba) && m.mamba.head_dim > 0) {
    out.push_back(m.mamba.Heads(m.hidden));  // Mamba heads H
    out.push_back(m.mamba.groups);
  }
  if (has(BlockKind::kRecurrent)) out.push_back(m.recurrent.heads);
  return out;
}

bool DividesAll(int64_t t, const std::vector<int64_t>& values) {
  return std::all_of(values.begin(), values.end(), [t](int64_t v) { return v % t == 0; });
}

/// Largest power of two <= cap that divides both a and b.
int64_t LargestPow2Dividing(int64_t a, int64_t b, int64_t cap) {
  int64_t e = 1;
  while (e * 2 <= cap && a % (e * 2) == 0 && b % (e * 2) == 0) e *= 2;
  return e;
}

/// Model-state bytes of `params` elements split `split` ways and data-parallel over `d` ranks:
/// 2 (bf16 param) + 4 (fp32 grad) on every replica, 12 (fp32 master + Adam m, v) sharded over d.
double StateBytes(int64_t params, int64_t split, int64_t d) {
  return static_cast<double>(params) / static_cast<double>(split) * (6.0 + 12.0 / static_cast<double>(d));
}

}  // namespace

std::vector<DefaultLayout> H200LayoutCandidates(const Inventory& inv, const LayoutPins& pins) {
  const ModelConfig& m = inv.recipe.model;
  std::vector<BlockKind> kinds;
  int64_t expert_params = 0;
  for (const Layer& l : inv.layers) {
    kinds.push_back(l.kind);
    expert_params = CheckedAdd(expert_params, l.totals.of(ShardClass::kEpSharded));
  }
  const int64_t dense_params = inv.total_params - expert_params;
  const bool has_moe = expert_params > 0;
  const std::vector<int64_t> heads = TpDivisibilityConstraints(m, kinds);
  // The framework's layers (a transformer layer is two sublayers).
  const int64_t layer_count = LayerCount(kinds);
  std::vector<int64_t> node_counts;
  for (int64_t nodes = 1; nodes <= 128; nodes *= 2) node_counts.push_back(nodes);
  if (pins.nodes) node_counts = {*pins.nodes};
  std::vector<int64_t> tps = {1, 2, 4, 8};
  if (pins.tp) tps = {*pins.tp};
  std::vector<DefaultLayout> out;
  for (const int64_t nodes : node_counts) {
    const int64_t world = 8 * nodes;
    for (const int64_t tp : tps) {
      if (!DividesAll(tp, heads) && !pins.tp) continue;
      std::vector<int64_t> pps;
      for (int64_t pp = 1; tp * pp <= world && pp <= std::max<int64_t>(1, layer_count / 2); pp *= 2) pps.push_back(pp);
      if (pins.pp) pps = {*pins.pp};
      for (const int64_t pp : pps) {
        if (world % (tp * pp) != 0) continue;
        const int64_t dp = world / (tp * pp);
        // A multi-node launch keeps data parallelism (more nodes, not a
        // 1-way-DP pipeline, is how a real run grows); one node may spend all
        // 8 GPUs on model parallelism.
        if (nodes > 1 && dp < 2 && !pins.tp && !pins.pp) continue;
        int64_t ep = has_moe ? LargestPow2Dividing(m.moe.experts, tp * dp, 64) : 1;
        if (pins.ep) ep = *pins.ep;
        if (ep <= 0 || (tp * dp) % ep != 0) continue;
        const int64_t expert_dp = tp * dp / ep;
        const double bytes = StateBytes(dense_params, tp * pp, dp) + StateBytes(expert_params, pp * ep, expert_dp);
        if (bytes > static_cast<double>(kDefaultStaticBudgetBytes)) continue;
        // Megatron splits the layers evenly, else with uneven first/last stages.
        const auto ends = UnevenEnds(layer_count, pp);
        if (!ends) continue;
        DefaultLayout l;
        l.first_stage_layers = ends->first;
        l.last_stage_layers = ends->second;
        l.nodes = nodes;
        l.tp = tp;
        l.pp = pp;
        l.ep = ep;
        l.dp = dp;
        l.global_batch = RoundUp(512, dp);  // a multiple of dp (micro_batch 1)
        l.static_bytes_per_gpu = static_cast<int64_t>(bytes);
        out.push_back(std::move(l));
      }
    }
  }
  // Fewest nodes, then the smallest model-parallel size, then the larger TP
  // (NVLink) over more pipeline stages.
  std::stable_sort(out.begin(), out.end(), [](const DefaultLayout& a, const DefaultLayout& b) {
    if (a.nodes != b.nodes) return a.nodes < b.nodes;
    if (a.tp * a.pp != b.tp * b.pp) return a.tp * a.pp < b.tp * b.pp;
    return a.tp > b.tp;
  });
  return out;
}

std::optional<DefaultLayout> DefaultH200Layout(const Inventory& inv, const LayoutPins& pins) {
  std::vector<DefaultLayout> candidates = H200LayoutCandidates(inv, pins);
  if (candidates.empty()) return std::nullopt;
  return std::move(candidates.front());
}

}  // namespace preflight

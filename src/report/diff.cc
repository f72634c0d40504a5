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

namespace preflight {
namespace {

using Flat = std::vector<std::pair<std::string, std::string>>;

std::string Bool(bool b) { return b ? "true" : "false"; }
// Shortest text that reads back to the same double ("3", "1.25").
std::string Real(double x) { return fmt::format("{}", x); }

const char* Name(FfnActivation a) {
  switch (a) {
    case FfnActivation::kSwiglu: return "swiglu";
    case FfnActivation::kGelu: return "gelu";
    case FfnActivation::kRelu2: return "relu2";
  }
  return "swiglu";
}
const char* Name(NormKind n) { return n == NormKind::kRmsNorm ? "rmsnorm" : "layernorm"; }
const char* Name(RouterScore r) { return r == RouterScore::kSoftmax ? "softmax" : "sigmoid"; }
const char* Name(AxisOrder o) { return o == AxisOrder::kTpCpDpPp ? "tp-cp-dp-pp" : "tp-cp-pp-dp"; }
const char* Name(CpComm c) {
  switch (c) {
    case CpComm::kP2p:
      return "p2p";
    case CpComm::kAllGather:
      return "all_gather";
    case CpComm::kA2a:
      return "a2a";
  }
  return "p2p";
}

/// "{k: v, k: v}" of (key, value) pairs.
std::string FlowMap(const Flat& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    out += fmt::format("{}{}: {}", i ? ", " : "", fields[i].first, fields[i].second);
  }
  return out + "}";
}

constexpr const char* kAbsent = "(absent)";

}  // namespace

Flat FlattenRecipe(const Recipe& r) {
  Flat f;
  auto add = [&f](std::string key, std::string value) { f.emplace_back(std::move(key), std::move(value)); };
  const ModelConfig& m = r.model;
  add("name", r.name);
  add("model.pattern", m.pattern);
  add("model.repeat", fmt::format("{}", m.repeat));
  add("model.hidden", fmt::format("{}", m.hidden));
  add("model.vocab", fmt::format("{}", m.vocab));
  add("model.vocab_pad_multiple", fmt::format("{}", m.vocab_pad_multiple));
  add("model.tie_embeddings", Bool(m.tie_embeddings));
  add("model.norm", Name(m.norm));
  if (!m.mla) {  // model.attention and model.mla are mutually exclusive in a recipe
    add("model.attention.heads", fmt::format("{}", m.attention.heads));
    add("model.attention.kv_heads", fmt::format("{}", m.attention.kv_heads));
    add("model.attention.head_dim", fmt::format("{}", m.attention.head_dim));
    add("model.attention.qk_norm", Bool(m.attention.qk_norm));
  } else {
    add("model.mla", FlowMap({{"heads", fmt::format("{}", m.mla->heads)},
                              {"q_lora_rank", fmt::format("{}", m.mla->q_lora_rank)},
                              {"kv_lora_rank", fmt::format("{}", m.mla->kv_lora_rank)},
                              {"qk_rope_head_dim", fmt::format("{}", m.mla->qk_rope_head_dim)},
                              {"qk_nope_head_dim", fmt::format("{}", m.mla->qk_nope_head_dim)},
                              {"v_head_dim", fmt::format("{}", m.mla->v_head_dim)}}));
  }
  add("model.mlp.ffn_hidden", fmt::format("{}", m.mlp.ffn_hidden));
  add("model.mlp.activation", Name(m.mlp.activation));
  const MoeConfig& e = m.moe;
  add("model.moe.experts", fmt::format("{}", e.experts));
  add("model.moe.top_k", fmt::format("{}", e.top_k));
  add("model.moe.ffn_hidden", fmt::format("{}", e.ffn_hidden));
  add("model.moe.shared_experts", fmt::format("{}", e.shared_experts));
  add("model.moe.shared_ffn_hidden", fmt::format("{}", e.shared_ffn_hidden));
  add("model.moe.capacity_factor", Real(e.capacity_factor));
  add("model.moe.dropless", Bool(e.dropless));
  add("model.moe.pad_to_capacity", Bool(e.pad_to_capacity));
  add("model.moe.dropless_skew", Real(e.dropless_skew));
  add("model.moe.router", Name(e.router));
  add("model.moe.router_bias", Bool(e.router_bias));
  add("model.moe.shared_gate", Bool(e.shared_gate));
  add("model.moe.first_k_dense", fmt::format("{}", e.first_k_dense));
  add("model.moe.layer_freq", fmt::format("{}", e.layer_freq));
  add("model.moe.layer_offset", fmt::format("{}", e.layer_offset));
  add("model.mamba.d_state", fmt::format("{}", m.mamba.d_state));
  add("model.mamba.d_conv", fmt::format("{}", m.mamba.d_conv));
  add("model.mamba.expand", fmt::format("{}", m.mamba.expand));
  add("model.mamba.head_dim", fmt::format("{}", m.mamba.head_dim));
  add("model.mamba.groups", fmt::format("{}", m.mamba.groups));
  add("model.mamba.chunk", fmt::format("{}", m.mamba.chunk));
  add("model.mamba.fused_norm_out_proj", Bool(m.mamba.fused_norm_out_proj));
  add("model.recurrent.width", fmt::format("{}", m.recurrent.width));
  add("model.recurrent.heads", fmt::format("{}", m.recurrent.heads));
  add("model.recurrent.d_conv", fmt::format("{}", m.recurrent.d_conv));
  const TrainingConfig& t = r.training;
  add("training.seq_len", fmt::format("{}", t.seq_len));
  add("training.micro_batch", fmt::format("{}", t.micro_batch));
  add("training.global_batch", fmt::format("{}", t.global_batch));
  add("training.recompute", Name(t.recompute));
  add("training.flash_attention", Bool(t.flash_attention));
  add("training.dropout", Real(t.dropout));
  add("training.precision.params", Name(t.precision.params));
  add("training.precision.grads", Name(t.precision.grads));
  add("training.precision.master", t.precision.master ? Name(*t.precision.master) : "none");
  add("training.precision.activations", Name(t.precision.activations));
  add("training.optimizer.matrices", Name(t.optimizer.matrices));
  add("training.optimizer.other", Name(t.optimizer.other));
  add("training.optimizer.muon_momentum", Name(t.optimizer.muon_momentum));
  add("training.optimizer.mamba_in_proj", Name(t.optimizer.mamba_in_proj));
  add("training.optimizer.router", Name(t.optimizer.router));
  const ParallelConfig& p = r.parallel;
  add("parallel.tp", fmt::format("{}", p.tp));
  add("parallel.sp", Bool(p.sp));
  add("parallel.cp", fmt::format("{}", p.cp));
  add("parallel.pp", fmt::format("{}", p.pp));
  add("parallel.vpp", fmt::format("{}", p.vpp));
  add("parallel.ep", fmt::format("{}", p.ep));
  add("parallel.expert_tp", fmt::format("{}", p.expert_tp));
  add("parallel.zero", fmt::format("{}", p.zero));
  add("parallel.schedule", Name(p.schedule));
  add("parallel.order", Name(p.order));
  add("parallel.cp_comm", Name(p.cp_comm));
  add("parallel.cp_recurrent", Name(p.cp_recurrent));
  add("parallel.cp_load_balance", Bool(p.cp_load_balance));
  add("parallel.stage_boundaries", fmt::format("[{}]", fmt::join(p.stage_boundaries, ", ")));
  const ClusterConfig& c = r.cluster;
  add("cluster.gpu", c.gpu);
  add("cluster.nodes", fmt::format("{}", c.nodes));
  add("cluster.gpus_per_node", fmt::format("{}", c.gpus_per_node));
  add("cluster.reserve_gib", Real(c.reserve_gib));
  add("cluster.min_headroom_gib", Real(c.min_headroom_gib));
  add("cluster.allocator_overhead", Real(c.allocator_overhead));
  add("cluster.capacity_mib", fmt::format("{}", c.capacity_mib));
  if (r.serving) {
    add("serving", FlowMap({{"batch", fmt::format("{}", r.serving->batch)},
                            {"context", fmt::format("{}", r.serving->context)},
                            {"kv_dtype", Name(r.serving->kv_dtype)},
                            {"ssm_dtype", Name(r.serving->ssm_dtype)}}));
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

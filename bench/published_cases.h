// Published throughput of real runs (tests/data/published/runs.json, copied
// from the calibration set) as recipes, priced by `plan`. Header-only so the
// bench (bench/throughput.cc) and the regression test
// (tests/published_runs_test.cc) share one path from a row to its figures.
//
// torchtitan rows: Llama 3.1 8B, FSDP2 (ZeRO 3) over all GPUs, AdamW, bf16
// compute with fp32 master and reduce, per-op selective checkpointing
// (recompute: selective_op; the Float8 rows keep Megatron's module-selective
// stand-in: the per-op policy's saves around torchao's Float8 linears are not
// priced),
// PyTorch SDPA (FlashAttention-2), eager elementwise ops unless torch.compile,
// tensorwise Float8 linears where the technique says so; H100 at 500 W with
// 96 GB (a custom device: the H100 preset at 96 GB, rates below).
// Megatron-LM PTD-P rows: GPT (LayerNorm, GeLU, learned positions, biases),
// fp16, full recompute, no sequence parallelism (2021), DDP, unfused
// attention with Megatron's fused softmax and bias-GeLU, interleaved 1F1B
// where pp > 1, micro-batch 1 (the table does not list it).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"

namespace preflight::published {

struct Row {
  std::string id;
  std::string metric;  // "tokens_per_sec_per_gpu" or "tflops_per_gpu"
  double measured = 0;
  std::string recipe;  // YAML
  double modeled = 0;
  double error_pct = 0;  // (modeled - measured) / measured * 100
  std::string error;     // a recipe or plan error, if any
};

/// torchtitan's H100s run at 500 W (Grand Teton), not the SXM's 700 W: the
/// tensor-core rates of the 700 W preset (measured) times this factor, fitted
/// on the first row (torchtitan-table1-FSDP) alone; the other five rows
/// (torch.compile, Float8, 128 GPUs) are predictions. HBM is not scaled.
constexpr double kPowerCap500W = 0.66;

inline std::string TorchtitanRecipe(const nlohmann::json& in) {
  const KernelRates h100 = GpuPreset("h100")->rates;
  const std::string technique = in["technique"].get<std::string>();
  const bool compile = technique.find("compile") != std::string::npos;
  const bool fp8 = technique.find("Float8") != std::string::npos;
  const int64_t gpus = in["gpus"].get<int64_t>();
  return fmt::format(R"(name: {id}
model:
  pattern: "AD"
  repeat: 32
  hidden: 4096
  vocab: 128256
  tie_embeddings: false
  norm: rmsnorm
  attention: {{heads: 32, kv_heads: 8, head_dim: 128}}
  mlp: {{ffn_hidden: 14336, activation: swiglu}}
training:
  seq_len: {seq}
  micro_batch: {mb}
  global_batch: {gb}
  recompute: {recompute}
  transformer_engine: false
  cross_entropy: fp32_upcast
  fused_elementwise: {compile}
  precision: {{params: bf16, grads: fp32, master: fp32, activations: {act}}}
  optimizer: {{matrices: adamw, other: adamw}}
parallel: {{tp: 1, cp: 1, pp: 1, zero: 3, partition: torchtitan}}
cluster:
  nodes: {nodes}
  gpus_per_node: 8
  device: {{based_on: h100, name: h100-96gb-500w, capacity_mib: 91553,
           rates: {{gemm: {gemm}, gemm_fp8: {fp8}, attention_flash2: {flash2}, attention_fused: {fused}}}}}
)",
                     fmt::arg("id", "torchtitan"), fmt::arg("seq", in["seq_len"].get<int64_t>()),
                     fmt::arg("mb", in["local_batch"].get<int64_t>()),
                     fmt::arg("gb", in["global_batch"].get<int64_t>()), fmt::arg("compile", compile ? "true" : "false"),
                     fmt::arg("act", fp8 ? "fp8" : "bf16"), fmt::arg("recompute", fp8 ? "selective" : "selective_op"),
                     fmt::arg("nodes", gpus / 8), fmt::arg("gemm", kPowerCap500W * h100.gemm),
                     fmt::arg("fp8", kPowerCap500W * h100.gemm_fp8),
                     fmt::arg("flash2", kPowerCap500W * h100.attention_flash2),
                     fmt::arg("fused", kPowerCap500W * h100.attention_fused));
}

inline std::string PtdpRecipe(const nlohmann::json& in) {
  const int64_t layers = in["layers"].get<int64_t>(), pp = in["pp"].get<int64_t>();
  const int64_t hidden = in["hidden"].get<int64_t>(), heads = in["attention_heads"].get<int64_t>();
  const int64_t per_stage = layers / pp;
  const int64_t vpp = pp > 1 && per_stage % 2 == 0 ? 2 : (pp > 1 && per_stage % 3 == 0 ? 3 : 1);
  return fmt::format(R"(name: ptdp
model:
  pattern: "AD"
  repeat: {layers}
  hidden: {hidden}
  vocab: {vocab}
  tie_embeddings: true
  learned_positions: {seq}
  linear_bias: true
  norm: layernorm
  attention: {{heads: {heads}, kv_heads: {heads}, head_dim: {hd}}}
  mlp: {{ffn_hidden: {ffn}, activation: gelu}}
training:
  seq_len: {seq}
  micro_batch: 1
  global_batch: {gb}
  recompute: full
  flash_attention: false
  transformer_engine: false
  precision: {{params: fp16, grads: fp32, master: fp32, activations: fp16}}
  optimizer: {{matrices: adamw, other: adamw}}
parallel: {{tp: {tp}, sp: false, cp: 1, pp: {pp}, vpp: {vpp}, zero: 0, schedule: {schedule}}}
cluster: {{gpu: a100, nodes: {nodes}, gpus_per_node: 8}}
)",
                     fmt::arg("layers", layers), fmt::arg("hidden", hidden),
                     fmt::arg("vocab", in["vocab"].get<int64_t>()), fmt::arg("seq", in["seq_len"].get<int64_t>()),
                     fmt::arg("heads", heads), fmt::arg("hd", hidden / heads), fmt::arg("ffn", 4 * hidden),
                     fmt::arg("gb", in["global_batch"].get<int64_t>()), fmt::arg("tp", in["tp"].get<int64_t>()),
                     fmt::arg("pp", pp), fmt::arg("vpp", vpp), fmt::arg("schedule", vpp > 1 ? "interleaved" : "1f1b"),
                     fmt::arg("nodes", in["gpus"].get<int64_t>() / 8));
}

/// The paper's own count (Narayanan et al. 2021, Eq. 3), full recompute
/// included: 96 B s l h^2 (1 + s / 6h + V / 16 l h) FLOPs a step.
inline double PtdpFlopsPerStep(const nlohmann::json& in) {
  const double b = in["global_batch"].get<double>(), s = in["seq_len"].get<double>();
  const double l = in["layers"].get<double>(), h = in["hidden"].get<double>(), v = in["vocab"].get<double>();
  return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
}

inline std::vector<Row> LoadRows(const std::string& path) {
  std::ifstream f(path);
  const nlohmann::json data = nlohmann::json::parse(f);
  std::vector<Row> rows;
  for (const nlohmann::json& run : data["runs"]) {
    Row row;
    row.id = run["id"].get<std::string>();
    const nlohmann::json& in = run["inputs"];
    const bool titan = row.id.rfind("torchtitan", 0) == 0;
    row.metric = titan ? "tokens_per_sec_per_gpu" : "tflops_per_gpu";
    row.measured = run["expected"][row.metric].get<double>();
    row.recipe = titan ? TorchtitanRecipe(in) : PtdpRecipe(in);
    const LoadResult loaded = LoadRecipeFromString(row.recipe, row.id + ".yaml");
    if (!loaded.ok()) {
      row.error = loaded.diagnostics.empty() ? "recipe" : loaded.diagnostics.front().message;
      rows.push_back(row);
      continue;
    }
    const Inventory inv = BuildInventory(*loaded.recipe);
    const PlanResult plan = MakePlan(inv, LayoutOf(*loaded.recipe));
    if (!plan.plan) {
      row.error = plan.diagnostics.empty() ? "plan" : plan.diagnostics.front().message;
      rows.push_back(row);
      continue;
    }
    const StepTime& t = plan.plan->time;
    const double gpus = static_cast<double>(plan.plan->layout.world());
    row.modeled = titan ? t.tokens_per_s / gpus : PtdpFlopsPerStep(in) / t.step_s / gpus / 1e12;
    row.error_pct = (row.modeled - row.measured) / row.measured * 100.0;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace preflight::published

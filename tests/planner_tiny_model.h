// A hand-built inventory for planner tests: every parameter count is set
// here by hand, so expected bytes follow from the numbers below, not from
// the inventory builder.
#pragma once

#include <limits>
#include <string>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"

namespace preflight::testing {

// hidden 64, attention 8 query / 4 KV heads of 8, dense FFN 128, 4 experts
// of FFN 32 (top-2, no shared expert), Mamba d_inner 128 (8 heads of 16, 2
// groups, d_state 16), seq 1024, micro-batch 2, bf16 params/activations,
// fp32 grads and Muon momentum, H200 links.
//
// Per-layer parameters (global):
//   A: norm 64 (REP, AdamW) + W_qkv 64*(8+2*4)*8 = 8192 + W_o 64*64 = 4096 (TP, Muon)
//   D: norm 64 (REP, AdamW) + 3*64*128 = 24576 (TP, Muon)
//   E: norm 64 + router 4*64 = 256 (REP, AdamW) + experts 4*3*64*32 = 24576 (EP, Muon)
//   M: norm 64 (REP, AdamW) + 20000 (TP, AdamW) [only the widths matter here]
//   embedding 1000 x 64 (vocab padded to 1024 at tp <= 8), untied head 1000 x 64, final norm 64.
inline ParamTotals Totals(int64_t rep_adamw, int64_t tp_muon, int64_t ep_muon, int64_t tp_adamw = 0) {
  ParamTotals t;
  t.elements[0][0] = rep_adamw;
  t.elements[1][0] = tp_adamw;
  t.elements[1][1] = tp_muon;
  t.elements[2][1] = ep_muon;
  return t;
}

inline Inventory TinyInventory(const std::string& pattern, int64_t vocab = 1000) {
  Inventory inv;
  Recipe& r = inv.recipe;
  r.name = "tiny";
  r.source.file = "tiny.yaml";
  ModelConfig& m = r.model;
  m.pattern = pattern;
  m.repeat = 1;
  m.hidden = 64;
  m.vocab = vocab;
  m.vocab_pad_multiple = 128;
  m.attention = AttentionConfig{8, 4, 8, false};
  m.mlp.ffn_hidden = 128;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_hidden = 32;
  m.moe.shared_experts = 0;
  m.mamba = MambaConfig{16, 4, 2, 16, 2, 64};
  m.recurrent = RecurrentConfig{64, 4, 4};
  r.training.seq_len = 1024;
  r.training.micro_batch = 2;
  r.cluster.gpu = "h200";
  // Compute priced by FLOPs alone, so these tests count layer units: every
  // GEMM and the attention core at half the peak, bandwidth unbounded.
  r.cluster.spec = *GpuPreset("h200");
  r.cluster.spec.hbm_gbps = std::numeric_limits<double>::infinity();
  r.cluster.spec.rates = KernelRates{0.5, 0.5, 1.0, 1.0, 0.5, 0.5, 0.0, 0.0};
  r.cluster.gpus_per_node = 8;
  // The planner's own balanced cut: these tests price partitions the
  // framework rules would refuse (8 layers on pp 3, DualPipe).
  r.parallel.partition = Partition::kBalanced;
  for (char c : pattern) {
    Layer layer;
    layer.index = static_cast<int64_t>(inv.layers.size());
    layer.kind = static_cast<BlockKind>(c);
    m.layers.push_back(layer.kind);
    // Matrices whose elements add up to the totals, so the step time's
    // GEMMs carry the layer's FLOPs (2 x its matrix elements a token).
    const auto matrix = [](const char* name, std::vector<int64_t> shape, Split split) {
      return ParamTensor{name, std::move(shape), split, OptimizerKind::kAdamW, DType::kBf16};
    };
    switch (layer.kind) {
      case BlockKind::kAttention:
        layer.totals = Totals(64, 12288, 0);
        layer.active_elements = 12352;
        layer.params = {matrix("mixer.qkv_proj.weight", {64, 128}, Split::kTpColumn),
                        matrix("mixer.o_proj.weight", {64, 64}, Split::kTpRow)};
        break;
      case BlockKind::kDenseMlp:
        layer.totals = Totals(64, 24576, 0);
        layer.active_elements = 24640;
        layer.params = {matrix("mlp.gate_up_proj.weight", {64, 256}, Split::kTpColumn),
                        matrix("mlp.down_proj.weight", {128, 64}, Split::kTpRow)};
        break;
      case BlockKind::kMoe:
        layer.totals = Totals(320, 0, 24576);
        layer.active_elements = 320 + 2 * 3 * 64 * 32;
        layer.params = {matrix("mlp.router.weight", {4, 64}, Split::kReplicated),
                        matrix("mlp.experts.gate_up_proj", {4, 64, 64}, Split::kExpert),
                        matrix("mlp.experts.down_proj", {4, 32, 64}, Split::kExpert)};
        break;
      case BlockKind::kMamba:
        layer.totals = Totals(64, 0, 0, 20000);
        layer.active_elements = 20064;
        layer.params = {matrix("mixer.in_proj.weight", {100, 200}, Split::kTpColumn)};
        break;
      case BlockKind::kRecurrent:
        layer.totals = Totals(64, 10000, 0);
        layer.active_elements = 10064;
        layer.params = {matrix("mixer.gate_proj.weight", {50, 200}, Split::kTpColumn)};
        break;
    }
    inv.family_layers[static_cast<size_t>(FamilyIndex(layer.kind))] += 1;
    inv.layers.push_back(layer);
  }
  SetLayerStarts(inv);
  inv.embedding = ParamTensor{"embedding.weight", {vocab, 64}, Split::kVocab, OptimizerKind::kAdamW, DType::kBf16};
  inv.final_norm = ParamTensor{"final_norm.weight", {64}, Split::kReplicated, OptimizerKind::kAdamW, DType::kBf16};
  inv.head = {ParamTensor{"output.weight", {vocab, 64}, Split::kVocab, OptimizerKind::kAdamW, DType::kBf16}};
  return inv;
}

inline Layout TinyLayout(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t micro_batches) {
  Layout l;
  l.tp = tp;
  l.cp = cp;
  l.dp = dp;
  l.pp = pp;
  l.micro_batch = 2;
  l.micro_batches = micro_batches;
  l.zero = 1;
  l.sp = false;
  return l;
}

/// Prices `layout` on `inv` with the partitioner's stages (or `stages` when given).
struct Priced {
  Mesh mesh;
  StagePlan stages;
  std::vector<StageComm> comm;
  StepTime time;
};
inline Priced Price(const Inventory& inv, const Layout& layout, const StagePlan* stages = nullptr) {
  Priced p;
  const PlanTables tables = BuildPlanTables(inv);
  p.mesh = PlaceRanks(layout, inv.recipe.cluster.gpus_per_node, inv.recipe.model.tie_embeddings);
  p.stages = stages ? *stages : PartitionStages(WeighLayers(inv, tables, layout), layout);
  p.comm = BuildStageComm(inv, tables, layout, p.stages, p.mesh.locality, CostModel{});
  p.time = EstimateStepTime(inv, tables, layout, p.stages, &p.comm, CostModel{});
  return p;
}

/// Sum of `send` over items matching axis, kind, pass and what.
inline int64_t Sent(const StageComm& sc, Axis axis, Collective kind, Pass pass, CommWhat what) {
  int64_t total = 0;
  for (const CommItem& i : sc.items) {
    if (i.axis == axis && i.kind == kind && i.pass == pass && i.what == what) total += i.send.count();
  }
  return total;
}
inline int64_t Received(const StageComm& sc, Axis axis, Pass pass, CommWhat what) {
  int64_t total = 0;
  for (const CommItem& i : sc.items) {
    if (i.axis == axis && i.pass == pass && i.what == what) total += i.recv.count();
  }
  return total;
}

}  // namespace preflight::testing

// Fine-grained activation offloading through the executor
// (training.activation_offload, simulator/activation_offload.h): the saved
// tensors of each listed module leave the device after the block's forward
// and come back before its backward, counted in the rank's host memory and on
// the host link. Hand-worked bytes on the blocks and on a small hybrid
// (A, E, D; tp 2 with SP, pp 2, ep 2); the numerics stay those of the
// unsharded reference; the comparison rows against fit and plan where
// Megatron's mechanism and the models agree.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "activation_offload.h"
#include "blocks.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_activation_offload_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::OnOneRank;
using testing::SmallDims;
using testing::SmallMlaDims;
using testing_sim::FindMemory;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

constexpr double kFdTolerance = 1e-6;  // central differences, step 1e-5 (simulator_blocks_test.cc)

OffloadSet AllModules() {
  OffloadSet s;
  for (OffloadModule m : kAllOffloadModules) s.bits |= OffloadSet::Of(m).bits;
  return s;
}

/// The bytes one forward of `letter` sent to the host with every module
/// listed (no Transformer Engine: the norms are modules of their own), after
/// its backward matched finite differences; the first forward's come back
/// before its backward, so the bytes up equal the bytes down of one forward.
int64_t OffloadedByBlock(char letter, const Dims& d) {
  int64_t up = 0;
  OnOneRank(d.seq, [&](Ctx& ctx) {
    ctx.transformer_engine = false;
    ActivationOffload offload(ctx.rank, AllModules(), 1);
    ctx.offload = &offload;
    auto block = MakeBlock<double>(letter, ctx, d, 2, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance, std::string(1, letter) + " offloaded");
    up = ctx.rank->bytes_to_device();
    EXPECT_GT(ctx.rank->bytes_to_host(), up);  // the finite differences' forwards stay offloaded
    EXPECT_EQ(ctx.rank->bytes_to_host() % up, 0);
  });
  return up;
}

// SmallDims: h 8, 4 heads / 2 KV heads of 4, 12 tokens, bf16 activations
// (2 B), fp32 statistics (4 B), 4 experts top-2 with fc1 [gate | up] of 6.
TEST(SimulatorActivationOffload, BlocksMatchFiniteDifferencesWithTheirScopesOnTheHost) {
  const Dims d = SmallDims();
  // attn_norm: x 12x8x2 + rstd 12x4; qkv_linear: n 12x8x2; core_attn: q
  // 12x16x2, k and v 12x8x2, LSE 12x4x4; attn_proj: o 12x16x2.
  EXPECT_EQ(OffloadedByBlock('A', d), 192 + 48 + 192 + 384 + 192 + 192 + 192 + 384);
  // mlp_norm: x + rstd; expert_fc1: 24 routed rows x 8 x 2 (dropless, 12 x
  // top-2); moe_act: fc1's output, 24 x (6 + 6) x 2.
  EXPECT_EQ(OffloadedByBlock('E', d), 192 + 48 + 384 + 576);
  EXPECT_EQ(OffloadedByBlock('D', d), 192 + 48);  // mlp_norm only
  // MLA: x + rstd; n, c_q 12x6, c_kv 12x(4+2), their normed copies 12x6 and
  // 12x4, the two latent norms' rstd 2 x 12x4; q and k 12x(4x6)x2, v
  // 12x(4x3)x2, LSE 12x4x4; o 12x12x2.
  EXPECT_EQ(OffloadedByBlock('A', SmallMlaDims()),
            192 + 48 + 192 + 144 + 144 + 144 + 96 + 96 + 576 + 576 + 288 + 192 + 288);
}

TEST(SimulatorActivationOffload, ModulesOfEachLayer) {
  EXPECT_TRUE(OffloadModulesOf('A', false, true, ModuleSet()).has(OffloadModule::kQkvLinear));
  EXPECT_FALSE(
      OffloadModulesOf('A', false, true, ModuleSet()).has(OffloadModule::kAttnNorm));  // fused into the QKV projection
  EXPECT_TRUE(OffloadModulesOf('A', true, true, ModuleSet()).has(OffloadModule::kAttnNorm));  // MLA's is its own
  EXPECT_TRUE(OffloadModulesOf('E', false, true, ModuleSet()).has(OffloadModule::kMlpNorm));
  EXPECT_TRUE(OffloadModulesOf('D', false, true, ModuleSet()).empty());
  EXPECT_TRUE(OffloadModulesOf('D', false, false, ModuleSet()).has(OffloadModule::kMlpNorm));
  EXPECT_TRUE(OffloadModulesOf('M', false, false, ModuleSet()).empty());
}

/// tp 2 with SP, pp 2, ep 2, dp 2, 4 micro-batches, no recompute: each stage
/// runs A E A D.
Recipe Hybrid(std::vector<Override> more) {
  std::vector<Override> o = {{"model.pattern", "AEADAEAD"},  {"model.moe.pad_to_capacity", "true"},
                             {"cluster.nodes", "1"},         {"cluster.gpus_per_node", "8"},
                             {"parallel.tp", "2"},           {"parallel.sp", "true"},
                             {"parallel.pp", "2"},           {"parallel.ep", "2"},
                             {"training.global_batch", "8"}, {"training.recompute", "none"}};
  o.insert(o.end(), more.begin(), more.end());
  return ScaledDefault(o);
}

struct StageFigures {
  int64_t host = 0, copied = 0, activations = 0;
};
StageFigures Measured(const SimulationReport& rep, int64_t stage) {
  StageFigures f;
  for (const RankMeasurement& m : rep.per_rank) {
    if (m.pipeline_rank != stage) continue;
    f.host = std::max(f.host, m.host_peak_bytes);
    f.copied = std::max(f.copied, m.bytes_to_host + m.bytes_to_device);
    f.activations = std::max(f.activations, m.peak_bytes[static_cast<size_t>(SimCategory::kActivations)]);
  }
  return f;
}

const CommAgreement* HostRow(const StageComparison& s) {
  for (const CommAgreement& a : s.comm) {
    if (a.axis == "host") return &a;
  }
  return nullptr;
}

void ExpectNumericsOk(const SimulationReport& rep) {
  EXPECT_LE(rep.loss.max_rel, 1e-10);
  EXPECT_LE(rep.worst_gradient.max_rel, 1e-10) << rep.worst_gradient.name;
  EXPECT_LE(rep.worst_update.max_rel, 1e-10) << rep.worst_update.name;
}

/// attn_proj saves the output projection's input, o: s*b tokens x
/// heads/tp x head_dim, 2 B each, per layer and micro-batch.
int64_t AttnProjBytes(const Recipe& r) {
  return r.training.seq_len * r.training.micro_batch * r.model.attention.heads / r.parallel.tp *
         r.model.attention.head_dim * 2;
}

TEST(SimulatorActivationOffload, TheOutputProjectionsInputLeavesAndComesBack) {
  const Recipe r =
      Hybrid({{"training.activation_offload", "[attn_proj]"}, {"training.activation_offload_min_elements", "1"}});
  ASSERT_EQ(r.micro_batches(), 4);
  const int64_t o = AttnProjBytes(r);
  const SimulationReport base = Simulate(Hybrid({}));
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  EXPECT_EQ(rep.loss_sharded, base.loss_sharded);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  // The last stage (A4 E5 A6 D7) keeps the last A layer's group of every
  // micro-batch (its backward is next: should_bulk_offload): A4's o of the
  // one micro-batch in flight waits on the host, and every micro-batch's
  // goes down and up.
  const StageFigures last = Measured(rep, 1);
  EXPECT_EQ(last.host, o);
  EXPECT_EQ(last.copied, 4 * o * 2);
  EXPECT_EQ(last.activations, Measured(base, 1).activations - o);
  const MemoryAgreement& host = FindMemory(Stage(c, 1), "host (offloaded)");
  EXPECT_EQ(host.modeled, o);
  EXPECT_TRUE(host.agrees);
  // The first stage (A0 E1 A2 D3, two micro-batches in flight): micro-batch
  // 0, the first to run backward, keeps A2's group (post_warmup_callback);
  // the others send both layers'. In the steady state the micro-batch whose
  // backward runs next has A2's group back already (pre_reload_last_layer,
  // one group: the chunk's one module name): three groups wait on the host,
  // as early on (micro-batch 0's A0, micro-batch 1's A0 and A2).
  const StageFigures first = Measured(rep, 0);
  EXPECT_EQ(first.host, 3 * o);
  EXPECT_EQ(first.copied, (4 * 2 - 1) * o * 2);
  const CommAgreement* link = HostRow(Stage(c, 0));
  ASSERT_NE(link, nullptr);
  EXPECT_EQ(link->modeled_sent, first.copied);
  EXPECT_TRUE(link->agrees);
  const CommAgreement* last_link = HostRow(Stage(c, 1));
  ASSERT_NE(last_link, nullptr);
  EXPECT_EQ(last_link->modeled_sent, last.copied);
  for (int64_t st = 0; st < 2; ++st) EXPECT_TRUE(FindMemory(Stage(c, st), "host (offloaded)").agrees) << st;
}

/// The activation peak of stage `stage`'s worst rank, by owner ("A", "D", "ends").
std::map<std::string, int64_t> PeakSplit(const SimulationReport& rep, int64_t stage) {
  const RankMeasurement* worst = nullptr;
  const auto acts = [](const RankMeasurement& m) {
    return m.peak_bytes[static_cast<size_t>(SimCategory::kActivations)];
  };
  for (const RankMeasurement& m : rep.per_rank) {
    if (m.pipeline_rank == stage && (worst == nullptr || acts(m) > acts(*worst))) worst = &m;
  }
  return worst == nullptr ? std::map<std::string, int64_t>{} : worst->activations_at_peak;
}

/// Llama 3 8B scaled to two stages (A0 D1 | A2 D3), tp 2 with SP, 4
/// micro-batches, no recompute.
Recipe DenseTwoStages(std::vector<Override> more) {
  std::vector<Override> o = {
      {"parallel.tp", "2"}, {"parallel.sp", "true"}, {"parallel.pp", "2"}, {"training.recompute", "none"}};
  o.insert(o.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("llama3-8b-h200.yaml", o, /*max_world=*/16, /*microbatches=*/4);
}

TEST(SimulatorActivationOffload, EachModulesGroupLeavesAtItsCommit) {
  const Recipe r = DenseTwoStages({{"training.activation_offload", "[qkv_linear, core_attn, attn_proj]"},
                                   {"training.activation_offload_min_elements", "1"}});
  ASSERT_EQ(r.micro_batches(), 4);
  ASSERT_TRUE(r.training.transformer_engine);
  const SimulationReport base = Simulate(DenseTwoStages({}));
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  // One attention layer's saved set (TE: the norm is fused into the QKV
  // projection, so its x and rstd are qkv_linear's): 8 tokens, 4 a rank
  // under SP; 2 local heads, 1 local KV head.
  const int64_t s = r.training.seq_len, res = s / 2, h = r.model.hidden, hd = r.model.attention.head_dim;
  const int64_t heads = r.model.attention.heads / 2, kv = r.model.attention.kv_heads / 2;
  const int64_t qkv = res * h * 2 + res * 4 + res * h * 2;
  const int64_t core = s * heads * hd * 2 + 2 * s * kv * hd * 2 + s * heads * 4;
  const int64_t proj = s * heads * hd * 2;
  // Stage 0 holds two micro-batches. Micro-batch 0, the first to run
  // backward, keeps A0's groups (post_warmup_callback); micro-batch 1's go.
  // Its qkv_linear group left when the projection ended, so the peak is at
  // its core attention's commit: micro-batch 0's A0 and D1 with micro-batch
  // 1's q, k, v and LSE, before they leave and before its D1 saves anything.
  // A hand-off at the layer's end would hold all of micro-batch 1's A0.
  const std::map<std::string, int64_t> peak = PeakSplit(rep, 0), plain = PeakSplit(base, 0);
  EXPECT_EQ(peak.at("A"), qkv + core + proj + core);
  EXPECT_EQ(peak.at("D"), plain.at("D") / 2);
  EXPECT_EQ(Measured(rep, 0).activations, peak.at("A") + peak.at("D") + peak.at("ends"));
  EXPECT_EQ(Measured(rep, 0).host, qkv + core + proj);  // micro-batch 1's A0, or later 2's with 1's back
  // fit's figure: the kept layer plus the group in flight over micro-batch
  // 1's end state (its D1).
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  const MemoryAgreement& acts = FindMemory(Stage(c, 0), "activations");
  EXPECT_EQ(acts.modeled, Measured(rep, 0).activations);
  EXPECT_TRUE(acts.agrees);
  EXPECT_TRUE(FindMemory(Stage(c, 1), "activations").agrees);
  EXPECT_TRUE(FindMemory(Stage(c, 0), "host (offloaded)").agrees);
}

TEST(SimulatorActivationOffload, TheExpertGroupsLeaveAfterFc1AndFc2) {
  // Padded routing (exact rows). Stage 0 (A0 E1 A2 D3) holds two
  // micro-batches: micro-batch 1's E1 peaks at a commit, expert_fc1's (its
  // input with fc1's output) or moe_act's (fc1's output with fc2's input),
  // before the combined output is saved: fit's group in flight, the
  // tensors saved after the commit left out, is the executor's measurement.
  const Recipe r = Hybrid(
      {{"training.activation_offload", "[expert_fc1, moe_act]"}, {"training.activation_offload_min_elements", "1"}});
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  for (int64_t st = 0; st < 2; ++st) {
    const MemoryAgreement& acts = FindMemory(Stage(c, st), "activations");
    EXPECT_EQ(acts.modeled, acts.measured) << st;
  }
}

TEST(SimulatorActivationOffload, TensorsUnderTheMinimumStay) {
  const Recipe probe = Hybrid({});
  const int64_t elements = AttnProjBytes(probe) / 2;
  const auto run = [&](int64_t min) {
    return Simulate(Hybrid({{"training.activation_offload", "[attn_proj]"},
                            {"training.activation_offload_min_elements", std::to_string(min)}}));
  };
  const SimulationReport at = run(elements), above = run(elements + 1);
  EXPECT_EQ(Measured(at, 1).host, AttnProjBytes(probe));
  for (int64_t s = 0; s < 2; ++s) {
    EXPECT_EQ(Measured(above, s).host, 0);
    EXPECT_EQ(Measured(above, s).copied, 0);
  }
}

TEST(SimulatorActivationOffload, EveryModule) {
  const std::vector<Override> all = {
      {"training.activation_offload", "[attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act]"},
      {"training.activation_offload_min_elements", "1"}};
  const Recipe r = Hybrid(all);
  const SimulationReport base = Simulate(Hybrid({}));
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  EXPECT_EQ(rep.loss_sharded, base.loss_sharded);
  // Megatron keeps the last group of each module name: on the last stage
  // (A4 E5 A6 D7) A6's attention groups and E5's (the stage's only E). A4's
  // go: x and rstd (the norm fused into the QKV projection, qkv_linear), n
  // (qkv_linear), q, k, v and the LSE (core_attn), o (attn_proj). Tokens: 8
  // on the sequence, 4 per SP rank; 2 local heads (tp 2), 1 local KV head.
  const int64_t s = r.training.seq_len, res = s / 2, h = r.model.hidden, hd = r.model.attention.head_dim;
  const int64_t heads = r.model.attention.heads / 2, kv = r.model.attention.kv_heads / 2;
  const int64_t a = res * h * 2 + res * 4 + res * h * 2 + s * heads * hd * 2 + 2 * s * kv * hd * 2 + s * heads * 4 +
                    s * heads * hd * 2;
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  EXPECT_EQ(Measured(rep, 1).host, a);
  EXPECT_TRUE(FindMemory(Stage(c, 1), "host (offloaded)").agrees);
  EXPECT_EQ(Measured(rep, 1).copied, 4 * a * 2);
  EXPECT_EQ(Measured(rep, 1).activations, Measured(base, 1).activations - a);
  // The first stage sends every layer's groups of micro-batches 1-3 and
  // micro-batch 0's A0: plan's bytes.
  const CommAgreement* link = HostRow(Stage(c, 0));
  ASSERT_NE(link, nullptr);
  EXPECT_TRUE(link->agrees) << link->measured_sent << " vs " << link->modeled_sent;
  EXPECT_GT(Measured(rep, 0).host, Measured(rep, 1).host);
}

TEST(SimulatorActivationOffload, RoutedRowsFollowTheRouter) {
  // Unpadded routing: the experts' rows are the router's choice, which plan
  // and fit price as uniform; the host-link bytes are informational.
  const Recipe r = Hybrid({{"model.moe.pad_to_capacity", "false"},
                           {"training.activation_offload", "[expert_fc1, moe_act]"},
                           {"training.activation_offload_min_elements", "1"}});
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  const CommAgreement* link = HostRow(Stage(c, 0));
  ASSERT_NE(link, nullptr);
  EXPECT_GT(link->measured_sent, 0);
  EXPECT_FALSE(link->exact);
  EXPECT_TRUE(link->agrees);
}

/// One attention layer's groups on the Hybrid geometry (TE: x and rstd of
/// the fused norm are qkv_linear's): 8 tokens, 4 a rank under SP; 2 local
/// heads (tp 2), 1 local KV head.
struct AttentionGroups {
  int64_t qkv = 0, core = 0, proj = 0;
};
AttentionGroups GroupsOf(const Recipe& r) {
  const int64_t s = r.training.seq_len, res = s / 2, h = r.model.hidden, hd = r.model.attention.head_dim;
  const int64_t heads = r.model.attention.heads / 2, kv = r.model.attention.kv_heads / 2;
  return {res * h * 2 + res * 4 + res * h * 2, s * heads * hd * 2 + 2 * s * kv * hd * 2 + s * heads * 4,
          s * heads * hd * 2};
}

/// fit's activations, its rerun transient and host rows, and plan's host
/// link agree with what the executor measured on both stages.
void ExpectModelsAgree(const Recipe& r, const SimulationReport& rep) {
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  for (int64_t st = 0; st < 2; ++st) {
    for (const MemoryAgreement& m : Stage(c, st).memory) EXPECT_TRUE(m.agrees) << st << " " << m.category;
    const CommAgreement* link = HostRow(Stage(c, st));
    if (link != nullptr) {
      EXPECT_EQ(link->modeled_sent, link->measured_sent) << st;
    }
  }
}

TEST(SimulatorActivationOffload, UnderTheCoresRerunTheCoreRunsNoGroup) {
  // Megatron calls _checkpointed_attention_forward outside the core_attn
  // scope (attention.py): the checkpoint's q, k, v stay on the device and
  // only qkv_linear and attn_proj go. Last stage (A4 E5 A6 D7): A6's groups
  // and E5's stay in every micro-batch, A4's qkv_linear and attn_proj go.
  const Recipe r = Hybrid({{"training.activation_offload", "[qkv_linear, core_attn, attn_proj, expert_fc1, moe_act]"},
                           {"training.activation_offload_min_elements", "1"},
                           {"training.recompute", "selective"},
                           {"training.recompute_modules", "[core_attn, moe_act]"}});
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  const AttentionGroups g = GroupsOf(r);
  EXPECT_EQ(Measured(rep, 1).host, g.qkv + g.proj);
  EXPECT_EQ(Measured(rep, 1).copied, 4 * (g.qkv + g.proj) * 2);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  for (int64_t st = 0; st < 2; ++st) {
    for (const char* row : {"activations", "host (offloaded)"}) {
      EXPECT_TRUE(FindMemory(Stage(c, st), row).agrees) << st << " " << row;
    }
    const CommAgreement* link = HostRow(Stage(c, st));
    ASSERT_NE(link, nullptr);
    EXPECT_EQ(link->modeled_sent, link->measured_sent) << st;
    // fit's rerun transient also holds a layer's offloaded groups (what
    // Megatron's bulk_reload brings back ahead while a layer's backward
    // runs); the executor reloads a layer's groups at its own backward, so
    // it measures less (docs/simulate.md).
    const MemoryAgreement& rerun = FindMemory(Stage(c, st), "activations_rerun");
    EXPECT_GE(rerun.modeled - rerun.measured, g.qkv + g.proj) << st;
  }
}

TEST(SimulatorActivationOffload, ACheckpointHandsNothingOffAndNeitherDoesItsRerun) {
  // Stages A0 D1 A2 D3 | A4 D5 A6 D7. Block full recompute of one layer:
  // A0 D1 (A4 D5) run under the checkpoint, under no_grad (nothing saved in
  // any scope) and again in backward (read at once): only A2 (A6) offloads.
  // The last stage keeps A6's groups in every micro-batch; the first sends
  // A2's of micro-batches 1-3, one at a time on the host (the next
  // backward's comes back ahead).
  const std::vector<Override> offload = {{"model.pattern", "ADADADAD"},
                                         {"training.activation_offload", "[qkv_linear, core_attn, attn_proj]"},
                                         {"training.activation_offload_min_elements", "1"},
                                         {"training.recompute", "full"}};
  std::vector<Override> block = offload;
  block.insert(block.end(), {{"training.recompute_method", "block"}, {"training.recompute_layers", "1"}});
  const Recipe r = Hybrid(block);
  const SimulationReport rep = Simulate(r);
  ExpectNumericsOk(rep);
  const AttentionGroups g = GroupsOf(r);
  const int64_t a = g.qkv + g.core + g.proj;
  EXPECT_EQ(Measured(rep, 0).host, a);
  EXPECT_EQ(Measured(rep, 0).copied, 3 * a * 2);
  EXPECT_EQ(Measured(rep, 1).host, 0);
  ExpectModelsAgree(r, rep);
  // Uniform: every layer runs under a checkpoint, nothing leaves.
  const Recipe uniform = Hybrid(offload);
  const SimulationReport all = Simulate(uniform);
  ExpectNumericsOk(all);
  for (int64_t st = 0; st < 2; ++st) {
    EXPECT_EQ(Measured(all, st).host, 0) << st;
    EXPECT_EQ(Measured(all, st).copied, 0) << st;
  }
  ExpectModelsAgree(uniform, all);
}

}  // namespace
}  // namespace preflight::sim::simulator_activation_offload_test

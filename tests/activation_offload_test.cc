// training.activation_offload: Megatron-LM's fine-grained activation
// offloading. What leaves the device is worked by hand from the tensors each
// module's scope saves (Llama 3 8B, tp 4 with SP, s 8192, b 1, bf16: a rank
// holds 2048 residual tokens and 8192 tokens of 32/4 query and 8/4 KV heads
// of 128); the rank's figures, the host-link time and the importer and emitter
// against Megatron's own flags. The four measured Megatron runs with
// offloading are in the fidelity corpus (tests/fidelity_test.cc).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::activation_offload_test {
namespace {

LoadResult Load(std::vector<std::string> sets) {
  std::vector<Override> overrides;
  for (const char* s : {"parallel.tp=4", "parallel.sp=true", "parallel.pp=1", "training.seq_len=8192",
                        "training.micro_batch=1", "training.recompute=none"}) {
    overrides.push_back(*ParseOverride(s));
  }
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
}

Recipe RecipeOf(const std::vector<std::string>& sets) {
  const LoadResult loaded = Load(sets);
  EXPECT_TRUE(loaded.ok()) << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  return *loaded.recipe;
}

int64_t Offloaded(const std::vector<std::string>& sets, BlockKind kind) {
  const Recipe r = RecipeOf(sets);
  return LayerOffloaded(r, LayoutOf(r), kind).count();
}

constexpr int64_t kQ = int64_t{8192} * 1024 * 2;  // 8192 tokens x 8 heads x 128 x 2 B
constexpr int64_t kKv = int64_t{8192} * 256 * 2;  // 2 KV heads
constexpr int64_t kResidual = int64_t{2048} * 4096 * 2;

TEST(ActivationOffload, EachScopeMovesTheTensorsItSaves) {
  // Q, K, V; the fp32 LSE (8192 x 8 = 65,536 elements) is under the 2^20 minimum.
  EXPECT_EQ(Offloaded({"training.activation_offload=[core_attn]"}, BlockKind::kAttention), kQ + 2 * kKv);
  EXPECT_EQ(Offloaded({"training.activation_offload=[core_attn]", "training.activation_offload_min_elements=65536"},
                      BlockKind::kAttention),
            kQ + 2 * kKv + int64_t{8192} * 8 * 4);
  EXPECT_EQ(Offloaded({"training.activation_offload=[attn_proj]"}, BlockKind::kAttention), kQ);
  // With TE the norm is fused into the QKV projection: its input and output
  // move with qkv_linear (rstd, 2048 elements, stays), and attn_norm has nothing.
  EXPECT_EQ(Offloaded({"training.activation_offload=[qkv_linear]"}, BlockKind::kAttention), 2 * kResidual);
  EXPECT_EQ(Offloaded({"training.activation_offload=[attn_norm]"}, BlockKind::kAttention), 0);
  // The dense MLP's norm is fused into fc1: mlp_norm has nothing either.
  EXPECT_EQ(Offloaded({"training.activation_offload=[mlp_norm]"}, BlockKind::kDenseMlp), 0);
  // Under a core_attn rerun Megatron calls _checkpointed_attention_forward
  // outside the core_attn offload scope (attention.py): the checkpoint's
  // Q, K, V stay on the device and the group does not exist; attn_proj still
  // moves the core's output. Full recompute saves nothing inside the scopes.
  EXPECT_EQ(
      Offloaded({"training.activation_offload=[core_attn]", "training.recompute=selective"}, BlockKind::kAttention), 0);
  EXPECT_EQ(Offloaded({"training.activation_offload=[core_attn, attn_proj]", "training.recompute=selective",
                       "training.recompute_modules=[layernorm]"},
                      BlockKind::kAttention),
            kQ + 2 * kKv + kQ);
  EXPECT_EQ(Offloaded({"training.activation_offload=[core_attn, attn_proj]", "training.recompute=selective"},
                      BlockKind::kAttention),
            kQ);
  EXPECT_EQ(Offloaded({"training.activation_offload=[core_attn]", "training.recompute=full"}, BlockKind::kAttention),
            0);
}

TEST(ActivationOffload, TheRankKeepsTheLastLayersAndTheHostTheRest) {
  const Recipe r = RecipeOf({"training.activation_offload=[core_attn, attn_proj]"});
  const Recipe plain = RecipeOf({});
  const PlanResult with = MakePlan(BuildInventory(r), LayoutOf(r));
  const PlanResult without = MakePlan(BuildInventory(plain), LayoutOf(plain));
  ASSERT_TRUE(with.plan && without.plan);
  const RankMemory& m = with.plan->memory->stages.front();
  const RankMemory& b = without.plan->memory->stages.front();
  const int64_t layer = kQ + 2 * kKv + kQ;
  // pp 1: every layer of the micro-batch in flight, 32 attention layers.
  ASSERT_EQ(m.in_flight_microbatches, 1);
  // The last attention layer's groups stay; each reload replaces a group
  // whose backward freed it, so nothing comes back on top of them.
  EXPECT_EQ(m.activations_offload_kept.count(), layer);
  EXPECT_EQ(m.host.count(), 31 * layer);
  EXPECT_EQ((b.of(Category::kActivations) - m.of(Category::kActivations)).count(), 31 * layer);
}

/// pp 2 (16 layers a stage), dp 2, 8 micro-batches: [core_attn, attn_proj].
Recipe TwoStages() {
  return RecipeOf({"training.activation_offload=[core_attn, attn_proj]", "parallel.pp=2", "cluster.nodes=2",
                   "training.global_batch=16"});
}

/// The layers (A and D sublayers) cut evenly over two stages.
StagePlan EvenTwoStages(const Recipe& r) {
  const int64_t n = static_cast<int64_t>(r.model.layers.size());
  StagePlan p;
  p.chunks.push_back(StageChunk{0, 0, 0, n / 2, true, false});
  p.chunks.push_back(StageChunk{1, 0, n / 2, n, false, true});
  return p;
}

TEST(ActivationOffload, TheLastStageKeepsItsLastGroupsInEveryMicroBatch) {
  const Recipe r = TwoStages();
  const Layout l = LayoutOf(r);
  ASSERT_EQ(l.pp, 2);
  ASSERT_EQ(l.micro_batches, 8);
  const StagePlan stages = EvenTwoStages(r);
  const int64_t core = kQ + 2 * kKv, proj = kQ;
  for (int64_t s = 0; s < 2; ++s) {
    const OffloadOnRank o = ActivationOffloadOnRank(r, l, stages, s);
    EXPECT_EQ(o.microbatch.count(), 16 * (core + proj));
    EXPECT_EQ(o.kept.count(), core + proj);  // one core_attn and one attn_proj group
  }
  // Stage 0: micro-batch 0 keeps its last core_attn and attn_proj groups
  // (post_warmup_callback), the 7 others send all 16 layers'. Stage 1: the
  // next backward is always the micro-batch that just ran forward
  // (should_bulk_offload), so each of the 8 keeps them. Down and up.
  EXPECT_EQ(ActivationOffloadTransfer(r, l, stages, 0).count(), 2 * (8 * 16 - 1) * (core + proj));
  EXPECT_EQ(ActivationOffloadTransfer(r, l, stages, 1).count(), 2 * 8 * 15 * (core + proj));
}

TEST(ActivationOffload, EachHeldMicroBatchKeepsOneLayerOnTheDevice) {
  // Stage 0 holds 2 micro-batches. Early, micro-batch 0 keeps its last
  // groups; in the steady state every micro-batch offloads all 16 layers,
  // and the one whose backward runs next gets its last groups back during
  // the previous backward (pre_reload_last_layer): host 2 x 16 - 1 layers
  // either way, one layer's groups on the device.
  const Recipe r = TwoStages();
  const PlanResult planned = MakePlan(BuildInventory(r), LayoutOf(r));
  ASSERT_TRUE(planned.plan);
  const int64_t layer = kQ + 2 * kKv + kQ;
  const RankMemory& first = planned.plan->memory->stages.at(0);
  ASSERT_EQ(first.in_flight_microbatches, 2);
  EXPECT_EQ(first.host.count(), (2 * 16 - 1) * layer);
  EXPECT_EQ(first.activations_offload_kept.count(), layer);
  const RankMemory& last = planned.plan->memory->stages.at(1);
  ASSERT_EQ(last.in_flight_microbatches, 1);
  EXPECT_EQ(last.host.count(), 15 * layer);
  EXPECT_EQ(last.activations_offload_kept.count(), layer);
}

TEST(ActivationOffload, TheHostLinkShowsWhereItOutlastsTheCompute) {
  // Without flash attention the offloaded s x s scores (8192 x 8 x 8192 x 2 B
  // a layer) take longer over PCIe than the compute they run beside. The
  // unfused core keeps K and V repeated to the 8 query heads (Megatron's
  // DotProductAttention repeat_interleaves them): kQ wide each.
  const std::vector<std::string> sets = {"training.activation_offload=[core_attn]", "training.flash_attention=false"};
  const Recipe r = RecipeOf(sets);
  std::vector<std::string> plain_sets = sets;
  plain_sets.push_back("training.activation_offload=[]");
  const Recipe plain = RecipeOf(plain_sets);
  const PlanResult with = MakePlan(BuildInventory(r), LayoutOf(r));
  const PlanResult without = MakePlan(BuildInventory(plain), LayoutOf(plain));
  ASSERT_TRUE(with.plan && without.plan);
  const int64_t layer = kQ + 2 * kQ + int64_t{8192} * 8 * 8192 * 2;
  const int64_t m = r.micro_batches();
  // pp 1: the only stage is the last, every micro-batch keeps a layer.
  const double bytes = static_cast<double>(m * 31 * layer);
  EXPECT_NEAR(with.plan->time.activation_offload_s, bytes / 63e9, 1e-9 * bytes / 63e9);
  const StageTime& st = with.plan->time.stages.front();
  const double fwd = st.forward_s * static_cast<double>(m),
               bwd = (st.backward_s + st.recompute_s) * static_cast<double>(m);
  const double t = bytes / 63e9;
  EXPECT_NEAR(with.plan->time.activation_offload_exposed_s, std::max(0.0, t - fwd) + std::max(0.0, t - bwd), 1e-9 * t);
  EXPECT_GT(with.plan->time.activation_offload_exposed_s, 0.0);
  EXPECT_NEAR(with.plan->time.step_s - without.plan->time.step_s, with.plan->time.activation_offload_exposed_s,
              1e-9 * with.plan->time.step_s);
}

TEST(ActivationOffload, ChecksFollowMegatron) {
  EXPECT_NE(
      testing::FirstErrorText(Load({"training.activation_offload=[core_attn]", "training.transformer_engine=false"}))
          .find("needs training.transformer_engine: true"),
      std::string::npos);
  const std::string typo = testing::FirstErrorText(Load({"training.activation_offload=[core_atn]"}));
  EXPECT_NE(typo.find("did you mean 'core_attn'"), std::string::npos) << typo;
  const LoadResult dense = Load({"training.activation_offload=[expert_fc1]"});
  ASSERT_TRUE(dense.ok());
  bool warned = false;
  for (const Diagnostic& d : dense.diagnostics) warned = warned || Format(d).find("has no effect") != std::string::npos;
  EXPECT_TRUE(warned);
  // transformer_config.py asserts: the "moe" checkpoint wraps the expert scopes.
  const std::string moe = testing::FirstErrorText(Load(
      {"training.activation_offload=[moe_act]", "training.recompute=selective", "training.recompute_modules=[moe]"}));
  EXPECT_NE(moe.find("recompute_modules has moe"), std::string::npos) << moe;
  EXPECT_TRUE(Load({"training.activation_offload=[mlp_norm]", "training.recompute=selective",
                    "training.recompute_modules=[moe]"})
                  .ok());
}

TEST(ActivationOffload, ImportReadsTheTestYamlFormAndTheEmitterWritesIt) {
  const std::string yaml =
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n  --seq-length: 128\n"
      "  --max-position-embeddings: 128\n  --micro-batch-size: 1\n  --vocab-size: 1000\n"
      "  --fine-grained-activation-offloading: true\n"
      "  --offload-modules: \"[expert_fc1 moe_act attn_norm core_attn]\"\n  --min-offloaded-tensor-size: 4096\n";
  const MegatronImport in = ImportMegatronArgs(yaml, "model.yaml");
  EXPECT_TRUE(in.ok());
  std::string modules, min;
  for (const YamlEntry& e : in.layout) {
    if (e.key_path == "training.activation_offload") modules = e.value;
    if (e.key_path == "training.activation_offload_min_elements") min = e.value;
  }
  EXPECT_EQ(modules, "[expert_fc1, moe_act, attn_norm, core_attn]");
  EXPECT_EQ(min, "4096");

  const Recipe r = RecipeOf({"training.activation_offload=[qkv_linear, core_attn]"});
  const PlanResult planned = MakePlan(BuildInventory(r), LayoutOf(r));
  ASSERT_TRUE(planned.plan.has_value());
  const std::string text = EmitMegatron(r, *planned.plan).text;
  EXPECT_NE(text.find("--fine-grained-activation-offloading \\\n--offload-modules qkv_linear core_attn"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("NVTE_CPU_OFFLOAD_V1=1"), std::string::npos);
}

TEST(ActivationOffload, FitShowsWhatTheDeviceKeepsAndTheHostHolds) {
  const testing::CommandResult with = testing::RunPreflight(
      {"fit", "recipes/llama3-8b-h200.yaml", "--set", "training.activation_offload=[core_attn, attn_proj]"});
  EXPECT_EQ(with.exit_code, 0) << with.err;
  EXPECT_NE(with.out.find("of which offloaded, on device"), std::string::npos) << with.out;
  EXPECT_NE(with.out.find("host (offloaded state)"), std::string::npos) << with.out;
  const testing::CommandResult without = testing::RunPreflight({"fit", "recipes/llama3-8b-h200.yaml"});
  EXPECT_EQ(without.out.find("of which offloaded"), std::string::npos);
}

}  // namespace
}  // namespace preflight::activation_offload_test

// training.recompute_modules: Megatron-LM's selective recompute by module.
// Each module's saving is checked against the tensors it frees, worked by
// hand from the recipe's dimensions (β = 2 B, bf16); the rerun's compute and
// the MoE rerun's second dispatch against the forward they repeat; the key's
// checks, the importer and the emitter against Megatron's own rules.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/geometry.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/compute.h"
#include "preflight/planner/plan.h"
#include "preflight/planner/tables.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::recompute_modules_test {
namespace {

LoadResult Load(const std::string& recipe, const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  return LoadRecipeFile(testing::SourcePath("recipes/" + recipe + ".yaml"), overrides);
}

Recipe RecipeOf(const std::string& recipe, const std::vector<std::string>& sets) {
  const LoadResult loaded = Load(recipe, sets);
  EXPECT_TRUE(loaded.ok()) << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  return *loaded.recipe;
}

/// One layer's saved bytes for one micro-batch under `modules`.
int64_t Saved(const std::string& recipe, std::vector<std::string> sets, const std::string& modules, BlockKind kind) {
  sets.push_back("training.recompute=selective");
  sets.push_back("training.recompute_modules=" + modules);
  const Recipe r = RecipeOf(recipe, sets);
  return LayerActivations(r, LayoutOf(r), kind).count();
}

// Llama 3 8B, tp 4 with SP, s 8192, b 1: a rank holds 2048 tokens of the
// residual stream and 8192 tokens / 4 of each FFN column block.
// h = 4096, f = 14336, RMSNorm (4 B of rstd a token).
const std::vector<std::string> kLlamaTp4 = {"parallel.tp=4", "parallel.sp=true", "training.micro_batch=1",
                                            "training.seq_len=8192"};

TEST(RecomputeModules, MlpWithTransformerEngineKeepsOnlyTheResidualInput) {
  const int64_t base = Saved("llama3-8b-h200", kLlamaTp4, "[core_attn]", BlockKind::kDenseMlp);
  const int64_t mlp = Saved("llama3-8b-h200", kLlamaTp4, "[core_attn, mlp]", BlockKind::kDenseMlp);
  // Kept: the sublayer's input, 2048 tokens x 4096 x 2 B.
  EXPECT_EQ(mlp, int64_t{2048} * 4096 * 2);
  // Freed: the fused norm's output and rstd (2048 x (8192 + 4)) and the
  // SwiGLU tensors (8192 tokens x 3 x 14336 / 4 columns x 2 B).
  EXPECT_EQ(base - mlp, int64_t{2048} * (4096 * 2 + 4) + int64_t{8192} * 3 * 14336 / 4 * 2);
}

TEST(RecomputeModules, MlpWithoutTransformerEngineKeepsTheNormOutputUnlessLayernormToo) {
  std::vector<std::string> local = kLlamaTp4;
  local.push_back("training.transformer_engine=false");
  const int64_t mlp = Saved("llama3-8b-h200", local, "[mlp]", BlockKind::kDenseMlp);
  // A separate norm: its input, output and rstd stay (the checkpoint's input is the norm output).
  EXPECT_EQ(mlp, int64_t{2048} * (4096 * 2 * 2 + 4));
  EXPECT_EQ(Saved("llama3-8b-h200", local, "[layernorm, mlp]", BlockKind::kDenseMlp), int64_t{2048} * 4096 * 2);
  // With TE the attention norm is fused: layernorm frees nothing there.
  EXPECT_EQ(Saved("llama3-8b-h200", kLlamaTp4, "[core_attn, layernorm]", BlockKind::kAttention),
            Saved("llama3-8b-h200", kLlamaTp4, "[core_attn]", BlockKind::kAttention));
  // Without TE it frees the attention norm's output and rstd.
  EXPECT_EQ(Saved("llama3-8b-h200", local, "[core_attn]", BlockKind::kAttention) -
                Saved("llama3-8b-h200", local, "[core_attn, layernorm]", BlockKind::kAttention),
            int64_t{2048} * (4096 * 2 + 4));
}

TEST(RecomputeModules, CoreAttnIsTheDefaultAndFreesTheSoftmaxStatistics) {
  // Flash attention keeps one fp32 LSE a query head: 8192 tokens x 32 heads / 4 x 4 B.
  EXPECT_EQ(Saved("llama3-8b-h200", kLlamaTp4, "[]", BlockKind::kAttention) -
                Saved("llama3-8b-h200", kLlamaTp4, "[core_attn]", BlockKind::kAttention),
            int64_t{8192} * 32 / 4 * 4);
  const Recipe r = RecipeOf("llama3-8b-h200", {});
  EXPECT_EQ(r.training.recompute_modules, ModuleSet::Of(RecomputeModule::kCoreAttn));
}

// DeepSeek-V3 (MLA, 256 routed experts of f 2048 top-8, one shared expert of
// 2048, SwiGLU, h 7168), tp 2 + SP, ep 8, s 4096, b 1.
const std::vector<std::string> kDeepSeek = {"parallel.tp=2",
                                            "parallel.sp=true",
                                            "parallel.ep=8",
                                            "parallel.pp=1",
                                            "parallel.cp=1",
                                            "parallel.vpp=1",
                                            "parallel.schedule=1f1b",
                                            "training.seq_len=4096",
                                            "training.micro_batch=1",
                                            "cluster.nodes=32",
                                            "parallel.partition=megatron",
                                            "parallel.expert_tp=1"};

TEST(RecomputeModules, MoeModulesFreeWhatTheirCheckpointsDiscard) {
  const Recipe r = RecipeOf("deepseek-v3-h200", kDeepSeek);
  ASSERT_TRUE(r.model.mla.has_value());
  const MoeRouting routing = RouteMoeOn(r, LayoutOf(r));
  const int64_t base = Saved("deepseek-v3-h200", kDeepSeek, "[core_attn]", BlockKind::kMoe);
  // moe_act: the activation output, f = 2048 a routed row, 2 B.
  EXPECT_EQ(base - Saved("deepseek-v3-h200", kDeepSeek, "[moe_act]", BlockKind::kMoe),
            routing.expert_tokens * 2048 * 2);
  // shared_experts: gate, up and the SwiGLU output of the 2048-wide shared
  // expert on 4096 tokens, column-split by tp 2.
  EXPECT_EQ(base - Saved("deepseek-v3-h200", kDeepSeek, "[shared_experts]", BlockKind::kMoe),
            int64_t{4096} * 3 * 2048 / 2 * 2);
  // layernorm: the MoE pre-MLP norm is its own module even with TE: its
  // output and rstd on the rank's 2048 residual tokens.
  EXPECT_EQ(base - Saved("deepseek-v3-h200", kDeepSeek, "[layernorm]", BlockKind::kMoe),
            int64_t{2048} * (7168 * 2 + 4));
  // moe: the input and the norm output with its rstd stay, nothing else.
  EXPECT_EQ(Saved("deepseek-v3-h200", kDeepSeek, "[moe]", BlockKind::kMoe), int64_t{2048} * (7168 * 2 * 2 + 4));
}

TEST(RecomputeModules, MlaUpProjFreesQueryKeyAndValue) {
  const Recipe r = RecipeOf("deepseek-v3-h200", kDeepSeek);
  const MlaConfig& a = *r.model.mla;  // 128 heads, q/k 128 + 64, v 128
  const int64_t qkv = a.heads * (2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.v_head_dim);
  EXPECT_EQ(qkv, 128 * (2 * 192 + 128));
  EXPECT_EQ(Saved("deepseek-v3-h200", kDeepSeek, "[core_attn]", BlockKind::kAttention) -
                Saved("deepseek-v3-h200", kDeepSeek, "[core_attn, mla_up_proj]", BlockKind::kAttention),
            int64_t{4096} * qkv / 2 * 2);
  // MLA's input norm is its own module: layernorm frees its output and rstd.
  EXPECT_EQ(Saved("deepseek-v3-h200", kDeepSeek, "[core_attn]", BlockKind::kAttention) -
                Saved("deepseek-v3-h200", kDeepSeek, "[core_attn, layernorm]", BlockKind::kAttention),
            int64_t{2048} * (7168 * 2 + 4));
}

TEST(RecomputeModules, TheLayerInBackwardHoldsWhatItsRerunRegenerates) {
  // pp 1, every layer in flight: the transient is the largest family's
  // rerun set, here the dense MLP's, once.
  std::vector<std::string> sets = kLlamaTp4;
  sets.push_back("training.recompute_modules=[core_attn, mlp]");
  const Recipe r = RecipeOf("llama3-8b-h200", sets);
  const Layout l = LayoutOf(r);
  Layout none = l;
  none.recompute = Recompute::kNone;
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, l);
  ASSERT_TRUE(planned.plan.has_value());
  const RankMemory& m = planned.plan->memory->stages.front();
  const int64_t mlp_rerun =
      LayerActivations(r, none, BlockKind::kDenseMlp).count() - LayerActivations(r, l, BlockKind::kDenseMlp).count();
  EXPECT_EQ(m.activations_transient.count(), mlp_rerun);
}

TEST(RecomputeModules, TheRerunIsPricedAsTheForwardItRepeats) {
  std::vector<std::string> sets = kLlamaTp4;
  sets.push_back("training.recompute_modules=[core_attn, mlp]");
  const Recipe r = RecipeOf("llama3-8b-h200", sets);
  const Inventory inv = BuildInventory(r);
  const PlanTables tables = BuildPlanTables(inv);
  const ComputeTimes t = LayerComputeTimes(inv, tables, LayoutOf(r), CostModel{});
  const LayerSeconds& d = t.family[static_cast<size_t>(FamilyIndex(BlockKind::kDenseMlp))];
  EXPECT_GT(d.forward.gemm, 0.0);
  EXPECT_DOUBLE_EQ(d.recompute.gemm, d.forward.gemm);
  EXPECT_DOUBLE_EQ(d.recompute.elementwise, d.forward.elementwise);
  const LayerSeconds& a = t.family[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))];
  EXPECT_DOUBLE_EQ(a.recompute.attention, a.forward.attention);
  EXPECT_EQ(a.recompute.gemm, 0.0);
}

TEST(RecomputeModules, SharedExpertAndUpProjectionRerunTheirOwnGemms) {
  std::vector<std::string> sets = kDeepSeek;
  sets.push_back("training.recompute=selective");
  sets.push_back("training.recompute_modules=[shared_experts, mla_up_proj]");
  const Recipe r = RecipeOf("deepseek-v3-h200", sets);
  const Inventory inv = BuildInventory(r);
  const PlanTables tables = BuildPlanTables(inv);
  const Layout l = LayoutOf(r);
  const ComputeTimes t = LayerComputeTimes(inv, tables, l, CostModel{});
  const GpuSpec& gpu = r.cluster.spec;
  // Shared expert, 4096 tokens: gate_up [7168 -> 2 x 2048] column-split by
  // tp 2, down [2048 -> 7168] row-split.
  const double shared = GemmSeconds(4096, 2.0 * 2048 / 2, 7168, gpu, CostModel{}, GemmPrecision::kBf16) +
                        GemmSeconds(4096, 7168, 2048.0 / 2, gpu, CostModel{}, GemmPrecision::kBf16);
  EXPECT_NEAR(t.family[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))].recompute.gemm, shared, 1e-12 * shared);
  // MLA up-projections: q_b [1536 -> 128 x 192], kv_b [512 -> 128 x 256], column-split.
  const double up = GemmSeconds(4096, 128.0 * 192 / 2, 1536, gpu, CostModel{}, GemmPrecision::kBf16) +
                    GemmSeconds(4096, 128.0 * 256 / 2, 512, gpu, CostModel{}, GemmPrecision::kBf16);
  EXPECT_NEAR(t.family[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))].recompute.gemm, up, 1e-12 * up);
}

int64_t BackwardDispatchCalls(const std::string& modules) {
  std::vector<std::string> sets = kDeepSeek;
  sets.push_back("training.recompute=selective");
  sets.push_back("training.recompute_modules=" + modules);
  const Recipe r = RecipeOf("deepseek-v3-h200", sets);
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, LayoutOf(r));
  EXPECT_TRUE(planned.plan.has_value());
  for (const CommItem& i : planned.plan->comm.front().items) {
    if (i.axis == Axis::kEp && i.what == CommWhat::kMoeDispatch && i.pass == Pass::kBackward) return i.calls;
  }
  return 0;
}

TEST(RecomputeModules, ARerunMoeLayerDispatchesItsTokensAgain) {
  const int64_t base = BackwardDispatchCalls("[core_attn]");
  ASSERT_GT(base, 0);
  EXPECT_EQ(BackwardDispatchCalls("[core_attn, moe]"), 2 * base);
  EXPECT_EQ(BackwardDispatchCalls("[core_attn, moe_act]"), base);
}

TEST(RecomputeModules, ChecksFollowMegatron) {
  EXPECT_NE(
      testing::FirstErrorText(Load("llama3-8b-h200", {"training.recompute=full", "training.recompute_modules=[mlp]"}))
          .find("applies only under training.recompute: selective"),
      std::string::npos);
  EXPECT_NE(
      testing::FirstErrorText(Load("llama3-8b-h200", {"training.recompute_modules=[mla_up_proj]"})).find("needs MLA"),
      std::string::npos);
  EXPECT_NE(testing::FirstErrorText(
                Load("mixtral-8x7b-h200", {"model.moe.grouped_gemm=false", "training.recompute_modules=[moe_act]"}))
                .find("model.moe.grouped_gemm"),
            std::string::npos);
  const std::string typo = testing::FirstErrorText(Load("llama3-8b-h200", {"training.recompute_modules=[core_atn]"}));
  EXPECT_NE(typo.find("training.recompute_modules[0]"), std::string::npos) << typo;
  EXPECT_NE(typo.find("did you mean 'core_attn'"), std::string::npos) << typo;
  EXPECT_NE(
      testing::FirstErrorText(Load("llama3-8b-h200", {"training.recompute_modules=[mlp, mlp]"})).find("listed twice"),
      std::string::npos);
  EXPECT_NE(
      testing::FirstErrorText(Load("llama3-8b-h200", {"training.recompute_modules=mlp"})).find("must be a list of"),
      std::string::npos);
  // A module the model has no layer for: a warning, as Megatron runs it as a no-op.
  const LoadResult no_moe = Load("llama3-8b-h200", {"training.recompute_modules=[core_attn, moe]"});
  ASSERT_TRUE(no_moe.ok());
  bool warned = false;
  for (const Diagnostic& d : no_moe.diagnostics)
    warned = warned || Format(d).find("has no effect") != std::string::npos;
  EXPECT_TRUE(warned);
}

MegatronImport Imported(const std::string& text) { return ImportMegatronArgs(text, "args.txt"); }

std::string RecipeLine(const MegatronImport& in, const std::string& key) {
  for (const YamlEntry& e : in.layout) {
    if (e.key_path == key) return e.value;
  }
  return "";
}

TEST(RecomputeModules, ImportReadsBothListFormsAndRefusesUnknownModules) {
  const std::string head =
      "pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
      "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1000 ";
  EXPECT_EQ(RecipeLine(Imported(head + "--recompute-granularity selective --recompute-modules core_attn mlp"),
                       "training.recompute_modules"),
            "[core_attn, mlp]");
  const MegatronImport none = Imported(head + "--recompute-granularity full --recompute-modules mlp");
  EXPECT_EQ(RecipeLine(none, "training.recompute_modules"), "");
  const MegatronImport bad = Imported(head + "--recompute-granularity selective --recompute-modules attn");
  bool failed = false;
  for (const Diagnostic& d : bad.diagnostics) {
    failed = failed || (d.severity == Severity::kError &&
                        d.message.find("not a Megatron-LM recompute module") != std::string::npos);
  }
  EXPECT_TRUE(failed);
}

TEST(RecomputeModules, TheEmittedArgumentsListTheModules) {
  std::vector<std::string> sets = {"training.recompute=selective", "training.recompute_modules=[core_attn, mlp]"};
  const Recipe r = RecipeOf("llama3-8b-h200", sets);
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, LayoutOf(r));
  ASSERT_TRUE(planned.plan.has_value());
  const Emission e = EmitMegatron(r, *planned.plan);
  EXPECT_NE(e.text.find("--recompute-modules core_attn mlp"), std::string::npos) << e.text;
}

}  // namespace
}  // namespace preflight::recompute_modules_test

// Loading valid recipes: the default recipe's values, layer expansion,
// --set overrides, presets and warnings. Expected values are counted by hand
// from the YAML in each test (and from docs/formulas.md §2.4 for the presets).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::recipe_load_test {
namespace {

std::string Letters(const std::vector<BlockKind>& layers) {
  std::string out;
  for (BlockKind k : layers) out += Letter(k);
  return out;
}

std::string AllDiagnostics(const LoadResult& r) {
  std::string out;
  for (const Diagnostic& d : r.diagnostics) out += Format(d) + "\n";
  return out;
}

Recipe MustLoad(const std::string& yaml, const std::vector<Override>& overrides = {}) {
  const LoadResult r = LoadRecipeFromString(yaml, "test.yaml", overrides);
  EXPECT_TRUE(r.ok()) << AllDiagnostics(r);
  return r.ok() ? *r.recipe : Recipe{};
}

TEST(DefaultRecipe, LoadsWithTheDocumentedValues) {
  const LoadResult r = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"));
  ASSERT_TRUE(r.ok()) << AllDiagnostics(r);
  EXPECT_TRUE(r.diagnostics.empty()) << AllDiagnostics(r);
  const Recipe& recipe = *r.recipe;
  EXPECT_EQ(recipe.name, "nam56r-h200");
  // "AEMEAEMEAEMR" x 4 = 48 layers; a period has 3 A, 5 E, 3 M, 1 R.
  ASSERT_EQ(recipe.model.layers.size(), 48u);
  EXPECT_EQ(Letters(recipe.model.layers).substr(0, 12), "AEMEAEMEAEMR");
  const auto count = [&](BlockKind k) { return std::count(recipe.model.layers.begin(), recipe.model.layers.end(), k); };
  EXPECT_EQ(count(BlockKind::kAttention), 3 * 4);
  EXPECT_EQ(count(BlockKind::kMoe), 5 * 4);
  EXPECT_EQ(count(BlockKind::kMamba), 3 * 4);
  EXPECT_EQ(count(BlockKind::kRecurrent), 4);
  EXPECT_EQ(count(BlockKind::kDenseMlp), 0);
  // 8 nodes x 8 GPUs; dp = 64 / (tp 4 x cp 1 x pp 4) = 4; expert dp = 4 x 1 x 4 / (ep 8) = 2;
  // micro-batches = 512 / (1 x 4) = 128.
  EXPECT_EQ(recipe.world(), 64);
  EXPECT_EQ(recipe.dp(), 4);
  EXPECT_EQ(recipe.expert_dp(), 2);
  EXPECT_EQ(recipe.micro_batches(), 128);
  EXPECT_EQ(recipe.model.attention.heads, 32);
  EXPECT_EQ(recipe.model.attention.kv_heads, 8);
  EXPECT_EQ(recipe.model.moe.shared_experts, 1);
  EXPECT_DOUBLE_EQ(recipe.model.moe.capacity_factor, 1.25);
  EXPECT_EQ(recipe.model.mamba.groups, 8);
  EXPECT_EQ(recipe.model.recurrent.heads, 32);
  EXPECT_EQ(recipe.training.recompute, Recompute::kSelective);
  EXPECT_EQ(recipe.training.optimizer.matrices, OptimizerKind::kMuon);
  EXPECT_EQ(recipe.parallel.schedule, Schedule::k1F1B);
  EXPECT_FALSE(recipe.model.mla.has_value());
  EXPECT_FALSE(recipe.serving.has_value());
  // H200 as nvidia-smi reports it (docs/formulas.md §2.4).
  EXPECT_EQ(recipe.cluster.spec.name, "h200");
  EXPECT_EQ(recipe.cluster.spec.capacity_mib, 143771);
  EXPECT_DOUBLE_EQ(recipe.cluster.reserve_gib, 3.0);
  // The source map points at the values: `parallel: {tp: 4, ...}` is line 31, tp's value column 16.
  EXPECT_EQ(recipe.source.Find("parallel.tp").line, 31);
  EXPECT_EQ(recipe.source.Find("parallel.tp").column, 16);
}

TEST(Files, MissingFileAndDirectory) {
  const LoadResult missing = LoadRecipeFile(testing::SourcePath("recipes/no-such-recipe.yaml"));
  ASSERT_FALSE(missing.ok());
  ASSERT_EQ(missing.diagnostics.size(), 1u);
  EXPECT_EQ(missing.diagnostics[0].message, "cannot open the recipe: no such file");
  const LoadResult directory = LoadRecipeFile(testing::SourcePath("recipes"));
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.diagnostics[0].message, "cannot read the recipe: not a regular file");
}

TEST(Files, CrLfLineEndings) {
  const LoadResult r = LoadRecipeFromString("name: x\r\nparallel:\r\n  tp: zz\r\n", "crlf.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(Format(r.diagnostics[0]),
            "crlf.yaml:3:7: parallel.tp = zz: must be an integer in [1, 16777216]\n"
            "      tp: zz\n"
            "          ^");
}

TEST(Files, AnchorsAndAliasesAreFine) {
  const Recipe r = MustLoad("parallel: {tp: &degree 2, pp: *degree}\n");
  EXPECT_EQ(r.parallel.tp, 2);
  EXPECT_EQ(r.parallel.pp, 2);
}

TEST(Presets, H200AndH100) {
  const auto h200 = GpuPreset("h200");
  ASSERT_TRUE(h200.has_value());
  EXPECT_EQ(h200->capacity_mib, 143771);  // nvidia-smi
  EXPECT_DOUBLE_EQ(h200->bf16_dense_tflops, 989.0);
  EXPECT_DOUBLE_EQ(h200->nvlink_gbps_per_dir, 450.0);  // docs/formulas.md §7.1
  EXPECT_DOUBLE_EQ(h200->ib_gbps_per_dir, 50.0);
  const auto h100 = GpuPreset("h100");
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(h100->capacity_mib, 81559);
  EXPECT_FALSE(GpuPreset("v100").has_value());
  EXPECT_EQ(GpuPresetNames(), (std::vector<std::string>{"h200", "h100", "h100-nvl", "a100", "b200", "gb200"}));
}

// Each preset against its datasheet, re-derived here: dense = the sparse
// figure / 2, links = lanes x rate, MiB from decimal GB where no nvidia-smi
// figure exists.
TEST(Presets, DerivedFromTheirDatasheets) {
  const auto get = [](const char* name) { return *GpuPreset(name); };
  // H200 and H100 SXM: the same Hopper die, more and faster HBM on H200.
  EXPECT_DOUBLE_EQ(get("h200").bf16_dense_tflops, get("h100").bf16_dense_tflops);
  EXPECT_DOUBLE_EQ(get("h100").fp8_dense_tflops, 3958.0 / 2);  // "3,958 TFLOPS*" with sparsity
  EXPECT_DOUBLE_EQ(get("h100").hbm_gbps, 3350.0);
  EXPECT_DOUBLE_EQ(get("h200").hbm_gbps, 4800.0);
  EXPECT_DOUBLE_EQ(get("h100").fp4_dense_tflops, 0.0);
  // H100 NVL: 1,671 / 3,341 TFLOPS sparse bf16 / fp8; 94 GB; a bridged pair.
  EXPECT_DOUBLE_EQ(get("h100-nvl").bf16_dense_tflops, std::floor(1671.0 / 2));
  EXPECT_EQ(get("h100-nvl").capacity_mib, static_cast<int64_t>(94e9 / (1 << 20)));
  EXPECT_EQ(get("h100-nvl").nvlink_domain, 2);
  // A100 SXM: 624 sparse bf16, no fp8; NVLink3 12 links x 25 GB/s a direction;
  // PCIe Gen4 x16: 16 GT/s x 16 lanes x 128/130 / 8 bits.
  EXPECT_DOUBLE_EQ(get("a100").bf16_dense_tflops, 624.0 / 2);
  EXPECT_DOUBLE_EQ(get("a100").fp8_dense_tflops, 0.0);
  EXPECT_DOUBLE_EQ(get("a100").nvlink_gbps_per_dir, 12 * 25.0);
  EXPECT_NEAR(get("a100").host_link_gbps_per_dir, 16.0 * 16 * 128 / 130 / 8, 0.1);
  // B200 / GB200: NVLink5 18 links x 50 GB/s; 4.5 / 9 PF sparse bf16 (B200),
  // 5 PF (GB200); fp4 4x bf16; one NVLink domain of 72 on NVL72.
  for (const char* b : {"b200", "gb200"}) {
    EXPECT_DOUBLE_EQ(get(b).nvlink_gbps_per_dir, 18 * 50.0) << b;
    EXPECT_DOUBLE_EQ(get(b).fp4_dense_tflops, 4 * get(b).bf16_dense_tflops) << b;
    EXPECT_DOUBLE_EQ(get(b).fp8_dense_tflops, 2 * get(b).bf16_dense_tflops) << b;
  }
  EXPECT_DOUBLE_EQ(get("b200").bf16_dense_tflops, 4500.0 / 2);
  EXPECT_DOUBLE_EQ(get("gb200").bf16_dense_tflops, 5000.0 / 2);
  EXPECT_EQ(get("gb200").nvlink_domain, 72);
  EXPECT_EQ(get("gb200").capacity_mib, static_cast<int64_t>(186e9 / (1 << 20)));
  // 7680-bit bus x 3996 MHz x 2 (DDR) / 8 bits.
  EXPECT_NEAR(get("b200").hbm_gbps, 7680.0 * 3996e6 * 2 / 8 / 1e9, 1.0);
  // Every preset can price a step: peaks, HBM, links and kernel rates present.
  for (const std::string& name : GpuPresetNames()) {
    const GpuSpec g = get(name.c_str());
    EXPECT_GT(g.hbm_gbps, 0) << name;
    EXPECT_GT(g.rates.gemm, 0) << name;
    EXPECT_GT(g.rates.hbm, 0) << name;
    EXPECT_GT(g.rates.attention_fused, 0) << name;
    EXPECT_EQ(g.fp8_dense_tflops > 0, g.rates.gemm_fp8 > 0) << name;
  }
}

TEST(Presets, CapacityOverride) {
  const Recipe r = MustLoad("cluster: {gpu: h100, capacity_mib: 80000}\n");
  EXPECT_EQ(r.cluster.spec.name, "h100");
  EXPECT_EQ(r.cluster.spec.capacity_mib, 80000);
  EXPECT_EQ(MustLoad("cluster: {gpu: h100}\n").cluster.spec.capacity_mib, 81559);
}

TEST(Names, EnumNamesMatchYaml) {
  EXPECT_STREQ(Name(DType::kBf16), "bf16");
  EXPECT_STREQ(Name(DType::kFp8), "fp8");
  EXPECT_STREQ(Name(Recompute::kFull), "full");
  EXPECT_STREQ(Name(OptimizerKind::kMuon), "muon");
  EXPECT_STREQ(Name(Schedule::kDualPipeV), "dualpipev");
  EXPECT_STREQ(Name(Schedule::k1F1B), "1f1b");
  EXPECT_STREQ(Name(CpRecurrent::kAllToAll), "all_to_all");
  EXPECT_STREQ(Name(CpRecurrent::kHandoff), "handoff");
}

TEST(Defaults, MinimalRecipeTakesHeaderDefaults) {
  const Recipe r = MustLoad("name: minimal\n");
  EXPECT_EQ(Letters(r.model.layers), "AEMEAEMEAEMRAEMEAEMEAEMRAEMEAEMEAEMRAEMEAEMEAEMR");
  EXPECT_EQ(r.world(), 64);
  EXPECT_EQ(r.dp(), 64);
  EXPECT_EQ(r.micro_batches(), 8);  // 512 / 64
  EXPECT_EQ(r.training.precision.master, DType::kFp32);
}

TEST(Defaults, SectionWithoutValueMeansDefaults) {
  const Recipe r = MustLoad("serving:\nmodel:\n");
  ASSERT_TRUE(r.serving.has_value());
  EXPECT_EQ(r.serving->context, 32768);
  EXPECT_EQ(r.model.layers.size(), 48u);
}

TEST(Enums, AllSpellings) {
  const Recipe r = MustLoad(
      "model: {norm: layernorm, mlp: {activation: gelu}, moe: {router: sigmoid}}\n"
      "training:\n"
      "  recompute: full\n"
      "  precision: {params: fp8, grads: bf16, master: none, activations: fp16}\n"
      "  optimizer: {matrices: adamw, muon_momentum: bf16, mamba_in_proj: muon, router: muon}\n"
      "parallel: {order: tp-cp-pp-dp, cp_comm: a2a, cp_recurrent: handoff, cp_load_balance: false}\n"
      "serving: {kv_dtype: fp8, ssm_dtype: bf16}\n");
  EXPECT_EQ(r.model.norm, NormKind::kLayerNorm);
  EXPECT_EQ(r.model.mlp.activation, FfnActivation::kGelu);
  EXPECT_EQ(r.model.moe.router, RouterScore::kSigmoid);
  EXPECT_EQ(r.training.recompute, Recompute::kFull);
  EXPECT_EQ(r.training.precision.params, DType::kFp8);
  EXPECT_EQ(r.training.precision.grads, DType::kBf16);
  EXPECT_FALSE(r.training.precision.master.has_value());
  EXPECT_EQ(r.training.precision.activations, DType::kFp16);
  EXPECT_EQ(r.training.optimizer.matrices, OptimizerKind::kAdamW);
  EXPECT_EQ(r.training.optimizer.muon_momentum, DType::kBf16);
  EXPECT_EQ(r.training.optimizer.mamba_in_proj, OptimizerKind::kMuon);
  EXPECT_EQ(r.parallel.order, AxisOrder::kTpCpPpDp);
  EXPECT_EQ(r.parallel.cp_comm, CpComm::kA2a);
  EXPECT_EQ(r.parallel.cp_recurrent, CpRecurrent::kHandoff);
  EXPECT_FALSE(r.parallel.cp_load_balance);
  ASSERT_TRUE(r.serving.has_value());
  EXPECT_EQ(r.serving->kv_dtype, DType::kFp8);
  EXPECT_EQ(r.serving->batch, 64);  // default
}

// ---- context parallelism ---------------------------------------------------

TEST(ContextParallel, DefaultsAreMegatrons) {
  const Recipe r = MustLoad("name: x\n");
  EXPECT_EQ(r.parallel.cp_comm, CpComm::kP2p);
  EXPECT_EQ(r.parallel.cp_recurrent, CpRecurrent::kAllToAll);
  EXPECT_TRUE(r.parallel.cp_load_balance);
}

// cp 3 on 48 GPUs, seq_len 8196 = 6 x 1366: the default model's 128 Mamba
// heads and 32 R gate blocks do not split over 3, so all-to-all CP is
// invalid; the hand-off keeps whole heads on every rank and only needs the
// conv tail (3 positions) inside a chunk (1366 positions).
TEST(ContextParallel, HandoffLiftsTheHeadRules) {
  const std::string base = "training: {seq_len: 8196}\ncluster: {nodes: 6}\nparallel: {cp: 3";
  const Recipe r = MustLoad(base + ", cp_recurrent: handoff}\n");
  EXPECT_EQ(r.parallel.cp_recurrent, CpRecurrent::kHandoff);
  const LoadResult bad = LoadRecipeFromString(base + "}\n", "x.yaml");
  ASSERT_FALSE(bad.ok());
  int cp_errors = 0;
  for (const Diagnostic& d : bad.diagnostics) cp_errors += d.key_path == "parallel.cp" ? 1 : 0;
  EXPECT_EQ(cp_errors, 2) << AllDiagnostics(bad);  // Mamba and R
}

// Without load balancing the sequence is cut into cp chunks: 8190 = 2 x 4095
// is fine for cp 2, though not a multiple of 2 x cp.
TEST(ContextParallel, UnbalancedNeedsOnlyCpChunks) {
  const Recipe r = MustLoad("training: {seq_len: 8190}\nparallel: {cp: 2, cp_load_balance: false}\n");
  EXPECT_FALSE(r.parallel.cp_load_balance);
}

// ---- layer expansion -------------------------------------------------------

TEST(Layers, PatternTimesRepeat) {
  EXPECT_EQ(Letters(MustLoad("model: {pattern: AMR, repeat: 3}\n").model.layers), "AMRAMRAMR");
}

TEST(Layers, ExplicitListOfLetters) {
  const Recipe r = MustLoad("model:\n  layers: [A, M, M, R, D]\n");
  EXPECT_EQ(Letters(r.model.layers), "AMMRD");
  EXPECT_EQ(r.model.pattern, "AMMRD");
  EXPECT_EQ(r.model.repeat, 1);
}

TEST(Layers, ExplicitString) {
  EXPECT_EQ(Letters(MustLoad("model: {layers: AMAMD}\n").model.layers), "AMAMD");
}

TEST(Layers, FirstKDenseTurnsLeadingMoeSlotsDense) {
  // DeepSeek-V3 style: E slots 0..2 become D, the rest stay MoE.
  const Recipe r = MustLoad("model:\n  pattern: AE\n  repeat: 5\n  moe: {first_k_dense: 3}\n");
  EXPECT_EQ(Letters(r.model.layers), "ADADADAEAE");
}

TEST(Layers, LayerFreqAndOffset) {
  // Slots j = 0..5; MoE iff j % 2 == 1.
  const Recipe r = MustLoad("model:\n  pattern: AE\n  repeat: 6\n  moe: {layer_freq: 2, layer_offset: 1}\n");
  EXPECT_EQ(Letters(r.model.layers), "ADAEADAEADAE");
}

TEST(Layers, FirstKDenseWithFreq) {
  // Slots 0, 1 dense; then (j - 2) % 3 == 0 -> slots 2 and 5 MoE, 3, 4, 6 dense.
  const Recipe r = MustLoad("model:\n  pattern: E\n  repeat: 7\n  moe: {first_k_dense: 2, layer_freq: 3}\n");
  EXPECT_EQ(Letters(r.model.layers), "DDEDDED");
}

TEST(Layers, MoeLayoutAppliesToExplicitList) {
  const Recipe r = MustLoad("model:\n  layers: [E, M, E, M]\n  moe: {first_k_dense: 1}\n");
  EXPECT_EQ(Letters(r.model.layers), "DMEM");
}

TEST(Layers, MlaMakesALayersMla) {
  const Recipe r = MustLoad("model:\n  mla: {heads: 16, q_lora_rank: 0}\n");
  ASSERT_TRUE(r.model.mla.has_value());
  EXPECT_EQ(r.model.mla->heads, 16);
  EXPECT_EQ(r.model.mla->q_lora_rank, 0);
  EXPECT_EQ(r.model.mla->kv_lora_rank, 512);  // default
}

// ---- schedules -------------------------------------------------------------

TEST(Schedule, OneFOneBWithVppIsInterleaved) {
  // The default hybrid pattern: Megatron needs '|' cuts for vpp, so the balanced cut.
  const Recipe r = MustLoad("parallel: {pp: 4, vpp: 2, schedule: 1f1b, partition: balanced}\n");
  EXPECT_EQ(r.parallel.schedule, Schedule::kInterleaved);
}

TEST(Schedule, DualPipeValid) {
  // pp 4 -> dp 16, m = 512 / 16 = 32: even and >= 2 x pp.
  // Neither framework runs DualPipe: the balanced cut.
  const Recipe r = MustLoad("parallel: {pp: 4, schedule: dualpipe, partition: balanced}\n");
  EXPECT_EQ(r.parallel.schedule, Schedule::kDualPipe);
}

TEST(Schedule, StageBoundaries) {
  const Recipe r = MustLoad("parallel: {pp: 4, stage_boundaries: [10, 22, 35]}\n");
  EXPECT_EQ(r.parallel.stage_boundaries, (std::vector<int64_t>{10, 22, 35}));
}

TEST(Schedule, DualPipeVAllowsOddPp) {
  // DualPipeV asserts only m >= 2 pp: pp 3 on 48 GPUs -> dp 16, m = 512 / 16 = 32 >= 6.
  const Recipe r = MustLoad("parallel: {pp: 3, schedule: dualpipev, partition: torchtitan}\ncluster: {nodes: 6}\n");
  EXPECT_EQ(r.parallel.schedule, Schedule::kDualPipeV);
  EXPECT_EQ(r.micro_batches(), 32);
}

// ---- warnings ----------------------------------------------------------------

TEST(Warnings, SpWithoutTpWarnsButLoads) {
  const LoadResult r = LoadRecipeFromString("parallel: {tp: 1, sp: true}\n", "w.yaml");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u) << AllDiagnostics(r);
  EXPECT_EQ(r.diagnostics[0].severity, Severity::kWarning);
  EXPECT_EQ(Format(r.diagnostics[0]),
            "w.yaml:1:23: warning: parallel.sp = true: has no effect with parallel.tp = 1 (sequence parallelism "
            "splits over TP)\n"
            "    parallel: {tp: 1, sp: true}\n"
            "                          ^");
}

TEST(Warnings, OneFOneBNeverFills) {
  // pp 8 -> dp 8; global batch 32 -> m = 4 < 8.
  const LoadResult r = LoadRecipeFromString("training: {global_batch: 32}\nparallel: {pp: 8}\n", "w.yaml");
  ASSERT_TRUE(r.ok()) << AllDiagnostics(r);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].key_path, "training.global_batch");
  EXPECT_NE(r.diagnostics[0].message.find("fewer than pp = 8: the 1F1B pipeline never fills"), std::string::npos);
}

TEST(Warnings, ExpertParallelismWithoutMoe) {
  const LoadResult r = LoadRecipeFromString("model: {pattern: AM}\nparallel: {ep: 2}\n", "w.yaml");
  ASSERT_TRUE(r.ok()) << AllDiagnostics(r);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(Format(r.diagnostics[0]),
            "w.yaml:2:16: warning: parallel.ep = 2: has no effect: the layer list has no MoE (E) layers\n"
            "    parallel: {ep: 2}\n"
            "                   ^");
}

// ---- overrides ---------------------------------------------------------------

TEST(Overrides, ParseOverride) {
  const auto o = ParseOverride("parallel.tp=8");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->key_path, "parallel.tp");
  EXPECT_EQ(o->value, "8");
  const auto flow = ParseOverride(" model.attention = {heads: 8, kv_heads: 8}");
  ASSERT_TRUE(flow.has_value());
  EXPECT_EQ(flow->key_path, "model.attention");
  EXPECT_EQ(flow->value, " {heads: 8, kv_heads: 8}");
  EXPECT_FALSE(ParseOverride("parallel.tp").has_value());
  EXPECT_FALSE(ParseOverride("=8").has_value());
  EXPECT_FALSE(ParseOverride("parallel..tp=8").has_value());
}

TEST(Overrides, SetExistingKey) {
  const std::string yaml = "parallel: {tp: 4, pp: 4, ep: 8}\n";
  const Recipe r = MustLoad(yaml, {{"parallel.tp", "8"}, {"model.pattern", "AEM"}});
  EXPECT_EQ(r.parallel.tp, 8);
  EXPECT_EQ(r.parallel.pp, 4);  // untouched
  EXPECT_EQ(Letters(r.model.layers), "AEMAEMAEMAEM");  // default repeat 4
}

TEST(Overrides, CreateNewSection) {
  const Recipe r = MustLoad("name: x\n", {{"serving.batch", "8"}});
  ASSERT_TRUE(r.serving.has_value());
  EXPECT_EQ(r.serving->batch, 8);
  EXPECT_EQ(r.serving->context, 32768);  // default
}

TEST(Overrides, LaterOverrideWins) {
  EXPECT_EQ(MustLoad("name: x\n", {{"parallel.pp", "2"}, {"parallel.pp", "4"}}).parallel.pp, 4);
}

TEST(Overrides, UnknownKeyNamesTheOverride) {
  const LoadResult r = LoadRecipeFromString("name: x\n", "r.yaml", {{"parallel.tpp", "8"}});
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(Format(r.diagnostics[0]), "--set parallel.tpp=8: parallel.tpp: unknown key; did you mean 'tp'?");
}

TEST(Overrides, BadValueNamesTheOverride) {
  const LoadResult r = LoadRecipeFromString("parallel:\n  tp: 4\n", "r.yaml", {{"parallel.tp", "6"}});
  ASSERT_FALSE(r.ok());
  std::string all = AllDiagnostics(r);
  EXPECT_NE(all.find("--set parallel.tp=6: parallel.tp = 6: tp x cp x pp = 6 x 1 x 1 must divide the world size 64"),
            std::string::npos)
      << all;
  for (const Diagnostic& d : r.diagnostics) {
    if (d.key_path != "parallel.tp") continue;  // seq_len's own diagnostic names the file
    EXPECT_EQ(d.file, "--set parallel.tp=6");
    EXPECT_EQ(d.mark.line, 0);
  }
}

TEST(Overrides, TypeErrorInOverride) {
  const LoadResult r = LoadRecipeFromString("name: x\n", "r.yaml", {{"model.hidden", "big"}});
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(Format(r.diagnostics[0]),
            "--set model.hidden=big: model.hidden = big: must be an integer in [1, 16777216]");
}

TEST(Overrides, CannotDescendIntoAScalar) {
  const LoadResult r = LoadRecipeFromString("name: x\n", "r.yaml", {{"name.first", "y"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(AllDiagnostics(r).find("cannot set a key under 'name': it is a scalar, not a map"), std::string::npos);
}

TEST(Overrides, InvalidYamlValue) {
  const LoadResult r = LoadRecipeFromString("name: x\n", "r.yaml", {{"parallel", "{tp: 2"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(AllDiagnostics(r).find("--set parallel={tp: 2: parallel = {tp: 2: the value is not valid YAML"),
            std::string::npos)
      << AllDiagnostics(r);
}

TEST(Overrides, ConflictNamesTheOverride) {
  const LoadResult r = LoadRecipeFromString("model:\n  layers: [A, M]\n", "r.yaml", {{"model.pattern", "AM"}});
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].message,
            "mutually exclusive with model.pattern (--set model.pattern=AM); give either an explicit layer list or "
            "pattern and repeat");
  EXPECT_EQ(r.diagnostics[0].mark.line, 2);
}

TEST(Overrides, DiagnosticsInCommandLineOrderAfterTheFile) {
  const LoadResult r = LoadRecipeFromString("model: {hidden: -1}\n", "r.yaml",
                                            {{"parallel.zz", "1"}, {"training.aa", "1"}});
  std::vector<std::string> files;
  for (const Diagnostic& d : r.diagnostics) files.push_back(d.file);
  EXPECT_EQ(files, (std::vector<std::string>{"r.yaml", "--set parallel.zz=1", "--set training.aa=1"}));
}

TEST(SourceMapAt, LocatesLaterDiagnostics) {
  // A check outside the parser (e.g. the planner) reports through the source map.
  const Recipe r = MustLoad("name: x\nparallel:\n  tp: 2\n", {{"parallel.pp", "2"}});
  EXPECT_EQ(Format(r.source.At("parallel.tp", "2", "spans two nodes", Severity::kWarning)),
            "test.yaml:3:7: warning: parallel.tp = 2: spans two nodes\n"
            "      tp: 2\n"
            "          ^");
  EXPECT_EQ(Format(r.source.At("parallel.pp", "2", "too deep")), "--set parallel.pp=2: parallel.pp = 2: too deep");
}

// ---- ValidateRecipe: re-checking a recipe changed in code (sweeps) ----------

TEST(ValidateRecipe, UnchangedRecipeIsClean) {
  const Recipe r = MustLoad("parallel:\n  tp: 4\n");
  EXPECT_TRUE(ValidateRecipe(r).empty());
}

TEST(ValidateRecipe, ChangedDegreeIsLocatedInTheFile) {
  Recipe r = MustLoad("cluster: {nodes: 6}\ntraining: {seq_len: 8196, global_batch: 480}\nparallel:\n  tp: 4\n");
  r.parallel.tp = 6;  // 48 GPUs, 8196 = 6 x 1366: only the head rules break
  const std::vector<Diagnostic> ds = ValidateRecipe(r);
  ASSERT_TRUE(HasErrors(ds));
  EXPECT_EQ(Format(ds[0]),
            "test.yaml:4:7: parallel.tp = 6: must divide model.attention.heads (32) and kv_heads (8); try 4 or 8\n"
            "      tp: 4\n"
            "          ^");
}

TEST(ValidateRecipe, ZeroDegreeIsARangeErrorNotADivisionByZero) {
  Recipe r = MustLoad("name: x\n");
  r.parallel.pp = 0;
  r.cluster.nodes = int64_t{1} << 40;
  const std::vector<Diagnostic> ds = ValidateRecipe(r);
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].key_path, "parallel.pp");
  EXPECT_EQ(ds[0].message, "out of range; valid range is [1, 16777216]");
  EXPECT_EQ(ds[1].key_path, "cluster.nodes");
}

TEST(ValidateRecipe, EmptyLayerList) {
  Recipe r = MustLoad("name: x\n");
  r.model.layers.clear();
  const std::vector<Diagnostic> ds = ValidateRecipe(r);
  ASSERT_TRUE(HasErrors(ds));
  EXPECT_EQ(ds[0].key_path, "model.layers");
}

TEST(SourceMapFind, FallsBackToParent) {
  SourceMap map;
  map.marks["parallel"] = {3, 11};
  map.marks["parallel.tp"] = {3, 16};
  EXPECT_EQ(map.Find("parallel.tp").column, 16);
  EXPECT_EQ(map.Find("parallel.vpp").column, 11);
  EXPECT_EQ(map.Find("parallel.stage_boundaries[2]").column, 11);
  EXPECT_EQ(map.Find("model.hidden").line, 0);
}

}  // namespace
}  // namespace preflight::recipe_load_test

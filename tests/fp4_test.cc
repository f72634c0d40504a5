// FP4 GEMMs (training.precision.fp4: nvfp4 | mxfp4): storage bytes from the
// formats' definitions, the device refusal, memory and step time priced end
// to end on a GB200, and the Megatron-LM import / emit round trip.
//
// The formats, as the test derives its figures (not from the code under test):
// - E2M1 values are 4 bits: two to a byte.
// - NVFP4 (NVIDIA, Transformer Engine's NVFP4BlockScaling): one E4M3 scale
//   (1 byte) per 16 consecutive values, one fp32 scale (4 bytes) per tensor.
// - MXFP4 (OCP Microscaling v1.0): one E8M0 scale (1 byte) per 32 values.
// - Transformer Engine 01634950 (nvfp4_tensor.py get_scale_shape /
//   make_empty; mxfp8_tensor.py make_empty) stores a tensor of M rows and K
//   columns rowwise as [M, K/2] bytes with scales [round_up(M, 128),
//   round_up(K/block, 4)] and columnwise as the transpose (NVFP4, scales
//   [round_up(K, 128), round_up(M/16, 4)]) or in place (MX, scales
//   [round_up(M/32, 4), round_up(K, 128)]); NVFP4 keeps an fp32 amax per
//   usage. A GEMM weight keeps both usages between forward and backward.
// - Megatron-LM d98e8a6 transformer_config.py: --fp4-format e2m1,
//   --fp4-recipe {nvfp4, custom} (default nvfp4), --fp4-param-gather.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/geometry.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/inventory/fp4_storage.h"
#include "preflight/inventory/inventory.h"
#include "preflight/planner/compute.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::fp4_test {
namespace {

using testing::FirstErrorText;
using testing::SourcePath;

// ---- the format definitions, as above -------------------------------------

constexpr int64_t kE2m1Bits = 4;
constexpr int64_t kNvfp4Block = 16, kMxfp4Block = 32;
constexpr int64_t kScaleByte = 1;         // E4M3 or E8M0
constexpr int64_t kTensorScaleBytes = 4;  // NVFP4's fp32 per-tensor scale

int64_t Up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// ---- storage ----------------------------------------------------------------

// A 4096 x 4096 linear weight (out x in), worked by hand.
TEST(Fp4Storage, HandWorkedSquareWeight) {
  const int64_t n = 4096;
  const int64_t values = n * n * kE2m1Bits / 8;  // 8,388,608
  // NVFP4: 4096 rows of 4096/16 = 256 scales; 4096 and 256 are already
  // multiples of 128 and 4, so no padding; one fp32 amax.
  const int64_t nv_usage = values + n * (n / kNvfp4Block) * kScaleByte + kTensorScaleBytes;
  EXPECT_EQ(nv_usage, 9'437'188);
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kNvfp4, n, n).values, values);
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kNvfp4, n, n).total(), nv_usage);
  EXPECT_EQ(Fp4Columnwise(Fp4Format::kNvfp4, n, n).total(), nv_usage);  // the transposed copy
  EXPECT_EQ(Fp4WeightBytes(Fp4Format::kNvfp4, n, n), 2 * nv_usage);
  // MXFP4: 4096 / 32 = 128 scales a row, no tensor scale.
  const int64_t mx_usage = values + n * (n / kMxfp4Block) * kScaleByte;
  EXPECT_EQ(mx_usage, 8'912'896);
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kMxfp4, n, n).total(), mx_usage);
  EXPECT_EQ(Fp4Columnwise(Fp4Format::kMxfp4, n, n).total(), mx_usage);
  EXPECT_EQ(Fp4WeightBytes(Fp4Format::kMxfp4, n, n), 2 * mx_usage);
  // Against bf16's 2 B an element: 0.5625 and 0.53125 of a byte per copy.
  EXPECT_LT(Fp4WeightBytes(Fp4Format::kNvfp4, n, n), 2 * n * n);
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kNone, n, n).total(), 0);
}

// Shapes off the 128 x 4 scale tiles pay TE's padding.
TEST(Fp4Storage, ScalesPadTo128By4Tiles) {
  // NVFP4 [out 200, in 48]: rowwise scales [round_up(200, 128), round_up(48/16, 4)];
  // columnwise (the transpose [48, 200]) [round_up(48, 128), round_up(ceil(200/16), 4)].
  const int64_t values = 200 * 48 / 2;
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kNvfp4, 200, 48).scales, Up(200, 128) * Up(48 / kNvfp4Block, 4));
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kNvfp4, 200, 48).total(), values + 256 * 4 + 4);
  EXPECT_EQ(Fp4Columnwise(Fp4Format::kNvfp4, 200, 48).scales, Up(48, 128) * Up((200 + 15) / 16, 4));
  EXPECT_EQ(Fp4Columnwise(Fp4Format::kNvfp4, 200, 48).total(), values + 128 * 16 + 4);
  // MXFP4 [out 200, in 64]: rowwise [256, round_up(2, 4)]; columnwise
  // [round_up(ceil(200/32), 4), round_up(64, 128)] = [8, 128].
  EXPECT_EQ(Fp4Rowwise(Fp4Format::kMxfp4, 200, 64).total(), 200 * 32 + 256 * 4);
  EXPECT_EQ(Fp4Columnwise(Fp4Format::kMxfp4, 200, 64).total(), 200 * 32 + 8 * 128);
}

// A rank's copies follow the weight's split: TP columns or rows, and one
// weight per local routed expert, split over expert TP.
TEST(Fp4Storage, LocalCopiesFollowTheSplit) {
  Layout l;
  l.tp = 4;
  l.ep = 2;
  l.expert_tp = 2;
  ParamTensor column{"layers.0.mlp.gate_up_proj.weight", {4096, 28672}, Split::kTpColumn};
  column.linear = true;
  EXPECT_EQ(Fp4LocalWeightBytes(column, Fp4Format::kNvfp4, l), Fp4WeightBytes(Fp4Format::kNvfp4, 28672 / 4, 4096));
  ParamTensor row{"layers.0.mlp.down_proj.weight", {14336, 4096}, Split::kTpRow};
  row.linear = true;
  EXPECT_EQ(Fp4LocalWeightBytes(row, Fp4Format::kNvfp4, l), Fp4WeightBytes(Fp4Format::kNvfp4, 4096, 14336 / 4));
  ParamTensor fc1{"layers.1.mlp.experts.gate_up_proj", {8, 4096, 28672}, Split::kExpert};
  fc1.linear = true;
  EXPECT_EQ(Fp4LocalWeightBytes(fc1, Fp4Format::kMxfp4, l), 4 * Fp4WeightBytes(Fp4Format::kMxfp4, 14336, 4096));
  ParamTensor fc2{"layers.1.mlp.experts.down_proj", {8, 14336, 4096}, Split::kExpert};
  fc2.linear = true;
  EXPECT_EQ(Fp4LocalWeightBytes(fc2, Fp4Format::kMxfp4, l), 4 * Fp4WeightBytes(Fp4Format::kMxfp4, 4096, 7168));
  ParamTensor router{"layers.1.mlp.router.weight", {8, 4096}, Split::kReplicated};
  EXPECT_EQ(Fp4LocalWeightBytes(router, Fp4Format::kNvfp4, l), 0);  // not a TE linear
}

// The inventory marks the projections, not the embedding, head, router or norms.
TEST(Fp4Storage, InventoryMarksTheLinearWeights) {
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/mixtral-8x7b-h200.yaml"));
  ASSERT_TRUE(loaded.ok());
  const Inventory inv = BuildInventory(*loaded.recipe);
  std::vector<std::string> linear;
  for (const ParamTensor& t : inv.layers.at(0).params) {
    if (t.linear) linear.push_back(t.name);
  }
  for (const ParamTensor& t : inv.layers.at(1).params) {
    if (t.linear) linear.push_back(t.name);
  }
  EXPECT_EQ(linear, (std::vector<std::string>{"layers.0.mixer.qkv_proj.weight", "layers.0.mixer.o_proj.weight",
                                              "layers.1.mlp.experts.gate_up_proj", "layers.1.mlp.experts.down_proj"}));
  EXPECT_FALSE(inv.embedding.linear);
  for (const ParamTensor& t : inv.head) EXPECT_FALSE(t.linear);
}

// ---- the device refusal and the other exits ---------------------------------

constexpr const char* kOnH100 = R"(name: fp4
cluster:
  gpu: h100
training:
  precision:
    fp4: nvfp4
)";

TEST(Fp4Recipe, RefusedWithoutFp4TensorCores) {
  const LoadResult loaded = LoadRecipeFromString(kOnH100, "fp4.yaml");
  ASSERT_FALSE(loaded.ok());
  const std::string error = FirstErrorText(loaded);
  EXPECT_NE(error.find("fp4.yaml:6:"), std::string::npos) << error;  // the file and line of the key
  EXPECT_NE(error.find("training.precision.fp4 = nvfp4"), std::string::npos) << error;
  EXPECT_NE(error.find("h100 has none"), std::string::npos) << error;
  EXPECT_NE(error.find("b200, gb200"), std::string::npos) << error;  // the presets with FP4 tensor cores
  // The CLI exits 2 on it; h200 too, and a custom device without an fp4 rate.
  const testing::CommandResult cli =
      testing::RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "--set", "training.precision.fp4=mxfp4"});
  EXPECT_EQ(cli.exit_code, 2);
  EXPECT_NE(cli.err.find("h200 has none"), std::string::npos) << cli.err;
  EXPECT_FALSE(LoadRecipeFromString(kOnH100, "fp4.yaml", {*ParseOverride("cluster.gpu=h200")}).ok());
  EXPECT_TRUE(LoadRecipeFromString(kOnH100, "fp4.yaml", {*ParseOverride("cluster.gpu=b200")}).ok());
  EXPECT_TRUE(LoadRecipeFromString(kOnH100, "fp4.yaml", {*ParseOverride("cluster.gpu=gb200")}).ok());
  const std::string custom =
      "cluster:\n  device: {based_on: b200, fp4_dense_tflops: 0}\ntraining:\n  precision: "
      "{fp4: nvfp4}\n";
  const LoadResult none = LoadRecipeFromString(custom, "custom.yaml");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(FirstErrorText(none).find("the cluster.device has none"), std::string::npos) << FirstErrorText(none);
  // A device with an fp4 peak but no GEMM fraction cannot price the GEMMs.
  const std::string no_rate =
      "cluster:\n  device: {based_on: a100, fp4_dense_tflops: 1000}\ntraining:\n  precision: {fp4: mxfp4}\n";
  const LoadResult unrated = LoadRecipeFromString(no_rate, "custom.yaml");
  ASSERT_FALSE(unrated.ok());
  EXPECT_NE(FirstErrorText(unrated).find("cluster.device.rates.gemm_fp8"), std::string::npos)
      << FirstErrorText(unrated);
}

TEST(Fp4Recipe, OtherRefusals) {
  struct Case {
    std::vector<std::string> sets;
    std::string part;
  };
  const std::vector<Case> cases = {
      {{"training.precision.fp4_params=true"}, "training.precision.fp4_params = true: needs training.precision.fp4"},
      {{"training.precision.fp4=nvfp4", "training.precision.activations=fp8"}, "excludes fp8 GEMMs"},
      {{"training.precision.fp4=nvfp4", "training.precision.params=fp8"}, "excludes fp8 parameters"},
      {{"training.precision.fp4=nvfp4", "training.transformer_engine=false"}, "needs training.transformer_engine"},
      {{"training.precision.fp4=mxfp4", "parallel.zero=3"}, "not priced under ZeRO 3"},
      {{"training.precision.fp4=nvfp4", "training.activation_offload=[core_attn]"}, "activation_offload"},
      {{"training.precision.fp4=nvfp4fp"}, "must be one of: none, nvfp4, mxfp4; did you mean 'nvfp4'?"},
  };
  for (const Case& c : cases) {
    std::vector<Override> overrides = {*ParseOverride("cluster.gpu=gb200")};
    for (const std::string& s : c.sets) overrides.push_back(*ParseOverride(s));
    const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/llama3-8b-h200.yaml"), overrides);
    ASSERT_FALSE(loaded.ok()) << c.part;
    EXPECT_NE(FirstErrorText(loaded).find(c.part), std::string::npos) << c.part << ": " << FirstErrorText(loaded);
  }
}

// ---- priced end to end: Llama 3 8B on GB200s --------------------------------

Recipe LoadOnGb200(const std::string& name, const std::vector<std::string>& sets) {
  std::vector<Override> overrides = {*ParseOverride("cluster.gpu=gb200")};
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/" + name + ".yaml"), overrides);
  EXPECT_TRUE(loaded.ok()) << FirstErrorText(loaded);
  return loaded.ok() ? *loaded.recipe : Recipe{};
}

struct Priced {
  RankMemory memory;
  double step_s = 0;
};

Priced PriceLlama(const std::vector<std::string>& sets) {
  const Recipe r = LoadOnGb200("llama3-8b-h200", sets);
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, LayoutOf(r));
  EXPECT_TRUE(planned.plan.has_value());
  if (!planned.plan) return {};
  return {EstimateRank(inv, planned.plan->layout, planned.plan->stages, 0), planned.plan->time.step_s};
}

// Llama 3 8B (hidden 4096, 32 query / 8 KV heads of 128, SwiGLU 14336, 32
// layers) at tp 1 pp 1, one micro-batch of 8192 tokens in flight.
constexpr int64_t kH = 4096, kQkv = (32 + 2 * 8) * 128, kF = 14336, kLayers = 32, kTokens = 8192;

TEST(Fp4Priced, Llama8bNvfp4WeightCopies) {
  const Priced bf16 = PriceLlama({});
  const Priced nv = PriceLlama({"training.precision.fp4=nvfp4"});
  const Priced nv_params = PriceLlama({"training.precision.fp4=nvfp4", "training.precision.fp4_params=true"});
  // Each layer's four linear weights [out, in]: qkv [6144, 4096], o [4096,
  // 4096], gate_up [28672, 4096], down [4096, 14336]. Every dimension is a
  // multiple of 128 and every in/16 of 4: no padding, so a weight's two
  // usages are 2 x (out*in/2 values + out*in/16 scales + 4 B amax).
  const int64_t weights[][2] = {{kQkv, kH}, {kH, kH}, {2 * kF, kH}, {kH, kF}};
  int64_t per_layer = 0, elements = 0;
  for (const auto& [out, in] : weights) {
    per_layer += 2 * (out * in * kE2m1Bits / 8 + out * in / kNvfp4Block * kScaleByte + kTensorScaleBytes);
    elements += out * in;
  }
  const int64_t copies = kLayers * per_layer;
  EXPECT_EQ(copies, 7'851'738'112);
  const Bytes tp_params = bf16.memory.of(Category::kTpShardedParams);
  EXPECT_EQ((nv.memory.of(Category::kTpShardedParams) - tp_params).count(), copies);
  // fp4_params: the bf16 copy of those weights (2 B an element) is gone.
  EXPECT_EQ((nv_params.memory.of(Category::kTpShardedParams) - tp_params).count(), copies - 2 * kLayers * elements);
  // Gradients and optimizer state do not change (fp32 main grads and master).
  EXPECT_EQ(nv_params.memory.of(Category::kGradients), bf16.memory.of(Category::kGradients));
}

TEST(Fp4Priced, Llama8bNvfp4SavedGemmInputs) {
  const Priced bf16 = PriceLlama({});
  const Priced nv = PriceLlama({"training.precision.fp4=nvfp4"});
  const Priced mx = PriceLlama({"training.precision.fp4=mxfp4"});
  // A GEMM input TE saves for backward becomes its columnwise FP4 copy: per
  // element 1/2 byte of values + 1/block of a scale byte, against 2 B bf16.
  // Per token of a layer: the attention norm output (h, into QKV) and the MLP
  // norm output (h, into gate_up) and fc2's input (f) change; the attention
  // output O stays bf16 for the attention core and gains O-projection's own
  // FP4 copy (32 x 128 = h).
  const auto saved_delta = [](int64_t block) {
    const auto fp4 = [block](int64_t n) { return n / 2 + n / block; };
    return (fp4(kH) - 2 * kH) + (fp4(kH) - 2 * kH) + (fp4(kF) - 2 * kF) + fp4(kH);
  };
  const Bytes base = bf16.memory.of(Category::kActivations);
  EXPECT_EQ((nv.memory.of(Category::kActivations) - base).count(), kLayers * kTokens * saved_delta(kNvfp4Block));
  EXPECT_EQ((mx.memory.of(Category::kActivations) - base).count(), kLayers * kTokens * saved_delta(kMxfp4Block));
  EXPECT_EQ(saved_delta(kNvfp4Block), -30080);
}

TEST(Fp4Priced, Gb200StepAtTheFp4Rate) {
  const Priced bf16 = PriceLlama({});
  const Priced fp8 = PriceLlama({"training.precision.activations=fp8"});
  const Priced nv = PriceLlama({"training.precision.fp4=nvfp4"});
  EXPECT_LT(nv.step_s, fp8.step_s);
  EXPECT_LT(fp8.step_s, bf16.step_s);
  // One compute-bound GEMM: the fp4 peak x the block-scaled rate, plus the
  // casts of both inputs (read 2 B, write 1/2 + 1/16 B an element).
  const GpuSpec gpu = *GpuPreset("gb200");
  const double m = 8192, n = 8192, k = 8192;
  const double compute =
      2 * m * n * k * (1 + gpu.rates.gemm_tile_k / k) / (gpu.fp4_dense_tflops * 1e12 * gpu.rates.gemm_fp8);
  const double cast = (2 + 0.5 + 1.0 / 16) * (m * k + k * n) / (gpu.hbm_gbps * 1e9 * gpu.rates.hbm);
  EXPECT_DOUBLE_EQ(GemmSeconds(m, n, k, gpu, CostModel{}, GemmPrecision::kNvfp4), compute + cast);
  EXPECT_EQ(gpu.fp4_dense_tflops, 2 * gpu.fp8_dense_tflops);  // the datasheet's dense fp4 peak
  const Recipe nvfp4 = LoadOnGb200("llama3-8b-h200", {"training.precision.fp4=nvfp4"});
  EXPECT_NE(PricedRates(nvfp4, CostModel{}).find("of 10000 TFLOPS nvfp4"), std::string::npos);
}

// MoE layers: the norm output stays bf16 (the router reads it) and only a
// shared expert's fc1 adds an FP4 copy of it; each routed row's fc1 input (h)
// and fc2 input (f / etp) become FP4.
TEST(Fp4Priced, MoeLayerTerms) {
  const auto fp4 = [](int64_t n) { return n / 2 + n / kNvfp4Block; };
  // Mixtral: no shared expert, h 4096, expert f 14336.
  const Recipe bf16 = LoadOnGb200("mixtral-8x7b-h200", {});
  const Recipe nv = LoadOnGb200("mixtral-8x7b-h200", {"training.precision.fp4=nvfp4"});
  const Layout l = LayoutOf(bf16);
  const TokenBytes b = SavedBytesPerToken(bf16, BlockKind::kMoe, Recompute::kNone, l.tp, l.cp);
  const TokenBytes f = SavedBytesPerToken(nv, BlockKind::kMoe, Recompute::kNone, l.tp, l.cp);
  EXPECT_EQ(f.replicated, b.replicated);
  EXPECT_EQ(f.sharded, b.sharded);
  const int64_t rows = RouteMoeOn(nv, l).expert_tokens;
  ASSERT_GT(rows, 0);
  const int64_t f_local = 14336 / l.expert_tp;
  EXPECT_EQ((MoeLayerActivations(nv, l, Recompute::kNone) - MoeLayerActivations(bf16, l, Recompute::kNone)).count(),
            rows * ((fp4(4096) - 2 * 4096) + (fp4(f_local) - 2 * f_local)));
  // DeepSeek-V3: one shared expert of 2048, h 7168.
  const Recipe ds = LoadOnGb200("deepseek-v3-h200", {});
  const Recipe ds_nv = LoadOnGb200("deepseek-v3-h200", {"training.precision.fp4=nvfp4"});
  const Layout dl = LayoutOf(ds);
  const TokenBytes db = SavedBytesPerToken(ds, BlockKind::kMoe, Recompute::kNone, dl.tp, dl.cp);
  const TokenBytes df = SavedBytesPerToken(ds_nv, BlockKind::kMoe, Recompute::kNone, dl.tp, dl.cp);
  EXPECT_EQ(df.replicated - db.replicated, fp4(7168));
  EXPECT_EQ(df.sharded - db.sharded, fp4(2048) - 2 * 2048);
}

// The other mixers: the norm output (fused into the first linear) and the
// last linear's input become FP4 — Mamba's out_proj input (its gated-norm
// output, d_inner = expand x h), R's W_o input (width d_r); MLA's normed
// latents (q_lora + kv_lora) too, and its O gains the projection's copy.
TEST(Fp4Priced, MambaRecurrentAndMlaTerms) {
  const auto fp4 = [](int64_t n) { return n / 2 + n / kNvfp4Block; };
  struct Case {
    std::string recipe;
    BlockKind kind;
    int64_t replicated, sharded;  // the expected fp4 - bf16 deltas per token
  };
  const int64_t h = 4096, d_inner = 2 * 4096, d_r = 4096;
  const int64_t latents = 1536 + 512, o = 128 * 128, ds_h = 7168;
  const std::vector<Case> cases = {
      {"nemotron-h-8b-h200", BlockKind::kMamba, fp4(h) - 2 * h, fp4(d_inner) - 2 * d_inner},
      {"nam56r-h200", BlockKind::kRecurrent, fp4(h) - 2 * h, fp4(d_r) - 2 * d_r},
      {"deepseek-v3-h200", BlockKind::kAttention, (fp4(ds_h) - 2 * ds_h) + (fp4(latents) - 2 * latents), fp4(o)},
  };
  for (const Case& c : cases) {
    const Recipe bf16 = LoadOnGb200(c.recipe, {});
    const Recipe nv = LoadOnGb200(c.recipe, {"training.precision.fp4=nvfp4"});
    const Layout l = LayoutOf(bf16);
    const TokenBytes b = SavedBytesPerToken(bf16, c.kind, Recompute::kNone, l.tp, l.cp);
    const TokenBytes f = SavedBytesPerToken(nv, c.kind, Recompute::kNone, l.tp, l.cp);
    EXPECT_EQ(f.replicated - b.replicated, c.replicated) << c.recipe;
    EXPECT_EQ(f.sharded - b.sharded, c.sharded) << c.recipe;
  }
  // Full recompute keeps the layer input only, in bf16 (no linear saved it).
  const Recipe nv = LoadOnGb200("nemotron-h-8b-h200", {"training.precision.fp4=nvfp4"});
  const Recipe bf16 = LoadOnGb200("nemotron-h-8b-h200", {});
  EXPECT_EQ(SavedBytesPerToken(nv, BlockKind::kMamba, Recompute::kFull, 1, 1).replicated,
            SavedBytesPerToken(bf16, BlockKind::kMamba, Recompute::kFull, 1, 1).replicated);
}

// A sweep of an FP4 recipe marks its ZeRO-3 rows invalid, with the reason
// the recipe check gives.
TEST(Fp4Priced, SweepRefusesZero3) {
  const testing::CommandResult r = testing::RunPreflight({"sweep",         "recipes/llama3-8b-h200.yaml",
                                                          "--gpus",        "32",
                                                          "--set",         "cluster.gpu=gb200",
                                                          "--set",         "training.precision.fp4=nvfp4",
                                                          "--tp",          "1,2",
                                                          "--cp",          "1",
                                                          "--pp",          "1",
                                                          "--vpp",         "1",
                                                          "--micro-batch", "1",
                                                          "--recompute",   "full",
                                                          "--zero",        "1,3",
                                                          "--format",      "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  int zero3 = 0, zero1_priced = 0;
  for (const auto& row : j["layouts"]) {
    if (row["zero"] == 3) {
      EXPECT_EQ(row["status"], "invalid") << row.dump();
      EXPECT_EQ(row["reason"], "training.precision.fp4 = nvfp4: is not priced under ZeRO 3") << row.dump();
      ++zero3;
    } else if (row["status"] != "invalid") {
      ++zero1_priced;
    }
  }
  EXPECT_EQ(zero3, 2);  // tp 1 and 2
  EXPECT_EQ(zero1_priced, 2);
}

// The reference executor has no FP4 GEMMs: simulate says so instead of
// comparing against a bf16 run.
TEST(Fp4Priced, SimulateRefuses) {
  const testing::CommandResult r =
      testing::RunPreflight({"simulate", "recipes/llama3-8b-h200.yaml", "--set", "cluster.gpu=gb200", "--set",
                             "training.precision.fp4=nvfp4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot simulate: FP4 GEMMs are not in the executor"), std::string::npos) << r.err;
}

// ---- Megatron-LM import and emit, torchtitan ---------------------------------

Recipe ReadBack(const std::string& args) {
  const MegatronImport imported = ImportMegatronArgs(args, "args.sh");
  EXPECT_TRUE(imported.ok());
  std::vector<Diagnostic> errors;
  const std::string yaml =
      EmitMegatronRecipe(imported, {{"cluster.gpu", "gb200"}, {"cluster.nodes", "4"}}, "rt", "args.sh", &errors);
  const LoadResult back = LoadRecipeFromString(yaml, "rt.yaml");
  EXPECT_TRUE(back.ok()) << yaml << FirstErrorText(back);
  return back.ok() ? *back.recipe : Recipe{};
}

Emission EmitLlama(EmitTarget target, const std::vector<std::string>& sets) {
  const Recipe r = LoadOnGb200("llama3-8b-h200", sets);
  const PlanResult planned = MakePlan(BuildInventory(r), LayoutOf(r));
  EXPECT_TRUE(planned.plan.has_value());
  return planned.plan ? Emit(target, r, *planned.plan) : Emission{};
}

TEST(Fp4Megatron, EmitAndImportRoundTrip) {
  const Emission e =
      EmitLlama(EmitTarget::kMegatron, {"training.precision.fp4=nvfp4", "training.precision.fp4_params=true"});
  EXPECT_TRUE(e.refusals.empty()) << e.text;
  EXPECT_NE(e.text.find("--fp4-format e2m1 \\\n--fp4-recipe nvfp4 \\\n--fp4-param-gather"), std::string::npos)
      << e.text;
  const std::string args = e.text + " \\\n--tokenizer-type NullTokenizer \\\n--vocab-size 128255\n";
  const Recipe back = ReadBack(args);
  EXPECT_EQ(back.training.precision.fp4, Fp4Format::kNvfp4);
  EXPECT_TRUE(back.training.precision.fp4_params);
  // Without fp4 no FP4 flag is written.
  EXPECT_EQ(EmitLlama(EmitTarget::kMegatron, {}).text.find("--fp4"), std::string::npos);
}

TEST(Fp4Megatron, ImportReadsTheFlags) {
  const std::string base =
      "--num-layers 2 --hidden-size 1024 --num-attention-heads 8 --seq-length 4096 "
      "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 32 --bf16 "
      "--tokenizer-type NullTokenizer --vocab-size 32000 ";
  const Recipe plain = ReadBack(base + "--fp4-format e2m1");
  EXPECT_EQ(plain.training.precision.fp4, Fp4Format::kNvfp4);  // --fp4-recipe defaults to nvfp4
  EXPECT_FALSE(plain.training.precision.fp4_params);
  EXPECT_FALSE(ImportMegatronArgs(base + "--fp4-format e2m1 --fp4-recipe custom", "a.sh").ok());
  EXPECT_FALSE(ImportMegatronArgs(base + "--fp4-param-gather", "a.sh").ok());  // Megatron raises without --fp4-format
  EXPECT_FALSE(ImportMegatronArgs(base + "--fp4-format e4m3", "a.sh").ok());
}

TEST(Fp4Emit, RefusedWhereTheFrameworkHasNoSuchRecipe) {
  const Emission mx = EmitLlama(EmitTarget::kMegatron, {"training.precision.fp4=mxfp4"});
  ASSERT_EQ(mx.refusals.size(), 1u) << mx.text;
  EXPECT_NE(mx.refusals[0].find("training.precision.fp4 = mxfp4"), std::string::npos);
  EXPECT_NE(mx.text.find("# cannot express: Megatron-LM's --fp4-recipe is nvfp4 or custom"), std::string::npos);
  EXPECT_EQ(mx.text.find("--fp4-format"), std::string::npos);
  const Emission tt = EmitLlama(EmitTarget::kTorchtitan, {"training.precision.fp4=nvfp4"});
  bool named = false;
  for (const std::string& r : tt.refusals) named = named || r.find("training.precision.fp4 = nvfp4") == 0;
  EXPECT_TRUE(named) << tt.text;
}

}  // namespace
}  // namespace preflight::fp4_test

// `import megatron` (issue 15): both input forms, continuations, ${VAR},
// --moe-layer-freq list expressions, hybrid patterns with '|', malformed
// input (errors with line and flag), and parameter counts of imported
// corpus models against counts worked out by hand from the model shape.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../bench/fidelity_cases.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::import_megatron_test {
namespace {

using ::testing::HasSubstr;

/// The imported recipe, loaded (fails the test when it does not validate).
Recipe Load(const MegatronImport& imported, const std::vector<Override>& layout = {}) {
  std::vector<Diagnostic> errors;
  const std::string yaml = EmitMegatronRecipe(imported, layout, "t", "t", &errors);
  EXPECT_FALSE(HasErrors(errors));
  const LoadResult loaded = LoadRecipeFromString(yaml, "t.yaml");
  EXPECT_TRUE(loaded.ok()) << yaml << (loaded.diagnostics.empty() ? "" : Format(loaded.diagnostics.front()));
  return loaded.ok() ? *loaded.recipe : Recipe{};
}

const Diagnostic* FirstError(const MegatronImport& m) {
  for (const Diagnostic& d : m.diagnostics) {
    if (d.severity == Severity::kError) return &d;
  }
  return nullptr;
}

std::string Letters(const Recipe& r) {
  std::string s;
  for (BlockKind k : r.model.layers) s += Letter(k);
  return s;
}

const fidelity::Case& CorpusCase(const std::string& id) {
  static const std::vector<fidelity::Case> cases = [] {
    std::string error;
    return fidelity::LoadCases(testing::SourcePath("tests/data/megatron_ci/cases.json"), &error);
  }();
  for (const fidelity::Case& c : cases) {
    if (c.id == id) return c;
  }
  static const fidelity::Case none;
  ADD_FAILURE() << "no case " << id;
  return none;
}

TEST(ImportMegatron, ModelArgsYamlMapsShapeDegreesAndPrecision) {
  const std::string text =
      "ENV_VARS:\n"
      "  CUDA_DEVICE_MAX_CONNECTIONS: 1\n"
      "MODEL_ARGS:\n"
      "  --num-layers: 4\n"
      "  --hidden-size: 1024\n"
      "  --num-attention-heads: 16\n"
      "  --group-query-attention: true\n"
      "  --num-query-groups: 4\n"
      "  --swiglu: true\n"
      "  --normalization: RMSNorm\n"
      "  --disable-bias-linear: true\n"
      "  --position-embedding-type: rope\n"
      "  --untie-embeddings-and-output-weights: true\n"
      "  --qk-layernorm: true\n"
      "  --tokenizer-type: NullTokenizer\n"
      "  --vocab-size: 1000\n"
      "  --make-vocab-size-divisible-by: 64\n"
      "  --seq-length: 2048\n"
      "  --micro-batch-size: 2\n"
      "  --global-batch-size: 32\n"
      "  --tensor-model-parallel-size: 2\n"
      "  --pipeline-model-parallel-size: 2\n"
      "  --sequence-parallel: true\n"
      "  --use-distributed-optimizer: true\n"
      "  --recompute-granularity: full\n"
      "  --bf16: true\n"
      "  --hidden-dropout: 0.0\n"
      "  --save: ${CHECKPOINT_SAVE_PATH}\n"
      "  --cuda-graph-impl: local\n"
      "  --mtp-num-layers: 1\n"
      "  --my-new-flag: 3\n";
  const MegatronImport m = ImportMegatronArgs(text, "model.yaml");
  ASSERT_TRUE(m.ok());
  const Recipe r = Load(m, {{"cluster.nodes", "1"}, {"cluster.gpus_per_node", "8"}});
  EXPECT_EQ(Letters(r), "ADADADAD");
  EXPECT_EQ(r.model.hidden, 1024);
  EXPECT_EQ(r.model.attention.kv_heads, 4);
  EXPECT_EQ(r.model.attention.head_dim, 64);  // 1024 / 16
  EXPECT_TRUE(r.model.attention.qk_norm);
  // --swiglu: ffn = int(4h * 2/3 / 64) * 64 = int(2730.67 / 64) * 64 = 42 * 64.
  EXPECT_EQ(r.model.mlp.ffn_hidden, 2688);
  EXPECT_EQ(r.model.mlp.activation, FfnActivation::kSwiglu);
  EXPECT_EQ(r.model.vocab, 1001);  // NullTokenizer adds the EOD token
  EXPECT_EQ(r.model.vocab_pad_multiple, 64);
  EXPECT_FALSE(r.model.tie_embeddings);
  EXPECT_EQ(r.model.norm, NormKind::kRmsNorm);
  EXPECT_EQ(r.training.recompute, Recompute::kFull);
  EXPECT_EQ(r.training.micro_batch, 2);
  EXPECT_EQ(r.parallel.tp, 2);
  EXPECT_TRUE(r.parallel.sp);
  EXPECT_EQ(r.parallel.zero, 1);
  // Megatron's even split of 4 layers over 2 stages is the recipe's default
  // partition: nothing pinned.
  EXPECT_TRUE(r.parallel.stage_boundaries.empty());
  EXPECT_EQ(r.parallel.partition, Partition::kMegatron);
  // MTP modules map to the recipe; CUDA graphs are a located warning; the
  // unknown flag is listed; --save is quiet.
  EXPECT_EQ(r.model.mtp_layers, 1);
  EXPECT_THAT(m.unrepresented, ::testing::Contains("--cuda-graph-impl"));
  EXPECT_EQ(m.unknown, std::vector<std::string>{"--my-new-flag"});
  bool located = false;
  for (const Diagnostic& d : m.diagnostics) {
    if (d.key_path == "--cuda-graph-impl") located = d.mark.line == 29 && d.severity == Severity::kWarning;
    EXPECT_NE(d.key_path, "--save");
  }
  EXPECT_TRUE(located);
}

TEST(ImportMegatron, CommandLineWithContinuationsCommentsAndVariables) {
  const std::string text =
      "# launch\n"
      "torchrun --nproc_per_node 4 --nnodes 2 pretrain_gpt.py \\\n"
      "    --num-layers 2 --hidden-size 256 \\\n"
      "    --num-attention-heads 4 \\\n"
      "    --vocab-file ${DATA}/vocab.json --merge-file \"${DATA}/merges.txt\" \\\n"
      "    --seq-length=128 --micro-batch-size 1 --global-batch-size 8 \\\n"
      "    --recompute-modules moe_act layernorm \\\n"
      "    --bf16\n";
  const MegatronImport m = ImportMegatronArgs(text, "run.sh");
  ASSERT_TRUE(m.ok());
  const Recipe r = Load(m);
  EXPECT_EQ(r.cluster.nodes, 2);  // from torchrun
  EXPECT_EQ(r.cluster.gpus_per_node, 4);
  EXPECT_EQ(r.model.vocab, 50257);  // GPT-2 BPE
  EXPECT_EQ(r.training.seq_len, 128);
  EXPECT_EQ(r.model.mlp.ffn_hidden, 1024);  // 4h, GeLU
  EXPECT_EQ(r.model.norm, NormKind::kLayerNorm);
  EXPECT_TRUE(r.model.tie_embeddings);
  bool modules = false;
  for (const MegatronArg& a : m.args) {
    if (a.flag == "--recompute-modules") modules = a.value == "moe_act layernorm" && a.line == 7;
    if (a.flag == "--vocab-file") {
      EXPECT_EQ(a.value, "${DATA}/vocab.json");
    }
  }
  EXPECT_TRUE(modules);
  // Megatron's defaults the recipe now holds: biases on every linear, a learned
  // position table of --max-position-embeddings (defaulting to --seq-length) rows,
  // Transformer Engine.
  EXPECT_TRUE(r.model.linear_bias);
  EXPECT_EQ(r.model.learned_positions, 128);
  EXPECT_TRUE(r.training.transformer_engine);
  EXPECT_FALSE(r.training.defer_head_wgrad);
}

// The flags that set the mechanisms fit now prices, each to its recipe key.
TEST(ImportMegatron, KernelAndDeferralFlagsMapToTheirKeys) {
  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 4\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 256\n  --pipeline-model-parallel-size: 2\n  --num-experts: 8\n"
      "  --moe-ffn-hidden-size: 32\n";
  const Recipe gelu = Load(ImportMegatronArgs(base, "m.yaml"), {{"cluster.gpus_per_node", "2"}});
  EXPECT_EQ(gelu.model.moe.activation, FfnActivation::kGelu);  // no --swiglu: GeLU experts, two matrices
  EXPECT_FALSE(gelu.model.moe.grouped_gemm);
  EXPECT_EQ(gelu.model.learned_positions, 256);
  const Recipe r =
      Load(ImportMegatronArgs(base + "  --swiglu: true\n  --moe-grouped-gemm: true\n"
                                     "  --disable-bias-linear: true\n  --position-embedding-type: rope\n"
                                     "  --transformer-impl: local\n"
                                     "  --defer-embedding-wgrad-compute: true\n  --wgrad-deferral-limit: 3\n",
                              "m.yaml"),
           {{"cluster.gpus_per_node", "2"}});
  EXPECT_EQ(r.model.moe.activation, FfnActivation::kSwiglu);
  EXPECT_TRUE(r.model.moe.grouped_gemm);
  EXPECT_FALSE(r.model.linear_bias);
  EXPECT_EQ(r.model.learned_positions, 0);
  EXPECT_FALSE(r.training.transformer_engine);
  EXPECT_TRUE(r.training.defer_head_wgrad);
  EXPECT_EQ(r.training.head_wgrad_deferral_limit, 3);
}

// The main_grad buffer's dtype follows Megatron's arguments.py: fp32 under
// --bf16 (unless --grad-reduce-in-bf16) and without mixed precision, the
// parameters' fp16 under --fp16 unless --accumulate-allreduce-grads-in-fp32.
TEST(ImportMegatron, GradientBufferDtypeFollowsTheAccumulationRule) {
  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 128\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 64\n";
  const auto grads = [&](const std::string& extra) {
    return Load(ImportMegatronArgs(base + extra, "m.yaml"), {{"cluster.gpus_per_node", "1"}}).training.precision.grads;
  };
  EXPECT_EQ(grads(""), DType::kFp32);
  EXPECT_EQ(grads("  --bf16: true\n"), DType::kFp32);
  EXPECT_EQ(grads("  --bf16: true\n  --grad-reduce-in-bf16: true\n"), DType::kBf16);
  EXPECT_EQ(grads("  --fp16: true\n"), DType::kFp16);
  EXPECT_EQ(grads("  --fp16: true\n  --accumulate-allreduce-grads-in-fp32: true\n"), DType::kFp32);
}

// Megatron's stage-split flags become the recipe's partition keys, and the
// recipe's split is then the one Megatron builds (hand-worked per case).
TEST(ImportMegatron, StageSplitFlagsMapToThePartitionKeys) {
  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 6\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 64\n  --pipeline-model-parallel-size: 2\n  --swiglu: true\n";
  const std::vector<Override> two_gpus = {{"cluster.gpus_per_node", "2"}};
  auto layers_per_chunk = [](const Recipe& r) {
    const Inventory inv = BuildInventory(r);
    std::vector<int64_t> out;
    const std::optional<StagePlan> plan = RecipeStagePlan(inv, LayoutOf(r));
    if (!plan) return out;
    for (const StageChunk& c : plan->chunks) {
      const LayerRange range = LayerRangeOf(c, inv.layer_starts);
      out.push_back(range.end - range.first);
    }
    return out;
  };
  // --decoder-first-pipeline-num-layers 2: rank 0 holds 2, rank 1 the other 4.
  const Recipe first =
      Load(ImportMegatronArgs(base + "  --decoder-first-pipeline-num-layers: 2\n", "m.yaml"), two_gpus);
  EXPECT_EQ(first.parallel.first_stage_layers, 2);
  EXPECT_EQ(layers_per_chunk(first), (std::vector<int64_t>{2, 4}));
  // Embedding and loss accounted: (6 + 2) / 2 = 4 a rank, one fewer layer on each end.
  const Recipe account = Load(ImportMegatronArgs(base + "  --account-for-embedding-in-pipeline-split: true\n"
                                                        "  --account-for-loss-in-pipeline-split: true\n",
                                                 "m.yaml"),
                              two_gpus);
  EXPECT_TRUE(account.parallel.embedding_in_split);
  EXPECT_TRUE(account.parallel.loss_in_split);
  EXPECT_EQ(layers_per_chunk(account), (std::vector<int64_t>{3, 3}));
  // An explicit layout: (t|)*2 unrolls to t|t|; 4 chunks on pp 2 set vpp 2.
  const Recipe layout =
      Load(ImportMegatronArgs(base + "  --pipeline-model-parallel-layout: \"Et*2|(t|)*2,t*2L\"\n", "m.yaml"),
           {{"cluster.gpus_per_node", "2"}, {"training.global_batch", "4"}});
  EXPECT_EQ(layout.parallel.vpp, 2);
  EXPECT_EQ(layout.parallel.stage_boundaries, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(layers_per_chunk(layout), (std::vector<int64_t>{2, 1, 1, 2}));
  // A layout Megatron would reject is an error on the flag.
  for (const std::string bad : {"Et*2|x|t*4L", "t*6|L", "Et*5|L", "E(t*3|t*3L"}) {
    const MegatronImport m =
        ImportMegatronArgs(base + "  --pipeline-model-parallel-layout: \"" + bad + "\"\n", "m.yaml");
    const Diagnostic* e = FirstError(m);
    ASSERT_NE(e, nullptr) << bad;
    EXPECT_EQ(e->key_path, "--pipeline-model-parallel-layout") << bad;
  }
}

// Optimizer CPU offload maps to the recipe's offload fraction (Megatron's
// default fraction is 1.0 when only --optimizer-cpu-offload is given).
TEST(ImportMegatron, OptimizerOffloadMapsToTheOffloadFraction) {
  const MegatronImport m = ImportMegatronArgs(
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 64\n  --optimizer-cpu-offload: true\n  --optimizer-offload-fraction: 0.5\n"
      "  --use-distributed-optimizer: true\n",
      "m.yaml");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m.unknown.empty());
  EXPECT_EQ(Load(m, {{"cluster.gpus_per_node", "2"}}).training.optimizer.offload_fraction, 0.5);
  const MegatronImport whole = ImportMegatronArgs(
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 64\n  --optimizer-cpu-offload: true\n  --use-distributed-optimizer: true\n",
      "m.yaml");
  EXPECT_EQ(Load(whole, {{"cluster.gpus_per_node", "2"}}).training.optimizer.offload_fraction, 1.0);
}

// Muon with --use-distributed-optimizer is Megatron's layer-wise optimizer
// (arguments.py validate_args at d98e8a6); without the shard-aligned layout
// it deals whole tensors, which the recipe prices as optimizer_sharding
// layer_wise. Muon owns the router too (a 2-D matrix, _is_muon_excluded).
TEST(ImportMegatron, MuonWithTheDistributedOptimizerIsLayerWise) {
  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n"
      "  --max-position-embeddings: 64\n  --bf16: true\n  --optimizer: muon\n  --use-distributed-optimizer: true\n";
  const MegatronImport legacy = ImportMegatronArgs(base + "  --no-use-layer-wise-param-layout: true\n", "m.yaml");
  ASSERT_TRUE(legacy.ok());
  EXPECT_TRUE(legacy.unknown.empty());
  const Recipe r = Load(legacy, {{"cluster.gpus_per_node", "2"}});
  EXPECT_EQ(r.parallel.optimizer_sharding, OptimizerSharding::kLayerWise);
  EXPECT_EQ(r.parallel.zero, 1);
  EXPECT_EQ(r.training.optimizer.router, OptimizerKind::kMuon);
  // With Megatron's default param layout: flat shards, and a warning that says so.
  const MegatronImport layout = ImportMegatronArgs(base, "m.yaml");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(Load(layout, {{"cluster.gpus_per_node", "2"}}).parallel.optimizer_sharding, OptimizerSharding::kFlat);
  bool warned = false;
  for (const Diagnostic& d : layout.diagnostics) {
    warned = warned || (d.severity == Severity::kWarning && d.message.find("shard-aligned") != std::string::npos);
  }
  EXPECT_TRUE(warned);
  // Adam keeps the flat distributed optimizer.
  std::string adam = base;
  adam.replace(adam.find("muon"), 4, "adam");
  EXPECT_EQ(Load(ImportMegatronArgs(adam + "  --no-use-layer-wise-param-layout: true\n", "m.yaml"),
                 {{"cluster.gpus_per_node", "2"}})
                .parallel.optimizer_sharding,
            OptimizerSharding::kFlat);
}

TEST(ImportMegatron, MoeLayerFreqListExpressionsAndIntegers) {
  std::vector<int> list;
  int64_t period = 0;
  ASSERT_TRUE(ParseMoeLayerFreq("([0]*3+[1]*9)", &list, &period));
  EXPECT_EQ(list, (std::vector<int>{0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  ASSERT_TRUE(ParseMoeLayerFreq("[1, 0]*2", &list, &period));
  EXPECT_EQ(list, (std::vector<int>{1, 0, 1, 0}));
  ASSERT_TRUE(ParseMoeLayerFreq("2", &list, &period));
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(period, 2);
  EXPECT_FALSE(ParseMoeLayerFreq("([0]*3+", &list, &period));
  EXPECT_FALSE(ParseMoeLayerFreq("0", &list, &period));
  EXPECT_FALSE(ParseMoeLayerFreq("[0]*x", &list, &period));

  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 4\n  --hidden-size: 64\n  --num-attention-heads: 4\n  --swiglu: true\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n  --num-experts: 8\n"
      "  --moe-ffn-hidden-size: 32\n  --moe-router-topk: 2\n";
  const Recipe listed = Load(ImportMegatronArgs(base + "  --moe-layer-freq: ([0]*1+[1]*3)\n", "m.yaml"));
  EXPECT_EQ(Letters(listed), "ADAEAEAE");
  const Recipe every_other = Load(ImportMegatronArgs(base + "  --moe-layer-freq: 2\n", "m.yaml"));
  EXPECT_EQ(Letters(every_other), "AEADAEAD");  // layer i is MoE iff i % 2 == 0
  // Hand count of one E sublayer: norm 2h + router E x h + 8 SwiGLU experts 3 h f_e,
  // each with its fc1 (2 f_e) and fc2 (h) biases (no --disable-bias-linear).
  const Inventory inv = BuildInventory(every_other);
  const int64_t e_sublayer = 2 * 64 + 8 * 64 + 8 * 3 * 64 * 32 + 8 * (2 * 32 + 64);
  EXPECT_EQ(inv.family_params[2], 2 * e_sublayer);  // family order A, M, E, R, D
  EXPECT_TRUE(listed.model.moe.dropless);
}

// TransformerConfig.moe_token_dispatcher_type defaults to "allgather"
// (transformer_config.py, Megatron-LM d98e8a6): 22 MoE corpus runs pass no
// --moe-token-dispatcher-type and ran the all-gather dispatcher.
TEST(ImportMegatron, TokenDispatcherDefaultsToMegatronsAllGather) {
  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
      "  --vocab-size: 100\n  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n  --num-experts: 8\n"
      "  --moe-ffn-hidden-size: 32\n  --moe-router-topk: 2\n";
  const MegatronImport absent = ImportMegatronArgs(base, "m.yaml");
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(Load(absent).model.moe.dispatcher, MoeDispatcher::kAllGather);
  const MegatronImport a2a = ImportMegatronArgs(base + "  --moe-token-dispatcher-type: alltoall\n", "m.yaml");
  EXPECT_EQ(Load(a2a).model.moe.dispatcher, MoeDispatcher::kAllToAll);
  EXPECT_TRUE(a2a.unrepresented.empty());
  const MegatronImport bad = ImportMegatronArgs(base + "  --moe-token-dispatcher-type: ring\n", "m.yaml");
  ASSERT_NE(FirstError(bad), nullptr);
  EXPECT_THAT(Format(*FirstError(bad)), HasSubstr("--moe-token-dispatcher-type"));
  EXPECT_THAT(Format(*FirstError(bad)), HasSubstr("allgather, alltoall, flex"));
  const fidelity::Case& c = CorpusCase("moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4/dev_dgx_h100");
  EXPECT_EQ(Load(ImportMegatronArgs(fidelity::ModelArgsYaml(c), c.id), fidelity::ClusterOf(c)).model.moe.dispatcher,
            MoeDispatcher::kAllGather);
}

TEST(ImportMegatron, HybridPatternWithPipelineCuts) {
  const MegatronImport m = ImportMegatronArgs(
      "MODEL_ARGS:\n  --hidden-size: 256\n  --num-attention-heads: 4\n  --seq-length: 128\n"
      "  --tokenizer-type: NullTokenizer\n  --vocab-size: 100\n  --pipeline-model-parallel-size: 3\n"
      "  --hybrid-layer-pattern: \"M-*|M-M|E-/*E\"\n  --num-experts: 4\n  --swiglu: true\n",
      "h.yaml");
  ASSERT_TRUE(m.ok());
  const Recipe r = Load(m, {{"cluster.gpus_per_node", "3"}, {"training.global_batch", "3"}});
  EXPECT_EQ(Letters(r), "MDAMDMED");
  EXPECT_EQ(r.parallel.stage_boundaries, (std::vector<int64_t>{3, 6}));
  bool mtp_warned = false;
  for (const Diagnostic& d : m.diagnostics) mtp_warned |= d.message.find("MTP") != std::string::npos;
  EXPECT_TRUE(mtp_warned);
}

TEST(ImportMegatron, MalformedInputNamesLineAndFlag) {
  const MegatronImport bad_int =
      ImportMegatronArgs("MODEL_ARGS:\n  --num-layers: twelve\n  --hidden-size: 8\n", "bad.yaml");
  const Diagnostic* e = FirstError(bad_int);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key_path, "--num-layers");
  EXPECT_EQ(e->mark.line, 2);

  const MegatronImport quote = ImportMegatronArgs("python pretrain_gpt.py \\\n  --data-path \"/a/b\n", "q.sh");
  e = FirstError(quote);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->mark.line, 2);
  EXPECT_THAT(e->message, HasSubstr("unterminated"));

  const MegatronImport yaml = ImportMegatronArgs("MODEL_ARGS:\n  --a: [1,\n", "y.yaml");
  EXPECT_FALSE(yaml.ok());

  const MegatronImport freq = ImportMegatronArgs(
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 8\n  --num-attention-heads: 2\n  --seq-length: 8\n"
      "  --vocab-size: 10\n  --num-experts: 2\n  --moe-layer-freq: ([0]*3\n",
      "f.yaml");
  e = FirstError(freq);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key_path, "--moe-layer-freq");
  EXPECT_EQ(e->mark.line, 8);

  const MegatronImport unexpanded = ImportMegatronArgs(
      "pretrain_gpt.py --num-layers ${LAYERS} --hidden-size 8 --num-attention-heads 2 --seq-length 8", "u.sh");
  e = FirstError(unexpanded);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key_path, "--num-layers");
  EXPECT_THAT(e->message, HasSubstr("unexpanded"));

  const MegatronImport stray = ImportMegatronArgs("pretrain_gpt.py --num-layers 2 extra 3", "s.sh");
  EXPECT_FALSE(stray.ok());

  // A flag read by several parts of the mapping is reported once.
  const MegatronImport twice = ImportMegatronArgs(
      "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 8\n  --num-attention-heads: 2\n  --vocab-size: 10\n"
      "  --tokenizer-type: NullTokenizer\n  --seq-length: x8\n  --num-experts: y\n  --mtp-num-layers: z\n",
      "t.yaml");
  for (const char* flag : {"--seq-length", "--num-experts", "--mtp-num-layers"}) {
    int errors = 0;
    for (const Diagnostic& d : twice.diagnostics) errors += d.key_path == flag && d.severity == Severity::kError;
    EXPECT_EQ(errors, 1) << flag;
  }
}

// Values may have 15 digits; two multiplied (mamba heads x head_dim, pp x
// virtual stages) passed int64 (signed overflow). The factors carry the
// recipe's bounds of their keys: an error at the flag, no product formed.
TEST(ImportMegatron, FactorsOfAProductAreBoundedAtTheirFlag) {
  const std::string base =
      "MODEL_ARGS:\n  --num-layers: 4\n  --hidden-size: 64\n  --num-attention-heads: 4\n  --vocab-size: 100\n"
      "  --tokenizer-type: NullTokenizer\n  --seq-length: 64\n";
  const struct {
    std::string extra;
    const char* flag;
    const char* bound;
  } cases[] = {
      {"  --hybrid-override-pattern: M*M*\n  --mamba-head-dim: 999999999999999\n", "--mamba-head-dim", "65536"},
      {"  --hybrid-override-pattern: M*M*\n  --mamba-num-heads: 999999999999999\n", "--mamba-num-heads", "1048576"},
      {"  --pipeline-model-parallel-size: 999999999999999\n  --num-virtual-stages-per-pipeline-rank: 999999999999999\n",
       "--pipeline-model-parallel-size", "16777216"},
      {"  --num-virtual-stages-per-pipeline-rank: 999999999999999\n", "--num-virtual-stages-per-pipeline-rank",
       "100000"},
      {"  --pipeline-model-parallel-size: 2\n  --num-layers-per-virtual-pipeline-stage: 999999999999999\n",
       "--num-layers-per-virtual-pipeline-stage", "100000"},
  };
  for (const auto& c : cases) {
    const MegatronImport m = ImportMegatronArgs(base + c.extra, "m.yaml");
    const Diagnostic* e = FirstError(m);
    ASSERT_NE(e, nullptr) << c.flag;
    EXPECT_EQ(e->key_path, c.flag);
    EXPECT_THAT(e->message, HasSubstr(std::string("must be at most ") + c.bound)) << c.flag;
  }
}

// Parameter counts of corpus models, worked out by hand from the shapes.
TEST(ImportMegatron, CorpusGpt7bParameterCount) {
  const fidelity::Case& c = CorpusCase("gpt/gpt3_7b_tp4_pp1_memory_speed/dev_dgx_gb200");
  const Recipe r = Load(ImportMegatronArgs(fidelity::ModelArgsYaml(c), c.id), fidelity::ClusterOf(c));
  // h 4096, 32 heads of 128, 8 query groups, ffn 4h GeLU, LayerNorm (weight + bias), untied,
  // NullTokenizer 131073 + 1. Per layer: q 4096^2 + k,v 2 x 4096 x 1024 + o 4096^2 + MLP
  // 2 x 4096 x 16384 + two LayerNorms 2 x 8192 = 176,177,152; linear biases qkv 6144 + o 4096 +
  // fc1 16384 + fc2 4096 = 30,720; learned positions 8192 (--max-position-embeddings) x 4096.
  const int64_t per_layer = 4096LL * 4096 * 2 + 2LL * 4096 * 1024 + 2LL * 4096 * 16384 + 2 * 8192 + 30720;
  ASSERT_EQ(per_layer, 176207872);
  const int64_t expected = 32 * per_layer + 2LL * 131074 * 4096 + 8192 + 8192LL * 4096;
  EXPECT_EQ(BuildInventory(r).total_params, expected);
  EXPECT_EQ(expected, 6745972736);
}

TEST(ImportMegatron, CorpusHybridParameterCount) {
  const fidelity::Case& c = CorpusCase("hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G/dev_dgx_h100");
  const Recipe r = Load(ImportMegatronArgs(fidelity::ModelArgsYaml(c), c.id), fidelity::ClusterOf(c));
  EXPECT_EQ(r.parallel.stage_boundaries, (std::vector<int64_t>{11, 22, 33}));
  // 44 layers: 20 M, 20 '-', 4 '*'; h 1024; LayerNorm; tied GPT-2 vocab 50257.
  // Mamba (d_inner 2048, 32 heads of 64, 8 groups, state 128): in_proj 1024 x (2*2048 + 2*8*128 + 32)
  // = 6,324,224; conv1d (2048 + 2048) x 4 + 4096 bias; dt_bias, A_log, D 3 x 32; gated norm 2048;
  // out_proj 2048 x 1024; pre-norm 2048.
  const int64_t mamba = 1024LL * 6176 + 4096 * 4 + 4096 + 3 * 32 + 2048 + 2048LL * 1024 + 2048;
  // MLP and attention linears carry biases (no --disable-bias-linear; Mamba's have none):
  // fc1 4096 + fc2 1024, qkv 2048 + o 1024. MambaModel keeps the learned absolute position
  // table (the default --position-embedding-type): 1024 positions x 1024.
  const int64_t mlp = 2LL * 1024 * 4096 + 2048 + 4096 + 1024;
  const int64_t attention = 2LL * 1024 * 1024 + 2LL * 1024 * 512 + 2048 + 2048 + 1024;  // 16 heads of 64, 8 groups
  const int64_t expected = 20 * mamba + 20 * mlp + 4 * attention + 50257LL * 1024 + 2048 + 1024LL * 1024;
  EXPECT_EQ(BuildInventory(r).total_params, expected);
}

TEST(ImportMegatron, HybridMtpDepthsAndASharedLayer) {
  const fidelity::Case& c =
      CorpusCase("nemotron/nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G/dev_dgx_gb200");
  const Recipe r = Load(ImportMegatronArgs(fidelity::ModelArgsYaml(c), c.id), fidelity::ClusterOf(c));
  // "MEMEM*EMEMEM*E/*E/*E" with --mtp-use-repeated-layer: two depths of one module.
  EXPECT_EQ(Letters(r), "MEMEMAEMEMEMAE");
  EXPECT_EQ(r.model.mtp_layers, 2);
  EXPECT_TRUE(r.model.mtp_shared_layer);
  // --data-parallel-sharding-strategy without --use-megatron-fsdp is never read:
  // the distributed optimizer alone.
  EXPECT_EQ(r.parallel.zero, 1);
  // h 768, RMSNorm, no biases, untied GPT-2 vocabulary of 50257 (the inventory counts it unpadded:
  // Megatron's padding depends on tp, and is priced per rank).
  // Mamba (16 heads of 64, 8 groups, state 128): in_proj 768 x (2 x 1024 + 2 x 8 x 128 + 16),
  // conv1d 3072 x 4 + 3072, dt_bias/A_log/D 3 x 16, gated norm 1024, out_proj 1024 x 768, pre-norm.
  const int64_t mamba = 768LL * 4112 + 3072 * 4 + 3072 + 3 * 16 + 1024 + 1024LL * 768 + 768;
  // Attention (8 heads of 64, 2 query groups): qkv 768 x 768, o 512 x 768, pre-norm.
  const int64_t attention = 768LL * 768 + 512LL * 768 + 768;
  // MoE: router 32 x 768 and its expert bias (32, an fp32 buffer the optimizer skips but the
  // checkpoint holds), 32 squared-ReLU experts of 512 (fc1 + fc2), a shared expert of 1024, pre-norm.
  const int64_t moe = 32LL * 768 + 32 + 32 * 2LL * 768 * 512 + 2LL * 768 * 1024 + 768;
  // One MTP module: enorm, hnorm, eh_proj 2h x h, attention + MoE, final norm.
  const int64_t mtp = 3 * 768 + 2LL * 768 * 768 + attention + moe;
  const int64_t expected = 6 * mamba + 2 * attention + 6 * moe + 768 + 2LL * 50257 * 768 + mtp;
  EXPECT_EQ(BuildInventory(r).total_params, expected);
}

TEST(ImportMegatron, HybridMtpDepthsMustAgreeAndOtherLayersAreNotCounted) {
  const std::string head =
      "MODEL_ARGS:\n  --hidden-size: 64\n  --num-attention-heads: 4\n  --seq-length: 128\n"
      "  --tokenizer-type: NullTokenizer\n  --vocab-size: 100\n  --num-experts: 4\n  --mamba-num-groups: 1\n";
  const MegatronImport differ = ImportMegatronArgs(head + "  --hybrid-layer-pattern: \"M*E/*E/*-\"\n", "h.yaml");
  const Diagnostic* e = FirstError(differ);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->key_path, "--hybrid-layer-pattern");
  EXPECT_THAT(e->message, HasSubstr("MTP depths differ"));
  const MegatronImport other = ImportMegatronArgs(head + "  --hybrid-layer-pattern: \"M*E/MM\"\n", "h.yaml");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(Load(other).model.mtp_layers, 0);
  bool warned = false;
  for (const Diagnostic& d : other.diagnostics)
    warned |= d.message.find("('MM' a depth) is not counted") != std::string::npos;
  EXPECT_TRUE(warned);
  // The older spelling: one depth's layers, --mtp-num-layers times.
  const MegatronImport legacy = ImportMegatronArgs(
      head + "  --hybrid-layer-pattern: \"M*E\"\n  --mtp-hybrid-override-pattern: \"*E\"\n  --mtp-num-layers: 3\n",
      "h.yaml");
  ASSERT_TRUE(legacy.ok());
  EXPECT_EQ(Load(legacy).model.mtp_layers, 3);
}

}  // namespace
}  // namespace preflight::import_megatron_test

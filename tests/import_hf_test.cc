// `preflight import hf`, library level: the mapping of Hugging Face configs to
// recipe model entries, the warnings for fields the recipe cannot represent,
// and the errors for bad input. Expected letters are worked out by hand from
// each model's published decoder-layer rule (quoted beside each case).
#include "preflight/recipe/import.h"

#include <algorithm>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/test_support.h"

namespace preflight::import_hf_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;
using testing::SourcePath;

HfImport ImportFixture(const std::string& name) {
  const std::string path = "tests/data/hf/" + name;
  return ImportHfConfig(ReadFile(SourcePath(path)), path);
}

std::map<std::string, std::string> Entries(const HfImport& r) {
  std::map<std::string, std::string> out;
  for (const auto& e : r.model) out[e.key_path] = e.value;
  return out;
}

std::set<std::string> WarnedKeys(const HfImport& r) {
  std::set<std::string> out;
  for (const auto& d : r.diagnostics) {
    if (d.severity == Severity::kWarning) out.insert(d.key_path);
  }
  return out;
}

std::string AllMessages(const HfImport& r) {
  std::string out;
  for (const auto& d : r.diagnostics) out += Format(d) + "\n";
  return out;
}

// ---- Layer patterns -------------------------------------------------------

const std::string kBambaLetters = "\"MDMDMDMDMDMDMDMDMDADMDMDMDMDMDMDMDMDADMDMDMDMDMDMDMDMDADMDMDMDMD\"";

struct PatternCase {
  const char* name;
  const char* fixture;
  std::string pattern;  // with the quotes the YAML needs
  std::string repeat;
};

const PatternCase kPatternCases[] = {
    // LlamaDecoderLayer: self_attn then mlp -> "AD", 32 layers.
    {"Llama31_8B", "llama-3.1-8b.json", "\"AD\"", "32"},
    // MixtralDecoderLayer: self_attn then block_sparse_moe -> "AE", 32 layers.
    {"Mixtral8x7B", "mixtral-8x7b.json", "\"AE\"", "32"},
    // Qwen3MoeDecoderLayer: sparse when (i+1) % decoder_sparse_step(1) == 0 and mlp_only_layers is [] -> all "AE".
    {"Qwen3_30B_A3B", "qwen3-30b-a3b.json", "\"AE\"", "48"},
    // DeepseekV3: "AE" x 61 with the first 3 FFN slots dense via moe.first_k_dense (checked below).
    {"DeepSeekV3", "deepseek-v3.json", "\"AE\"", "61"},
    // Jamba: layer i is attention iff i % 8 == 4, MoE iff i % 2 == 1; one period of 8 layers =
    // M D, M E, M D, M E, A D, M E, M D, M E -> 16 letters, 32 layers = 4 periods.
    {"JambaV01", "jamba-v0.1.json", "\"MDMEMDMEADMEMDME\"", "4"},
    // Mamba-2 only: 64 mixer layers.
    {"Mamba2_2_7B", "mamba2-2.7b.json", "\"M\"", "64"},
    // gpt-oss: attention + MoE per layer, 36 layers (120b) and 24 (20b).
    {"GptOss120B", "gpt-oss-120b.json", "\"AE\"", "36"},
    {"GptOss20B", "gpt-oss-20b.json", "\"AE\"", "24"},
    // Nemotron-H-8B: "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" letter for letter
    // (M->M, *->A, -->D); not periodic, so written whole with repeat 1.
    {"NemotronH8B", "nemotron-h-8b.json", "\"MDMDMDMADMDMDMDMDMADMDMDMDMDMADMDMDMDMDMADMDMDMDMDMD\"", "1"},
    // Qwen2/Qwen3/Mistral/Gemma decoder layers: attention then gated MLP, as Llama's.
    {"Qwen25_7B", "qwen2.5-7b.json", "\"AD\"", "28"},
    {"Qwen3_8B", "qwen3-8b.json", "\"AD\"", "36"},
    {"Mistral7B", "mistral-7b-v0.1.json", "\"AD\"", "32"},
    {"Gemma2_2B", "gemma-2-2b.json", "\"AD\"", "26"},
    {"Gemma3_1B", "gemma-3-1b.json", "\"AD\"", "26"},
    // mamba_ssm create_block: a mixer per layer, no MLP when d_intermediate is 0 (Mamba2 here, the
    // Mamba1 default in mamba-2.8b, written as the M stand-in).
    {"Mamba2_2_7B_MambaSsm", "mamba2-2.7b-ssm.json", "\"M\"", "64"},
    {"Mamba1_2_8B_MambaSsm", "mamba-2.8b-ssm.json", "\"M\"", "64"},
    // Bamba-9B: attention at layers 9, 18, 27 (attn_layer_indices), Mamba-2 elsewhere, each with an MLP:
    // 9 x MD, AD, 8 x MD, AD, 8 x MD, AD, 4 x MD; not periodic. The mamba_ssm form is the same model.
    {"Bamba9B", "bamba-9b.json", kBambaLetters, "1"},
    {"Bamba9B_MambaSsm", "bamba-9.8b-ssm.json", kBambaLetters, "1"},
    // Qwen3-Next: full attention at every 4th layer (full_attention_interval 4), Gated DeltaNet (as M)
    // elsewhere, each with the MoE FFN: M E M E M E A E, 12 times.
    {"Qwen3CoderNext", "qwen3-coder-next.json", "\"MEMEMEAE\"", "12"},
    // Granite-4.0-H-Small: the fixture's layer_types put "attention" at 5, 15, 25, 35 (4 of 40, IBM's 9:1
    // interleave; the exact positions were not checked against the released file, and no count depends
    // on them), "mamba" elsewhere, every layer with the MoE FFN: 5 x ME, AE, 4 x ME (10 layers), 4 times.
    {"Granite40HSmall", "granite-4.0-h-small.json", "\"MEMEMEMEMEAEMEMEMEME\"", "4"},
    // Kimi-K2 runs through the DeepSeek-V3 importer: "AE" x 61, the first FFN slot dense (first_k_dense_replace 1).
    {"KimiK2", "kimi-k2-instruct-0905.json", "\"AE\"", "61"},
    // GLM-4.5-Air: attention + FFN per layer, 46 layers, the first FFN slot dense (first_k_dense_replace 1).
    {"Glm45Air", "glm-4.5-air.json", "\"AE\"", "46"},
};

class ImportPattern : public ::testing::TestWithParam<PatternCase> {};

TEST_P(ImportPattern, MapsDecoderLayersToLetters) {
  const PatternCase& c = GetParam();
  const HfImport r = ImportFixture(c.fixture);
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.pattern"), c.pattern);
  EXPECT_EQ(e.at("model.repeat"), c.repeat);
}

INSTANTIATE_TEST_SUITE_P(All, ImportPattern, ::testing::ValuesIn(kPatternCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(ImportHf, DeepSeekV3MapsMlaSharedExpertsAndSigmoidRouter) {
  const HfImport r = ImportFixture("deepseek-v3.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  // Values from deepseek-ai/DeepSeek-V3 config.json.
  EXPECT_EQ(e.at("model.mla.heads"), "128");
  EXPECT_EQ(e.at("model.mla.q_lora_rank"), "1536");
  EXPECT_EQ(e.at("model.mla.kv_lora_rank"), "512");
  EXPECT_EQ(e.at("model.mla.qk_rope_head_dim"), "64");
  EXPECT_EQ(e.at("model.mla.qk_nope_head_dim"), "128");
  EXPECT_EQ(e.at("model.mla.v_head_dim"), "128");
  EXPECT_EQ(e.at("model.moe.experts"), "256");
  EXPECT_EQ(e.at("model.moe.top_k"), "8");
  EXPECT_EQ(e.at("model.moe.ffn_hidden"), "2048");
  EXPECT_EQ(e.at("model.moe.shared_experts"), "1");
  EXPECT_EQ(e.at("model.moe.first_k_dense"), "3");
  EXPECT_EQ(e.at("model.moe.router"), "sigmoid");      // scoring_func: sigmoid
  EXPECT_EQ(e.at("model.moe.router_bias"), "true");    // topk_method: noaux_tc
  EXPECT_EQ(e.at("model.mlp.ffn_hidden"), "18432");    // the 3 dense layers
  EXPECT_EQ(e.count("model.attention.heads"), 0u);     // MLA replaces GQA
}

TEST(ImportHf, DeepSeekWithLayerFrequencyIsWrittenLetterByLetter) {
  // moe_layer_freq 2, first_k_dense_replace 1, 5 layers: MoE iff i >= 1 and i % 2 == 0 -> layers 2, 4.
  const std::string json = R"({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 5, "num_attention_heads": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 8, "intermediate_size": 128, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "moe_layer_freq": 2, "first_k_dense_replace": 1})";
  const HfImport r = ImportHfConfig(json, "small.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.pattern"), "\"ADADAEADAE\"");
  EXPECT_EQ(e.at("model.repeat"), "1");
  EXPECT_EQ(e.count("model.moe.first_k_dense"), 0u);
  EXPECT_EQ(e.at("model.mla.q_lora_rank"), "0");  // absent q_lora_rank = no query compression
}

TEST(ImportHf, Qwen3MlpOnlyLayersBecomeDense) {
  // mlp_only_layers [0, 2], 4 layers, step 1 -> AD AE AD AE = "ADAE" x 2.
  const std::string json = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "mlp_only_layers": [0, 2], "decoder_sparse_step": 1})";
  const HfImport r = ImportHfConfig(json, "small.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.pattern"), "\"ADAE\"");
  EXPECT_EQ(e.at("model.repeat"), "2");
  EXPECT_EQ(e.at("model.mlp.ffn_hidden"), "128");
  EXPECT_EQ(e.at("model.attention.qk_norm"), "true");
}

TEST(ImportHf, NemotronHMapsMambaAndRelu2) {
  const HfImport r = ImportFixture("nemotron-h-8b.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  // nvidia/Nemotron-H-8B-Base-8K: 128 Mamba heads x 64 = 8192 = 2 x 4096.
  EXPECT_EQ(e.at("model.mamba.expand"), "2");
  EXPECT_EQ(e.at("model.mamba.head_dim"), "64");
  EXPECT_EQ(e.at("model.mamba.groups"), "8");
  EXPECT_EQ(e.at("model.mamba.d_state"), "128");
  EXPECT_EQ(e.at("model.mlp.ffn_hidden"), "21504");
  EXPECT_EQ(e.at("model.mlp.activation"), "relu2");  // mlp_hidden_act: squared ReLU
  EXPECT_EQ(e.at("model.attention.head_dim"), "128");  // attention_head_dim
}

TEST(ImportHf, NemotronHMoeLettersMapToE) {
  const std::string json = R"({"architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 4, "hybrid_override_pattern": "ME*E", "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16,
    "n_groups": 2})";
  const HfImport r = ImportHfConfig(json, "small.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.pattern"), "\"MEAE\"");
  EXPECT_EQ(e.at("model.moe.experts"), "8");
  // The experts are the non-gated squared-ReLU MLP of NemotronHMOE: two matrices, as moe.activation relu2.
  EXPECT_EQ(e.at("model.moe.activation"), "relu2");
  EXPECT_FALSE(WarnedKeys(r).count("n_routed_experts")) << AllMessages(r);
}

// ---- Warnings for what the recipe cannot represent -----------------------

struct WarningCase {
  const char* name;
  const char* fixture;
  std::vector<std::string> keys;  // every key that must be named in a warning
};

const WarningCase kWarningCases[] = {
    {"Llama31_8B", "llama-3.1-8b.json", {"rope_scaling"}},
    {"DeepSeekV3",
     "deepseek-v3.json",
     {"n_group", "topk_group", "num_nextn_predict_layers", "routed_scaling_factor", "rope_scaling",
      "quantization_config"}},
    {"JambaV01", "jamba-v0.1.json", {"mamba_dt_rank"}},
    {"GptOss120B",
     "gpt-oss-120b.json",
     {"attention_bias", "sinks", "num_local_experts", "swiglu_limit", "layer_types", "sliding_window", "rope_scaling",
      "quantization_config"}},
    // Qwen2's q/k/v biases (no config key: named on architectures); Mistral's sliding window.
    {"Qwen25_7B", "qwen2.5-7b.json", {"architectures"}},
    {"Mistral7B", "mistral-7b-v0.1.json", {"sliding_window"}},
    // Gemma: the extra norms (architectures), GeGLU, softcapping, sliding window.
    {"Gemma2_2B",
     "gemma-2-2b.json",
     {"architectures", "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window"}},
    {"Gemma3_1B", "gemma-3-1b.json", {"architectures", "hidden_activation", "sliding_window"}},
    // mamba-2.8b's Mamba-1 mixer (the default of ssm_cfg.layer).
    {"Mamba1_2_8B_MambaSsm", "mamba-2.8b-ssm.json", {"ssm_cfg.layer"}},
    // Qwen3-Next: the attention output gate (architectures) and Gated DeltaNet as Mamba-2.
    {"Qwen3CoderNext", "qwen3-coder-next.json", {"architectures", "linear_num_value_heads"}},
    // Kimi-K2: YaRN scaling and the routed-output scale, neither with parameters.
    {"KimiK2", "kimi-k2-instruct-0905.json", {"rope_scaling", "routed_scaling_factor"}},
    // GLM-4.5-Air: the q/k/v biases (a stand-in with its difference) and the MTP layer.
    {"Glm45Air", "glm-4.5-air.json", {"attention_bias", "num_nextn_predict_layers"}},
};

class ImportWarnings : public ::testing::TestWithParam<WarningCase> {};

TEST_P(ImportWarnings, NameEveryUnrepresentedField) {
  const WarningCase& c = GetParam();
  const HfImport r = ImportFixture(c.fixture);
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const std::set<std::string> warned = WarnedKeys(r);
  for (const auto& k : c.keys) EXPECT_TRUE(warned.count(k)) << k << " not warned:\n" << AllMessages(r);
}

INSTANTIATE_TEST_SUITE_P(All, ImportWarnings, ::testing::ValuesIn(kWarningCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(ImportHf, CleanConfigsImportWithoutWarnings) {
  // Mixtral 8x7B v0.1, Nemotron-H-8B, Mamba-2 2.7B (both formats), Qwen3-30B-A3B, Qwen3-8B, Bamba-9B
  // (both formats) and Granite-4.0-H-Small have nothing the recipe cannot hold.
  for (const char* f :
       {"mixtral-8x7b.json", "nemotron-h-8b.json", "mamba2-2.7b.json", "qwen3-30b-a3b.json", "mamba2-2.7b-ssm.json",
        "qwen3-8b.json", "bamba-9b.json", "bamba-9.8b-ssm.json", "granite-4.0-h-small.json"}) {
    const HfImport r = ImportFixture(f);
    EXPECT_TRUE(r.diagnostics.empty()) << f << ":\n" << AllMessages(r);
  }
}

TEST(ImportHf, WarningNamesFileLineKeyAndValue) {
  const HfImport r = ImportFixture("llama-3.1-8b.json");
  ASSERT_EQ(r.diagnostics.size(), 1u) << AllMessages(r);
  const std::string msg = Format(r.diagnostics[0]);
  // "rope_scaling" is on line 22 of the fixture, indented 2 spaces.
  EXPECT_THAT(msg, HasSubstr("tests/data/hf/llama-3.1-8b.json:22:3: warning: rope_scaling = {\"factor\":8.0"));
  EXPECT_THAT(msg, HasSubstr("not represented in the recipe"));
}

TEST(ImportHf, UnknownNonNullKeysAreListedNotDropped) {
  const std::string json = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "fancy_new_thing": 3,
    "another_knob": true, "unset_knob": null})";
  const HfImport r = ImportHfConfig(json, "small.json");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u) << AllMessages(r);
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("another_knob, fancy_new_thing"));
  EXPECT_THAT(r.diagnostics[0].message, ::testing::Not(HasSubstr("unset_knob")));
}

TEST(ImportHf, ManyUnknownKeysAreCountedPastThirty) {
  std::string json = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128)";
  for (int i = 10; i < 50; ++i) json += ", \"knob" + std::to_string(i) + "\": 1";
  const HfImport r = ImportHfConfig(json + "}", "many.json");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  // 40 unknown keys, sorted: knob10 ... knob39 listed, knob40 ... knob49 counted.
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("knob38, knob39 and 10 more"));
}

TEST(ImportHf, LlamaBiasesAndNonSiluAreWarned) {
  const std::string json = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "attention_bias": true,
    "mlp_bias": true, "hidden_act": "gelu"})";
  const HfImport r = ImportHfConfig(json, "small.json");
  ASSERT_TRUE(r.ok());
  const auto warned = WarnedKeys(r);
  EXPECT_TRUE(warned.count("attention_bias") && warned.count("mlp_bias") && warned.count("hidden_act"))
      << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.attention.kv_heads"), "4");   // absent num_key_value_heads = MHA
  EXPECT_EQ(e.at("model.attention.head_dim"), "16");  // hidden / heads
}

TEST(ImportHf, PythonInfinityIsAccepted) {
  // Python's json writes Infinity (Nemotron-H and Mamba-2 time_step_limit); the fixture has it.
  EXPECT_THAT(ReadFile(SourcePath("tests/data/hf/mamba2-2.7b.json")), HasSubstr("Infinity"));
  EXPECT_TRUE(ImportFixture("mamba2-2.7b.json").ok());
  // ...but not inside strings, which stay as written.
  const HfImport r = ImportHfConfig(R"({"architectures": ["Infinity"]})", "x.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.diagnostics[0].value, "\"Infinity\"");
}

// ---- Errors ---------------------------------------------------------------

TEST(ImportHf, UnsupportedArchitectureListsTheSupportedOnes) {
  const HfImport r = ImportHfConfig("{\n  \"architectures\": [\"BertForMaskedLM\"]\n}\n", "bert.json");
  ASSERT_FALSE(r.ok());
  const std::string msg = Format(r.diagnostics[0]);
  EXPECT_THAT(msg,
              HasSubstr("bert.json:2:3: architectures = \"BertForMaskedLM\": unsupported architecture; "
                        "supported: BambaForCausalLM, DeepseekV3ForCausalLM, FalconH1ForCausalLM, Gemma2ForCausalLM, "
                        "Gemma3ForCausalLM, Glm4MoeForCausalLM, GptOssForCausalLM, GraniteMoeHybridForCausalLM, "
                        "JambaForCausalLM, LlamaForCausalLM, "
                        "Mamba2ForCausalLM, MistralForCausalLM, MixtralForCausalLM, NemotronHForCausalLM, "
                        "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, "
                        "Zamba2ForCausalLM and mamba_ssm configs "
                        "(mamba_ssm MambaLMHeadModel)"));
}

/// A small Zamba2 config in Zamba2Config's keys (transformers >= 4.48): 4 layers, the last hybrid.
constexpr const char* kSmallZamba2 = R"({"architectures": ["Zamba2ForCausalLM"], "hidden_size": 64,
  "vocab_size": 100, "num_hidden_layers": 4, "layers_block_type": ["mamba", "mamba", "mamba", "hybrid"],
  "num_attention_heads": 4, "intermediate_size": 256, "mamba_d_state": 16, "mamba_expand": 2, "n_mamba_heads": 4,
  "num_mem_blocks": 1, "adapter_rank": 8, "use_shared_attention_adapter": true, "hidden_act": "gelu"})";

TEST(ImportHf, ZambaTwoHybridLayerStandsInAsAttentionMlpThenMamba) {
  const HfImport r = ImportHfConfig(kSmallZamba2, "z.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.pattern"), "\"MMMADM\"");  // the shared block runs before the hybrid layer's Mamba
  // The shared attention's heads are 2 x hidden / heads wide (Zamba2Config's attention_head_dim).
  EXPECT_EQ(e.at("model.attention.head_dim"), "32");
  EXPECT_EQ(e.at("model.attention.kv_heads"), "4");  // absent num_key_value_heads = MHA
  EXPECT_EQ(e.at("model.mamba.head_dim"), "32");     // 2 x 64 / 4 heads
  EXPECT_EQ(e.at("model.tie_embeddings"), "true");   // PretrainedConfig's default
  // Four stand-in warnings, one per difference the recipe cannot hold.
  const auto warned = WarnedKeys(r);
  for (const char* k : {"num_mem_blocks", "num_attention_heads", "layers_block_type", "adapter_rank"}) {
    EXPECT_TRUE(warned.count(k)) << k << "\n" << AllMessages(r);
  }
  ASSERT_EQ(r.stand_ins.size(), 4u);
  // One use of one block: nothing counted twice. The 2h input: norm 64 + q/k/v 64 x 3 x 128; the linear
  // 64 x 64; the adapters: gate_up 64 x 8 + 8 x 512, q/k/v 3 x (128 x 8 + 8 x 128).
  EXPECT_EQ(r.stand_ins[0].param_difference, 0);
  EXPECT_EQ(r.stand_ins[1].param_difference, -(64 + 64 * 3 * 128));
  EXPECT_EQ(r.stand_ins[2].param_difference, -64 * 64);
  EXPECT_EQ(r.stand_ins[3].param_difference, -(64 * 8 + 8 * 512 + 3 * (128 * 8 + 8 * 128)));
}

TEST(ImportHf, ZambaTwoForkKeysImportAsTheirCurrentNames) {
  // Zyphra's transformers fork wrote ffn_hidden_size, lora_rank, state_size, expansion_factor,
  // conv_dimension, mamba_headdim and use_shared_*_lora; the same model in either form imports alike.
  const HfImport current = ImportHfConfig(kSmallZamba2, "z.json");
  const HfImport fork = ImportHfConfig(R"({"architectures": ["Zamba2ForCausalLM"], "hidden_size": 64,
    "vocab_size": 100, "num_hidden_layers": 4, "layers_block_type": ["mamba", "mamba", "mamba", "hybrid"],
    "num_attention_heads": 4, "ffn_hidden_size": 256, "state_size": 16, "expansion_factor": 2, "mamba_headdim": 32,
    "num_mem_blocks": 1, "lora_rank": 8, "use_shared_attention_lora": true, "use_shared_block_lora": true,
    "gated_linear_unit": true, "conv_dimension": 4, "kv_channels": 16, "num_query_groups": 4})",
                                       "z.json");
  ASSERT_TRUE(current.ok() && fork.ok()) << AllMessages(fork);
  EXPECT_EQ(Entries(current), Entries(fork));
  ASSERT_EQ(current.stand_ins.size(), fork.stand_ins.size());
  for (size_t i = 0; i < fork.stand_ins.size(); ++i) {
    EXPECT_EQ(current.stand_ins[i].param_difference, fork.stand_ins[i].param_difference) << i;
  }
  EXPECT_THAT(AllMessages(fork), Not(HasSubstr("keys not imported")));
}

TEST(ImportHf, ZambaTwoBadLayoutsAreNamed) {
  const HfImport missing = ImportHfConfig(R"({"architectures": ["Zamba2ForCausalLM"], "hidden_size": 64,
    "vocab_size": 100, "num_hidden_layers": 2})",
                                          "z.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(AllMessages(missing), HasSubstr("layers_block_type: missing required field for Zamba2ForCausalLM"));
  const HfImport odd = ImportHfConfig(R"({"architectures": ["Zamba2ForCausalLM"], "hidden_size": 64,
    "vocab_size": 100, "num_hidden_layers": 2, "layers_block_type": ["mamba", "attention"]})",
                                      "z.json");
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(AllMessages(odd), HasSubstr("each layer type must be \"hybrid\" or \"mamba\""));
  const HfImport heads = ImportHfConfig(R"({"architectures": ["Zamba2ForCausalLM"], "hidden_size": 64,
    "vocab_size": 100, "num_hidden_layers": 1, "layers_block_type": ["hybrid"], "num_attention_heads": 3})",
                                        "z.json");
  ASSERT_FALSE(heads.ok());
  EXPECT_THAT(AllMessages(heads), HasSubstr("num_attention_heads = 3: must divide 2 x hidden_size = 128"));
}

TEST(ImportHf, FalconH1StandsInAsAttentionThenMambaWithItsWidthInHeads) {
  const HfImport r = ImportHfConfig(ReadFile(SourcePath("tests/data/hf/falcon-h1-0.5b.json")), "f.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const std::string yaml = EmitRecipeYaml(r, {}, "f.json", "");
  EXPECT_THAT(yaml, HasSubstr("pattern: \"AMD\""));
  EXPECT_THAT(yaml, HasSubstr("repeat: 36"));
  EXPECT_THAT(yaml, HasSubstr("heads: 24"));
  EXPECT_THAT(yaml, Not(HasSubstr("expand:")));
  // The warning names the stand-in and its difference: 36 x (1024 + 1536) more parameters.
  EXPECT_THAT(AllMessages(r), HasSubstr("side by side"));
  EXPECT_THAT(AllMessages(r), HasSubstr("the recipe counts 92,160 more parameters than the model"));
}

TEST(ImportHf, MalformedJsonNamesLineAndColumn) {
  const HfImport r = ImportHfConfig("{\n  \"hidden_size\": 4096,\n  \"vocab_size\": ,\n}\n", "bad.json");
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].mark.line, 3);
  EXPECT_THAT(Format(r.diagnostics[0]), HasSubstr("bad.json:3:"));
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("malformed JSON"));
}

TEST(ImportHf, MissingRequiredFieldIsNamed) {
  const std::string json = R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "num_experts_per_tok": 2})";
  const HfImport r = ImportHfConfig(json, "m.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(AllMessages(r), HasSubstr("m.json: num_local_experts: missing required field for MixtralForCausalLM"));
}

TEST(ImportHf, IllTypedFieldIsNamedWithValue) {
  const std::string json = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "4096", "vocab_size": 100,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": -1})";
  const HfImport r = ImportHfConfig(json, "l.json");
  ASSERT_FALSE(r.ok());
  const std::string all = AllMessages(r);
  EXPECT_THAT(all, HasSubstr("hidden_size = \"4096\": must be a positive integer"));
  EXPECT_THAT(all, HasSubstr("intermediate_size = -1: must be a positive integer"));
}

TEST(ImportHf, OddJsonShapesAreErrorsNotCrashes) {
  // Each is bad input: an error diagnostic, never an exception or a recipe.
  for (const char* json : {"[]", "null", "42", "\"text\"", "", "{\"architectures\": []}",
                           "{\"architectures\": [7]}", "{\"architectures\": \"LlamaForCausalLM\"}"}) {
    const HfImport r = ImportHfConfig(json, "odd.json");
    EXPECT_FALSE(r.ok()) << json;
    EXPECT_TRUE(r.model.empty()) << json;
  }
  // Floats, huge and negative values where positive integers belong.
  const std::string json = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096.0, "vocab_size": 1e30,
    "num_hidden_layers": 18446744073709551615, "num_attention_heads": 32, "intermediate_size": 0})";
  const HfImport r = ImportHfConfig(json, "l.json");
  ASSERT_FALSE(r.ok());
  const std::string all = AllMessages(r);
  EXPECT_THAT(all, HasSubstr("hidden_size = 4096.0: must be a positive integer"));
  EXPECT_THAT(all, HasSubstr("vocab_size = 1e+30: must be a positive integer"));
  EXPECT_THAT(all, HasSubstr("num_hidden_layers = 18446744073709551615: must be a positive integer"));
  EXPECT_THAT(all, HasSubstr("intermediate_size = 0: must be a positive integer"));
  // A billion layers is an error, not a billion-letter pattern (the recipe's bound is 100000).
  const HfImport deep = ImportHfConfig(R"({"architectures": ["Mamba2ForCausalLM"], "hidden_size": 64,
    "vocab_size": 100, "num_hidden_layers": 1000000000, "num_heads": 2, "head_dim": 64, "state_size": 16})",
                                       "deep.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(AllMessages(deep), HasSubstr("num_hidden_layers = 1000000000: at most 100000 layers are supported"));
}

TEST(ImportHf, DeeplyNestedJsonIsRefusedNotACrash) {
  // 100000 nested lists under one key: refused before the (recursive) JSON routines see it.
  const std::string json = "{\"architectures\": [\"LlamaForCausalLM\"],\n \"rope_scaling\": " +
                           std::string(100000, '[') + std::string(100000, ']') + "}";
  const HfImport r = ImportHfConfig(json, "deep.json");
  ASSERT_FALSE(r.ok());
  // Line 2 is ` "rope_scaling": [[[...`: the first '[' is column 18, the object's '{' is level 1, so
  // level 65 is the 64th '[', column 18 + 63 = 81.
  EXPECT_THAT(Format(r.diagnostics[0]), HasSubstr("deep.json:2:81: JSON nested deeper than 64 levels"));
  // Brackets inside strings do not count.
  const HfImport s = ImportHfConfig("{\"architectures\": [\"" + std::string(200, '[') + "\"]}", "s.json");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.diagnostics[0].message, HasSubstr("unsupported architecture"));
}

TEST(ImportHf, AFieldReadTwiceIsReportedOnce) {
  // Jamba's intermediate_size is both the dense MLP width and the expert width.
  const std::string json = R"({"architectures": ["JambaForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_experts_per_tok": 2})";
  const HfImport r = ImportHfConfig(json, "j.json");
  ASSERT_FALSE(r.ok());
  int count = 0;
  for (const auto& d : r.diagnostics) count += d.key_path == "intermediate_size" ? 1 : 0;
  EXPECT_EQ(count, 1) << AllMessages(r);
}

TEST(ImportHf, MissingArchitecturesIsAnError) {
  const HfImport r = ImportHfConfig(R"({"hidden_size": 64})", "x.json");
  ASSERT_FALSE(r.ok());
  // One error, no follow-on about the keys it did not read.
  ASSERT_EQ(r.diagnostics.size(), 1u) << AllMessages(r);
  EXPECT_THAT(AllMessages(r), HasSubstr("architectures: missing required field"));
  EXPECT_THAT(AllMessages(r), HasSubstr("d_model and n_layer for a mamba_ssm config"));
}

// ---- mamba_ssm configs (state-spaces/mamba config_mamba.py MambaConfig) ------

TEST(ImportHf, MambaSsmMamba2ReadsTheRealConfigWithoutWarnings) {
  // state-spaces/mamba2-2.7b's config.json: no architectures, ssm_cfg {"layer": "Mamba2"}, every
  // mixer field at Mamba2's defaults (d_state 128, d_conv 4, expand 2, headdim 64, ngroups 1,
  // chunk_size 256), vocab 50277 padded to a multiple of 16 = 50288.
  const HfImport r = ImportFixture("mamba2-2.7b-ssm.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  EXPECT_TRUE(r.diagnostics.empty()) << AllMessages(r);
  EXPECT_EQ(r.architecture, "mamba_ssm MambaLMHeadModel");
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.hidden"), "2560");
  EXPECT_EQ(e.at("model.vocab"), "50288");
  EXPECT_EQ(e.at("model.tie_embeddings"), "true");
  EXPECT_EQ(e.at("model.mamba.d_state"), "128");
  EXPECT_EQ(e.at("model.mamba.head_dim"), "64");
  EXPECT_EQ(e.at("model.mamba.groups"), "1");
  EXPECT_EQ(e.at("model.mamba.expand"), "2");
  EXPECT_EQ(e.count("model.attention.heads"), 0u);
}

TEST(ImportHf, MambaSsmMamba1IsTheNearestMWithTheDifferenceStated) {
  // ssm_cfg without "layer" is Mamba-1 (create_block's default): Mamba-1 defaults d_state 16, d_conv 4.
  const HfImport r = ImportFixture("mamba-2.8b-ssm.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  ASSERT_EQ(r.stand_ins.size(), 1u) << AllMessages(r);
  EXPECT_EQ(r.stand_ins[0].key, "ssm_cfg.layer");
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.mamba.d_state"), "16");
  EXPECT_EQ(e.at("model.vocab"), "50280");  // 50277 padded to a multiple of 8 (pad_vocab_size_multiple)
  // Per layer, Mamba-1 (d_model 2560, d_inner 5120, dt_rank 160, d_state 16): 41,241,600 (worked in
  // import_counts_test.cc). The stand-in Mamba-2 (80 heads of 64, 1 group): in_proj 2560 x (10240 + 32
  // + 80) = 26,501,120, conv1d (5120 + 32) x 5 = 25,760, dt_bias/A_log/D 240, norm 5120, out_proj
  // 13,107,200 = 39,639,440: 1,602,160 fewer a layer, 102,538,240 over 64 layers.
  EXPECT_EQ(r.stand_ins[0].param_difference, -102538240);
  EXPECT_THAT(AllMessages(r), HasSubstr("102,538,240 fewer parameters than the model (1.72 GiB less model state"));
}

TEST(ImportHf, MambaSsmHybridReadsAttnLayersAndTheMlp) {
  // The Bamba 9.8B mamba_ssm config: MHA at 9, 18, 27 with attn_cfg (no biases, no conv), GatedMLP of 14336.
  const HfImport r = ImportFixture("bamba-9.8b-ssm.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  EXPECT_TRUE(r.diagnostics.empty()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.attention.heads"), "32");
  EXPECT_EQ(e.at("model.attention.kv_heads"), "8");
  EXPECT_EQ(e.at("model.attention.head_dim"), "128");
  EXPECT_EQ(e.at("model.mlp.ffn_hidden"), "14336");
  EXPECT_EQ(e.count("model.linear_bias"), 0u);
}

TEST(ImportHf, MambaSsmAttentionDefaultsHaveBiases) {
  // mha.py: qkv_proj_bias and out_proj_bias default to true. Without an MLP the recipe's linear_bias
  // is exactly those two; with one it would add MLP biases, so they are a stated stand-in instead:
  // qkv (4 + 2 x 2) x 16 = 128 and out 64 a layer, one attention layer.
  const std::string no_mlp = R"({"d_model": 64, "n_layer": 2, "vocab_size": 100, "ssm_cfg": {"layer": "Mamba2"},
    "attn_layer_idx": [1], "attn_cfg": {"num_heads": 4, "num_heads_kv": 2}})";
  const HfImport a = ImportHfConfig(no_mlp, "a.json");
  ASSERT_TRUE(a.ok()) << AllMessages(a);
  EXPECT_EQ(Entries(a).at("model.linear_bias"), "true");
  EXPECT_EQ(Entries(a).at("model.pattern"), "\"MA\"");
  const std::string with_mlp = R"({"d_model": 64, "n_layer": 2, "vocab_size": 100, "d_intermediate": 100,
    "ssm_cfg": {"layer": "Mamba2"}, "attn_layer_idx": [1], "attn_cfg": {"num_heads": 4, "num_heads_kv": 2}})";
  const HfImport b = ImportHfConfig(with_mlp, "b.json");
  ASSERT_TRUE(b.ok()) << AllMessages(b);
  EXPECT_EQ(Entries(b).count("model.linear_bias"), 0u);
  EXPECT_EQ(Entries(b).at("model.mlp.ffn_hidden"), "128");  // GatedMLP rounds 100 up to 128
  ASSERT_EQ(b.stand_ins.size(), 1u) << AllMessages(b);
  EXPECT_EQ(b.stand_ins[0].param_difference, -(128 + 64));
}

TEST(ImportHf, MambaSsmErrorsNameTheNestedKey) {
  const HfImport bad_layer =
      ImportHfConfig(R"({"d_model": 64, "n_layer": 2, "vocab_size": 100, "ssm_cfg": {"layer": "Mamba3"}})", "m.json");
  ASSERT_FALSE(bad_layer.ok());
  ASSERT_EQ(bad_layer.diagnostics.size(), 1u) << AllMessages(bad_layer);
  EXPECT_THAT(AllMessages(bad_layer), HasSubstr("ssm_cfg.layer = \"Mamba3\""));
  const HfImport bad_index = ImportHfConfig(
      R"({"d_model": 64, "n_layer": 2, "vocab_size": 100, "attn_layer_idx": [5], "attn_cfg": {"num_heads": 4}})",
      "m.json");
  ASSERT_FALSE(bad_index.ok());
  EXPECT_THAT(AllMessages(bad_index), HasSubstr("attn_layer_idx = 5: must be a list of layer indices in 0..1"));
  const HfImport not_object =
      ImportHfConfig(R"({"d_model": 64, "n_layer": 2, "vocab_size": 100, "ssm_cfg": 3})", "m.json");
  ASSERT_FALSE(not_object.ok());
  EXPECT_THAT(AllMessages(not_object), HasSubstr("ssm_cfg = 3: must be an object"));
}

// Found by the CI fuzz run (hf_import_fuzz): a mamba_ssm d_model of 2.5e12
// overflowed the Mamba-1 stand-in's parameter count (signed overflow, UBSan).
TEST(ImportHf, SizesBeyondTheRecipesBoundsAreErrorsNotOverflows) {
  const HfImport huge = ImportHfConfig(R"({"d_model": 2564444444440, "n_layer": 64, "vocab_size": 50277})", "m.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(AllMessages(huge), HasSubstr("d_model = 2564444444440: must be at most 16777216"));
  // Each size within bounds, their product (d_inner = expand x d_model, then
  // d_inner x d_model) past int64.
  const HfImport product = ImportHfConfig(
      R"({"d_model": 16777216, "n_layer": 64, "vocab_size": 50277, "ssm_cfg": {"expand": 16777216}})", "m.json");
  ASSERT_FALSE(product.ok());
  EXPECT_THAT(AllMessages(product), HasSubstr("too large to count the parameters"));
  // A vocabulary may be larger than a width.
  const HfImport vocab = ImportHfConfig(R"({"d_model": 64, "n_layer": 2, "vocab_size": 20000000})", "m.json");
  EXPECT_TRUE(vocab.ok()) << AllMessages(vocab);
}

// Each size within its bound (2^24), a stand-in's parameter count of three or
// more of them past int64: an error at the stand-in's key, never a wrapped
// count (signed overflow, UBSan). One case a family of stand-in.
struct OverflowCase {
  const char* name;
  const char* config;
  const char* key;  // where the error is located
};

const OverflowCase kOverflowCases[] = {
    // Zamba2's shared attention: q/k/v of (1 + 2 x 2^24) heads of 2 x 2^24 / 1 over hidden 2^24 = 2^74.
    {"Zamba2SharedBlock",
     R"({"architectures": ["Zamba2ForCausalLM"], "num_hidden_layers": 1, "layers_block_type": ["hybrid"],
         "hidden_size": 16777216, "vocab_size": 1000, "num_attention_heads": 1,
         "num_key_value_heads": 16777216})",
     "num_mem_blocks"},
    // Qwen3-Next's Gated DeltaNet: in_proj_qkvz of hidden 2^24 x (2 x 2^48 + ...) = 2^73.
    {"GatedDeltaNet",
     R"({"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 1, "hidden_size": 16777216,
         "vocab_size": 1000, "linear_num_value_heads": 16777216, "linear_value_head_dim": 16777216,
         "linear_num_key_heads": 1})",
     "linear_num_value_heads"},
    // Qwen2's q/k/v biases: (2^24 + 2 x 2^24) x 2^24 a layer, 100,000 layers = 2^66.
    {"Qwen2AttentionBias",
     R"({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 100000, "hidden_size": 16777216,
         "vocab_size": 1000, "num_attention_heads": 16777216, "num_key_value_heads": 16777216,
         "head_dim": 16777216, "intermediate_size": 64})",
     "architectures"},
    // GLM's q/k/v biases (attention_bias): the same product.
    {"Glm4AttentionBias",
     R"({"architectures": ["Glm4MoeForCausalLM"], "num_hidden_layers": 100000, "hidden_size": 16777216,
         "vocab_size": 1000, "num_attention_heads": 16777216, "num_key_value_heads": 16777216,
         "head_dim": 16777216, "attention_bias": true, "intermediate_size": 64, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "moe_intermediate_size": 64})",
     "attention_bias"},
    // Qwen3-Next's attention output gate: hidden x heads x head_dim = 2^72.
    {"Qwen3NextOutputGate",
     R"({"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 1, "layer_types": ["full_attention"],
         "hidden_size": 16777216, "vocab_size": 1000, "num_attention_heads": 16777216, "head_dim": 16777216})",
     "architectures"},
    // A mamba_ssm MHA's conv1d over q, k and v: 3 x 2^48 x (2^24 + 1) = 2^73.6.
    {"MambaSsmAttentionConv",
     R"({"d_model": 64, "n_layer": 1, "vocab_size": 100, "attn_layer_idx": [0],
         "attn_cfg": {"num_heads": 16777216, "head_dim": 16777216, "d_conv": 16777216}})",
     "attn_cfg.d_conv"},
    // Falcon-H1's missing gated norm: d_inner 2^48 x 100,000 layers = 2^64.6.
    {"FalconH1GatedNorm",
     R"({"architectures": ["FalconH1ForCausalLM"], "num_hidden_layers": 100000, "hidden_size": 16777216,
         "vocab_size": 1000, "attn_layer_indices": [], "mamba_use_mlp": false, "mamba_n_heads": 16777216,
         "mamba_expand": 16777216, "mamba_d_state": 16})",
     "architectures"},
};

void PrintTo(const OverflowCase& c, std::ostream* os) { *os << c.name; }

class StandInOverflow : public ::testing::TestWithParam<OverflowCase> {};

TEST_P(StandInOverflow, IsAnErrorAtTheKeyNotAWrappedCount) {
  const OverflowCase& c = GetParam();
  const HfImport r = ImportHfConfig(c.config, "config.json");
  ASSERT_FALSE(r.ok()) << AllMessages(r);
  EXPECT_THAT(AllMessages(r), HasSubstr("too large to count the parameters")) << AllMessages(r);
  bool at_key = false;
  for (const Diagnostic& d : r.diagnostics) at_key = at_key || (d.severity == Severity::kError && d.key_path == c.key);
  EXPECT_TRUE(at_key) << AllMessages(r);
}

INSTANTIATE_TEST_SUITE_P(ImportHf, StandInOverflow, ::testing::ValuesIn(kOverflowCases),
                         [](const auto& test_info) { return std::string(test_info.param.name); });

// Zamba2's per-use LoRA adapters: (hidden x rank + rank x 2 x ffn + 3 x 4 x hidden x rank) a use
// = 45 x 2^44 at hidden 2^20, rank and ffn 2^24; 2^14 uses pass 2^63. One shared block a use
// (num_mem_blocks = uses) keeps the block copies' count at zero.
TEST(ImportHf, ZambaAdapterCountPastInt64IsAnErrorAtTheRank) {
  const int64_t uses = 16384;
  std::string types;
  for (int64_t i = 0; i < uses; ++i) types += std::string(i > 0 ? ", " : "") + "\"hybrid\"";
  const std::string config = R"({"architectures": ["Zamba2ForCausalLM"], "num_hidden_layers": )" +
                             std::to_string(uses) + R"(, "layers_block_type": [)" + types + R"(],
      "hidden_size": 1048576, "vocab_size": 1000, "num_mem_blocks": )" +
                             std::to_string(uses) + R"(, "intermediate_size": 16777216,
      "adapter_rank": 16777216, "use_shared_attention_adapter": true})";
  const HfImport r = ImportHfConfig(config, "config.json");
  ASSERT_FALSE(r.ok()) << AllMessages(r);
  ASSERT_FALSE(r.diagnostics.empty());
  int errors = 0;
  for (const Diagnostic& d : r.diagnostics) {
    if (d.severity != Severity::kError) continue;
    ++errors;
    EXPECT_EQ(d.key_path, "adapter_rank");
    EXPECT_THAT(d.message, HasSubstr("too large to count the parameters"));
  }
  EXPECT_EQ(errors, 1) << AllMessages(r);
}

// ---- Nearest-letter stand-ins of the dense families -----------------------------

TEST(ImportHf, StandInDifferencesAreWorkedByHand) {
  // Qwen2.5-7B: q, k, v biases of (28 + 2 x 4) x 128 = 4608 a layer (Qwen2Attention), 28 layers.
  const HfImport qwen = ImportFixture("qwen2.5-7b.json");
  ASSERT_EQ(qwen.stand_ins.size(), 1u) << AllMessages(qwen);
  EXPECT_EQ(qwen.stand_ins[0].param_difference, -129024);
  // Gemma 2 2B: post_attention_layernorm and post_feedforward_layernorm, 2 x 2304 a layer, 26 layers.
  const HfImport gemma = ImportFixture("gemma-2-2b.json");
  ASSERT_EQ(gemma.stand_ins.size(), 1u) << AllMessages(gemma);
  EXPECT_EQ(gemma.stand_ins[0].param_difference, -119808);
  const auto e = Entries(gemma);
  EXPECT_EQ(e.at("model.tie_embeddings"), "true");  // Gemma2Config's default, absent from the file
  EXPECT_EQ(e.at("model.attention.head_dim"), "256");
  EXPECT_EQ(Entries(ImportFixture("gemma-3-1b.json")).at("model.attention.qk_norm"), "true");
  // Qwen3-Coder-Next, by Qwen3NextAttention's and Qwen3NextGatedDeltaNet's shapes (hidden 2048):
  // the output gate is q_proj's second half, 2048 x 16 x 256 = 8,388,608 a layer, 12 attention
  // layers. Gated DeltaNet (key 16 x 128, value 32 x 128, conv 4): in_proj_qkvz 2048 x 12288, in_proj_ba
  // 2048 x 64, conv1d 8192 x 4 (no bias), dt_bias and A_log 32 each, norm 128, out_proj 4096 x 2048
  // = 33,718,464; the Mamba-2 stand-in (32 heads of 128, 16 groups, d_state 128): in_proj 2048 x
  // (8192 + 4096 + 32), conv1d 8192 x 5, 3 x 32, norm 4096, out_proj = 33,665,120; 53,344 fewer,
  // 36 layers.
  const HfImport next = ImportFixture("qwen3-coder-next.json");
  ASSERT_TRUE(next.ok()) << AllMessages(next);
  int64_t stated = 0;
  for (const StandIn& s : next.stand_ins) stated += s.param_difference;
  EXPECT_EQ(stated, -12 * 8388608 - 36 * 53344);
  const auto n = Entries(next);
  EXPECT_EQ(n.at("model.moe.shared_gate"), "true");
  EXPECT_EQ(n.at("model.mamba.groups"), "16");
  EXPECT_EQ(n.at("model.mamba.head_dim"), "128");
  EXPECT_EQ(Entries(ImportFixture("qwen3-8b.json")).at("model.attention.qk_norm"), "true");
}

TEST(ImportHf, NemotronPatternMustMatchLayerCountAndAlphabet) {
  const std::string base = R"({"architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_attention_heads": 4, "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2,
    "intermediate_size": 128, )";
  const HfImport wrong_length = ImportHfConfig(base + R"("num_hidden_layers": 3, "hybrid_override_pattern": "M-"})",
                                               "n.json");
  ASSERT_FALSE(wrong_length.ok());
  EXPECT_THAT(AllMessages(wrong_length), HasSubstr("has 2 letters but num_hidden_layers is 3"));
  const HfImport bad_letter = ImportHfConfig(base + R"("num_hidden_layers": 2, "hybrid_override_pattern": "MX"})",
                                             "n.json");
  ASSERT_FALSE(bad_letter.ok());
  EXPECT_THAT(AllMessages(bad_letter), HasSubstr("letter 'X' is not one of M (Mamba-2), * (attention)"));
}

// A small GraniteMoeHybrid config (the field names of GraniteMoeHybridConfig) with `extra` fields.
std::string GraniteConfig(const std::string& extra) {
  return R"({"architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64, "vocab_size": 100,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 2,
    "mamba_d_head": 64, "mamba_d_state": 16, "shared_intermediate_size": 256, )" +
         extra + "}";
}

TEST(ImportHf, GraniteWithoutExpertsIsDense) {
  // H-Micro's form: num_local_experts 0, so the layer's FFN is the shared MLP alone (a SwiGLU of
  // shared_intermediate_size), a D after each mixer.
  const HfImport r = ImportHfConfig(GraniteConfig(R"("num_local_experts": 0, "layer_types": ["mamba", "attention"])"),
                                    "granite-micro.json");
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  const auto e = Entries(r);
  EXPECT_EQ(e.at("model.pattern"), "\"MDAD\"");
  EXPECT_EQ(e.at("model.mlp.ffn_hidden"), "256");
  EXPECT_EQ(e.count("model.moe.experts"), 0u);
  EXPECT_TRUE(r.diagnostics.empty()) << AllMessages(r);
}

TEST(ImportHf, GraniteLayerTypesMustNameEveryLayer) {
  const HfImport missing = ImportHfConfig(GraniteConfig(R"("num_local_experts": 0)"), "g.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(AllMessages(missing), HasSubstr("layer_types: missing required field for GraniteMoeHybridForCausalLM"));
  const HfImport short_list =
      ImportHfConfig(GraniteConfig(R"("num_local_experts": 0, "layer_types": ["mamba"])"), "g.json");
  ASSERT_FALSE(short_list.ok());
  EXPECT_THAT(AllMessages(short_list), HasSubstr("must list num_hidden_layers (2) layer types"));
  const HfImport bad =
      ImportHfConfig(GraniteConfig(R"("num_local_experts": 0, "layer_types": ["mamba", "moe"])"), "g.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(AllMessages(bad), HasSubstr("each layer type must be \"attention\" or \"mamba\""));
}

TEST(ImportHf, MambaWidthNotAMultipleOfHiddenIsAnError) {
  // Nemotron-H-4B style: 112 heads x 64 = 7168 is not a multiple of 3072.
  const std::string json = R"({"architectures": ["NemotronHForCausalLM"], "hidden_size": 3072, "vocab_size": 100,
    "num_hidden_layers": 1, "hybrid_override_pattern": "M", "mamba_num_heads": 112, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8})";
  const HfImport r = ImportHfConfig(json, "n4.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(AllMessages(r), HasSubstr("mamba_num_heads * mamba_head_dim = 7168 must be a multiple of hidden_size"));
}

// ---- Round trip through the recipe parser ---------------------------------

class ImportRoundTrip : public ::testing::TestWithParam<PatternCase> {};

TEST_P(ImportRoundTrip, WrittenRecipeValidatesAndKeepsTheModel) {
  const PatternCase& c = GetParam();
  const HfImport r = ImportFixture(c.fixture);
  ASSERT_TRUE(r.ok()) << AllMessages(r);
  // A realistic layout as --layout would give it, plus the schema defaults for the rest.
  const std::string yaml = EmitRecipeYaml(r, {{"parallel.tp", "1", ""}, {"cluster.nodes", "2", ""}}, c.fixture, "");
  const LoadResult loaded = LoadRecipeFromString(yaml, "imported.yaml");
  ASSERT_TRUE(loaded.ok()) << yaml;
  EXPECT_TRUE(loaded.diagnostics.empty()) << yaml;
  const Recipe& recipe = *loaded.recipe;
  EXPECT_EQ("\"" + recipe.model.pattern + "\"", c.pattern);
  EXPECT_EQ(std::to_string(recipe.model.repeat), c.repeat);
  EXPECT_EQ(recipe.name, r.name);
  EXPECT_EQ(std::to_string(recipe.model.hidden), Entries(r).at("model.hidden"));
  EXPECT_EQ(std::to_string(recipe.model.vocab), Entries(r).at("model.vocab"));
  EXPECT_EQ(recipe.cluster.nodes, 2);
}

INSTANTIATE_TEST_SUITE_P(All, ImportRoundTrip, ::testing::ValuesIn(kPatternCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// ---- Layout merge and emission -------------------------------------------

TEST(ImportLayout, OverridesReplaceDefaultsInSchemaOrder) {
  std::vector<Diagnostic> ds;
  const auto merged = MergeLayout({{"parallel.tp", "1", ""}, {"cluster.nodes", "1", ""}},
                                  {{"cluster.nodes", "4"}, {"parallel.pp", "2"}}, &ds);
  ASSERT_TRUE(ds.empty());
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].key_path, "parallel.tp");
  EXPECT_EQ(merged[1].key_path, "parallel.pp");
  EXPECT_EQ(merged[1].value, "2");
  EXPECT_EQ(merged[2].key_path, "cluster.nodes");
  EXPECT_EQ(merged[2].value, "4");
}

TEST(ImportLayout, UnknownLayoutKeyIsAnErrorListingValidKeys) {
  std::vector<Diagnostic> ds;
  (void)MergeLayout({}, {{"model.hidden", "8"}}, &ds);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].severity, Severity::kError);
  EXPECT_THAT(Format(ds[0]), HasSubstr("model.hidden = 8: not a layout key; valid: training.seq_len"));
}

TEST(ImportLayout, EmitsNestedBlockYaml) {
  HfImport imported;
  imported.architecture = "LlamaForCausalLM";
  imported.name = "tiny-h200";
  imported.model = {{"model.pattern", "\"AD\"", "two sublayers"}, {"model.attention.heads", "4", ""},
                    {"model.attention.kv_heads", "2", ""}, {"model.mlp.ffn_hidden", "128", ""}};
  const std::string yaml = EmitRecipeYaml(imported, {{"training.precision.params", "bf16", ""},
                                                     {"parallel.tp", "2", "set by --layout"}},
                                          "c.json", "why this layout");
  EXPECT_EQ(yaml,
            "# Imported by `preflight import hf` from c.json (LlamaForCausalLM).\n"
            "# why this layout\n"
            "name: tiny-h200\n"
            "model:\n"
            "  pattern: \"AD\"  # two sublayers\n"
            "  attention:\n"
            "    heads: 4\n"
            "    kv_heads: 2\n"
            "  mlp:\n"
            "    ffn_hidden: 128\n"
            "training:\n"
            "  precision:\n"
            "    params: bf16\n"
            "parallel:\n"
            "  tp: 2  # set by --layout\n");
}

}  // namespace
}  // namespace preflight::import_hf_test

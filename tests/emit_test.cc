// `preflight plan --emit`: the Megatron-LM arguments and torchtitan config module of
// the planned layout for the example recipes. Expected values come from the
// recipes (and the papers and configs their comments cite), from the
// upstream flag semantics named beside each case, or from hand derivations
// written next to them; never from the renderer's own output.
#include <algorithm>
#include <map>
#include <optional>
#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/fields.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/emit.h"
#include "support/test_support.h"

namespace preflight::emit_test {
namespace {

using testing::SourcePath;

Emission EmitFor(EmitTarget target, const std::string& recipe, const std::vector<std::string>& sets = {}) {
  std::vector<Override> overrides;
  for (const std::string& s : sets) overrides.push_back(*ParseOverride(s));
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/" + recipe + ".yaml"), overrides);
  for (const Diagnostic& d : loaded.diagnostics) {
    if (d.severity == Severity::kError) ADD_FAILURE() << Format(d);
  }
  if (!loaded.ok()) return {};
  const Inventory inventory = BuildInventory(*loaded.recipe);
  const PlanResult planned = MakePlan(inventory, LayoutOf(*loaded.recipe));
  for (const Diagnostic& d : planned.diagnostics) ADD_FAILURE() << Format(d);
  if (!planned.plan) return {};
  return Emit(target, *loaded.recipe, *planned.plan);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Megatron flag -> value ("" for a bare flag), from "--flag value \" lines.
std::map<std::string, std::string> MegatronFlags(const std::string& text) {
  std::map<std::string, std::string> out;
  for (std::string line : Lines(text)) {
    if (line.rfind("--", 0) != 0) continue;
    if (line.size() >= 2 && line.compare(line.size() - 2, 2, " \\") == 0) line.resize(line.size() - 2);
    const size_t space = line.find(' ');
    std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    out[line.substr(0, space)] = value;
  }
  return out;
}

// torchtitan config module: "section.key" -> value as written (strings keep
// their quotes), from the keyword arguments of the Trainer.Config call; a
// top-level argument is its own key ("model_spec"), a multi-line list its
// lines joined.
std::map<std::string, std::string> PyKeys(const std::string& text) {
  std::map<std::string, std::string> out;
  std::vector<std::string> sections;
  std::string list_key;
  for (const std::string& raw : Lines(text)) {
    const size_t first = raw.find_first_not_of(' ');
    if (first == std::string::npos || raw[first] == '#') continue;
    std::string line = raw.substr(first);
    const size_t comment = line.find("  #");
    if (comment != std::string::npos) line.resize(comment);
    if (!list_key.empty()) {
      if (line == "],") {
        list_key.clear();
      } else {
        out[list_key] += line;
      }
      continue;
    }
    if (line == "),") {
      if (!sections.empty()) sections.pop_back();
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos || (line.back() != ',' && line.back() != '(' && line.back() != '[')) continue;
    std::string key = line.substr(0, eq);
    std::string value = line.substr(eq + 1);
    const std::string path = sections.empty() ? key : sections.back() + "." + key;
    if (value.back() == '(' && value.find("Config(") != std::string::npos && value.find(')') == std::string::npos) {
      sections.push_back(key);
      continue;
    }
    if (value == "[") {
      list_key = path;
      out[path] = "";
      continue;
    }
    if (value.back() == ',') value.pop_back();
    out[path] = value;
  }
  return out;
}

bool HasWarning(const Emission& e, const std::string& key, const std::string& text) {
  for (const Diagnostic& d : e.warnings) {
    if (d.severity == Severity::kWarning && d.key_path == key && d.message.find(text) != std::string::npos) return true;
  }
  return false;
}

// Megatron's own reading of a layout string
// (pipeline_parallel_layer_layout.py parse_str_to_list): drop commas, unroll
// "(..)*n" then "x*n", split at '|'. Returns the decoder-layer count of each
// stage, with the E/L markers checked separately.
/// The count of a "*n" suffix at `i` (advancing past it), or 1.
int RepeatAt(const std::string& s, size_t* i) {
  if (*i >= s.size() || s[*i] != '*') return 1;
  size_t j = *i + 1;
  while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
  const int n = std::stoi(s.substr(*i + 1, j - *i - 1));
  *i = j;
  return n;
}

/// One unrolling pass: with `groups`, each "(..)*n" becomes n copies of its
/// text and everything else is copied; without, each "x*n" becomes n copies
/// of x. Megatron runs the group pass first, then the single pass (no nesting).
std::string Unroll(const std::string& s, bool groups) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (groups && s[i] != '(') {
      out += s[i++];
      continue;
    }
    std::string unit(1, s[i]);
    if (groups) {
      const size_t close = s.find(')', i);
      unit = s.substr(i + 1, close - i - 1);
      i = close;
    }
    ++i;
    for (int k = RepeatAt(s, &i); k > 0; --k) out += unit;
  }
  return out;
}

// (std::regex is avoided: GCC 12's libstdc++ regex trips -Wmaybe-uninitialized
// in the sanitizer build.)
std::vector<int> UnrollLayout(std::string s, std::string* flat) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  s = Unroll(Unroll(s, /*groups=*/true), /*groups=*/false);
  *flat = s;
  std::vector<int> layers{0};
  for (char ch : s) {
    if (ch == '|') layers.push_back(0);
    if (ch == 't') ++layers.back();
  }
  return layers;
}

// ---------------------------------------------------------------------------
// Megatron-LM: one flag of one recipe per case.

constexpr const char* kAbsent = "<absent>";

struct FlagCase {
  const char* name;
  const char* recipe;
  std::vector<std::string> sets;
  const char* flag;
  const char* value;  // "" a bare flag, kAbsent not emitted
};

const FlagCase kFlagCases[] = {
    // Llama 3 405B: paper Table 3 (126 layers, 16384 hidden, FFN 53248, 128/8
    // heads of 128) and Table 4 (TP 8, PP 16, 16 sequences per DP rank x DP 128).
    {"Llama405B_Tp", "llama3-405b-h200", {}, "--tensor-model-parallel-size", "8"},
    {"Llama405B_Sp", "llama3-405b-h200", {}, "--sequence-parallel", ""},
    {"Llama405B_Pp", "llama3-405b-h200", {}, "--pipeline-model-parallel-size", "16"},
    {"Llama405B_Cp", "llama3-405b-h200", {}, "--context-parallel-size", "1"},
    // The recipe's DP-outermost order is Megatron's tp-cp-ep-pp-dp (arguments.py).
    {"Llama405B_Order", "llama3-405b-h200", {}, "--use-tp-pp-dp-mapping", ""},
    // Megatron's own split: vpp 2 and the embedding and loss counted as layers
    // (126 + 2 = 16 x 2 x 4), the paper's one-fewer-layer first and last stage.
    {"Llama405B_VppFlag", "llama3-405b-h200", {}, "--num-virtual-stages-per-pipeline-rank", "2"},
    {"Llama405B_AccountEmbedding", "llama3-405b-h200", {}, "--account-for-embedding-in-pipeline-split", ""},
    {"Llama405B_AccountLoss", "llama3-405b-h200", {}, "--account-for-loss-in-pipeline-split", ""},
    {"Llama405B_NoLayout", "llama3-405b-h200", {}, "--pipeline-model-parallel-layout", kAbsent},
    // The balanced cut is written out; its layout carries vpp, and arguments.py
    // allows only one of the two.
    {"Llama405B_BalancedNoVppFlag",
     "llama3-405b-h200",
     {"parallel.partition=balanced", "parallel.embedding_in_split=false", "parallel.loss_in_split=false"},
     "--num-virtual-stages-per-pipeline-rank",
     kAbsent},
    {"Llama405B_MicroBatch", "llama3-405b-h200", {}, "--micro-batch-size", "1"},
    {"Llama405B_GlobalBatch", "llama3-405b-h200", {}, "--global-batch-size", "2048"},
    {"Llama405B_Layers", "llama3-405b-h200", {}, "--num-layers", "126"},
    {"Llama405B_Hidden", "llama3-405b-h200", {}, "--hidden-size", "16384"},
    {"Llama405B_Ffn", "llama3-405b-h200", {}, "--ffn-hidden-size", "53248"},
    {"Llama405B_Heads", "llama3-405b-h200", {}, "--num-attention-heads", "128"},
    {"Llama405B_Gqa", "llama3-405b-h200", {}, "--group-query-attention", ""},
    {"Llama405B_KvGroups", "llama3-405b-h200", {}, "--num-query-groups", "8"},
    {"Llama405B_HeadDim", "llama3-405b-h200", {}, "--kv-channels", "128"},
    {"Llama405B_SeqLen", "llama3-405b-h200", {}, "--seq-length", "8192"},
    {"Llama405B_Swiglu", "llama3-405b-h200", {}, "--swiglu", ""},
    {"Llama405B_Untied", "llama3-405b-h200", {}, "--untie-embeddings-and-output-weights", ""},
    {"Llama405B_Adam", "llama3-405b-h200", {}, "--optimizer", "adam"},
    {"Llama405B_Zero1", "llama3-405b-h200", {}, "--use-distributed-optimizer", ""},
    {"Llama405B_Selective", "llama3-405b-h200", {}, "--recompute-granularity", "selective"},
    {"Llama405B_CoreAttn", "llama3-405b-h200", {}, "--recompute-modules", "core_attn"},
    {"Llama405B_Bf16", "llama3-405b-h200", {}, "--bf16", ""},
    // Llama 3 8B: tp 1 leaves SP off (Megatron drops it at tp 1 anyway).
    {"Llama8B_Tp", "llama3-8b-h200", {}, "--tensor-model-parallel-size", "1"},
    {"Llama8B_NoSp", "llama3-8b-h200", {}, "--sequence-parallel", kAbsent},
    {"Llama8B_Layers", "llama3-8b-h200", {}, "--num-layers", "32"},
    {"Llama8B_GlobalBatch", "llama3-8b-h200", {}, "--global-batch-size", "512"},
    {"Llama8B_NoLayout", "llama3-8b-h200", {}, "--pipeline-model-parallel-layout", kAbsent},
    // Recipe: optimizer.matrices muon; at tp 1 no TP mode is needed.
    {"Llama8B_Muon", "llama3-8b-h200", {}, "--optimizer", "muon"},
    {"Llama8B_NoMuonTpMode", "llama3-8b-h200", {}, "--muon-tp-mode", kAbsent},
    // parallel.optimizer_sharding layer_wise: the legacy whole-tensor deal the plan prices.
    {"Llama8B_LayerWise",
     "llama3-8b-h200",
     {"parallel.optimizer_sharding=layer_wise"},
     "--no-use-layer-wise-param-layout",
     ""},
    {"Llama8B_FlatKeepsTheLayout", "llama3-8b-h200", {}, "--no-use-layer-wise-param-layout", kAbsent},
    // Mixtral 8x7B (HF config): 8 experts of 14336, top-2, every layer MoE, no dense FFN.
    {"Mixtral_Ep", "mixtral-8x7b-h200", {}, "--expert-model-parallel-size", "8"},
    {"Mixtral_Etp", "mixtral-8x7b-h200", {}, "--expert-tensor-parallel-size", "1"},
    {"Mixtral_Experts", "mixtral-8x7b-h200", {}, "--num-experts", "8"},
    {"Mixtral_TopK", "mixtral-8x7b-h200", {}, "--moe-router-topk", "2"},
    {"Mixtral_ExpertFfn", "mixtral-8x7b-h200", {}, "--moe-ffn-hidden-size", "14336"},
    {"Mixtral_Layers", "mixtral-8x7b-h200", {}, "--num-layers", "32"},
    {"Mixtral_AllMoe", "mixtral-8x7b-h200", {}, "--moe-layer-freq", kAbsent},
    {"Mixtral_NoDenseFfn", "mixtral-8x7b-h200", {}, "--ffn-hidden-size", kAbsent},
    {"Mixtral_Dropless", "mixtral-8x7b-h200", {}, "--moe-expert-capacity-factor", kAbsent},
    {"Mixtral_Softmax", "mixtral-8x7b-h200", {}, "--moe-router-score-function", "softmax"},
    {"Mixtral_A2a", "mixtral-8x7b-h200", {}, "--moe-token-dispatcher-type", "alltoall"},
    // DeepSeek-V3 (HF config, report section 3.2): MLA ranks, 256 experts top-8
    // sigmoid with bias, 1 shared expert of 2048, the first 3 of 61 layers dense.
    {"DeepSeek_Mla", "deepseek-v3-h200", {}, "--multi-latent-attention", ""},
    {"DeepSeek_QLora", "deepseek-v3-h200", {}, "--q-lora-rank", "1536"},
    {"DeepSeek_KvLora", "deepseek-v3-h200", {}, "--kv-lora-rank", "512"},
    {"DeepSeek_Nope", "deepseek-v3-h200", {}, "--qk-head-dim", "128"},
    {"DeepSeek_Rope", "deepseek-v3-h200", {}, "--qk-pos-emb-head-dim", "64"},
    {"DeepSeek_V", "deepseek-v3-h200", {}, "--v-head-dim", "128"},
    {"DeepSeek_MlaHeads", "deepseek-v3-h200", {}, "--num-attention-heads", "128"},
    {"DeepSeek_NoGqa", "deepseek-v3-h200", {}, "--num-query-groups", kAbsent},
    {"DeepSeek_Experts", "deepseek-v3-h200", {}, "--num-experts", "256"},
    {"DeepSeek_TopK", "deepseek-v3-h200", {}, "--moe-router-topk", "8"},
    {"DeepSeek_Shared", "deepseek-v3-h200", {}, "--moe-shared-expert-intermediate-size", "2048"},
    {"DeepSeek_Sigmoid", "deepseek-v3-h200", {}, "--moe-router-score-function", "sigmoid"},
    {"DeepSeek_Bias", "deepseek-v3-h200", {}, "--moe-router-enable-expert-bias", ""},
    // A gated shared expert (Qwen2-MoE): arguments.py @ d98e8a6 has --moe-shared-expert-gate (store_true).
    {"DeepSeek_SharedGate", "deepseek-v3-h200", {"model.moe.shared_gate=true"}, "--moe-shared-expert-gate", ""},
    {"DeepSeek_NoSharedGate", "deepseek-v3-h200", {}, "--moe-shared-expert-gate", kAbsent},
    // moe_freq_type list: 0 for the 3 dense layers, 1 for the other 58.
    {"DeepSeek_LayerFreq", "deepseek-v3-h200", {}, "--moe-layer-freq", "([0]*3+[1]*58)"},
    {"DeepSeek_DenseFfn", "deepseek-v3-h200", {}, "--ffn-hidden-size", "18432"},
    {"DeepSeek_Layers", "deepseek-v3-h200", {}, "--num-layers", "61"},
    {"DeepSeek_Ep", "deepseek-v3-h200", {}, "--expert-model-parallel-size", "64"},
    {"DeepSeek_Pp", "deepseek-v3-h200", {}, "--pipeline-model-parallel-size", "16"},
    {"DeepSeek_GlobalBatch", "deepseek-v3-h200", {}, "--global-batch-size", "15360"},
    {"DeepSeek_Full", "deepseek-v3-h200", {}, "--recompute-granularity", "full"},
    {"DeepSeek_Uniform", "deepseek-v3-h200", {}, "--recompute-method", "uniform"},
    {"DeepSeek_OneLayer", "deepseek-v3-h200", {}, "--recompute-num-layers", "1"},
    // Nemotron-H 8B: the HF config's hybrid_override_pattern letter for letter
    // (tests/data/hf/nemotron-h-8b.json, quoted in the recipe), pp 1 so no '|'.
    {"NemotronH_Pattern",
     "nemotron-h-8b-h200",
     {},
     "--hybrid-layer-pattern",
     "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"},
    // The pattern sets the layer count (examples/mamba/README.md).
    {"NemotronH_NoNumLayers", "nemotron-h-8b-h200", {}, "--num-layers", kAbsent},
    // 26 | 26: the first 26 letters of that pattern, then the other 26.
    {"NemotronH_PinnedPp2",
     "nemotron-h-8b-h200",
     {"parallel.pp=2", "parallel.stage_boundaries=[26]"},
     "--hybrid-layer-pattern",
     "M-M-M-M*-M-M-M-M-M*-M-M-M-|M-M*-M-M-M-M-M*-M-M-M-M-M-"},
    {"NemotronH_Relu2", "nemotron-h-8b-h200", {}, "--squared-relu", ""},
    {"NemotronH_NoSwiglu", "nemotron-h-8b-h200", {}, "--swiglu", kAbsent},
    {"NemotronH_Ffn", "nemotron-h-8b-h200", {}, "--ffn-hidden-size", "21504"},
    // 128 Mamba heads of 64 = expand 2 x hidden 4096 / 64; 8 groups, d_state 128.
    {"NemotronH_MambaHeads", "nemotron-h-8b-h200", {}, "--mamba-num-heads", "128"},
    {"NemotronH_MambaHeadDim", "nemotron-h-8b-h200", {}, "--mamba-head-dim", "64"},
    {"NemotronH_MambaGroups", "nemotron-h-8b-h200", {}, "--mamba-num-groups", "8"},
    {"NemotronH_MambaState", "nemotron-h-8b-h200", {}, "--mamba-state-dim", "128"},
    {"NemotronH_NoRope", "nemotron-h-8b-h200", {}, "--position-embedding-type", "none"},
    // nam56r: tp 4 with SP, pp 4, ep 8 over the stage's 16 ranks, expert TP 1
    // (given although Megatron's default would be tp), 1 shared expert of 2048.
    {"Nam56r_Tp", "nam56r-h200", {}, "--tensor-model-parallel-size", "4"},
    {"Nam56r_Sp", "nam56r-h200", {}, "--sequence-parallel", ""},
    {"Nam56r_Pp", "nam56r-h200", {}, "--pipeline-model-parallel-size", "4"},
    {"Nam56r_Ep", "nam56r-h200", {}, "--expert-model-parallel-size", "8"},
    {"Nam56r_Etp", "nam56r-h200", {}, "--expert-tensor-parallel-size", "1"},
    {"Nam56r_Capacity", "nam56r-h200", {}, "--moe-expert-capacity-factor", "1.25"},
    {"Nam56r_Shared", "nam56r-h200", {}, "--moe-shared-expert-intermediate-size", "2048"},
    {"Nam56r_Muon", "nam56r-h200", {}, "--optimizer", "muon"},
    // The plan prices Megatron's duplicated TP Muon (docs/plan.md, muon_tp_gather).
    {"Nam56r_MuonTp", "nam56r-h200", {}, "--muon-tp-mode", "duplicated"},
    // R has no Megatron symbol: no pattern at all rather than an invented one.
    {"Nam56r_NoPattern", "nam56r-h200", {}, "--hybrid-layer-pattern", kAbsent},
    // Llama 3 8B with pinned stages: cuts at sublayers 14, 32, 50 are layers
    // Boundaries 7, 16, 25 (layers) -> 7, 9, 9, 7 layers; embedding first, loss last.
    {"Llama8B_PinnedLayout",
     "llama3-8b-h200",
     {"parallel.pp=4", "parallel.stage_boundaries=[7, 16, 25]"},
     "--pipeline-model-parallel-layout",
     "Et*7|t*9|t*9|t*7L"},
    // Pinned 8 | 8 | 8 | 8 layers: Megatron's even split, no layout needed.
    {"Llama8B_EvenSplit",
     "llama3-8b-h200",
     {"parallel.pp=4", "parallel.stage_boundaries=[8, 16, 24]"},
     "--pipeline-model-parallel-layout",
     kAbsent},
    {"Llama8B_EvenVpp",
     "llama3-8b-h200",
     {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "parallel.stage_boundaries=[8, 16, 24]"},
     "--num-virtual-stages-per-pipeline-rank",
     "2"},
    // Megatron's uneven first/last stage: the same flags reproduce it.
    {"Llama8B_FirstStage",
     "llama3-8b-h200",
     {"parallel.pp=4", "parallel.first_stage_layers=5", "parallel.last_stage_layers=9"},
     "--decoder-first-pipeline-num-layers",
     "5"},
    {"Llama8B_LastStage",
     "llama3-8b-h200",
     {"parallel.pp=4", "parallel.first_stage_layers=5", "parallel.last_stage_layers=9"},
     "--decoder-last-pipeline-num-layers",
     "9"},
    // ZeRO 0: DDP; 2 and 3: Megatron-FSDP, which needs the fsdp_dtensor format (arguments.py).
    // One MTP module's weights at every depth (MultiTokenPredictionBlock, mtp_use_repeated_layer).
    {"Mtp_SharedLayer",
     "llama3-8b-h200",
     {"model.mtp_layers=2", "model.mtp_shared_layer=true"},
     "--mtp-use-repeated-layer",
     ""},
    {"Mtp_Apart", "llama3-8b-h200", {"model.mtp_layers=2"}, "--mtp-use-repeated-layer", kAbsent},
    // A hybrid's MTP depths follow its pattern after '/' (hybrid_layer_allocation.py parse_hybrid_pattern).
    {"Mtp_HybridDepths",
     "jamba-v0.1-h200",
     {"model.mtp_layers=2", "parallel.pp=1", "parallel.ep=8"},
     "--hybrid-layer-pattern",
     "M-MEM-ME*-MEM-MEM-MEM-ME*-MEM-MEM-MEM-ME*-MEM-MEM-MEM-ME*-MEM-ME/*E/*E"},
    {"Zero0_NoDistOpt", "llama3-8b-h200", {"parallel.zero=0"}, "--use-distributed-optimizer", kAbsent},
    {"Zero2_Fsdp", "llama3-8b-h200", {"parallel.zero=2"}, "--use-megatron-fsdp", ""},
    {"Zero2_Strategy", "llama3-8b-h200", {"parallel.zero=2"}, "--data-parallel-sharding-strategy", "optim_grads"},
    {"Zero3_Strategy",
     "llama3-8b-h200",
     {"parallel.zero=3"},
     "--data-parallel-sharding-strategy",
     "optim_grads_params"},
    {"Zero3_CkptFormat", "llama3-8b-h200", {"parallel.zero=3"}, "--ckpt-format", "fsdp_dtensor"},
    // CP 2 with the all-gather exchange: TransformerConfig.cp_comm_type @ d98e8a6 takes "p2p", "all_gather",
    // "a2a" or "a2a+p2p" and hands it to Transformer Engine, whose context_parallel.py branches on
    // "all_gather" (arguments.py's help text says "allgather", which TE does not know).
    {"Cp_AllGather",
     "llama3-8b-h200",
     {"parallel.cp=2", "parallel.cp_comm=all_gather"},
     "--cp-comm-type",
     "all_gather"},
};

class MegatronFlag : public ::testing::TestWithParam<FlagCase> {};

TEST_P(MegatronFlag, MatchesRecipe) {
  const FlagCase& c = GetParam();
  const Emission e = EmitFor(EmitTarget::kMegatron, c.recipe, c.sets);
  const std::map<std::string, std::string> flags = MegatronFlags(e.text);
  const auto it = flags.find(c.flag);
  if (std::string(c.value) == kAbsent) {
    EXPECT_EQ(it, flags.end()) << c.flag << "\n" << e.text;
  } else {
    ASSERT_NE(it, flags.end()) << c.flag << "\n" << e.text;
    EXPECT_EQ(it->second, c.value) << e.text;
  }
}

INSTANTIATE_TEST_SUITE_P(All, MegatronFlag, ::testing::ValuesIn(kFlagCases),
                         [](const auto& test_info) { return std::string(test_info.param.name); });

// Shell-ready: comment lines first (a '#' inside a continued command would end
// it), then one flag a line, each but the last continued with " \".
TEST(EmitMegatron, ShellReadyBlock) {
  for (const char* recipe : {"nam56r-h200", "llama3-405b-h200", "deepseek-v3-h200", "nemotron-h-8b-h200"}) {
    const std::vector<std::string> lines = Lines(EmitFor(EmitTarget::kMegatron, recipe).text);
    size_t first_flag = 0;
    while (first_flag < lines.size() && lines[first_flag].rfind("# ", 0) == 0) ++first_flag;
    ASSERT_LT(first_flag, lines.size()) << recipe;
    for (size_t i = first_flag; i < lines.size(); ++i) {
      EXPECT_EQ(lines[i].rfind("--", 0), 0u) << recipe << ": " << lines[i];
      const bool continued = lines[i].size() > 2 && lines[i].compare(lines[i].size() - 2, 2, " \\") == 0;
      EXPECT_EQ(continued, i + 1 < lines.size()) << recipe << ": " << lines[i];
    }
  }
}

// Llama 3 405B as planned: the layout holds pp 16 x vpp 2 = 32 chunks of the
// 126 layers, the embedding on the first and the loss on the last, read with
// Megatron's own unrolling rules.
TEST(EmitMegatron, Llama405BLayoutHoldsThePlan) {
  const Emission e =
      EmitFor(EmitTarget::kMegatron, "llama3-405b-h200",
              {"parallel.partition=balanced", "parallel.embedding_in_split=false", "parallel.loss_in_split=false"});
  const std::string layout = MegatronFlags(e.text)["--pipeline-model-parallel-layout"];
  ASSERT_FALSE(layout.empty()) << e.text;
  std::string flat;
  const std::vector<int> stages = UnrollLayout(layout, &flat);
  EXPECT_EQ(stages.size(), 32u) << layout;
  int total = 0;
  for (int n : stages) {
    EXPECT_GE(n, 1) << layout;
    total += n;
  }
  EXPECT_EQ(total, 126) << layout;
  EXPECT_EQ(flat.front(), 'E') << flat;
  EXPECT_EQ(flat.back(), 'L') << flat;
}

/// Layers per chunk of the plan MakePlan prices for `r`.
std::vector<int64_t> PlannedLayers(const Recipe& r) {
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, LayoutOf(r));
  std::vector<int64_t> out;
  if (!planned.plan) return out;
  for (const StageChunk& c : planned.plan->stages.chunks) {
    const LayerRange range = LayerRangeOf(c, inv.layer_starts);
    out.push_back(range.end - range.first);
  }
  return out;
}

// The emitted arguments run the partition the plan priced: read back by
// `import megatron` (with the tokenizer the emitter leaves out), the recipe
// they make is priced on the same chunks, for Megatron's own split with the
// embedding and loss accounted (405B), an uneven first/last stage, a pinned
// cut and the balanced cut (both as --pipeline-model-parallel-layout) and a
// hybrid's '|' cuts.
TEST(EmitMegatron, EmittedStagesReadBackAsThePricedPartition) {
  struct Case {
    std::string recipe;
    std::vector<std::string> sets;
    int64_t nodes;
  };
  const std::vector<Case> cases = {
      {"llama3-405b-h200", {}, 2048},
      {"llama3-8b-h200", {"parallel.pp=4", "parallel.first_stage_layers=5", "parallel.last_stage_layers=9"}, 4},
      {"llama3-8b-h200", {"parallel.pp=4", "parallel.stage_boundaries=[7, 16, 25]"}, 4},
      {"llama3-8b-h200", {"parallel.pp=4", "parallel.partition=balanced"}, 4},
      {"nemotron-h-8b-h200", {"parallel.pp=4", "cluster.nodes=4"}, 4},
  };
  for (const Case& c : cases) {
    std::vector<Override> overrides;
    for (const std::string& s : c.sets) overrides.push_back(*ParseOverride(s));
    const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/" + c.recipe + ".yaml"), overrides);
    ASSERT_TRUE(loaded.ok()) << c.recipe;
    const Emission e = EmitFor(EmitTarget::kMegatron, c.recipe, c.sets);
    // The emitter leaves the tokenizer to the user; NullTokenizer adds the EOD token.
    const std::string args = e.text + " \\\n--tokenizer-type NullTokenizer \\\n--vocab-size " +
                             std::to_string(loaded.recipe->model.vocab - 1) + "\n";
    const MegatronImport imported = ImportMegatronArgs(args, "emitted.sh");
    ASSERT_TRUE(imported.ok()) << c.recipe << "\n" << args;
    std::vector<Diagnostic> errors;
    const std::string yaml =
        EmitMegatronRecipe(imported, {{"cluster.nodes", std::to_string(c.nodes)}}, "rt", "emitted.sh", &errors);
    const LoadResult back = LoadRecipeFromString(yaml, "rt.yaml");
    ASSERT_TRUE(back.ok()) << c.recipe << "\n" << yaml << Format(back.diagnostics.front());
    const std::vector<int64_t> priced = PlannedLayers(*loaded.recipe);
    ASSERT_EQ(static_cast<int64_t>(priced.size()), loaded.recipe->parallel.pp * loaded.recipe->parallel.vpp)
        << c.recipe;
    EXPECT_EQ(PlannedLayers(*back.recipe), priced) << c.recipe << "\n" << e.text;
  }
}

// Whatever the partition, a hybrid pattern is the recipe's letters mapped
// A -> *, M -> M, E -> E, with one '|' per stage cut: nam56r without its R
// block is "*EME" x 3 a period, 4 periods, in pp 4 segments.
TEST(EmitMegatron, HybridPatternMapsEveryLetter) {
  const Emission e = EmitFor(EmitTarget::kMegatron, "nam56r-h200", {"model.pattern=AEMEAEMEAEME"});
  std::string pattern = MegatronFlags(e.text)["--hybrid-layer-pattern"];
  ASSERT_FALSE(pattern.empty()) << e.text;
  const size_t segments = 1 + static_cast<size_t>(std::count(pattern.begin(), pattern.end(), '|'));
  EXPECT_EQ(segments, 4u) << pattern;
  pattern.erase(std::remove(pattern.begin(), pattern.end(), '|'), pattern.end());
  std::string expected;
  for (int i = 0; i < 12; ++i) expected += "*EME";
  EXPECT_EQ(pattern, expected);
}

struct WarningCase {
  const char* name;
  EmitTarget target;
  const char* recipe;
  std::vector<std::string> sets;
  const char* key;
  const char* text;  // part of the message
};

const WarningCase kWarningCases[] = {
    // Megatron's layer symbols are M * - E (examples/mamba/README.md): no R.
    {"Megatron_Recurrent", EmitTarget::kMegatron, "nam56r-h200", {}, "model.pattern", "R (recurrent)"},
    // Recipe chunk 256; Megatron's MambaMixer uses 128 and has no flag (docs/formulas.md §0).
    {"Megatron_MambaChunk", EmitTarget::kMegatron, "nam56r-h200", {}, "model.mamba.chunk", "SSD chunk"},
    // docs/formulas.md §9.4: Megatron's Muon takes the router; the recipe gives it to AdamW.
    {"Megatron_MuonRouter", EmitTarget::kMegatron, "mixtral-8x7b-h200", {}, "training.optimizer.router", "router"},
    {"Megatron_DualPipe", EmitTarget::kMegatron, "deepseek-v3-h200", {}, "parallel.schedule", "DualPipe"},
    {"Megatron_DualPipeV",
     EmitTarget::kMegatron,
     "deepseek-v3-h200",
     {"parallel.schedule=dualpipev"},
     "parallel.schedule",
     "DualPipeV"},
    // arguments.py @ 000c4ac: "Muon optimizer does not support Megatron-FSDP".
    {"Megatron_MuonFsdp", EmitTarget::kMegatron, "llama3-8b-h200", {"parallel.zero=3"}, "parallel.zero", "Muon"},
    {"Torchtitan_Hybrid", EmitTarget::kTorchtitan, "nemotron-h-8b-h200", {}, "model.pattern", "Mamba-2"},
    {"Torchtitan_Zero1", EmitTarget::kTorchtitan, "llama3-8b-h200", {}, "parallel.zero", "ZeRO-1"},
    {"Torchtitan_Order", EmitTarget::kTorchtitan, "llama3-405b-h200", {}, "parallel.order", "[pp, dp_replicate"},
    {"Torchtitan_DualPipe", EmitTarget::kTorchtitan, "deepseek-v3-h200", {}, "parallel.schedule", "DualPipe"},
    {"Torchtitan_Muon", EmitTarget::kTorchtitan, "mixtral-8x7b-h200", {}, "training.optimizer.matrices", "Muon"},
    {"Torchtitan_Ulysses",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"parallel.cp=2", "parallel.cp_comm=a2a"},
     "parallel.cp_comm",
     "all-gathers K/V"},
    // Keys the field table marks as having no framework setting (kNoCounterpart).
    {"Megatron_Handoff",
     EmitTarget::kMegatron,
     "nemotron-h-8b-h200",
     {"parallel.cp=2", "parallel.cp_recurrent=handoff"},
     "parallel.cp_recurrent",
     "no setting for parallel.cp_recurrent = handoff"},
    {"Megatron_NoLoadBalance",
     EmitTarget::kMegatron,
     "llama3-8b-h200",
     {"parallel.cp=2", "parallel.cp_load_balance=false"},
     "parallel.cp_load_balance",
     "no setting for parallel.cp_load_balance = false"},
    {"Megatron_MuonMomentum",
     EmitTarget::kMegatron,
     "llama3-8b-h200",
     {"training.optimizer.muon_momentum=bf16"},
     "training.optimizer.muon_momentum",
     "= bf16"},
    // Issue "launch configs": fp8 activations priced 18 GiB lower, emitted text unchanged.
    {"Megatron_Fp8Activations",
     EmitTarget::kMegatron,
     "llama3-8b-h200",
     {"training.precision.activations=fp8"},
     "training.precision.activations",
     "activations in the bf16 compute dtype"},
    {"Torchtitan_Biases",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"model.linear_bias=true"},
     "model.linear_bias",
     "llama3 8B has no linear biases"},
    {"Torchtitan_ExpertTp",
     EmitTarget::kTorchtitan,
     "mixtral-8x7b-h200",
     {"parallel.expert_tp=2"},
     "parallel.expert_tp",
     "= 2"},
    // Dropped before issue 18 (fp8/fp16 activations, cp_recurrent handoff,
    // cp_load_balance false): each is now a refusal naming its key, per emitter.
    {"Megatron_Fp16Activations",
     EmitTarget::kMegatron,
     "llama3-8b-h200",
     {"training.precision.activations=fp16"},
     "training.precision.activations",
     "activations in the bf16 compute dtype"},
    {"Torchtitan_Fp8Activations",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"training.precision.activations=fp8"},
     "training.precision.activations",
     "bf16 compute dtype"},
    {"Torchtitan_Fp16Activations",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"training.precision.activations=fp16"},
     "training.precision.activations",
     "bf16 compute dtype"},
    {"Torchtitan_Handoff",
     EmitTarget::kTorchtitan,
     "nemotron-h-8b-h200",
     {"parallel.cp=2", "parallel.cp_recurrent=handoff"},
     "parallel.cp_recurrent",
     "no setting for parallel.cp_recurrent = handoff"},
    // The load balancer is a torchtitan field (context_parallel_load_balancer =
    // None); Megatron has none (Megatron_NoLoadBalance above).
    // configs.py @ b5bcd76: mixed_precision_reduce: Literal["float32"].
    {"Torchtitan_Bf16Reduce",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"training.precision.grads=bf16"},
     "training.precision.grads",
     "float32 only"},
    // No torchtitan model flavor: Mixtral 8x7B; Llama 3 8B with another width.
    {"Torchtitan_NoFlavor",
     EmitTarget::kTorchtitan,
     "mixtral-8x7b-h200",
     {},
     "model.pattern",
     "no torchtitan model flavor"},
    {"Torchtitan_WiderLlama",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"model.mlp.ffn_hidden=16384"},
     "model.pattern",
     "dense FFN 14336 (recipe 16384)"},
    {"Torchtitan_TransformerEngine",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {},
     "training.transformer_engine",
     "plain PyTorch"},
    {"Torchtitan_Selective", EmitTarget::kTorchtitan, "llama3-8b-h200", {}, "training.recompute", "per-op policy"},
    {"Torchtitan_CpRing",
     EmitTarget::kTorchtitan,
     "llama3-8b-h200",
     {"parallel.cp=2"},
     "parallel.cp_comm",
     "all-gathers"},
    // parallel_dims.py @ b5bcd76: ep must divide dp_shard x cp x tp; DDP (zero 0)
    // leaves dp_shard 1, so 8 expert ranks cannot be found.
    {"Torchtitan_EpNeedsShard",
     EmitTarget::kTorchtitan,
     "mixtral-8x7b-h200",
     {"parallel.zero=0"},
     "parallel.ep",
     "= 1 x 1 x 1 = 1"},
};

class EmitWarning : public ::testing::TestWithParam<WarningCase> {};

TEST_P(EmitWarning, NamesTheKey) {
  const WarningCase& c = GetParam();
  const Emission e = EmitFor(c.target, c.recipe, c.sets);
  EXPECT_TRUE(HasWarning(e, c.key, c.text)) << c.key << " / " << c.text << "\n" << e.text;
  // Every warning is also said in the emitted comments, and refuses the
  // emission: a # WARNING: block opens the text, naming the key.
  EXPECT_NE(e.text.find("# cannot express: "), std::string::npos);
  EXPECT_EQ(e.text.rfind("# WARNING: ", 0), 0u) << e.text;
  EXPECT_NE(e.text.find(std::string("# WARNING: - ") + c.key + " = "), std::string::npos) << e.text;
  EXPECT_FALSE(e.refusals.empty());
}

INSTANTIATE_TEST_SUITE_P(All, EmitWarning, ::testing::ValuesIn(kWarningCases),
                         [](const auto& test_info) { return std::string(test_info.param.name); });

// Every key says how each framework spells it, or that it has no setting
// (the emitters' "cannot express" check reads it), or that it is preflight's own.
TEST(EmitWarning, EveryRecipeKeyHasBothSpellings) {
  for (const RecipeField& f : RecipeFields()) {
    if (f.kind == FieldKind::kSection) continue;
    EXPECT_FALSE(f.megatron.empty()) << f.path;
    EXPECT_FALSE(f.torchtitan.empty()) << f.path;
  }
}

// Every enum or bool key the field table says a framework has no setting
// for, set away from its default on a recipe where it matters (nam56r with
// CP 2: attention, Mamba, MoE, R blocks, Muon, TP, PP), is named in a warning
// and refuses the emission: nothing the plan prices is dropped silently.
TEST(EmitWarning, EveryKeyWithoutCounterpartRefuses) {
  int checked = 0;
  for (EmitTarget target : {EmitTarget::kMegatron, EmitTarget::kTorchtitan}) {
    for (const RecipeField& f : RecipeFields()) {
      const std::string_view spelling = target == EmitTarget::kMegatron ? f.megatron : f.torchtitan;
      if (spelling != kNoCounterpart || (f.kind != FieldKind::kBool && f.kind != FieldKind::kEnum)) continue;
      const std::string runs = DefaultText(f);
      std::string other;
      if (f.kind == FieldKind::kBool) other = runs == "true" ? "false" : "true";
      for (const std::string& n : f.names) {
        if (other.empty() && n != runs) other = n;
      }
      if (other.empty()) continue;  // an enum of one word (optimizer.other)
      std::vector<std::string> sets = {"parallel.cp=2", std::string(f.path) + "=" + other};
      // What the recipe parser requires with the key (docs/recipe.md).
      if (f.path == "parallel.fsdp_cpu_offload") {
        sets.insert(sets.end(), {"parallel.zero=3", "training.optimizer.matrices=adamw"});
      }
      if (f.path == "training.recompute_method") sets.push_back("training.recompute=full");
      if (f.path == "training.precision.fp4_params") {
        sets.insert(sets.end(), {"cluster.gpu=gb200", "training.precision.fp4=nvfp4"});
      }
      const Emission e = EmitFor(target, "nam56r-h200", sets);
      EXPECT_TRUE(HasWarning(e, std::string(f.path), "")) << Name(target) << " " << f.path << "=" << other;
      bool refused = false;
      for (const std::string& r : e.refusals) refused |= r.rfind(std::string(f.path) + " = ", 0) == 0;
      EXPECT_TRUE(refused) << Name(target) << " " << f.path;
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
}

// A key without a setting at its default, or where it does not matter, says nothing.
TEST(EmitWarning, DefaultOrIrrelevantKeysSayNothing) {
  // cp_recurrent only matters with M or R layers under CP; Llama 3 has neither.
  const Emission e = EmitFor(EmitTarget::kMegatron, "llama3-8b-h200",
                             {"training.optimizer.matrices=adamw", "parallel.zero=0", "parallel.cp_recurrent=handoff"});
  EXPECT_EQ(e.text.find("cannot express"), std::string::npos) << e.text;
}

TEST(EmitWarning, NoneForAPlainTransformer) {
  // Llama 3 8B at tp 1, pp 1 with AdamW and ZeRO-1: Megatron expresses all of it.
  const Emission e = EmitFor(EmitTarget::kMegatron, "llama3-8b-h200", {"training.optimizer.matrices=adamw"});
  EXPECT_TRUE(e.warnings.empty()) << Format(e.warnings.front());
  EXPECT_TRUE(e.refusals.empty()) << e.refusals.front();
  EXPECT_EQ(e.text.find("cannot express"), std::string::npos) << e.text;
  EXPECT_EQ(e.text.find("WARNING"), std::string::npos) << e.text;
}

// The issue's example: Llama 3 8B at micro-batch 4 without recompute is
// 79.9 GiB over an H200 (fit says so), and Megatron-LM would run out of
// memory: refused by both emitters with the fit verdict as the reason.
TEST(EmitRefusal, DoesNotFit) {
  for (EmitTarget target : {EmitTarget::kMegatron, EmitTarget::kTorchtitan}) {
    const Emission e = EmitFor(target, "llama3-8b-h200", {"training.micro_batch=4", "training.recompute=none"});
    ASSERT_FALSE(e.refusals.empty()) << Name(target);
    EXPECT_NE(e.refusals.front().find("the plan does not fit: stage 0 over capacity by"), std::string::npos)
        << e.refusals.front();
    EXPECT_EQ(e.text.rfind("# WARNING: ", 0), 0u) << e.text;
    EXPECT_NE(e.text.find("# WARNING: - the plan does not fit"), std::string::npos) << e.text;
  }
}

// Muon with ZeRO 2/3 is Megatron-FSDP, which validate_args @ d98e8a6
// rejects for every emerging optimizer; DualPipeV has no Megatron schedule.
TEST(EmitRefusal, MegatronCannotRun) {
  for (const char* zero : {"parallel.zero=2", "parallel.zero=3"}) {
    const Emission e = EmitFor(EmitTarget::kMegatron, "llama3-8b-h200", {zero});
    EXPECT_TRUE(HasWarning(e, "parallel.zero", "Emerging optimizer does not support Megatron-FSDP")) << e.text;
    EXPECT_FALSE(e.refusals.empty()) << zero;
  }
  const Emission dualpipev = EmitFor(EmitTarget::kMegatron, "deepseek-v3-h200", {"parallel.schedule=dualpipev"});
  EXPECT_TRUE(HasWarning(dualpipev, "parallel.schedule", "no DualPipeV")) << dualpipev.text;
  EXPECT_EQ(MegatronFlags(dualpipev.text).count("--pipeline-model-parallel-layout"), 0u);
  // The default recipe: its R blocks have no Megatron layer.
  EXPECT_FALSE(EmitFor(EmitTarget::kMegatron, "nam56r-h200").refusals.empty());
}

// A selective recompute of no module recomputes nothing: no recompute flags
// (--recompute-modules takes nargs='+' at d98e8a6, so a bare flag is a parse error).
TEST(EmitMegatron, SelectiveWithoutModulesIsNoRecompute) {
  const std::map<std::string, std::string> flags =
      MegatronFlags(EmitFor(EmitTarget::kMegatron, "llama3-8b-h200", {"training.recompute_modules=[]"}).text);
  EXPECT_EQ(flags.count("--recompute-modules"), 0u);
  EXPECT_EQ(flags.count("--recompute-granularity"), 0u);
}

// Each emitter names the upstream it targets (commit and date) in its header.
TEST(EmitHeader, NamesTheUpstream) {
  EXPECT_NE(EmitFor(EmitTarget::kMegatron, "llama3-8b-h200").text.find("# target: NVIDIA/Megatron-LM d98e8a6"),
            std::string::npos);
  EXPECT_NE(
      EmitFor(EmitTarget::kTorchtitan, "llama3-8b-h200").text.find("# target: pytorch/torchtitan b5bcd76 (2026-08-21)"),
      std::string::npos);
}

// ---------------------------------------------------------------------------
// torchtitan: one key of one recipe per case.

struct KeyCase {
  const char* name;
  const char* recipe;
  std::vector<std::string> sets;
  const char* key;    // "section.key"
  const char* value;  // as written in TOML, kAbsent not emitted
};

// The fields are TrainingConfig's and ParallelismConfig's at b5bcd76
// (torchtitan/config/configs.py): tokens, not sequences.
const KeyCase kKeyCases[] = {
    // Llama 3 405B (paper Table 4): TP 8, PP 16, DP 128, interleaved 1F1B;
    // torchtitan's llama3 registry has the 405B flavor.
    {"Llama405B_Model", "llama3-405b-h200", {}, "model_spec", "model_registry(\"405B\")"},
    {"Llama405B_Tp", "llama3-405b-h200", {}, "parallelism.tensor_parallel_degree", "8"},
    {"Llama405B_Pp", "llama3-405b-h200", {}, "parallelism.pipeline_parallel_degree", "16"},
    {"Llama405B_Schedule", "llama3-405b-h200", {}, "parallelism.pipeline_parallel_schedule", "\"Interleaved1F1B\""},
    // 16 sequences per DP rank (paper), micro-batches of one: 16 pipeline micro-batches.
    {"Llama405B_Microbatches", "llama3-405b-h200", {}, "parallelism.num_pp_microbatches", "16"},
    // ZeRO-1 maps to FSDP2 over the 128 DP ranks (no replicate group).
    {"Llama405B_Shard", "llama3-405b-h200", {}, "parallelism.data_parallel_shard_degree", "128"},
    {"Llama405B_Replicate", "llama3-405b-h200", {}, "parallelism.data_parallel_replicate_degree", "1"},
    {"Llama405B_NoCp", "llama3-405b-h200", {}, "parallelism.context_parallel_degree", kAbsent},
    // One micro-batch of 1 x 8192 tokens; a step of 2048 x 8192.
    {"Llama405B_MicroTokens", "llama3-405b-h200", {}, "training.num_tokens_per_microbatch_per_dp_rank", "8192"},
    {"Llama405B_StepTokens", "llama3-405b-h200", {}, "training.num_tokens_per_train_step", "16777216"},
    {"Llama405B_Context", "llama3-405b-h200", {}, "training.max_context_length", "8192"},
    // PP forbids CUDA graphs (Trainer.Config._validate_cuda_graphs).
    {"Llama405B_NoGraphs", "llama3-405b-h200", {}, "training.disable_cuda_graphs", "True"},
    {"Llama405B_Ac", "llama3-405b-h200", {}, "activation_checkpoint", "SelectiveAC.Config()"},
    {"Llama405B_AdamW", "llama3-405b-h200", {}, "optimizer", "default_adamw()"},
    // Llama 3 8B: pp 1, so no pipeline fields and CUDA graphs stay allowed.
    {"Llama8B_Model", "llama3-8b-h200", {}, "model_spec", "model_registry(\"8B\")"},
    {"Llama8B_MicroTokens", "llama3-8b-h200", {}, "training.num_tokens_per_microbatch_per_dp_rank", "8192"},
    {"Llama8B_NoSchedule", "llama3-8b-h200", {}, "parallelism.pipeline_parallel_schedule", kAbsent},
    {"Llama8B_Graphs", "llama3-8b-h200", {}, "training.disable_cuda_graphs", kAbsent},
    {"Llama8B_Zero0", "llama3-8b-h200", {"parallel.zero=0"}, "parallelism.data_parallel_replicate_degree", "32"},
    {"Llama8B_Zero0Shard", "llama3-8b-h200", {"parallel.zero=0"}, "parallelism.data_parallel_shard_degree", "1"},
    {"Llama8B_Zero3", "llama3-8b-h200", {"parallel.zero=3"}, "parallelism.fsdp_reshard_after_forward", "\"always\""},
    {"Llama8B_Zero2", "llama3-8b-h200", {"parallel.zero=2"}, "parallelism.fsdp_reshard_after_forward", "\"never\""},
    {"Llama8B_NoRecompute", "llama3-8b-h200", {"training.recompute=none"}, "activation_checkpoint", "None"},
    {"Llama8B_Full", "llama3-8b-h200", {"training.recompute=full"}, "activation_checkpoint", "FullAC.Config()"},
    // torchtitan's per-op policy is its SelectiveAC (no "cannot" note).
    {"Llama8B_SelectiveOp",
     "llama3-8b-h200",
     {"training.recompute=selective_op"},
     "activation_checkpoint",
     "SelectiveAC.Config()"},
    {"Llama8B_Cp", "llama3-8b-h200", {"parallel.cp=2"}, "parallelism.context_parallel_degree", "2"},
    {"Llama8B_CpNoBalance",
     "llama3-8b-h200",
     {"parallel.cp=2", "parallel.cp_load_balance=false"},
     "parallelism.context_parallel_load_balancer",
     "None"},
    {"Llama8B_TpNoSp", "llama3-8b-h200", {"parallel.tp=2"}, "parallelism.enable_sequence_parallel", "False"},
    {"Llama8B_TpSp",
     "llama3-8b-h200",
     {"parallel.tp=2", "parallel.sp=true"},
     "parallelism.enable_sequence_parallel",
     kAbsent},
    {"Llama8B_MasterNone", "llama3-8b-h200", {"training.precision.master=none"}, "training.dtype", "\"bfloat16\""},
    {"Llama8B_Fp32",
     "llama3-8b-h200",
     {"training.precision.params=fp32"},
     "training.mixed_precision_param",
     "\"float32\""},
    // Mixtral has no torchtitan model: EP 8 over the dense DP 64, the model left to the user.
    {"Mixtral_Ep", "mixtral-8x7b-h200", {}, "parallelism.expert_parallel_degree", "8"},
    {"Mixtral_Shard", "mixtral-8x7b-h200", {}, "parallelism.data_parallel_shard_degree", "64"},
    {"Mixtral_NoModel", "mixtral-8x7b-h200", {}, "model_spec", "None"},
    // DeepSeek-V3: the 671B flavor with its MTP module, 240 micro-batches of 1 per DP rank, EP 64, full recompute.
    {"DeepSeek_Model", "deepseek-v3-h200", {}, "model_spec", "model_registry(\"671B\", num_mtp_layers=1)"},
    {"DeepSeek_Microbatches", "deepseek-v3-h200", {}, "parallelism.num_pp_microbatches", "240"},
    {"DeepSeek_Ep", "deepseek-v3-h200", {}, "parallelism.expert_parallel_degree", "64"},
    {"DeepSeek_Ac", "deepseek-v3-h200", {}, "activation_checkpoint", "FullAC.Config()"},
    {"DeepSeek_DualPipeV",
     "deepseek-v3-h200",
     {"parallel.schedule=dualpipev"},
     "parallelism.pipeline_parallel_schedule",
     "\"DualPipeV\""},
    // Qwen3-30B-A3B: the registry's 30B-A3B flavor.
    {"Qwen3Moe_Model", "qwen3-30b-a3b-h200", {}, "model_spec", "model_registry(\"30B-A3B\")"},
    {"GptOss_Model", "gpt-oss-120b-h200", {}, "model_spec", "model_registry(\"120b\")"},
    // Nemotron-H: tp 1, dp 8; no Mamba model upstream.
    {"NemotronH_Shard", "nemotron-h-8b-h200", {}, "parallelism.data_parallel_shard_degree", "8"},
    {"NemotronH_NoExperts", "nemotron-h-8b-h200", {}, "parallelism.expert_parallel_degree", kAbsent},
    // nam56r: the default recipe's degrees.
    {"Nam56r_Tp", "nam56r-h200", {}, "parallelism.tensor_parallel_degree", "4"},
    {"Nam56r_Pp", "nam56r-h200", {}, "parallelism.pipeline_parallel_degree", "4"},
    {"Nam56r_Ep", "nam56r-h200", {}, "parallelism.expert_parallel_degree", "8"},
    {"Nam56r_Microbatches", "nam56r-h200", {}, "parallelism.num_pp_microbatches", "128"},
    // No torchtitan model for M/R: no module names to split by.
    {"Nam56r_NoFqns", "nam56r-h200", {}, "parallelism.module_fqns_per_model_part", kAbsent},
};

class TorchtitanKey : public ::testing::TestWithParam<KeyCase> {};

TEST_P(TorchtitanKey, MatchesRecipe) {
  const KeyCase& c = GetParam();
  const Emission e = EmitFor(EmitTarget::kTorchtitan, c.recipe, c.sets);
  const std::map<std::string, std::string> keys = PyKeys(e.text);
  const auto it = keys.find(c.key);
  if (std::string(c.value) == kAbsent) {
    EXPECT_EQ(it, keys.end()) << c.key << "\n" << e.text;
  } else {
    ASSERT_NE(it, keys.end()) << c.key << "\n" << e.text;
    EXPECT_EQ(it->second, c.value) << e.text;
  }
}

INSTANTIATE_TEST_SUITE_P(All, TorchtitanKey, ::testing::ValuesIn(kKeyCases),
                         [](const auto& test_info) { return std::string(test_info.param.name); });

// Each upstream flavor's architecture, transcribed from its registry
// (torchtitan/models/<family>/__init__.py @ b5bcd76: n_layers, dim, n_heads,
// n_kv_heads, head_dim, ffn hidden_dim, vocab_size, weight tying, MoE
// num_experts / top_k / hidden_dim / shared experts, the first dense layers),
// written as a recipe: the emitter names that flavor.
struct FlavorCase {
  const char* name;
  const char* recipe;
  std::vector<std::string> sets;
  const char* model_spec;
};

const FlavorCase kFlavorCases[] = {
    {"Llama3_1B",
     "llama3-8b-h200",
     {"model.repeat=16", "model.hidden=2048", "model.attention.heads=32", "model.attention.kv_heads=8",
      "model.attention.head_dim=64", "model.mlp.ffn_hidden=8192", "model.tie_embeddings=true"},
     "model_registry(\"1B\")"},
    {"Llama3_3B",
     "llama3-8b-h200",
     {"model.repeat=28", "model.hidden=3072", "model.attention.heads=24", "model.attention.kv_heads=8",
      "model.mlp.ffn_hidden=8192", "model.tie_embeddings=true"},
     "model_registry(\"3B\")"},
    {"Llama3_70B",
     "llama3-8b-h200",
     {"model.repeat=80", "model.hidden=8192", "model.attention.heads=64", "model.mlp.ffn_hidden=28672",
      "cluster.nodes=16", "parallel.tp=8"},
     "model_registry(\"70B\")"},
    {"Qwen3_0_6B",
     "llama3-8b-h200",
     {"model.repeat=28", "model.hidden=1024", "model.vocab=151936", "model.attention.heads=16",
      "model.attention.qk_norm=true", "model.mlp.ffn_hidden=3072", "model.tie_embeddings=true"},
     "model_registry(\"0.6B\")"},
    {"Qwen3_8B",
     "llama3-8b-h200",
     {"model.repeat=36", "model.vocab=151936", "model.attention.qk_norm=true", "model.mlp.ffn_hidden=12288"},
     "model_registry(\"8B\")"},
    {"Qwen3_32B",
     "llama3-8b-h200",
     {"model.repeat=64", "model.hidden=5120", "model.vocab=151936", "model.attention.heads=64",
      "model.attention.qk_norm=true", "model.mlp.ffn_hidden=25600", "cluster.nodes=16", "parallel.tp=8"},
     "model_registry(\"32B\")"},
    {"Qwen3_235B_A22B",
     "qwen3-30b-a3b-h200",
     {"model.repeat=94", "model.hidden=4096", "model.attention.heads=64", "model.moe.ffn_hidden=1536",
      "cluster.nodes=32"},
     "model_registry(\"235B-A22B\")"},
    {"DeepSeekV3_16B",
     "deepseek-v3-h200",
     {"model.repeat=27", "model.hidden=2048", "model.vocab=102400", "model.mla.heads=16", "model.mla.q_lora_rank=0",
      "model.mlp.ffn_hidden=10944", "model.moe.first_k_dense=1", "model.moe.experts=64", "model.moe.top_k=6",
      "model.moe.ffn_hidden=1408", "model.moe.shared_experts=2", "model.moe.router=softmax", "model.mtp_layers=0",
      "parallel.pp=1", "parallel.schedule=1f1b", "cluster.nodes=8"},
     "model_registry(\"16B\")"},
    {"GptOss_20b",
     "gpt-oss-120b-h200",
     {"model.repeat=24", "model.moe.experts=32", "parallel.ep=32"},
     "model_registry(\"20b\")"},
};

class TorchtitanFlavor : public ::testing::TestWithParam<FlavorCase> {};

TEST_P(TorchtitanFlavor, NamesTheFlavor) {
  const FlavorCase& c = GetParam();
  const Emission e = EmitFor(EmitTarget::kTorchtitan, c.recipe, c.sets);
  EXPECT_EQ(PyKeys(e.text)["model_spec"], c.model_spec) << e.text;
}

INSTANTIATE_TEST_SUITE_P(All, TorchtitanFlavor, ::testing::ValuesIn(kFlavorCases),
                         [](const auto& test_info) { return std::string(test_info.param.name); });

// Pinned Llama 3 8B stages, 7 | 9 | 9 | 7 layers (boundaries 7, 16, 25):
// one module list a stage, torchtitan's names (pipeline_parallel.py @
// b5bcd76: tok_embeddings, layers.N, norm, lm_head).
TEST(EmitTorchtitan, PinnedStagesAsModuleNames) {
  const Emission e =
      EmitFor(EmitTarget::kTorchtitan, "llama3-8b-h200", {"parallel.pp=4", "parallel.stage_boundaries=[7, 16, 25]"});
  std::string expected;
  const int sizes[] = {7, 9, 9, 7};
  int layer = 0;
  for (int s = 0; s < 4; ++s) {
    std::string row = s == 0 ? "\"tok_embeddings\"" : "";
    for (int i = 0; i < sizes[s]; ++i) row += (row.empty() ? "" : ", ") + ("\"layers." + std::to_string(layer++) + "\"");
    if (s == 3) row += ", \"norm\", \"lm_head\"";
    expected += "[" + row + "],";
  }
  EXPECT_EQ(PyKeys(e.text)["parallelism.module_fqns_per_model_part"], expected) << e.text;
}

TEST(EmitTarget, ParsesItsNames) {
  EXPECT_EQ(ParseEmitTarget("megatron"), EmitTarget::kMegatron);
  EXPECT_EQ(ParseEmitTarget("torchtitan"), EmitTarget::kTorchtitan);
  EXPECT_FALSE(ParseEmitTarget("deepspeed").has_value());
  EXPECT_STREQ(Name(EmitTarget::kTorchtitan), "torchtitan");
}

}  // namespace
}  // namespace preflight::emit_test

// `preflight import hf`, end to end through the parser and the inventory:
// the imported recipe validates, and its total and active parameter counts
// match the figures the model authors published. The expected values are the
// published figures (source beside each), never computed by preflight.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "preflight/recipe/import.h"
#include "preflight/inventory/inventory.h"
#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight {
namespace {

using testing::ReadFile;
using testing::RelativelyClose;
using testing::SourcePath;

std::string Messages(const std::vector<Diagnostic>& ds) {
  std::string out;
  for (const auto& d : ds) out += Format(d) + "\n";
  return out;
}

/// Imports tests/data/hf/`fixture`, writes the recipe YAML (schema-default
/// layout) and parses it back with the recipe parser.
LoadResult ImportAndLoad(const std::string& fixture) {
  const std::string path = "tests/data/hf/" + fixture;
  const HfImport imported = ImportHfConfig(ReadFile(SourcePath(path)), path);
  EXPECT_TRUE(imported.ok()) << Messages(imported.diagnostics);
  return LoadRecipeFromString(EmitRecipeYaml(imported, {}, path, ""), fixture + ".yaml");
}

/// How the publisher counts "active" parameters.
enum class Active {
  kAll,                    // every parameter a token touches, embedding table included
  kWithoutInputEmbedding,  // the embedding lookup is not counted (OpenAI's gpt-oss table)
};

struct PublishedCase {
  const char* name;
  const char* fixture;
  double total;        // published total parameters
  double total_tol;    // relative tolerance
  double active;       // published active parameters per token
  double active_tol;
  Active convention;
};

// Sources (tolerance 0.5 % unless the figure itself is coarser; see each line):
const PublishedCase kCases[] = {
    // Llama-3.1-8B: 8.03B parameters (meta-llama/Llama-3.1-8B model page, safetensors count). Dense: active = total.
    {"Llama31_8B", "llama-3.1-8b.json", 8.03e9, 0.005, 8.03e9, 0.005, Active::kAll},
    // Mixtral 8x7B: "46.7B total parameters but only uses 12.9B parameters per token"
    // (Mistral AI, "Mixtral of experts", mistral.ai/news/mixtral-of-experts, Dec 2023).
    {"Mixtral8x7B", "mixtral-8x7b.json", 46.7e9, 0.005, 12.9e9, 0.005, Active::kAll},
    // Qwen3-30B-A3B: "Number of Parameters: 30.5B in total and 3.3B activated" (Qwen/Qwen3-30B-A3B model
    // card). 3.3B carries two significant digits: tolerance 2 % there (half a unit of the last digit
    // is 1.5 %; the card's figure is a truncation of 3.35B, all of attention + 8 of 128 experts + both
    // embedding tables, which is what preflight counts).
    {"Qwen3_30B_A3B", "qwen3-30b-a3b.json", 30.5e9, 0.005, 3.3e9, 0.02, Active::kAll},
    // DeepSeek-V3: "671B total parameters" (arXiv 2412.19437 abstract; without the 14B MTP module, which
    // the importer warns about); "Activation parameters: 36.6B (including 0.9B for the output Head)"
    // (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md), i.e. without the input embedding.
    {"DeepSeekV3", "deepseek-v3.json", 671e9, 0.005, 36.6e9, 0.005, Active::kWithoutInputEmbedding},
    // Jamba v0.1: 51.6B parameters in the checkpoint (ai21labs/Jamba-v0.1 model page, safetensors
    // count; the card rounds to "52B"), "12B active parameters" (model card). The Mamba-1 mixers are
    // imported as Mamba-2 (warned): about 0.1B fewer parameters, inside the tolerance.
    {"JambaV01", "jamba-v0.1.json", 51.6e9, 0.005, 12e9, 0.005, Active::kAll},
    // Nemotron-H-8B-Base-8K: 8.1B parameters (nvidia/Nemotron-H-8B-Base-8K model page, safetensors count;
    // the paper, arXiv 2504.03624, calls it 8B). Dense: active = total. Needs the two-matrix relu^2 MLP.
    {"NemotronH8B", "nemotron-h-8b.json", 8.1e9, 0.005, 8.1e9, 0.005, Active::kAll},
    // Mamba-2 2.7B: 2.7B (Dao & Gu, arXiv 2405.21060, model sizes; state-spaces/mamba2-2.7b). Tied head.
    {"Mamba2_2_7B", "mamba2-2.7b.json", 2.7e9, 0.005, 2.7e9, 0.005, Active::kAll},
    // gpt-oss-120b: total 116.83B, active 5.13B; gpt-oss-20b: 20.91B, 3.61B (OpenAI, "gpt-oss-120b &
    // gpt-oss-20b Model Card", arXiv 2508.10925, Table 1; the active count there includes the
    // unembedding but not the embedding). Biases and sinks (about 0.05B in 120b) are not counted (warned).
    {"GptOss120B", "gpt-oss-120b.json", 116.83e9, 0.005, 5.13e9, 0.005, Active::kWithoutInputEmbedding},
    {"GptOss20B", "gpt-oss-20b.json", 20.91e9, 0.005, 3.61e9, 0.005, Active::kWithoutInputEmbedding},
};

class ImportedCounts : public ::testing::TestWithParam<PublishedCase> {};

TEST_P(ImportedCounts, MatchPublishedFigures) {
  const PublishedCase& c = GetParam();
  const LoadResult loaded = ImportAndLoad(c.fixture);
  ASSERT_TRUE(loaded.ok()) << Messages(loaded.diagnostics);
  const Inventory inv = BuildInventory(*loaded.recipe);
  const double total = static_cast<double>(inv.total_params);
  double active = static_cast<double>(inv.active_params);
  if (c.convention == Active::kWithoutInputEmbedding) active -= static_cast<double>(inv.embedding.elements());
  EXPECT_TRUE(RelativelyClose(total, c.total, c.total_tol)) << "total " << total << " vs published " << c.total;
  EXPECT_TRUE(RelativelyClose(active, c.active, c.active_tol)) << "active " << active << " vs published " << c.active;
}

INSTANTIATE_TEST_SUITE_P(All, ImportedCounts, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(ImportedCounts, Qwen3NonEmbeddingTotal) {
  // "Number of Parameters (Non-Embedding): 29.9B" (Qwen/Qwen3-30B-A3B model card).
  const LoadResult loaded = ImportAndLoad("qwen3-30b-a3b.json");
  ASSERT_TRUE(loaded.ok()) << Messages(loaded.diagnostics);
  const Inventory inv = BuildInventory(*loaded.recipe);
  int64_t head = 0;
  for (const auto& t : inv.head) head += t.elements();
  const double non_embedding = static_cast<double>(inv.total_params - inv.embedding.elements() - head);
  EXPECT_TRUE(RelativelyClose(non_embedding, 29.9e9, 0.005)) << non_embedding;
}

TEST(ImportedCounts, DeepSeekV3HasThreeDenseLayersThenMoe) {
  // first_k_dense_replace 3 (config.json): layers 0-2 dense, 3-60 MoE; 61 attention layers.
  const LoadResult loaded = ImportAndLoad("deepseek-v3.json");
  ASSERT_TRUE(loaded.ok()) << Messages(loaded.diagnostics);
  const Inventory inv = BuildInventory(*loaded.recipe);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))], 61);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kDenseMlp))], 3);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))], 58);
}

TEST(ImportedCounts, JambaHasFourAttentionAndSixteenMoeLayers) {
  // Jamba v0.1: 32 layers, attention every 8th from 4 (4 layers), MoE every 2nd from 1 (16 layers).
  const LoadResult loaded = ImportAndLoad("jamba-v0.1.json");
  ASSERT_TRUE(loaded.ok()) << Messages(loaded.diagnostics);
  const Inventory inv = BuildInventory(*loaded.recipe);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kAttention))], 4);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kMamba))], 28);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))], 16);
  EXPECT_EQ(inv.family_layers[static_cast<size_t>(FamilyIndex(BlockKind::kDenseMlp))], 16);
}

}  // namespace
}  // namespace preflight

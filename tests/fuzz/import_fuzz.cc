// libFuzzer targets over the two importers (issue "Hostile input"): the input
// is a Hugging Face config.json (hf_import_fuzz) or Megatron-LM launch
// arguments (megatron_import_fuzz, built from this file with
// PREFLIGHT_FUZZ_MEGATRON). Promises: no exception escapes; an import is ok
// exactly when it has no error diagnostic, and every diagnostic has a message;
// the recipe an ok import writes, when it loads, is priced as `plan` prices it
// (fuzz_price.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_price.h"
#include "preflight/recipe/import.h"
#include "preflight/recipe/import_megatron.h"
#include "preflight/recipe/recipe.h"

namespace {

using preflight::Diagnostic;
using preflight::fuzz::Fail;

void CheckDiagnostics(const std::vector<Diagnostic>& diagnostics) {
  for (const Diagnostic& d : diagnostics) {
    if (d.message.empty()) Fail("a diagnostic without a message");
  }
}

void LoadAndPrice(const std::string& yaml) {
  const preflight::LoadResult loaded = preflight::LoadRecipeFromString(yaml, "imported.yaml");
  // A written recipe the parser refuses (kv_heads = 7 of 32 heads, a global
  // batch dp does not divide) is reported by `import` at its line, as the
  // recipe's error: exit 2 with a located message, which the load's
  // diagnostics are.
  if (!loaded.ok()) return;
  preflight::fuzz::Price(*loaded.recipe);
}

#ifdef PREFLIGHT_FUZZ_MEGATRON

void Import(const std::string& text) {
  const preflight::MegatronImport imported = preflight::ImportMegatronArgs(text, "args.sh");
  CheckDiagnostics(imported.diagnostics);
  if (preflight::HasErrors(imported.diagnostics)) return;
  std::vector<Diagnostic> emitted;
  const std::string yaml = preflight::EmitMegatronRecipe(imported, {}, "fuzz", "args.sh", &emitted);
  CheckDiagnostics(emitted);
  if (preflight::HasErrors(emitted)) return;  // e.g. a world size the arguments cannot fill
  LoadAndPrice(yaml);
}

#else

// One node of eight GPUs with data parallelism only: every model the importer
// accepts can be laid out so.
const std::vector<preflight::YamlEntry> kLayout = {
    {"training.seq_len", "4096", ""},
    {"training.micro_batch", "1", ""},
    {"training.global_batch", "8", ""},
    {"training.recompute", "selective", ""},
    {"training.optimizer.matrices", "adamw", ""},
    {"parallel.tp", "1", ""},
    {"parallel.pp", "1", ""},
    {"parallel.ep", "1", ""},
    {"cluster.gpu", "h200", ""},
    {"cluster.nodes", "1", ""},
    {"cluster.gpus_per_node", "8", ""},
};

void Import(const std::string& text) {
  const preflight::HfImport imported = preflight::ImportHfConfig(text, "config.json");
  CheckDiagnostics(imported.diagnostics);
  if (imported.ok() == preflight::HasErrors(imported.diagnostics)) Fail("ok() disagrees with the diagnostics");
  if (!imported.ok()) return;
  std::vector<Diagnostic> merged;
  const std::vector<preflight::YamlEntry> layout = preflight::MergeLayout(kLayout, {}, &merged);
  if (preflight::HasErrors(merged)) Fail("the fixed layout does not merge");
  LoadAndPrice(preflight::EmitRecipeYaml(imported, layout, "config.json", ""));
}

#endif

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  preflight::fuzz::ReportReachAtExit();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ++preflight::fuzz::Counts().inputs;
  Import(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}

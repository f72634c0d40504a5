// libFuzzer target over the recipe parser and validator (issue 9).
//
// The input picks one of three paths, so a single corpus covers all of them:
//  - plain bytes: the whole input is recipe YAML (LoadRecipeFromString);
//  - "@set\n" + lines: each line goes through ParseOverride, and the valid
//    ones are applied as `--set` overrides to the default recipe
//    (recipes/nam56r-h200.yaml, read once at start-up);
//  - YAML + "\n@set\n" + lines: the overrides are applied to that YAML.
// Every result is checked for the library's promises: no exception escapes,
// an accepted recipe has no error diagnostic and a rejected one has at least
// one, every diagnostic formats, a second load gives the same diagnostics, and
// an accepted recipe is priced as `plan` prices it (fuzz_price.h).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_price.h"
#include "preflight/recipe/recipe.h"

namespace {

using preflight::fuzz::Fail;

std::string& DefaultRecipe() {
  static std::string text;
  return text;
}

std::vector<preflight::Override> OverridesFrom(std::string_view lines) {
  std::vector<preflight::Override> overrides;
  size_t start = 0;
  while (start < lines.size()) {
    size_t end = lines.find('\n', start);
    if (end == std::string_view::npos) end = lines.size();
    if (auto o = preflight::ParseOverride(std::string(lines.substr(start, end - start)))) {
      overrides.push_back(std::move(*o));
    }
    start = end + 1;
  }
  return overrides;
}

std::string Render(const preflight::LoadResult& r) {
  std::string out = r.ok() ? "ok\n" : "rejected\n";
  for (const auto& d : r.diagnostics) out += preflight::Format(d) + "\n";
  return out;
}

void Check(const std::string& yaml, const std::vector<preflight::Override>& overrides) {
  const preflight::LoadResult first = preflight::LoadRecipeFromString(yaml, "fuzz.yaml", overrides);
  if (first.ok() == preflight::HasErrors(first.diagnostics)) Fail("ok() disagrees with the error diagnostics");
  for (const auto& d : first.diagnostics) {
    if (d.message.empty()) Fail("a diagnostic without a message");
  }
  const preflight::LoadResult second = preflight::LoadRecipeFromString(yaml, "fuzz.yaml", overrides);
  if (Render(first) != Render(second)) Fail("two loads of the same input disagree");
  if (!first.ok()) return;
  preflight::fuzz::Price(*first.recipe);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::ifstream in(PREFLIGHT_SOURCE_DIR "/recipes/nam56r-h200.yaml", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  DefaultRecipe() = text.str();
  preflight::fuzz::ReportReachAtExit();
  if (DefaultRecipe().empty()) Fail("cannot read recipes/nam56r-h200.yaml");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  ++preflight::fuzz::Counts().inputs;
  constexpr std::string_view kSetOnly = "@set\n";
  constexpr std::string_view kSetAfter = "\n@set\n";
  if (input.substr(0, kSetOnly.size()) == kSetOnly) {
    Check(DefaultRecipe(), OverridesFrom(input.substr(kSetOnly.size())));
  } else if (const size_t cut = input.find(kSetAfter); cut != std::string_view::npos) {
    Check(std::string(input.substr(0, cut)), OverridesFrom(input.substr(cut + kSetAfter.size())));
  } else {
    Check(std::string(input), {});
  }
  return 0;
}

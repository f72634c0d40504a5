// libFuzzer target over the recipe parser and validator (issue 9).
//
// The input picks one of four paths, so a single corpus covers all of them:
//  - plain bytes: the whole input is recipe YAML (LoadRecipeFromString);
//  - "@set\n" + lines: each line goes through ParseOverride, and the valid
//    ones are applied as `--set` overrides to the default recipe
//    (recipes/nam56r-h200.yaml, read once at start-up);
//  - YAML + "\n@set\n" + lines: the overrides are applied to that YAML;
//  - "\x01" + bytes: structured, so many inputs are valid recipes that reach
//    pricing: the next byte picks a shipped recipe, then each pair of bytes
//    (up to six) picks a key of the recipe field table and one of its telling
//    values (a small degree, the default, an enum word, now and then a
//    bound), applied as `--set`. One marker byte survives mutation better
//    than a word.
// Every result is checked for the library's promises: no exception escapes,
// an accepted recipe has no error diagnostic and a rejected one has at least
// one, every diagnostic formats, a second load gives the same diagnostics, and
// an accepted recipe is priced as `plan` prices it (fuzz_price.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "fuzz_price.h"
#include "preflight/recipe/fields.h"
#include "preflight/recipe/recipe.h"

namespace {

using preflight::fuzz::Fail;

std::string& DefaultRecipe() {
  static std::string text;
  return text;
}

/// recipes/*.yaml, in name order (read once at start-up).
std::vector<std::string>& ShippedRecipes() {
  static std::vector<std::string> texts;
  return texts;
}

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The values worth trying for a field; `choice` picks one.
std::string PickValue(const preflight::RecipeField& f, uint8_t choice) {
  using K = preflight::FieldKind;
  const auto pick = [choice](const std::vector<std::string>& from) { return from[choice % from.size()]; };
  switch (f.kind) {
    case K::kInt:  // mostly values a layout uses, a bound one time in eight
      return pick({"1", "2", "4", "8", "16", "64", preflight::DefaultText(f), preflight::DefaultText(f), "1", "2", "4",
                   "8", "1", "2", std::to_string(f.min), std::to_string(f.max)});
    case K::kReal:
      return pick(
          {fmt::format("{}", f.real_min), fmt::format("{}", f.real_max), "0.5", "1", preflight::DefaultText(f)});
    case K::kBool: return choice % 2 ? "true" : "false";
    case K::kEnum: return f.names.empty() ? "x" : pick(f.names);
    case K::kWords: {
      std::string list;
      for (size_t i = 0; i < f.names.size() && i < 8; ++i) {
        if (choice >> i & 1) list += (list.empty() ? "" : ", ") + f.names[i];
      }
      return "[" + list + "]";
    }
    case K::kLetters: return pick({"AEME", "AD", "M", "AEMEAEMEAEMR", "MMMA", "E", "R", "ADADADAD"});
    default: return preflight::DefaultText(f);
  }
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

/// Structured inputs: a shipped recipe and the overrides the bytes pick.
void CheckPicked(std::string_view bytes) {
  if (bytes.empty() || ShippedRecipes().empty()) return;
  const std::string& base = ShippedRecipes()[static_cast<uint8_t>(bytes[0]) % ShippedRecipes().size()];
  std::vector<const preflight::RecipeField*> fields;
  for (const preflight::RecipeField& f : preflight::RecipeFields()) {
    if (f.kind != preflight::FieldKind::kSection && f.kind != preflight::FieldKind::kString) fields.push_back(&f);
  }
  std::vector<preflight::Override> overrides;
  for (size_t i = 1; i + 1 < bytes.size() && overrides.size() < 6; i += 2) {
    const preflight::RecipeField& f = *fields[static_cast<uint8_t>(bytes[i]) % fields.size()];
    overrides.push_back({std::string(f.path), PickValue(f, static_cast<uint8_t>(bytes[i + 1]))});
  }
  // To reproduce a finding from the command line: PREFLIGHT_FUZZ_PRINT=1 recipe_fuzz CRASH_FILE.
  if (std::getenv("PREFLIGHT_FUZZ_PRINT") != nullptr) {
    std::fprintf(stderr, "recipe #%d of recipes/*.yaml by name",
                 static_cast<uint8_t>(bytes[0]) % static_cast<int>(ShippedRecipes().size()));
    for (const preflight::Override& o : overrides)
      std::fprintf(stderr, " --set %s=%s", o.key_path.c_str(), o.value.c_str());
    std::fprintf(stderr, "\n");
  }
  Check(base, overrides);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  DefaultRecipe() = ReadText(PREFLIGHT_SOURCE_DIR "/recipes/nam56r-h200.yaml");
  preflight::fuzz::ReportReachAtExit();
  if (DefaultRecipe().empty()) Fail("cannot read recipes/nam56r-h200.yaml");
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(PREFLIGHT_SOURCE_DIR "/recipes")) {
    if (entry.path().extension() == ".yaml") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const auto& path : paths) ShippedRecipes().push_back(ReadText(path));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  ++preflight::fuzz::Counts().inputs;
  constexpr std::string_view kSetOnly = "@set\n";
  constexpr std::string_view kSetAfter = "\n@set\n";
  constexpr std::string_view kPick = "\x01";
  if (input.substr(0, kPick.size()) == kPick) {
    CheckPicked(input.substr(kPick.size()));
  } else if (input.substr(0, kSetOnly.size()) == kSetOnly) {
    Check(DefaultRecipe(), OverridesFrom(input.substr(kSetOnly.size())));
  } else if (const size_t cut = input.find(kSetAfter); cut != std::string_view::npos) {
    Check(std::string(input.substr(0, cut)), OverridesFrom(input.substr(cut + kSetAfter.size())));
  } else {
    Check(std::string(input), {});
  }
  return 0;
}

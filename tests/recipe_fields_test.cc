// The recipe field table against its independent readers: docs/recipe.md's
// key tables (every key documented, with the table's default and unit, and
// no documented key missing from the table), the parser (every key accepts
// its own default through --set and reads back unchanged), and diff's
// flattening (exactly the table's keys).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "preflight/recipe/fields.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/diff.h"
#include "support/test_support.h"

namespace preflight::recipe_fields_test {
namespace {

using testing::SourcePath;

struct DocRow {
  std::string default_text, unit;
};

std::string Trim(std::string s) {
  const size_t a = s.find_first_not_of(" `");
  const size_t b = s.find_last_not_of(" `");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

/// Rows of docs/recipe.md's key tables ("| key | default | unit | valid |
/// meaning |"), by full path: the section is the nearest heading naming one.
std::map<std::string, DocRow> DocumentedKeys() {
  std::ifstream in(SourcePath("docs/recipe.md"));
  std::map<std::string, DocRow> out;
  std::string line, section;
  bool in_key_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) == 0) {
      const size_t a = line.find('`');
      const size_t b = a == std::string::npos ? a : line.find('`', a + 1);
      section = a == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
      in_key_table = false;
      continue;
    }
    if (line.rfind("| key | default | unit |", 0) == 0) {
      in_key_table = true;
      continue;
    }
    if (line.rfind("|", 0) != 0) in_key_table = false;  // a table ends at its first non-row line
    if (!in_key_table || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(Trim(cell));
    const std::string path = section == "name" ? "name" : section + "." + cells.at(0);
    out[path] = {cells.at(1), cells.at(2)};
  }
  return out;
}

/// Same value: equal text, or equal numbers ("3.0" and "3").
bool SameValue(const std::string& doc, const std::string& table) {
  if (doc == table) return true;
  char* end_doc = nullptr;
  char* end_table = nullptr;
  const double a = std::strtod(doc.c_str(), &end_doc);
  const double b = std::strtod(table.c_str(), &end_table);
  return !doc.empty() && *end_doc == '\0' && *end_table == '\0' && a == b;
}

TEST(RecipeFields, DocsListEveryKeyWithTheTablesDefaultAndUnit) {
  const std::map<std::string, DocRow> docs = DocumentedKeys();
  const Recipe defaults;
  for (const RecipeField& f : RecipeFields()) {
    if (f.kind == FieldKind::kSection && f.parent().empty()) continue;  // a "## `model`" heading, not a row
    const auto row = docs.find(std::string(f.path));
    EXPECT_NE(row, docs.end()) << f.path << " is in the field table but not in docs/recipe.md";
    if (row == docs.end()) continue;
    EXPECT_EQ(row->second.unit, f.unit) << f.path;
    if (f.text != nullptr) {
      EXPECT_TRUE(SameValue(row->second.default_text, f.text(defaults)))
          << f.path << ": docs say " << row->second.default_text << ", the recipe defaults to " << f.text(defaults);
    }
  }
  for (const auto& [path, row] : docs) {
    EXPECT_NE(FindRecipeField(path), nullptr) << path << " is documented but not in the field table";
  }
}

TEST(RecipeFields, EveryKeyAcceptsItsDefaultThroughSet) {
  const std::string yaml = "name: fields\n";
  const LoadResult base = LoadRecipeFromString(yaml, "fields.yaml");
  ASSERT_TRUE(base.recipe) << (base.diagnostics.empty() ? "" : base.diagnostics.front().message);
  for (const RecipeField& f : RecipeFields()) {
    // cluster.device has no defaults: a device is given whole or based on a
    // preset (recipe_device_test sets each of its keys with based_on).
    if (f.text == nullptr || f.path == "name" || f.path.rfind("cluster.device.", 0) == 0) continue;
    const std::string value = f.text(*base.recipe);
    const LoadResult set = LoadRecipeFromString(yaml, "fields.yaml", {{std::string(f.path), value}});
    ASSERT_TRUE(set.recipe) << f.path << "=" << value << ": "
                            << (set.diagnostics.empty() ? "" : set.diagnostics.front().message);
    EXPECT_EQ(f.text(*set.recipe), value) << f.path;
  }
}

TEST(RecipeFields, UnknownPathsAreRefusedWithASuggestion) {
  const LoadResult set = LoadRecipeFromString("name: fields\n", "fields.yaml", {{"parallel.tpp", "8"}});
  ASSERT_FALSE(set.recipe);
  ASSERT_FALSE(set.diagnostics.empty());
  EXPECT_NE(set.diagnostics.front().message.find("did you mean 'tp'"), std::string::npos)
      << set.diagnostics.front().message;
}

TEST(RecipeFields, DiffFlattensExactlyTheTablesKeys) {
  const LoadResult loaded = LoadRecipeFile(SourcePath("recipes/nam56r-h200.yaml"));
  ASSERT_TRUE(loaded.recipe);
  const auto flat = FlattenRecipe(*loaded.recipe);
  std::vector<std::string> expected;
  for (const RecipeField& f : RecipeFields()) {
    const std::string parent(f.parent());
    if (f.text == nullptr || parent == "model.mla" || parent.rfind("cluster.device", 0) == 0 || parent == "serving") {
      continue;
    }
    expected.emplace_back(f.path);
  }
  std::vector<std::string> got;
  for (const auto& [path, value] : flat) got.push_back(path);
  EXPECT_EQ(got, expected);
  // The integer ranges the parser enforces come from the table too.
  const RecipeField* tp = FindRecipeField("parallel.tp");
  ASSERT_NE(tp, nullptr);
  const LoadResult over =
      LoadRecipeFromString("name: fields\n", "fields.yaml", {{"parallel.tp", std::to_string(tp->max + 1)}});
  EXPECT_FALSE(over.recipe);
}

}  // namespace
}  // namespace preflight::recipe_fields_test

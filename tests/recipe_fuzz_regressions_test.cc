// Inputs found by the libFuzzer target (tests/fuzz/recipe_fuzz.cc), each
// minimized by hand to the smallest text that showed the problem, with the
// message we now give. bench/README.md lists the fuzz runs that found them.
#include <string>

#include <gtest/gtest.h>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/recipe.h"

namespace preflight::recipe_fuzz_regressions_test {
namespace {

struct Case {
  const char* name;
  const char* yaml;
  int line, column;     // 1-based, counted by hand
};

// yaml-cpp 0.7's LoadAll never returned (and grew memory without bound) on a
// document that starts with a stray ',': the parser hands out empty documents
// without consuming the token (jbeder/yaml-cpp#1040). Found by the first fuzz
// run (timeout after 2 s, 2 GB RSS when rerun alone) from a mutated llama3-8b
// recipe whose text began ", on 4 H200 nodes."; found and fixed the same way
// on the recipe branch (yaml_load.cc: at most two documents are parsed).
// The diagnostic points at the comma; its wording is checked once below.
const Case kStrayComma[] = {
    {"CommaAlone", ",", 1, 1},
    {"CommaThenText", ", on 4 H200 nodes.\nmodel:\n  #\n", 1, 1},
    {"CommaAfterSpace", "  ,a", 1, 3},
    {"CommaAfterComment", "# c\n,", 2, 1},
    {"CommaAfterDocumentMarker", "---\n,", 2, 1},
};

class StrayComma : public ::testing::TestWithParam<Case> {};

TEST_P(StrayComma, IsASyntaxErrorNotAHang) {
  const Case& c = GetParam();
  const LoadResult r = LoadRecipeFromString(c.yaml, "fuzz.yaml");
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  const Diagnostic& d = r.diagnostics[0];
  EXPECT_EQ(d.mark.line, c.line) << Format(d);
  EXPECT_EQ(d.mark.column, c.column) << Format(d);
  EXPECT_EQ(d.severity, Severity::kError);
}

INSTANTIATE_TEST_SUITE_P(Fuzz, StrayComma, ::testing::ValuesIn(kStrayComma),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(FuzzRegressions, StrayCommaMessage) {
  const LoadResult r = LoadRecipeFromString(",\nname: x\n", "fuzz.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(Format(r.diagnostics[0]),
            "fuzz.yaml:1:1: not a recipe: the document reads as null (malformed YAML?); expected a map with keys "
            "name, model, training, parallel, cluster, serving\n    ,\n    ^");
}

TEST(FuzzRegressions, CommaInAnOverrideValueIsNoValue) {
  // Load (one document) does not loop on ','; it reads as an empty value.
  const LoadResult r = LoadRecipeFromString("name: x\n", "fuzz.yaml", {*ParseOverride("parallel.tp=,")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.diagnostics[0].key_path, "parallel.tp");
  EXPECT_EQ(r.diagnostics[0].file, "--set parallel.tp=,");
}

TEST(FuzzRegressions, SecondDocumentStillNamedWhereItStarts) {
  // The two-document scan keeps the message and position.
  const LoadResult r = LoadRecipeFromString("name: x\n---\nname: y\n", "fuzz.yaml");
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].mark.line, 3);
  EXPECT_EQ(r.diagnostics[0].mark.column, 1);
  EXPECT_NE(r.diagnostics[0].message.find("a second YAML document"), std::string::npos);
}

}  // namespace
}  // namespace preflight::recipe_fuzz_regressions_test

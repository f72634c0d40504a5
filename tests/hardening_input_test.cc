// Hostile and extreme recipe text (issue 9): deep nesting, huge strings,
// alias bombs, huge and non-finite numbers, bytes that are not UTF-8, and
// floods of errors. Each must be rejected with a clear, located, bounded
// message (exit 2 at the CLI), never a crash, a hang or a number. Time is not
// asserted here (speed lives in bench/); ctest's per-test timeout
// and the sanitizer run catch a hang or a memory error.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/recipe.h"

namespace preflight::hardening_input_test {
namespace {

constexpr const char* kFile = "hostile.yaml";

std::string Repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

/// Every diagnostic formatted, one per line.
std::string FormatAll(const LoadResult& r) {
  std::string out;
  for (const Diagnostic& d : r.diagnostics) out += Format(d) + "\n";
  return out;
}

/// Loads `yaml` twice; expects a rejection, the same diagnostics both times,
/// and a report of bounded size (no megabyte echo of the input).
LoadResult ExpectRejected(const std::string& yaml, const std::vector<Override>& overrides = {}) {
  const LoadResult first = LoadRecipeFromString(yaml, kFile, overrides);
  EXPECT_FALSE(first.ok());
  EXPECT_TRUE(HasErrors(first.diagnostics));
  const LoadResult second = LoadRecipeFromString(yaml, kFile, overrides);
  EXPECT_EQ(FormatAll(first), FormatAll(second)) << "two loads of the same text disagree";
  EXPECT_LT(FormatAll(first).size(), 64u * 1024) << "the report echoes too much of the input";
  return first;
}

/// The first error diagnostic (the test fails when there is none).
Diagnostic FirstError(const LoadResult& r) {
  for (const Diagnostic& d : r.diagnostics) {
    if (d.severity == Severity::kError) return d;
  }
  ADD_FAILURE() << "no error diagnostic";
  return {};
}

// ---- nesting -------------------------------------------------------------

TEST(HardeningNesting, HundredThousandDeepFlowSequences) {
  const size_t depth = 100'000;
  const LoadResult r = ExpectRejected("model: " + Repeat("[", depth) + Repeat("]", depth) + "\n");
  // yaml-cpp 0.7's parser stops at depth 2000 (DeepRecursion) instead of
  // recursing on; the message is the parser's, prefixed by ours.
  EXPECT_NE(FirstError(r).message.find("not valid YAML"), std::string::npos) << FormatAll(r);
}

TEST(HardeningNesting, HundredThousandDeepFlowMaps) {
  const size_t depth = 100'000;
  const LoadResult r = ExpectRejected(Repeat("{a: ", depth) + "1" + Repeat("}", depth) + "\n");
  EXPECT_NE(FirstError(r).message.find("not valid YAML"), std::string::npos) << FormatAll(r);
}

TEST(HardeningNesting, DeepBlockMaps) {
  // 2500 levels of block maps, one more space of indentation each: about
  // 3.1 MB, under the 4 MiB file limit, and past yaml-cpp's depth bound.
  std::string yaml;
  for (size_t level = 0; level < 2500; ++level) yaml += std::string(level, ' ') + "a:\n";
  ASSERT_LT(yaml.size(), size_t{4} << 20);
  const LoadResult r = ExpectRejected(yaml);
  EXPECT_NE(FirstError(r).message.find("not valid YAML"), std::string::npos) << FormatAll(r);
}

TEST(HardeningNesting, DeepOverrideValue) {
  const size_t depth = 100'000;
  const auto o = ParseOverride("model.layers=" + Repeat("[", depth) + Repeat("]", depth));
  ASSERT_TRUE(o.has_value());
  const LoadResult r = ExpectRejected("name: x\n", {*o});
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.key_path, "model.layers");
  EXPECT_NE(d.message.find("the value is not valid YAML"), std::string::npos) << Format(d);
  // The diagnostic names the override, shortened: "--set model.layers=[[[[...".
  EXPECT_EQ(d.file.rfind("--set model.layers=[[[[", 0), 0u) << d.file;
  EXPECT_LE(d.file.size(), 6u + 80u + 3u);
}

// ---- huge strings ----------------------------------------------------------

TEST(HardeningHugeText, TenMegabytePatternInTheFile) {
  const std::string yaml = "model:\n  pattern: " + Repeat("AEME", 10 * 1024 * 1024 / 4) + "\n";
  const LoadResult r = ExpectRejected(yaml);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].message,
            "the file is 10485779 bytes; recipes are limited to 4194304 bytes (4 MiB)");  // 7 + 11 + 10 MiB + 1 bytes
}

TEST(HardeningHugeText, TenMegabytePatternOverride) {
  const auto o = ParseOverride("model.pattern=" + Repeat("AEME", 10 * 1024 * 1024 / 4));
  ASSERT_TRUE(o.has_value());
  const LoadResult r = ExpectRejected("name: x\n", {*o});
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.key_path, "model.pattern");
  // 10 MiB letters = 10485760 > the 100000-layer bound.
  EXPECT_NE(d.message.find("10485760 letters; at most 100000 layers are supported"), std::string::npos) << Format(d);
  // The first 80 bytes of the typed text: "model.pattern=" (14) and 66 letters.
  EXPECT_EQ(d.file, "--set model.pattern=" + Repeat("AEME", 16) + "AE...");
}

TEST(HardeningHugeText, HundredThousandBadLettersGiveOneDiagnostic) {
  // 100000 letters (the layer bound), every one of them bad.
  const std::string yaml = "model:\n  pattern: " + Repeat("x", 100'000) + "\n";
  const LoadResult r = ExpectRejected(yaml);
  ASSERT_EQ(r.diagnostics.size(), 1u) << FormatAll(r);
  const Diagnostic& d = r.diagnostics[0];
  EXPECT_EQ(d.key_path, "model.pattern");
  EXPECT_EQ(d.mark.line, 2);
  EXPECT_EQ(d.mark.column, 12);  // "  pattern: " is 11 columns
  EXPECT_NE(d.message.find("bad layer letter 'x' at position 1 (and 99999 more bad letters)"), std::string::npos);
  // The 100011-byte source line is shown as a window around the caret.
  EXPECT_LE(d.source_line.size(), 160u);
}

TEST(HardeningHugeText, LongLineCaretSitsUnderTheBadValue) {
  // One flow map on one line; the bad value sits 300+ bytes in.
  const std::string yaml = "{model: {pattern: " + std::string(300, 'A') + "}, parallel: {tp: 0}}\n";
  const LoadResult r = ExpectRejected(yaml);
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.key_path, "parallel.tp");
  // Column: "{model: {pattern: " (18) + 300 A + "}, parallel: {tp: " (18) = 336 bytes before the 0.
  EXPECT_EQ(d.mark.column, 337);
  const std::string text = Format(d);
  const size_t caret_line = text.rfind('\n');
  const size_t source_line = text.rfind('\n', caret_line - 1);
  const std::string shown = text.substr(source_line + 1, caret_line - source_line - 1);
  const std::string caret = text.substr(caret_line + 1);
  ASSERT_EQ(caret.back(), '^');
  ASSERT_LT(caret.size() - 1, shown.size());
  EXPECT_EQ(shown[caret.size() - 1], '0') << text;
  EXPECT_EQ(shown.rfind("    ...", 0), 0u) << "the window starts with an ellipsis: " << text;
}

TEST(HardeningHugeText, LongUnknownKeyIsShortened) {
  // 1000 bytes: under the 1024-character limit YAML puts on implicit keys.
  const LoadResult r = ExpectRejected(std::string(1000, 'k') + ": 1\n");
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.key_path, std::string(200, 'k') + "...");
  EXPECT_NE(d.message.find("unknown key"), std::string::npos);
}

TEST(HardeningHugeText, HugeKeyIsASyntaxError) {
  // 3 MB: past the implicit-key limit, so yaml-cpp rejects it; the report stays small.
  const LoadResult r = ExpectRejected(std::string(3'000'000, 'k') + ": 1\n");
  EXPECT_NE(FirstError(r).message.find("not valid YAML"), std::string::npos) << FormatAll(r);
}

TEST(HardeningHugeText, HugeIntegerTextIsShortened) {
  const LoadResult r = ExpectRejected("model:\n  hidden: " + std::string(1'000'000, '9') + "\n");
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.key_path, "model.hidden");
  EXPECT_EQ(d.value, std::string(120, '9') + "...");
  EXPECT_EQ(d.message, "out of range; valid range is [1, 16777216]");
}

TEST(HardeningHugeText, FloodOfUnknownKeysIsCapped) {
  std::string yaml;
  for (int i = 0; i < 5000; ++i) yaml += fmt::format("unknown_key_{}: 1\n", i);
  const LoadResult r = ExpectRejected(yaml);
  // 100 diagnostics kept, then one line counting the other 4900.
  ASSERT_EQ(r.diagnostics.size(), 101u);
  EXPECT_EQ(r.diagnostics.back().message, "4900 more problems not shown (at most 100 are listed); fix the ones above first");
  EXPECT_EQ(r.diagnostics.back().severity, Severity::kError);
  EXPECT_EQ(r.diagnostics.front().mark.line, 1);
  EXPECT_EQ(r.diagnostics[99].mark.line, 100);
}

TEST(HardeningHugeText, LongOverrideKeyPath) {
  const auto deep = ParseOverride("a.b.c.d.e.f.g.h.i=1");
  ASSERT_TRUE(deep.has_value());
  const LoadResult r1 = ExpectRejected("name: x\n", {*deep});
  EXPECT_EQ(FirstError(r1).file, "--set a.b.c.d.e.f.g.h.i=1");
  EXPECT_EQ(FirstError(r1).message,
            "the key path is 17 bytes in 9 parts; recipe keys are at most 200 bytes in 8 parts (e.g. parallel.tp)");

  // A 2 MB dotted path would otherwise create a million nested maps.
  std::string path = Repeat("a.", 1'000'000) + "a";
  const auto huge = ParseOverride(path + "=1");
  ASSERT_TRUE(huge.has_value());
  const LoadResult r2 = ExpectRejected("name: x\n", {*huge});
  EXPECT_EQ(FirstError(r2).key_path, Repeat("a.", 40) + "...");
}

// ---- aliases -----------------------------------------------------------------

/// "Billion laughs": nine levels of ten aliases each, 10^9 leaves if expanded.
std::string LaughsPrelude() {
  std::string yaml = "l0: &l0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n";
  for (int level = 1; level <= 9; ++level) {
    // fmt::format, not "l" + std::to_string(...): GCC 12 -O3 reports a false
    // -Wrestrict on const char* + std::string&&.
    const std::string prev = fmt::format("*l{}", level - 1);
    yaml += fmt::format("l{}: &l{} [", level, level);
    for (int i = 0; i < 10; ++i) yaml += fmt::format("{}{}", i ? ", " : "", prev);
    yaml += "]\n";
  }
  return yaml;
}

TEST(HardeningAliases, BillionLaughsAsTheLayerList) {
  const LoadResult r = ExpectRejected(LaughsPrelude() + "model:\n  layers: *l9\n");
  bool layer_error = false;
  for (const Diagnostic& d : r.diagnostics) {
    if (d.key_path == "model.layers[0]") layer_error = d.message.find("layer 1 must be one letter") != std::string::npos;
  }
  EXPECT_TRUE(layer_error) << FormatAll(r);
}

TEST(HardeningAliases, BillionLaughsInEveryKindOfValue) {
  for (const char* tail : {"name: *l9\n", "model: *l9\n", "model: {pattern: *l9}\n", "parallel: {tp: *l9}\n",
                           "parallel: {stage_boundaries: *l9}\n", "training: {recompute: *l9}\n",
                           "cluster: {gpu: *l9}\n", "serving: *l9\n", "*l9 : 1\n"}) {
    SCOPED_TRACE(tail);
    ExpectRejected(LaughsPrelude() + tail);
  }
}

TEST(HardeningAliases, AliasedMapsOfUnknownKeys) {
  // Each level is a map of ten keys aliasing the previous map; reading
  // visits one level at a time, so this is bounded too.
  std::string yaml = "m0: &m0 {k0: 1, k1: 1, k2: 1, k3: 1, k4: 1, k5: 1, k6: 1, k7: 1, k8: 1, k9: 1}\n";
  for (int level = 1; level <= 9; ++level) {
    const std::string prev = fmt::format("*m{}", level - 1);
    yaml += fmt::format("m{}: &m{} {{", level, level);
    for (int i = 0; i < 10; ++i) yaml += fmt::format("{}k{}: {}", i ? ", " : "", i, prev);
    yaml += "}\n";
  }
  ExpectRejected(yaml + "model: *m9\n");
}

// ---- numbers -------------------------------------------------------------------

struct NumberCase {
  const char* name;
  const char* yaml;
  const char* key_path;
  const char* message;
};

const NumberCase kNumberCases[] = {
    {"TwoToThe63", "model: {hidden: 9223372036854775808}\n", "model.hidden", "out of range; valid range is [1, 16777216]"},
    {"Int64Max", "model: {hidden: 9223372036854775807}\n", "model.hidden", "out of range; valid range is [1, 16777216]"},
    {"Int64Min", "model: {hidden: -9223372036854775808}\n", "model.hidden", "must be positive; valid range is [1, 16777216]"},
    {"BelowInt64Min", "model: {hidden: -9223372036854775809}\n", "model.hidden", "out of range; valid range is [1, 16777216]"},
    {"TenToThe30", "model: {hidden: 1e30}\n", "model.hidden", "out of range; valid range is [1, 16777216]"},
    {"TenToThe30Batch", "training: {global_batch: 1e30}\n", "training.global_batch",
     "out of range; valid range is [1, 1099511627776]"},
    {"TenToThe309", "model: {hidden: 1e309}\n", "model.hidden", "must be an integer in [1, 16777216]"},
    {"IntNan", "parallel: {tp: .nan}\n", "parallel.tp", "must be an integer in [1, 16777216]"},
    {"IntInf", "parallel: {tp: .inf}\n", "parallel.tp", "must be an integer in [1, 16777216]"},
    {"DoubleDotNan", "cluster: {reserve_gib: .nan}\n", "cluster.reserve_gib", "must be a number in [0, 1000000]"},
    {"DoubleNan", "cluster: {reserve_gib: nan}\n", "cluster.reserve_gib", "must be a number in [0, 1000000]"},
    {"DoubleNanUpper", "cluster: {reserve_gib: NaN}\n", "cluster.reserve_gib", "must be a number in [0, 1000000]"},
    {"DoubleInf", "cluster: {min_headroom_gib: .inf}\n", "cluster.min_headroom_gib", "must be a number in [0, 1000000]"},
    {"DoubleInfWord", "cluster: {min_headroom_gib: inf}\n", "cluster.min_headroom_gib", "must be a number in [0, 1000000]"},
    {"DoubleMinusInf", "model: {moe: {capacity_factor: -.inf}}\n", "model.moe.capacity_factor",
     "must be a number in [0.01, 1024]"},
    {"DoubleOverflow", "cluster: {reserve_gib: 1e309}\n", "cluster.reserve_gib", "must be a number in [0, 1000000]"},
    {"DoubleHuge", "cluster: {reserve_gib: 1e30}\n", "cluster.reserve_gib", "out of range; valid range is [0, 1000000]"},
    {"DoubleNegative", "cluster: {allocator_overhead: -0.5}\n", "cluster.allocator_overhead",
     "out of range; valid range is [0, 1)"},
    {"BoundaryTooBig", "parallel: {pp: 2, stage_boundaries: [9223372036854775808]}\n", "parallel.stage_boundaries[0]",
     ""},
};

class HardeningNumbers : public ::testing::TestWithParam<NumberCase> {};

TEST_P(HardeningNumbers, RejectedWithTheRange) {
  const NumberCase& c = GetParam();
  const LoadResult r = ExpectRejected(c.yaml);
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.key_path, c.key_path) << Format(d);
  EXPECT_NE(d.message.find(c.message), std::string::npos) << Format(d);
  EXPECT_EQ(d.mark.line, 1);
}

INSTANTIATE_TEST_SUITE_P(All, HardeningNumbers, ::testing::ValuesIn(kNumberCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// ---- bytes ---------------------------------------------------------------------

struct ByteCase {
  const char* name;
  std::string yaml;
  int line, column;  // of the first bad byte, counted by hand
  const char* message;
};

std::vector<ByteCase> ByteCases() {
  using namespace std::string_literals;
  return {
      {"Ff", "name: \"\xff\xfe\"\n", 1, 8, "byte 0xFF is not valid UTF-8; a recipe is UTF-8 text"},
      {"LoneContinuation", "model:\n  pattern: A\x80\n", 2, 13, "byte 0x80 is not valid UTF-8"},
      {"TruncatedSequence", "name: caf\xc3", 1, 10, "byte 0xC3 is not valid UTF-8"},
      {"Overlong", "name: \xc0\xaf\n", 1, 7, "byte 0xC0 is not valid UTF-8"},
      {"Surrogate", "name: \xed\xa0\x80\n", 1, 7, "byte 0xED is not valid UTF-8"},
      {"PastUnicode", "name: \xf4\x90\x80\x80\n", 1, 7, "byte 0xF4 is not valid UTF-8"},
      {"Nul", "name: a\0b\n"s, 1, 8, "control character U+0000 is not allowed in YAML"},
      {"Escape", "name: \x1b[31mred\n", 1, 7, "control character U+001B is not allowed in YAML"},
      {"Delete", "name: a\x7f\n", 1, 8, "control character U+007F is not allowed in YAML"},
      {"C1Control", "name: \xc2\x9b\n", 1, 7, "control character U+009B is not allowed in YAML"},
      {"NonCharacter", "\n\nname: \xef\xbf\xbf\n", 3, 7, "control character U+FFFF is not allowed in YAML"},
  };
}

class HardeningBytes : public ::testing::TestWithParam<ByteCase> {};

TEST_P(HardeningBytes, RejectedAtTheByte) {
  const ByteCase& c = GetParam();
  const LoadResult r = ExpectRejected(c.yaml);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  const Diagnostic& d = r.diagnostics[0];
  EXPECT_EQ(d.mark.line, c.line);
  EXPECT_EQ(d.mark.column, c.column);
  EXPECT_NE(d.message.find(c.message), std::string::npos) << d.message;
  // What is printed back is plain ASCII, whatever the input held.
  for (char ch : Format(d)) {
    EXPECT_TRUE(ch == '\n' || (ch >= 0x20 && ch <= 0x7e)) << "byte " << static_cast<int>(static_cast<unsigned char>(ch));
  }
}

INSTANTIATE_TEST_SUITE_P(All, HardeningBytes, ::testing::ValuesIn(ByteCases()),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(HardeningBytesOk, Utf8NameAndByteOrderMarkAreFine) {
  const LoadResult r = LoadRecipeFromString("\xef\xbb\xbfname: \"Mod\xc3\xa8le \xe2\x9c\x88 \xf0\x9f\x9a\x80\"\n", kFile);
  ASSERT_TRUE(r.ok()) << FormatAll(r);
  EXPECT_EQ(r.recipe->name, "Mod\xc3\xa8le \xe2\x9c\x88 \xf0\x9f\x9a\x80");
}

TEST(HardeningBytesOk, BadBytesInAnOverride) {
  const auto o = ParseOverride("name=\xff\x1b");
  ASSERT_TRUE(o.has_value());
  const LoadResult r = ExpectRejected("name: x\n", {*o});
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.file, "--set name=??");
  EXPECT_EQ(d.key_path, "name");
  EXPECT_EQ(d.message, "at column 6 of the override: byte 0xFF is not valid UTF-8; a recipe is UTF-8 text");
}

// ---- documents -------------------------------------------------------------------

TEST(HardeningDocuments, MillionEmptyDocuments) {
  // 4 MiB of "---\n": a million documents, each null.
  const LoadResult r = ExpectRejected(Repeat("---\n", (size_t{4} << 20) / 4));
  EXPECT_EQ(r.diagnostics.size(), 1u) << FormatAll(r);
}

TEST(HardeningDocuments, ManyDocumentsAfterARecipe) {
  // 10,000 documents: 60,000 separators, under the parser's 400,000 bound.
  const LoadResult r = ExpectRejected("name: x\n" + Repeat("---\nname: y\n", 10'000));
  const Diagnostic d = FirstError(r);
  EXPECT_EQ(d.mark.line, 3);  // the first node of the second document, "name: y"
  EXPECT_NE(d.message.find("a second YAML document"), std::string::npos);
}

}  // namespace
}  // namespace preflight::hardening_input_test

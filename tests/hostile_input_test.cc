// Defects from the hostile-input sweep (issue "Hostile input, full disks and
// huge layouts"), one test each, named after the defect's number there.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"
#include "preflight/planner/plan.h"
#include "preflight/planner/stages.h"
#include "preflight/planner/sweep.h"
#include "preflight/recipe/import.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/check.h"
#include "support/test_support.h"

namespace preflight::hostile_input_test {
namespace {

using testing::RunPreflight;

const char* kRecipe = "recipes/llama3-8b-h200.yaml";

// 7: a JSON config that gives a key twice (a reader keeps either) is refused,
// with the key and where its second copy is.
TEST(HostileInput, Defect7DuplicateJsonKeyIsRefused) {
  const HfImport r = ImportHfConfig(
      "{\"architectures\": [\"LlamaForCausalLM\"],\n \"hidden_size\": 4096,\n \"hidden_size\": 8192}", "c.json");
  ASSERT_FALSE(r.diagnostics.empty());
  EXPECT_EQ(r.diagnostics.front().severity, Severity::kError);
  EXPECT_EQ(r.diagnostics.front().key_path, "hidden_size");
  EXPECT_EQ(r.diagnostics.front().mark.line, 3);
  EXPECT_NE(r.diagnostics.front().message.find("twice"), std::string::npos);
}

// 1: the balanced cut's search (chunks x layers^2 / 2 steps, (chunks + 1) x
// (layers + 1) cells) is bounded: on 100,000 layers `partition: balanced` is
// refused on its key before anything is sized, and the framework's partition
// plans without the advice search.
TEST(HostileInput, Defect1BalancedSearchIsBounded) {
  EXPECT_TRUE(BalancedSearchAffordable(126, 128));
  EXPECT_FALSE(BalancedSearchAffordable(100000, 4));
  const std::vector<Override> deep = {{"model.pattern", "AEME"}, {"model.repeat", "25000"}};
  std::vector<Override> balanced = deep;
  balanced.push_back({"parallel.partition", "balanced"});
  const LoadResult b = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"), balanced);
  ASSERT_TRUE(b.ok());
  const std::vector<Diagnostic> refused = ValidateForPlan(*b.recipe, LayoutOf(*b.recipe));
  ASSERT_TRUE(HasErrors(refused));
  EXPECT_EQ(refused.front().key_path, "parallel.partition");
  const LoadResult m = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"), deep);
  ASSERT_TRUE(m.ok());
  const PlanResult p = MakePlan(BuildInventory(*m.recipe), LayoutOf(*m.recipe));
  ASSERT_TRUE(p.plan.has_value());
  EXPECT_FALSE(p.plan->balanced_cut.has_value());
  EXPECT_EQ(p.plan->stages.chunks.size(), 4u);
}

// 3: inputs are read bounded and from regular files only: a device or a
// FIFO is refused at once (no unbounded read, no hang), stdin is capped.
TEST(HostileInput, Defect3ReadsAreBoundedAndRegularFilesOnly) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"import", "hf", "/dev/zero"},
                                               {"import", "megatron", "/dev/zero"},
                                               {"diff", "/dev/zero", kRecipe},
                                               {"import", "hf", "recipes"}}) {
    const auto run = RunPreflight(args);
    EXPECT_EQ(run.exit_code, 2) << args[1];
    EXPECT_NE(run.err.find("not a regular file"), std::string::npos) << run.err;
  }
  const auto big = RunPreflight({"import", "megatron", "-"}, std::string((16u << 20) + 2, 'a'));
  EXPECT_EQ(big.exit_code, 2);
  EXPECT_NE(big.err.find("larger than 16 MiB"), std::string::npos) << big.err;
}

// 11: a write that fails (a full disk) exits 2 naming the path and the
// system's reason, for files and for standard output alike; a file is
// replaced whole, through a temporary that does not stay behind.
TEST(HostileInput, Defect11WriteFailuresExitTwo) {
  const auto full = RunPreflight({"sweep", kRecipe, "--gpus", "8", "--tp", "1", "--pp", "1", "--out", "/dev/full"});
  EXPECT_EQ(full.exit_code, 2);
  EXPECT_NE(full.err.find("/dev/full: cannot write"), std::string::npos) << full.err;
  const std::string command =
      std::string(PREFLIGHT_BINARY) + " plan " + testing::SourcePath(kRecipe) + " > /dev/full 2> /dev/null";
  const int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string dir = ::testing::TempDir() + "preflight_write_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/sweep.csv";
  std::ofstream(out) << "old";
  const auto ok =
      RunPreflight({"sweep", kRecipe, "--gpus", "8", "--tp", "1", "--pp", "1", "--format", "csv", "--out", out});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(testing::ReadFile(out).rfind("tp,sp,", 0), 0u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir);
}

// 12: outputs are not written through a symbolic link, nor onto an input of
// the same run (sweep --out naming the recipe).
TEST(HostileInput, Defect12NoWriteThroughLinksOrOntoInputs) {
  const std::string dir = ::testing::TempDir() + "preflight_link_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string recipe = dir + "/r.yaml";
  std::filesystem::copy_file(testing::SourcePath(kRecipe), recipe);
  const std::string before = testing::ReadFile(recipe);
  const auto onto = RunPreflight({"sweep", recipe, "--gpus", "8", "--tp", "1", "--pp", "1", "--out", recipe});
  EXPECT_EQ(onto.exit_code, 2);
  EXPECT_NE(onto.err.find("is an input of this run"), std::string::npos) << onto.err;
  EXPECT_EQ(testing::ReadFile(recipe), before);
  const std::string link = dir + "/link.csv";
  std::filesystem::create_symlink(recipe, link);
  const auto through = RunPreflight({"sweep", kRecipe, "--gpus", "8", "--tp", "1", "--pp", "1", "--out", link});
  EXPECT_EQ(through.exit_code, 2);
  EXPECT_NE(through.err.find("symbolic link"), std::string::npos) << through.err;
  EXPECT_EQ(testing::ReadFile(recipe), before);
  std::filesystem::remove_all(dir);
}

// 14: text from input is escaped for where it goes: a backtick in a file name
// cannot close the Markdown code span around it, control characters reach
// neither the pull-request comment nor the SVG.
TEST(HostileInput, Defect14NamesAreEscapedForMarkdownAndSvg) {
  CheckReport report;
  CheckEntry e;
  e.file = "a`b\x1b[31m.yaml";
  e.errors = {"bad | input"};
  report.entries.push_back(e);
  const std::string md = RenderCheckMarkdown(report);
  EXPECT_NE(md.find("``a`b?[31m.yaml``"), std::string::npos) << md;
  EXPECT_EQ(md.find('\x1b'), std::string::npos);
  EXPECT_NE(md.find("bad \\| input"), std::string::npos) << md;
  // A recipe name with a control character is refused where it is read...
  const LoadResult bell = LoadRecipeFile(testing::SourcePath(kRecipe), {{"name", "\"x\\u0007y\""}});
  ASSERT_FALSE(bell.ok());
  EXPECT_EQ(bell.diagnostics.front().key_path, "name");
  // ...and markup in one is escaped in the SVG.
  const std::string svg_path = ::testing::TempDir() + "defect14.svg";
  const auto svg = RunPreflight({"fit", kRecipe, "--set", "name=\"x<y>&'\"", "--svg", svg_path});
  EXPECT_EQ(svg.exit_code, 0) << svg.err;
  EXPECT_NE(testing::ReadFile(svg_path).find("<title>x&lt;y&gt;&amp;&apos;"), std::string::npos);
  std::remove(svg_path.c_str());
}

// 14, the terminal: control characters that come from input (an imported
// config's values, a file name, an option's value) reach stderr escaped, so
// an input cannot recolour the terminal or move its cursor.
TEST(HostileInput, Defect14InputReachesTheTerminalEscaped) {
  Diagnostic d;
  d.file = "f\x1b.json";
  d.key_path = "architectures";
  d.value = "\"Llama\x1b[31mX\"";
  d.message = "unsupported\r architecture\nsecond line";
  const std::string text = Format(d);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_NE(text.find("Llama\\x1b[31mX"), std::string::npos) << text;
  EXPECT_NE(text.find("architecture\nsecond line"), std::string::npos) << text;  // a message keeps its lines
  const std::string config = ::testing::TempDir() + "escape.json";
  std::ofstream(config) << "{\"architectures\": [\"Llama\\u001b[31mX\"]}";
  const auto hf = RunPreflight({"import", "hf", config});
  EXPECT_EQ(hf.exit_code, 2);
  EXPECT_EQ(hf.err.find('\x1b'), std::string::npos) << hf.err;
  EXPECT_NE(hf.err.find("\\x1b"), std::string::npos) << hf.err;
  std::remove(config.c_str());
  const auto path = RunPreflight({"validate", "missing\x1b[2J.yaml"});
  EXPECT_EQ(path.exit_code, 2);
  EXPECT_EQ(path.err.find('\x1b'), std::string::npos) << path.err;
  const auto option = RunPreflight({"sweep", kRecipe, "--gpus", "8", "--tp", "1\x1b[2J"});
  EXPECT_EQ(option.exit_code, 2);
  EXPECT_EQ(option.err.find('\x1b'), std::string::npos) << option.err;
}

// 7: a --set value spanning lines could open another YAML document in the
// text it is spliced into; text after the document end "..." would go
// unread. Both are refused.
TEST(HostileInput, Defect7MultiLineSetAndTextAfterDocumentEndAreRefused) {
  const auto set = RunPreflight({"fit", kRecipe, "--set", "parallel.tp=4\n---\n8"});
  EXPECT_EQ(set.exit_code, 2);
  EXPECT_NE(set.err.find("one line"), std::string::npos) << set.err;
  EXPECT_FALSE(ParseOverride("parallel.tp=4\r\n").has_value());
  EXPECT_TRUE(ParseOverride("parallel.tp=4").has_value());
  const LoadResult r = LoadRecipeFromString("name: x\n...\n%%%\n", "r.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.diagnostics.front().mark.line, 3);
  EXPECT_TRUE(LoadRecipeFromString("name: x\n...\n# a comment\n", "r.yaml").ok());
}

// 9: a --layout value with a line break cannot inject a YAML section into
// the imported recipe.
TEST(HostileInput, Defect9LayoutValueWithNewlineIsRefused) {
  const std::string path = ::testing::TempDir() + "llama.json";
  std::ofstream(path) << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, "
                         "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
                         "\"vocab_size\": 128256, \"intermediate_size\": 14336}";
  const auto run = RunPreflight({"import", "hf", path, "--layout", "cluster.nodes=2\nparallel:\n  tp: 8"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("one line"), std::string::npos) << run.err;
  EXPECT_EQ(run.out, "");
  std::remove(path.c_str());
}

// 2 and 6: a sweep space too large to hold, or whose size overflows 64 bits,
// and a cluster beyond the recipe's node range are refused before anything
// is sized by them (no bad_alloc, no "0 layouts" with exit 0).
TEST(HostileInput, Defects2And6SweepSpaceAndClusterAreBounded) {
  const auto wide = RunPreflight(
      {"sweep", kRecipe, "--gpus", "1024", "--tp", "1..1024", "--pp", "1..1024", "--cp", "1..1024", "--ep", "1..1024"});
  EXPECT_EQ(wide.exit_code, 2);
  EXPECT_NE(wide.err.find("narrow the axes"), std::string::npos) << wide.err;
  const auto huge = RunPreflight({"sweep", kRecipe, "--gpus", "4611686018427387904"});
  EXPECT_EQ(huge.exit_code, 2);
  EXPECT_NE(huge.err.find("cluster.nodes"), std::string::npos) << huge.err;
  SweepSpace overflow;
  overflow.recompute.assign(3, Recompute::kNone);
  for (auto* axis : {&overflow.tp, &overflow.cp, &overflow.pp, &overflow.vpp, &overflow.ep, &overflow.expert_tp,
                     &overflow.dp_replicate, &overflow.micro_batch, &overflow.zero}) {
    axis->assign(1u << 10, 1);
  }
  EXPECT_FALSE(CheckedSweepSize(overflow).has_value());
}

// 4: fit re-plans every candidate of its advice; the balanced-cut search
// (O(L^2) in the layers) runs only where its advice is shown, so fit is no
// longer quadratic per candidate (timings in bench/README.md). The plan
// priced is the same with and without the advice.
TEST(HostileInput, Defect4SuggestionsSkipTheBalancedCutSearch) {
  const LoadResult r = LoadRecipeFile(testing::SourcePath("recipes/nam56r-h200.yaml"));
  ASSERT_TRUE(r.ok());
  const Inventory inv = BuildInventory(*r.recipe);
  const PlanResult advised = MakePlan(inv, LayoutOf(*r.recipe));
  const PlanResult priced = MakePlan(inv, LayoutOf(*r.recipe), CostModel{}, /*advise_balanced_cut=*/false);
  ASSERT_TRUE(advised.plan && priced.plan);
  EXPECT_TRUE(advised.plan->balanced_cut.has_value());
  EXPECT_FALSE(priced.plan->balanced_cut.has_value());
  EXPECT_EQ(priced.plan->time.step_s, advised.plan->time.step_s);
  EXPECT_EQ(priced.plan->memory->stages.front().total(), advised.plan->memory->stages.front().total());
}

// 8: nan passes a range check (every comparison with it is false); the
// numeric options refuse it as bad input.
TEST(HostileInput, Defect8NanOptionsAreBadInput) {
  EXPECT_EQ(RunPreflight({"check", kRecipe, "--max-regression-gib", "nan"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"check", kRecipe, "--max-regression-gib", "inf"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"plan", kRecipe, "--compute-efficiency", "nan"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"plan", kRecipe, "--latency-us", "nan"}).exit_code, 2);
  EXPECT_EQ(RunPreflight({"check", kRecipe, "--max-regression-gib", "0.5"}).exit_code, 0);
}

// 10: a number beyond double range is a located input error (exit 2), not an
// internal error (exit 3).
TEST(HostileInput, Defect10NumberOverflowInHfConfigIsBadInput) {
  const HfImport r = ImportHfConfig("{\"architectures\": [\"LlamaForCausalLM\"],\n \"hidden_size\": 1e400}", "c.json");
  ASSERT_FALSE(r.diagnostics.empty());
  EXPECT_EQ(r.diagnostics.front().mark.line, 2);
  EXPECT_NE(r.diagnostics.front().message.find("out of range"), std::string::npos);
  const std::string path = ::testing::TempDir() + "overflow.json";
  std::ofstream(path) << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 1e400}";
  const auto run = RunPreflight({"import", "hf", path});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("1e400"), std::string::npos) << run.err;
  std::remove(path.c_str());
}

// 13: an unknown command is named (with the valid ones), not "A subcommand
// is required"; control characters in it stay escaped.
TEST(HostileInput, Defect13UnknownCommandIsNamed) {
  const auto run = RunPreflight({"frobnicate"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("unknown command 'frobnicate'"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("plan"), std::string::npos);
  const auto ctrl = RunPreflight({"bad\x1b[31mred"});
  EXPECT_EQ(ctrl.exit_code, 2);
  EXPECT_EQ(ctrl.err.find('\x1b'), std::string::npos) << ctrl.err;
}

// 15-17 (UBSan, found by the structured fuzz input of tests/fuzz): HSDP
// replicas that do not divide the expert group of a model without E layers
// (gpt-oss-120b's ep 64 on an A/D pattern, dp_replicate 16) passed
// validation, and the mesh divided by an expert ZeRO group of 0 ranks.
// Megatron builds the expert groups with or without MoE layers and asserts
// the division; so does the validator now, on the key.
TEST(HostileInput, UbsanExpertGroupOfNoRanksIsRefused) {
  const LoadResult r = LoadRecipeFile(testing::SourcePath("recipes/gpt-oss-120b-h200.yaml"),
                                      {{"model.pattern", "AD"}, {"parallel.dp_replicate", "16"}});
  ASSERT_FALSE(r.ok());
  const std::string error = testing::FirstErrorText(r);
  EXPECT_NE(error.find("parallel.dp_replicate = 16: must divide the expert data-parallel group (1 ranks)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("set it to 1"), std::string::npos) << error;
}

// 15-17 (UBSan, found by hunting every sweep option at the int64 bounds): an
// axis list up to 2^63 - 1 overflowed its `++x` loop, and --gpus 2^63 - 1
// overflowed the "try N or M" advice of a GPU count no node size divides.
TEST(HostileInput, UbsanSweepAxisAndGpusAtTheInt64Bound) {
  std::string error;
  EXPECT_FALSE(ParseAxisList("9223372036854775807", 1, &error).has_value());
  EXPECT_NE(error.find("above the largest value an axis takes, 16777216"), std::string::npos) << error;
  EXPECT_FALSE(ParseAxisList("1..9223372036854775807", 1, &error).has_value());
  EXPECT_TRUE(ParseAxisList("16777216", 1, &error).has_value()) << error;
  const auto tp = RunPreflight({"sweep", kRecipe, "--gpus", "64", "--tp", "9223372036854775807"});
  EXPECT_EQ(tp.exit_code, 2);
  EXPECT_NE(tp.err.find("--tp"), std::string::npos) << tp.err;
  const auto gpus = RunPreflight({"sweep", kRecipe, "--gpus", "9223372036854775807"});
  EXPECT_EQ(gpus.exit_code, 2);
  EXPECT_NE(gpus.err.find("largest cluster"), std::string::npos) << gpus.err;
}

}  // namespace
}  // namespace preflight::hostile_input_test

// `preflight plan` end to end: exit codes, sections, JSON keys (docs/plan.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::planner_cli_test {
namespace {

using testing::RunPreflight;

TEST(PlannerCli, DefaultRecipeTable) {
  const auto r = RunPreflight({"plan", "recipes/nam56r-h200.yaml"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* section : {"rank map", "groups per axis", "stages (partitioned by megatron",
                              "communication per step", "step time", "MFU"}) {
    EXPECT_NE(r.out.find(section), std::string::npos) << section << "\n" << r.out;
  }
}

TEST(PlannerCli, JsonKeys) {
  const auto r = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["world"], 64);
  EXPECT_EQ(j["layout"]["tp"], 4);
  EXPECT_EQ(j["rank_map"].size(), 8u);
  EXPECT_EQ(j["stages"].size(), 4u);
  EXPECT_TRUE(j["stages"][0].contains("memory"));
  EXPECT_EQ(j["communication"].size(), 4u);
  EXPECT_TRUE(j["step"]["step_s"].get<double>() > 0);
  // nam56r: tp 4 inside a node (tp-cp-dp-pp, 8 GPUs a node).
  for (const auto& g : j["groups"]) {
    if (g["axis"] == "tp") {
      EXPECT_TRUE(g["intra_node"].get<bool>());
    }
    if (g["axis"] == "pp") {
      EXPECT_FALSE(g["intra_node"].get<bool>());
      // rank = tp + 4*(dp + 4*pp): the first PP group strides 16 ranks.
      EXPECT_EQ(g["first_group"], nlohmann::json::parse("[0, 16, 32, 48]"));
    }
  }
}

// The cost knobs reach the model: at a quarter of peak the compute takes
// longer, so the step does and tokens/s drop.
TEST(PlannerCli, ComputeEfficiencyKnob) {
  const auto base = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json"});
  const auto slow =
      RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json", "--compute-efficiency", "0.25"});
  ASSERT_EQ(base.exit_code, 0) << base.err;
  ASSERT_EQ(slow.exit_code, 0) << slow.err;
  const auto b = nlohmann::json::parse(base.out);
  const auto s = nlohmann::json::parse(slow.out);
  EXPECT_EQ(s["cost_model"]["compute_efficiency"], 0.25);
  EXPECT_GT(s["step"]["step_s"].get<double>(), b["step"]["step_s"].get<double>());
  EXPECT_LT(s["step"]["tokens_per_s"].get<double>(), b["step"]["tokens_per_s"].get<double>());
  EXPECT_EQ(RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--compute-efficiency", "2"}).exit_code, 2);
}

// Memory as the balanced partition's constraint (docs/plan.md): the default
// recipe's time-balanced cut puts 14 layers and the embedding on stage 0 (the
// estimator puts it at ~26.8 GiB); on a device of 26000 MiB (25.4 GiB) that
// overflows, and the parameter-balanced cut (10 layers beside the embedding,
// ~21.8 GiB) fits. With the real 143771 MiB the time cut stays.
TEST(PlannerCli, MemoryConstrainsTheBalancedPartition) {
  const auto roomy =
      RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json", "--set", "parallel.partition=balanced"});
  ASSERT_EQ(roomy.exit_code, 0) << roomy.err;
  EXPECT_EQ(nlohmann::json::parse(roomy.out)["partition"], "time");
  const auto tight = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json", "--set",
                                   "cluster.capacity_mib=26000", "--set", "parallel.partition=balanced"});
  ASSERT_EQ(tight.exit_code, 0) << tight.err;
  const auto j = nlohmann::json::parse(tight.out);
  EXPECT_EQ(j["partition"], "parameters");
  EXPECT_TRUE(j["memory_verdict"]["fits"].get<bool>());
  EXPECT_LT(j["stages"][0]["chunks"][0]["end_layer"].get<int>(), 14);
  EXPECT_NE(tight.err.find("does not fit in memory"), std::string::npos) << tight.err;
}

// Megatron's split is priced as the job runs (12 layers a stage, stage 0
// 23.65 GiB with the embedding); on a 24000 MiB device it is over, and the
// plan says so rather than pricing another cut, then names the balanced cut
// that fits (10 | 12 | 15 | 11 layers, the parameter-balanced one).
TEST(PlannerCli, FrameworkPartitionIsPricedAndTheBalancedCutAdvised) {
  const auto r =
      RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json", "--set", "cluster.capacity_mib=24000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["partition"], "megatron");
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(j["stages"][s]["chunks"][0]["first_layer"], 12 * s);
    EXPECT_EQ(j["stages"][s]["chunks"][0]["end_layer"], 12 * s + 12);
  }
  EXPECT_FALSE(j["memory_verdict"]["fits"].get<bool>());
  ASSERT_TRUE(j.contains("balanced_cut")) << r.out;
  EXPECT_TRUE(j["balanced_cut"]["fits"].get<bool>());
  EXPECT_EQ(j["balanced_cut"]["stage_boundaries"], (std::vector<int>{10, 22, 37}));
  EXPECT_LT(j["balanced_cut"]["worst_stage_total_bytes_after"].get<int64_t>(),
            j["balanced_cut"]["worst_stage_total_bytes_before"].get<int64_t>());
  // Pinned as advised, the plan prices that cut and fits.
  const auto pinned = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--format", "json", "--set",
                                    "cluster.capacity_mib=24000", "--set", "parallel.stage_boundaries=[10,22,37]"});
  ASSERT_EQ(pinned.exit_code, 0) << pinned.err;
  const auto p = nlohmann::json::parse(pinned.out);
  EXPECT_TRUE(p["memory_verdict"]["fits"].get<bool>());
  EXPECT_FALSE(p.contains("balanced_cut"));
}

TEST(PlannerCli, BadInputExitsTwo) {
  const auto r = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--set", "parallel.tp=3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("parallel.tp"), std::string::npos) << r.err;
  const auto missing = RunPreflight({"plan", "recipes/no-such-recipe.yaml"});
  EXPECT_EQ(missing.exit_code, 2);
}

// All-to-all CP on the R block needs model.recurrent.heads (32) % (tp*cp)
// == 0; tp 4 x cp 16 = 64 does not divide it (the Mamba, sequence and world
// rules all pass with pp 1). The recipe validator reports it on parallel.cp;
// the hand-off mode has no head rule and plans.
TEST(PlannerCli, ContextParallelOnRecurrentRejected) {
  const auto r = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--set", "parallel.cp=16", "--set", "parallel.pp=1"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("parallel.cp = 16"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.recurrent.heads/tp (8) divisible by cp"), std::string::npos) << r.err;
  const auto handoff = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--set", "parallel.cp=16", "--set",
                                     "parallel.pp=1", "--set", "parallel.cp_recurrent=handoff"});
  EXPECT_EQ(handoff.exit_code, 0) << handoff.err;
}

// --emit prints the launch configuration instead of the report: Megatron
// arguments (a shell block) or a torchtitan config module on stdout, what the
// framework cannot express as warnings on stderr (nam56r's R block,
// docs/formulas.md §0: Megatron's layer symbols are M * - E). A
// configuration that does not run the plan as priced exits 1 with its
// reasons on stderr and a # WARNING: block opening the text; --force exits 0
// with the same text.
TEST(PlannerCli, EmitMegatron) {
  const auto r = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--emit", "megatron"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out.rfind("# WARNING: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("# Megatron-LM arguments for nam56r-h200"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--tensor-model-parallel-size 4 \\\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank map"), std::string::npos) << "no plan report with --emit";
  EXPECT_NE(r.err.find("warning: model.pattern = AEMEAEMEAEMR: --emit megatron: R (recurrent)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--emit megatron: model.pattern = AEMEAEMEAEMR: R (recurrent)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exit 1; --force"), std::string::npos) << r.err;
  const auto forced = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--emit", "megatron", "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.out, r.out);
  EXPECT_NE(forced.err.find("emitted anyway (--force)"), std::string::npos) << forced.err;
}

// The example: 79.9 GiB over capacity on every stage; `fit` exits 1
// on it, and so does --emit, saying why, unless --force.
TEST(PlannerCli, EmitRefusesWhatDoesNotFit) {
  const std::vector<std::string> args = {"plan",  "recipes/llama3-8b-h200.yaml", "--set", "training.micro_batch=4",
                                         "--set", "training.recompute=none"};
  ASSERT_EQ(RunPreflight({"fit", "recipes/llama3-8b-h200.yaml", "--set", "training.micro_batch=4", "--set",
                          "training.recompute=none"})
                .exit_code,
            1);
  for (const char* target : {"megatron", "torchtitan"}) {
    std::vector<std::string> emit = args;
    emit.insert(emit.end(), {"--emit", target});
    const auto r = RunPreflight(emit);
    EXPECT_EQ(r.exit_code, 1) << target << r.err;
    EXPECT_NE(r.err.find("the plan does not fit: stage 0 over capacity by"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.rfind("# WARNING: ", 0), 0u) << r.out;
    emit.push_back("--force");
    const auto forced = RunPreflight(emit);
    EXPECT_EQ(forced.exit_code, 0) << target << forced.err;
    EXPECT_EQ(forced.out.rfind("# WARNING: ", 0), 0u) << forced.out;
  }
}

// What runs as planned exits 0 without a WARNING block: Llama 3 8B on AdamW
// with the distributed optimizer for Megatron; on ZeRO 3 (FSDP2), full
// recompute and plain PyTorch for torchtitan.
TEST(PlannerCli, EmitRunnableExitsZero) {
  const auto m = RunPreflight(
      {"plan", "recipes/llama3-8b-h200.yaml", "--emit", "megatron", "--set", "training.optimizer.matrices=adamw"});
  EXPECT_EQ(m.exit_code, 0) << m.err;
  EXPECT_EQ(m.out.find("WARNING"), std::string::npos) << m.out;
  const auto t =
      RunPreflight({"plan", "recipes/llama3-8b-h200.yaml", "--emit", "torchtitan", "--set",
                    "training.optimizer.matrices=adamw", "--set", "parallel.zero=3", "--set", "training.recompute=full",
                    "--set", "training.transformer_engine=false", "--set", "training.cross_entropy=fp32_upcast"});
  EXPECT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out.find("WARNING"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("def preflight_config() -> Trainer.Config:\n"), std::string::npos) << t.out;
}

TEST(PlannerCli, EmitTorchtitan) {
  const auto r = RunPreflight({"plan", "recipes/llama3-405b-h200.yaml", "--emit", "torchtitan"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("parallelism=ParallelismConfig(\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensor_parallel_degree=8,\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("parallel.order"), std::string::npos) << r.err;
  // --force needs --emit.
  EXPECT_EQ(RunPreflight({"plan", "recipes/llama3-8b-h200.yaml", "--force"}).exit_code, 2);
}

// A bad --emit value is a usage error: exit 2 naming the valid values.
TEST(PlannerCli, EmitBadValue) {
  const auto r = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--emit", "foo"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("foo"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("megatron"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("torchtitan"), std::string::npos) << r.err;
  // --emit replaces the report, so it does not combine with --format.
  EXPECT_EQ(RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--emit", "megatron", "--format", "json"}).exit_code, 2);
  // A bad recipe still exits 2 before anything is emitted.
  const auto bad = RunPreflight({"plan", "recipes/nam56r-h200.yaml", "--emit", "megatron", "--set", "parallel.tp=3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(bad.out.empty()) << bad.out;
}

}  // namespace
}  // namespace preflight::planner_cli_test

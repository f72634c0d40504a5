// `preflight simulate`: exit codes and output formats.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::simulate_cli_test {
namespace {

using testing::RunPreflight;

// Issue 7's done criterion: the scaled default recipe on its full layout --
// tp 4 with SP, pp 4 (1F1B), dp 4, ep 8 over tp x dp, ZeRO 1, Muon + AdamW,
// every block family -- agrees on numerics, bytes and memory.
TEST(SimulateCli, DefaultRecipeOnItsFullLayoutAgrees) {
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "agree");
  EXPECT_EQ(j["ranks"], 64);
  EXPECT_EQ(j["layout"]["tp"], 4);
  EXPECT_EQ(j["layout"]["pp"], 4);
  EXPECT_EQ(j["layout"]["dp"], 4);
  EXPECT_EQ(j["layout"]["ep"], 8);
  EXPECT_EQ(j["layout"]["zero"], 1);
  ASSERT_EQ(j["comparison"]["stages"].size(), 4u);
  // Every family's activations are measured somewhere in the pipeline, and
  // both optimizers hold state.
  std::set<std::string> families;
  int64_t muon = 0, adamw = 0;
  for (const auto& stage : j["comparison"]["stages"]) {
    for (const auto& row : stage["memory"]) {
      const std::string c = row["category"];
      if (c.rfind("activations ", 0) == 0 && row["measured"].get<int64_t>() > 0) families.insert(c);
      if (c == "optimizer_muon") muon += row["measured"].get<int64_t>();
      if (c == "optimizer_adamw") adamw += row["measured"].get<int64_t>();
    }
  }
  for (const char* f : {"activations A", "activations M", "activations E", "activations R"}) EXPECT_EQ(families.count(f), 1u) << f;
  EXPECT_GT(muon, 0);
  EXPECT_GT(adamw, 0);
}

TEST(SimulateCli, AgreesOnTheDefaultRecipesDensePart) {
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AD", "--set",
                               "parallel.pp=1", "--scale", "hidden=16", "--scale", "seq=8", "--scale", "max_world=8"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("verdict: agree"), std::string::npos) << r.out;
}

TEST(SimulateCli, JsonCarriesEveryRankEveryStageAndTheVerdict) {
  // pp 2 x tp 4 x dp 2 (ep 2 folds over tp x dp): 16 ranks, 2 stages.
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AE", "--set",
                               "parallel.ep=2", "--set", "parallel.pp=2", "--scale", "hidden=16", "--scale",
                               "max_world=16", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "agree");
  EXPECT_EQ(j["ranks"], 16);
  EXPECT_EQ(j["per_rank"].size(), 16u);
  EXPECT_EQ(j["comparison"]["stages"].size(), 2u);
  EXPECT_EQ(j["layout"]["dp"], 2);
  EXPECT_FALSE(j["numerics"]["gradients"].empty());
  EXPECT_EQ(j["numerics"]["updates"].size(), j["numerics"]["gradients"].size());
}

// Issue 20: shipped recipes the executor used to refuse, each for a block
// it lacked: Nemotron-H's squared-ReLU MLP, Qwen3-30B-A3B's qk_norm, Mamba-2's
// tied embeddings. Each now runs on its own layout and agrees.
TEST(SimulateCli, ShippedRecipesWithNewBlocksAgree) {
  for (const char* recipe : {"nemotron-h-8b-h200", "qwen3-30b-a3b-h200", "mamba2-2.7b-h200"}) {
    const auto r = RunPreflight({"simulate", std::string("recipes/") + recipe + ".yaml", "--format", "json"});
    ASSERT_EQ(r.exit_code, 0) << recipe << "\n" << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["verdict"], "agree") << recipe;
  }
}

TEST(SimulateCli, TiedEmbeddingsUnderZero2OnOneStageIsBadInput) {
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AD", "--set",
                               "model.tie_embeddings=true", "--set", "parallel.zero=2", "--set", "parallel.pp=1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("tied embeddings and MTP under ZeRO 2/3 are in the executor when the embedding and the head "
                       "are on different pipeline ranks only"),
            std::string::npos)
      << r.err;
}

TEST(SimulateCli, TiedEmbeddingsUnderZero2OverStagesAgree) {
  // pp 4: the copies on the first and last stage, their shares summed.
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AD", "--set",
                               "model.tie_embeddings=true", "--set", "parallel.zero=2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(SimulateCli, MoreThan1024RanksIsBadInput) {
  // Llama 3 405B's long-context layout (the recipe's comment): tp 8 x cp 16 x
  // pp 16 = 2,048 model ranks even at dp 1, past the executor's 1,024 threads.
  const auto r = RunPreflight({"simulate", "recipes/llama3-405b-h200.yaml", "--set", "training.seq_len=131072", "--set",
                               "parallel.cp=16", "--set", "training.global_batch=128"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("the executor runs at most 1024 simulated ranks"), std::string::npos) << r.err;
}

TEST(SimulateCli, ALayoutABlockRefusesIsBadInputNotACrash) {
  // The Mamba block refuses the fused kernel under all-to-all CP inside its
  // rank thread; the refusal reaches the user as exit 2 with the reason.
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.mamba.fused_norm_out_proj=true",
                               "--set", "parallel.cp=2", "--scale", "max_world=32"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot simulate: Mamba fused_norm_out_proj is not supported with all-to-all CP"),
            std::string::npos)
      << r.err;
}

TEST(SimulateCli, BadScaleIsBadInput) {
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--scale", "hidden=0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--scale hidden = 0: must be an integer in 1..1024"), std::string::npos) << r.err;
  const auto k = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--scale", "width=8"});
  EXPECT_EQ(k.exit_code, 2);
  EXPECT_NE(k.err.find("KEY one of hidden"), std::string::npos) << k.err;
}

// The MPI runtime outside mpirun (or in a build without MPI) is bad input that
// names the -np the scaled layout needs: nam56r-h200 keeps tp 4 x pp 4 x dp 4 = 64 ranks.
TEST(SimulateCli, MpiRuntimeOutsideMpirunNamesTheRankCount) {
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--runtime", "mpi"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--runtime mpi: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("start it with mpirun -np 64"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  const auto bad = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--runtime", "mpich"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
}

// A recipe the executor refuses says so first, under any runtime: no -np to
// start processes that would not be used.
TEST(SimulateCli, MpiRuntimeRefusesAnUnsupportedRecipeBeforeAskingForRanks) {
  const auto r =
      RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "training.dropout=0.1", "--runtime", "mpi"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("dropout inside flash attention is not in the executor"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("-np"), std::string::npos) << r.err;
}

// More than 1,024 ranks need the MPI runtime; max_world counts ranks, up to 65,536.
TEST(SimulateCli, ThreadRuntimeRefusesMoreThan1024Ranks) {
  const auto r = RunPreflight({"simulate", "recipes/llama3-405b-h200.yaml", "--scale", "max_world=2048"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("at most 1024 simulated ranks in one process; the scaled layout has 2048 (run it under mpirun"),
            std::string::npos)
      << r.err;
  const auto big = RunPreflight({"simulate", "recipes/llama3-8b-h200.yaml", "--scale", "max_world=65537"});
  EXPECT_EQ(big.exit_code, 2);
  EXPECT_NE(big.err.find("--scale max_world = 65537: must be an integer in 1..65536"), std::string::npos) << big.err;
}

TEST(SimulateCli, BadStageIsBadInput) {
  const auto r = RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AD", "--stage", "9"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--stage 9: must be a pipeline stage in 0..3"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace preflight::simulate_cli_test

namespace preflight::simulate_cli_test {
namespace {

// Expert-TP 2: the executor applies the routing probs at the source after the
// combine (docs/formulas.md §8.3, Megatron's unpermute), so the expert output kept for
// d(probs) is held once per dispatched row, not per expert-TP-gathered row.
// The estimator's MoE activations must equal what the executor measures,
// byte for byte, for every block family on every rank.
TEST(SimulateCli, ExpertTpActivationsMatchTheEstimatorExactly) {
  const auto r = testing::RunPreflight({"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AEDE", "--set",
                                        "parallel.ep=2", "--set", "parallel.expert_tp=2", "--set", "parallel.pp=1",
                                        "--set", "model.moe.pad_to_capacity=true", "--scale", "max_world=4", "--format",
                                        "json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "agree");
  int families = 0;
  for (const auto& row : j["comparison"]["stages"][0]["memory"]) {
    const std::string category = row["category"];
    if (category == "activations A" || category == "activations E" || category == "activations D") {
      EXPECT_EQ(row["measured"].get<int64_t>(), row["modeled"].get<int64_t>()) << category;
      ++families;
    }
  }
  EXPECT_EQ(families, 3);
}

}  // namespace
}  // namespace preflight::simulate_cli_test

namespace preflight::simulate_cli_test {
namespace {

// One thread per simulated rank: whatever order the threads reach the
// collectives in, the central matcher reduces in rank order, so the report
// (errors to the last bit, counted bytes, peaks) is the same run after run.
TEST(SimulateCli, OutputIsIdenticalRunAfterRun) {
  const std::vector<std::string> args = {"simulate", "recipes/nam56r-h200.yaml", "--set", "model.pattern=AEDE",
                                         "--set", "parallel.ep=4", "--scale", "max_world=16", "--format", "json"};
  const auto first = testing::RunPreflight(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  for (int run = 0; run < 3; ++run) {
    const auto again = testing::RunPreflight(args);
    EXPECT_EQ(again.exit_code, first.exit_code);
    EXPECT_EQ(again.out, first.out);
  }
}

}  // namespace
}  // namespace preflight::simulate_cli_test

namespace preflight::simulate_cli_test {
namespace {
// MLA's core is not rerun in the executor: selective core_attn on an MLA
// recipe is refused, not measured as a disagreement.
TEST(SimulateCli, MlaUpProjectionUnderUlyssesWithoutCoreIsRefused) {
  // Ulysses keeps its own head-split q, k, v, which the up-projection's rerun does not free.
  const auto r = testing::RunPreflight(
      {"simulate", "recipes/deepseek-v3-h200.yaml", "--set", "parallel.schedule=1f1b", "--set", "model.mtp_layers=0",
       "--set", "parallel.ep=4", "--set", "parallel.pp=2", "--set", "training.recompute=selective", "--set",
       "training.recompute_modules=[mla_up_proj]", "--set", "parallel.cp=2", "--set", "parallel.cp_comm=a2a"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("mla_up_proj is not in the executor under parallel.cp_comm: a2a"), std::string::npos) << r.err;
}
}  // namespace
}  // namespace preflight::simulate_cli_test

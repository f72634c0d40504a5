// Multi-token prediction in the executor (simulator/mtp_block.cc, Megatron
// multi_token_prediction.py MultiTokenPredictionLayer): one module's
// hand-written backward against finite differences, and scaled steps with
// MTP on the last stage (tp with and without SP, pp, ep, D = 2, tied head)
// agreeing with one rank, with plan's bytes and with fit's memory.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "blocks.h"
#include "preflight/simulator/sim.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::simulator_mtp_test {
namespace {

using sim::Ctx;
using sim::Dims;
using sim::Mat;
using sim::Param;
using sim::testing::FdRelError;
using sim::testing::Numeric;
using sim::testing::OnOneRank;
using sim::testing::Random;

constexpr double kFdTolerance = 1e-6;  // central differences at testing::kFdStep = 1e-5

/// L = MTP loss + sum(normed * R): the module's loss and its normed output
/// (what the next depth reads) both carry gradient.
void CheckModule(char ffn, bool checkpointed = false) {
  const Dims d = sim::testing::SmallDims();
  OnOneRank(d.seq, [&](Ctx& ctx) {
    auto head_weight = sim::MakeParam<double>(ctx, "head.weight", d.vocab, d.hidden, sim::ShardKind::kRows,
                                              sim::Init::kMatrix, 7, 0.8);
    sim::MtpModule<double> mtp(ctx, d, 1, ffn, 4, 7, 0.8, head_weight.get(), checkpointed);
    Mat<double> h = Random(d.tokens(), d.hidden, 11), e = Random(d.tokens(), d.hidden, 13);
    const Mat<double> r = Random(d.tokens(), d.hidden, 12);
    std::vector<int64_t> targets;
    std::vector<double> weights;
    for (int64_t t = 0; t < d.tokens(); ++t) {
      targets.push_back((t * 7 + 1) % d.vocab);
      weights.push_back(t < d.tokens() - d.batch ? 0.05 + 0.01 * static_cast<double>(t) : 0.0);  // last position masked
    }
    const auto loss = [&] {
      ++ctx.microbatch;
      Mat<double> normed;
      const double l = mtp.Forward(ctx, h, e, targets, weights, &normed);
      return l + normed.cwiseProduct(r).sum();
    };
    loss();
    Mat<double> de;
    const Mat<double> dh = mtp.Backward(ctx, &r, &de);
    EXPECT_LT(FdRelError(dh, Numeric(&h, loss)), kFdTolerance) << ffn << " dh";
    EXPECT_LT(FdRelError(de, Numeric(&e, loss)), kFdTolerance) << ffn << " de";
    std::vector<Param<double>*> params = mtp.params();
    params.push_back(head_weight.get());  // the shared output weight gets the module's part
    for (Param<double>* p : params) {
      EXPECT_LT(FdRelError(p->grad.m, Numeric(&p->value.m, loss)), kFdTolerance) << ffn << " " << p->name;
    }
  });
}

TEST(SimulatorMtp, ModuleMatchesFiniteDifferences) {
  CheckModule('D');
  CheckModule('E');
}

TEST(SimulatorMtp, CheckpointedModuleMatchesFiniteDifferences) {
  // Full recompute: the forward keeps only the checkpoint's inputs and the
  // output layer's, the backward reruns enorm through the final norm.
  CheckModule('D', /*checkpointed=*/true);
}

/// Scaled DeepSeek-V3 with its MTP module (MLA + MoE layer) on 1F1B, routing
/// padded to capacity so the MoE activations compare exactly, the first layer
/// dense so the MTP module's FFN (the model's last kind) is MoE.
Recipe ScaledDeepSeek(std::vector<Override> more) {
  std::vector<Override> sets = {{"parallel.schedule", "1f1b"},         {"training.recompute", "none"},
                                {"model.moe.first_k_dense", "1"},      {"model.moe.dropless", "false"},
                                {"model.moe.pad_to_capacity", "true"}, {"model.moe.capacity_factor", "1.0"}};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml", sets, /*max_world=*/8);
}

TEST(SimulatorMtp, DeepSeekMoeModuleOnTheLastStageAgrees) {
  const Recipe r = ScaledDeepSeek({{"parallel.pp", "2"}, {"parallel.ep", "4"}});
  ASSERT_EQ(r.model.mtp_layers, 1);
  const SimComparison c = testing_sim::ExpectStepAgrees(r);
  // The last stage's embedding copy (MTP embeds the shifted ids) is summed
  // with the first stage's over the embedding group, untied as the recipe is.
  for (int64_t stage : {0, 1}) {
    const CommAgreement* tied =
        testing_sim::FindComm(testing_sim::Stage(c, stage), Axis::kEmbedding, Collective::kAllReduce, Pass::kOptimizer,
                              CommWhat::kTiedEmbedding);
    ASSERT_NE(tied, nullptr);
    EXPECT_GT(tied->measured_sent, 0);
  }
}

TEST(SimulatorMtp, TensorParallelWithSequenceParallelAgrees) {
  // eh_proj under SP: its 2h input gathered, its output gathered over TP and
  // scattered back; backward the scatter's gather, the 2h reduce-scatter and
  // the input's re-gather (plan's five mtp_projection items).
  const Recipe r = ScaledDeepSeek({{"parallel.pp", "2"},
                                   {"parallel.tp", "2"},
                                   {"parallel.sp", "true"},
                                   {"parallel.ep", "2"},
                                   {"model.mtp_layers", "2"}});
  const SimComparison c = testing_sim::ExpectStepAgrees(r);
  const StageComparison& last = testing_sim::Stage(c, 1);
  for (const auto& [kind, pass] :
       {std::pair{Collective::kAllGather, Pass::kForward}, std::pair{Collective::kAllGather, Pass::kBackward},
        std::pair{Collective::kReduceScatter, Pass::kBackward}}) {
    const CommAgreement* a = testing_sim::FindComm(last, Axis::kTp, kind, pass, CommWhat::kMtpProjection);
    ASSERT_NE(a, nullptr);
    EXPECT_GT(a->measured_sent, 0);
    EXPECT_EQ(a->measured_sent, a->modeled_sent);
  }
}

TEST(SimulatorMtp, TensorParallelWithoutSequenceParallelAndMuonAgrees) {
  // A dense recipe with Muon matrices: the MTP module's matrices are gathered
  // over TP with the layers' (plan counts them with the head's stage).
  const Recipe r = testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                             {{"model.mtp_layers", "1"},
                                              {"training.recompute", "none"},
                                              {"parallel.tp", "2"},
                                              {"parallel.sp", "false"},
                                              {"parallel.pp", "2"}},
                                             /*max_world=*/8);
  const SimComparison c = testing_sim::ExpectStepAgrees(r);
  const CommAgreement* ar = testing_sim::FindComm(testing_sim::Stage(c, 1), Axis::kTp, Collective::kAllReduce,
                                                  Pass::kBackward, CommWhat::kMtpProjection);
  ASSERT_NE(ar, nullptr);
  EXPECT_GT(ar->measured_sent, 0);
}

TEST(SimulatorMtp, TiedHeadSharesTheCopyWithTheModules) {
  testing_sim::ExpectStepAgrees(testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                                          {{"model.mtp_layers", "1"},
                                                           {"model.tie_embeddings", "true"},
                                                           {"training.recompute", "none"},
                                                           {"parallel.tp", "2"},
                                                           {"parallel.sp", "true"},
                                                           {"parallel.pp", "2"}},
                                                          /*max_world=*/8));
}

TEST(SimulatorMtp, FullRecomputeAgrees) {
  // Uniform: each module is one checkpoint, rerun in backward with eh_proj's
  // gathers (plan's rerun items) and its rerun memory (fit's MTP transient).
  const SimComparison c = testing_sim::ExpectStepAgrees(ScaledDeepSeek({{"training.recompute", "full"},
                                                                        {"parallel.pp", "2"},
                                                                        {"parallel.tp", "2"},
                                                                        {"parallel.sp", "true"},
                                                                        {"parallel.ep", "2"}}));
  EXPECT_GT(testing_sim::FindMemory(testing_sim::Stage(c, 1), "activations_rerun").measured, 0);
  // Block: Megatron skips the MTP recompute (a warning), the layers' follow the method.
  testing_sim::ExpectStepAgrees(ScaledDeepSeek({{"training.recompute", "full"},
                                                {"training.recompute_method", "block"},
                                                {"parallel.pp", "2"},
                                                {"parallel.ep", "4"}}));
}

TEST(SimulatorMtp, RefusedWithContextParallel) {
  // The shifted ids cross the CP ranks' chunks (Megatron roll_tensor's CP
  // exchange), which the executor does not run.
  const Recipe r = testing_sim::ScaledRecipe(
      "llama3-8b-h200.yaml", {{"model.mtp_layers", "1"}, {"training.recompute", "none"}, {"parallel.cp", "2"}},
      /*max_world=*/8);
  EXPECT_THROW(Simulate(r), SimUnsupported);
}

}  // namespace
}  // namespace preflight::simulator_mtp_test

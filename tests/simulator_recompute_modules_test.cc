// Selective recompute by module, executed for real (Megatron-LM's
// --recompute-modules): "layernorm", "mlp" without Transformer Engine,
// "moe_act", "shared_experts" and "moe". Each drops its saved set in
// forward and reruns it in backward; the step's numerics (fp64, against the
// unsharded reference run without recompute), its byte buckets (the reruns'
// collectives in the backward pass, against plan) and its saved and rerun
// activation memory (against fit) agree, and a hand count pins one of them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_recompute_modules_test {
namespace {

using testing_sim::ExpectStepAgrees;
using testing_sim::FindComm;
using testing_sim::FindMemory;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

Override Modules(const std::string& list) { return {"training.recompute_modules", list}; }
const Override kSelective{"training.recompute", "selective"};

/// The transformer stack ADAD without Transformer Engine (its norms are
/// their own modules) at tp 2 (SP) and pp 2, 4 micro-batches.
Recipe DenseStack(std::vector<Override> sets) {
  sets.insert(sets.begin(), {{"model.pattern", "ADAD"},
                             {"parallel.tp", "2"},
                             {"parallel.pp", "2"},
                             {"parallel.cp", "1"},
                             {"training.transformer_engine", "false"},
                             kSelective});
  return ScaledDefault(sets, /*max_world=*/4);
}

/// The default recipe's A/E/M/R stack at tp 4 (SP), ep 2, pp 2, routing
/// padded to capacity so that the expert rows (and so the memory and the
/// exchanges) are exact.
Recipe MoeStack(std::vector<Override> sets) {
  sets.insert(sets.begin(), {kSelective, {"parallel.ep", "2"}, {"model.moe.pad_to_capacity", "true"}});
  return ScaledDefault(sets, /*max_world=*/16);
}

TEST(SimulatorRecomputeModules, DenseModulesWithoutTransformerEngineAgree) {
  for (const char* list : {"[layernorm]", "[mlp]", "[core_attn, mlp, layernorm]"}) {
    SCOPED_TRACE(list);
    const Recipe r = DenseStack({Modules(list)});
    ASSERT_FALSE(r.training.transformer_engine);
    const SimComparison c = ExpectStepAgrees(r);
    EXPECT_GT(FindMemory(Stage(c, 0), "activations_rerun").measured, 0);
  }
}

TEST(SimulatorRecomputeModules, MoeModulesAgreeAtTpEpAndPp) {
  for (const char* list : {"[layernorm]", "[moe_act]", "[shared_experts]", "[moe]",
                           "[core_attn, layernorm, moe_act, shared_experts]", "[moe, shared_experts, moe_act]"}) {
    SCOPED_TRACE(list);
    const Recipe r = MoeStack({Modules(list)});
    ASSERT_GT(r.parallel.pp, 1);
    ASSERT_GT(r.parallel.tp, 1);
    ASSERT_GT(r.model.moe.SharedWidth(), 0);
    const SimComparison c = ExpectStepAgrees(r);
    EXPECT_GT(FindMemory(Stage(c, 0), "activations_rerun").measured, 0);
  }
}

TEST(SimulatorRecomputeModules, DroplessMoeRerunAgreesWithinTheRoutingTolerance) {
  // Dropless routing: the executor's rows are its router's choice; the
  // memory rows compare within the dropless tolerance, the rest exactly.
  const Recipe r = MoeStack({Modules("[moe]"), {"model.moe.pad_to_capacity", "false"}, {"model.moe.dropless", "true"}});
  ExpectStepAgrees(r);
}

TEST(SimulatorRecomputeModules, LayernormRerunByHand) {
  // pp 1, tp 1, one micro-batch in flight, seq 8 x micro-batch 1, h 16,
  // bf16, RMSNorm: each sublayer's norm output is 8 x 16 x 2 = 256 B and its
  // rstd 8 x 4 = 32 B. "layernorm" drops both from each of the 4
  // sublayers' saved sets (4 x 288 B) and reruns one sublayer's at a time.
  const std::vector<Override> base{{"model.pattern", "ADAD"},
                                   {"parallel.tp", "1"},
                                   {"parallel.pp", "1"},
                                   {"parallel.cp", "1"},
                                   {"training.transformer_engine", "false"}};
  std::vector<Override> rerun = base, kept = base;
  rerun.push_back(kSelective);
  rerun.push_back(Modules("[layernorm]"));
  kept.push_back({"training.recompute", "none"});
  const Recipe r = ScaledDefault(rerun, /*max_world=*/1);
  ASSERT_EQ(r.training.seq_len * r.training.micro_batch, 8);
  ASSERT_EQ(r.model.hidden, 16);
  const SimulationReport with = Simulate(r);
  const SimulationReport without = Simulate(ScaledDefault(kept, /*max_world=*/1));
  const auto at_peak = [](const SimulationReport& rep, const std::string& owner) {
    return rep.per_rank.at(0).activations_at_peak.at(owner);
  };
  EXPECT_EQ(at_peak(without, "A") - at_peak(with, "A"), 2 * 288);
  EXPECT_EQ(at_peak(without, "D") - at_peak(with, "D"), 2 * 288);
  const SimComparison c = CompareWithModels(r, with, SimPrecision::kFp64);
  const MemoryAgreement& rerun_row = FindMemory(Stage(c, 0), "activations_rerun");
  EXPECT_EQ(rerun_row.measured, 288);
  EXPECT_EQ(rerun_row.modeled, 288);
}

TEST(SimulatorRecomputeModules, RerunCollectivesAreCountedInBackward) {
  // The shared expert's rerun repeats its TP region's forward gather and
  // reduce-scatter in the backward pass; "moe" repeats the dispatch and
  // combine all-to-alls there too. "moe_act" and "layernorm" move nothing.
  const auto backward = [](const Recipe& r, Axis axis, Collective kind, CommWhat what) {
    const SimComparison c = ExpectStepAgrees(r);
    const CommAgreement* a = FindComm(Stage(c, 0), axis, kind, Pass::kBackward, what);
    return a == nullptr ? int64_t{0} : a->measured_sent;
  };
  const Recipe none = MoeStack({Modules("[core_attn]")});
  const int64_t shared_ag = backward(none, Axis::kTp, Collective::kAllGather, CommWhat::kMoeSharedExpert);
  ASSERT_GT(shared_ag, 0);
  // Without the rerun the backward gathers twice (dy, the saved input).
  EXPECT_EQ(
      backward(MoeStack({Modules("[shared_experts]")}), Axis::kTp, Collective::kAllGather, CommWhat::kMoeSharedExpert),
      shared_ag * 3 / 2);
  EXPECT_EQ(backward(MoeStack({Modules("[moe_act, layernorm]")}), Axis::kTp, Collective::kAllGather,
                     CommWhat::kMoeSharedExpert),
            shared_ag);
  const int64_t dispatch = backward(none, Axis::kEp, Collective::kAllToAll, CommWhat::kMoeDispatch);
  ASSERT_GT(dispatch, 0);
  EXPECT_EQ(backward(MoeStack({Modules("[moe]")}), Axis::kEp, Collective::kAllToAll, CommWhat::kMoeDispatch),
            2 * dispatch);
}

TEST(SimulatorRecomputeModules, RerunFlopsAreCounted) {
  // A lone-MLP stack DD without Transformer Engine at tp 1, 2 micro-batches
  // of T = 8 tokens: "mlp" reruns each D's 3 GEMMs of 2 T h f = 2 x 8 x 16 x
  // 16 FLOPs once; "layernorm" adds no GEMM.
  const std::vector<Override> base{{"model.pattern", "DD"},
                                   {"parallel.tp", "1"},
                                   {"parallel.pp", "1"},
                                   {"parallel.cp", "1"},
                                   {"training.transformer_engine", "false"},
                                   kSelective};
  const auto flops = [&](const std::string& list) {
    std::vector<Override> sets = base;
    sets.push_back(Modules(list));
    const Recipe r = ScaledDefault(sets, /*max_world=*/1);
    EXPECT_EQ(r.micro_batches(), 2);
    return Simulate(r).flops;
  };
  const double none = flops("[core_attn]");
  EXPECT_EQ(flops("[mlp]") - none, 2.0 * 2 * 3 * 2 * 8 * 16 * 16);
  EXPECT_EQ(flops("[layernorm]"), none);
}

/// DeepSeek-V3 scaled (MLA attention, whose input norm is its own module;
/// MoE with a shared expert, padded to capacity so its rows are exact), 1F1B
/// on two stages, ep 4, with `more` and selective recompute of `list`.
Recipe DeepSeek(const std::string& list, std::vector<Override> more) {
  std::vector<Override> sets = {{"parallel.schedule", "1f1b"},
                                {"parallel.pp", "2"},
                                {"parallel.ep", "4"},
                                {"model.moe.first_k_dense", "1"},
                                {"model.moe.dropless", "false"},
                                {"model.moe.pad_to_capacity", "true"},
                                {"model.moe.capacity_factor", "1.0"},
                                kSelective,
                                Modules(list)};
  sets.insert(sets.end(), more.begin(), more.end());
  return testing_sim::ScaledRecipe("deepseek-v3-h200.yaml", sets, /*max_world=*/8);
}

/// DeepSeek without MTP.
Recipe MlaStack(const std::string& list) { return DeepSeek(list, {{"model.mtp_layers", "0"}}); }

TEST(SimulatorRecomputeModules, MlaModulesAgree) {
  const Recipe r = MlaStack("[core_attn, layernorm, moe_act, shared_experts]");
  ASSERT_TRUE(r.model.mla.has_value());
  const SimComparison c = ExpectStepAgrees(r);
  EXPECT_GT(FindMemory(Stage(c, 0), "activations_rerun").measured, 0);
}

TEST(SimulatorRecomputeModules, MlaCoreRerunAgreesUnderContextParallel) {
  // The core reruns with its CP exchange; under a2a TE keeps the head-split
  // q, k, v of the rerun beside the kept inputs.
  for (const char* comm : {"p2p", "a2a"}) {
    SCOPED_TRACE(comm);
    const Recipe r =
        DeepSeek("[core_attn]", {{"model.mtp_layers", "0"}, {"parallel.cp", "2"}, {"parallel.cp_comm", comm}});
    ASSERT_EQ(r.parallel.cp, 2);
    ExpectStepAgrees(r);
  }
}

TEST(SimulatorRecomputeModules, MlaUpProjectionRerunAgrees) {
  // q, k, v dropped after the core and recomputed from the latents, the
  // up-projections' TP gathers again in backward (tp 2, SP); with the core
  // rerun too, under Ulysses CP.
  const Recipe sp =
      DeepSeek("[mla_up_proj]",
               {{"model.mtp_layers", "0"}, {"parallel.tp", "2"}, {"parallel.sp", "true"}, {"parallel.ep", "2"}});
  ASSERT_EQ(sp.parallel.tp, 2);
  const SimComparison c = ExpectStepAgrees(sp);
  EXPECT_GT(FindMemory(Stage(c, 0), "activations_rerun").measured, 0);
  ExpectStepAgrees(DeepSeek("[core_attn, mla_up_proj]",
                            {{"model.mtp_layers", "0"}, {"parallel.cp", "2"}, {"parallel.cp_comm", "a2a"}}));
}

TEST(SimulatorRecomputeModules, MlaUpProjectionUnderUlyssesWithoutCoreIsRefused) {
  try {
    Simulate(DeepSeek("[mla_up_proj]", {{"model.mtp_layers", "0"}, {"parallel.cp", "2"}, {"parallel.cp_comm", "a2a"}}));
    ADD_FAILURE() << "simulated a policy it does not execute";
  } catch (const SimUnsupported& e) {
    EXPECT_NE(std::string(e.what()).find("training.recompute_modules: mla_up_proj"), std::string::npos) << e.what();
  }
}

TEST(SimulatorRecomputeModules, MtpModulesRerunTheirLayersModules) {
  // The MTP module's transformer layer is a TransformerLayer like the
  // stack's: its blocks drop and rerun the same modules. GQA with a dense
  // MLP (no Transformer Engine: "mlp" reruns inside the block), and MLA with
  // MoE at tp 2 (SP) and ep 2.
  ExpectStepAgrees(testing_sim::ScaledRecipe("llama3-8b-h200.yaml",
                                             {{"model.mtp_layers", "1"},
                                              {"training.transformer_engine", "false"},
                                              kSelective,
                                              Modules("[core_attn, mlp, layernorm]"),
                                              {"parallel.tp", "2"},
                                              {"parallel.sp", "true"},
                                              {"parallel.pp", "2"}},
                                             /*max_world=*/8));
  ExpectStepAgrees(DeepSeek("[layernorm, moe, shared_experts]",
                            {{"parallel.tp", "2"}, {"parallel.sp", "true"}, {"parallel.ep", "2"}}));
}

TEST(SimulatorRecomputeModules, MtpWithTransformerEngineMlpIsRefused) {
  // With Transformer Engine "mlp" checkpoints the whole D sublayer, which the
  // executor places for the stack's layers only.
  const Recipe r = testing_sim::ScaledRecipe(
      "llama3-8b-h200.yaml", {{"model.mtp_layers", "1"}, kSelective, Modules("[core_attn, mlp]")}, /*max_world=*/8);
  EXPECT_THROW(Simulate(r), SimUnsupported);
}

}  // namespace
}  // namespace preflight::sim::simulator_recompute_modules_test

// Recompute policies executed for real: which layers are checkpointed
// (Megatron-LM transformer_block.py _checkpointed_forward, by hand), that the
// saved set shrinks to the checkpoints, that the rerun's FLOPs and
// collectives are counted, and that numerics, bytes and memory agree with
// the planner and the estimator per policy at pp > 1 and tp > 1.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "recompute.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_recompute_test {
namespace {

using testing_sim::ExpectStepAgrees;
using testing_sim::FindMemory;
using testing_sim::ScaledDefault;
using testing_sim::Stage;

std::vector<BlockKind> Kinds(const std::string& letters) {
  std::vector<BlockKind> out;
  for (char c : letters) out.push_back(static_cast<BlockKind>(c));
  return out;
}

TrainingConfig Full(RecomputeMethod method, int64_t n) {
  TrainingConfig t;
  t.recompute = Recompute::kFull;
  t.recompute_method = method;
  t.recompute_layers = n;
  return t;
}

TEST(SimulatorRecompute, CheckpointGroupsByHand) {
  // A transformer stack: a layer is an attention + MLP pair (4 layers of 2).
  const std::vector<BlockKind> stack = Kinds("ADADADAD");
  const std::vector<CheckpointGroup> one{{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  EXPECT_EQ(CheckpointGroups(stack, 0, 8, Full(RecomputeMethod::kUniform, 1)), one);
  // uniform 3: layers 0-2 together, then the rest (layer 3).
  const std::vector<CheckpointGroup> three{{0, 6}, {6, 8}};
  EXPECT_EQ(CheckpointGroups(stack, 0, 8, Full(RecomputeMethod::kUniform, 3)), three);
  // block 2: the chunk's first two layers, each its own checkpoint; the rest keep everything.
  const std::vector<CheckpointGroup> block{{0, 2}, {2, 4}};
  EXPECT_EQ(CheckpointGroups(stack, 0, 8, Full(RecomputeMethod::kBlock, 2)), block);
  // A chunk holding layers 1..2 (sublayers 2..5) counts from its own start.
  const std::vector<CheckpointGroup> chunk{{0, 2}};
  EXPECT_EQ(CheckpointGroups(stack, 2, 6, Full(RecomputeMethod::kBlock, 1)), chunk);
  // A hybrid stack: one letter a layer.
  const std::vector<CheckpointGroup> hybrid{{0, 2}, {2, 4}};
  EXPECT_EQ(CheckpointGroups(Kinds("MAME"), 0, 4, Full(RecomputeMethod::kUniform, 2)), hybrid);
  // Selective "mlp": each dense MLP on its own; core_attn alone checkpoints no layer.
  TrainingConfig selective;
  selective.recompute = Recompute::kSelective;
  EXPECT_TRUE(CheckpointGroups(Kinds("AD"), 0, 2, selective).empty());
  selective.recompute_modules = ModuleSet::Of(RecomputeModule::kMlp);
  const std::vector<CheckpointGroup> mlp{{3, 4}};
  EXPECT_EQ(CheckpointGroups(Kinds("AEMD"), 0, 4, selective), mlp);
  TrainingConfig none;
  none.recompute = Recompute::kNone;
  EXPECT_TRUE(CheckpointGroups(stack, 0, 8, none).empty());
}

/// The transformer stack ADAD at tp 2 (SP) and pp 2 with 4 micro-batches
/// (1F1B: stage 0 holds 2 in flight), under `sets`.
Recipe StackWith(std::vector<Override> sets) {
  sets.insert(sets.begin(),
              {{"model.pattern", "ADAD"}, {"parallel.tp", "2"}, {"parallel.pp", "2"}, {"parallel.cp", "1"}});
  return ScaledDefault(sets, /*max_world=*/4);
}

struct Policy {
  const char* name;
  std::vector<Override> sets;
};

std::vector<Policy> Policies() {
  return {
      {"none", {{"training.recompute", "none"}}},
      {"selective core_attn", {{"training.recompute", "selective"}}},
      {"selective mlp", {{"training.recompute", "selective"}, {"training.recompute_modules", "[core_attn, mlp]"}}},
      {"full uniform 1", {{"training.recompute", "full"}}},
      {"full uniform 2", {{"training.recompute", "full"}, {"training.recompute_layers", "2"}}},
      {"full block 1",
       {{"training.recompute", "full"}, {"training.recompute_method", "block"}, {"training.recompute_layers", "1"}}}};
}

TEST(SimulatorRecompute, EveryPolicyAgreesAtTpAndPp) {
  for (const Policy& p : Policies()) {
    SCOPED_TRACE(p.name);
    const Recipe r = StackWith(p.sets);
    ASSERT_EQ(r.parallel.pp, 2);
    ASSERT_EQ(r.parallel.tp, 2);
    ExpectStepAgrees(r);
  }
}

TEST(SimulatorRecompute, HybridWithExpertsAndMambaAgreesUnderFullRecompute) {
  // The default recipe's A/E/M/R pattern, pp 2, tp 4 (SP), ep 2, padded
  // routing so the expert rows are exact.
  for (const char* method : {"uniform", "block"}) {
    SCOPED_TRACE(method);
    const Recipe r = ScaledDefault({{"training.recompute", "full"},
                                    {"training.recompute_method", method},
                                    {"parallel.ep", "2"},
                                    {"model.moe.pad_to_capacity", "true"}},
                                   /*max_world=*/16);
    ASSERT_GT(r.parallel.pp, 1);
    ExpectStepAgrees(r);
  }
}

TEST(SimulatorRecompute, ContextParallelCoreRerunAgreesInEveryCpMode) {
  for (const char* comm : {"p2p", "all_gather", "a2a"}) {
    SCOPED_TRACE(comm);
    const Recipe r = StackWith({{"parallel.cp", "2"}, {"parallel.cp_comm", comm}, {"parallel.pp", "1"}});
    ASSERT_EQ(r.training.recompute, Recompute::kSelective);
    ExpectStepAgrees(r);
  }
}

TEST(SimulatorRecompute, FullRecomputeKeepsOnlyTheCheckpoints) {
  // pp 1, tp 1: one micro-batch in flight. seq 8, micro-batch 1, h 16, bf16:
  // a checkpoint is 8 x 16 x 2 = 256 B per framework layer (an A+D pair,
  // charged to its attention); the D sublayers keep nothing.
  const std::vector<Override> sets{{"model.pattern", "ADADAD"},
                                   {"parallel.tp", "1"},
                                   {"parallel.pp", "1"},
                                   {"parallel.cp", "1"},
                                   {"training.recompute", "full"}};
  const Recipe r = ScaledDefault(sets, /*max_world=*/1);
  ASSERT_EQ(r.training.seq_len, 8);
  const SimulationReport rep = Simulate(r);
  const std::map<std::string, int64_t>& at_peak = rep.per_rank.at(0).activations_at_peak;
  EXPECT_EQ(at_peak.at("A"), 3 * 256);
  EXPECT_EQ(at_peak.count("D") == 0 ? 0 : at_peak.at("D"), 0);
  // Without recompute every sublayer keeps its set: far more than the checkpoints.
  std::vector<Override> none = sets;
  none.back() = {"training.recompute", "none"};
  const SimulationReport kept = Simulate(ScaledDefault(none, 1));
  EXPECT_GT(kept.per_rank.at(0).activations_at_peak.at("A"), 3 * 256 * 4);
  EXPECT_GT(kept.per_rank.at(0).activations_at_peak.at("D"), 0);
  // The rerun holds one layer's set at a time, less its checkpoint.
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  const MemoryAgreement& rerun = FindMemory(Stage(c, 0), "activations_rerun");
  EXPECT_GT(rerun.measured, 0);
  EXPECT_EQ(rerun.measured, rerun.modeled);
}

TEST(SimulatorRecompute, RerunFlopsAreCounted) {
  // A lone-MLP (hybrid) stack DD at tp 1, 2 micro-batches of T = 8 tokens:
  // full recompute reruns each D forward once, 3 GEMMs of 2 T h f = 2 x 8 x
  // 16 x 16 FLOPs each: 2 mb x 2 layers x 3 x 4096 more than no recompute.
  const std::vector<Override> base{
      {"model.pattern", "DD"}, {"parallel.tp", "1"}, {"parallel.pp", "1"}, {"parallel.cp", "1"}};
  std::vector<Override> full = base, none = base;
  full.push_back({"training.recompute", "full"});
  none.push_back({"training.recompute", "none"});
  const Recipe r = ScaledDefault(full, /*max_world=*/1);
  ASSERT_EQ(r.micro_batches(), 2);
  ASSERT_EQ(r.training.seq_len * r.training.micro_batch, 8);
  const double extra = Simulate(r).flops - Simulate(ScaledDefault(none, 1)).flops;
  EXPECT_EQ(extra, 2.0 * 2 * 3 * 2 * 8 * 16 * 16);
}

TEST(SimulatorRecompute, Fp16AndFp8DtypesAgreeUnderRecompute) {
  // Numerics in fp64; memory and bytes in the recipe's dtypes (fp16 2 B,
  // FP8 activations 1 B), as the estimator and planner price them.
  for (const char* dtype : {"fp16", "fp8"}) {
    SCOPED_TRACE(dtype);
    const Recipe r = StackWith({{"training.recompute", "full"}, {"training.precision.activations", dtype}});
    const SimComparison c = ExpectStepAgrees(r);
    EXPECT_GT(FindMemory(Stage(c, 0), "activations_rerun").measured, 0);
  }
}

}  // namespace
}  // namespace preflight::sim::simulator_recompute_test

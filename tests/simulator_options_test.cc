// Block options the recipe can name that change what the executor runs:
// learned absolute position embeddings (model.learned_positions), a
// replicated word embedding (parallel.embedding: replicated), the shared
// expert's sigmoid gate (moe.shared_gate) and the unfused attention core
// (training.flash_attention: false). Each is checked against
// finite differences or a hand-worked value, the sharded step against the
// unsharded one (fp64 1e-10), and that step's bytes and memory against the
// planner and the estimator (ExpectStepAgrees), with one hand-worked figure.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_core.h"
#include "blocks.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_options_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::FdRelError;
using testing::Numeric;
using testing::OnOneRank;
using testing::SmallDims;
using testing::SmallMlaDims;
using testing_sim::ExpectStepAgrees;
using testing_sim::FindComm;
using testing_sim::FindMemory;
using testing_sim::OneStage;
using testing_sim::Stage;

constexpr double kFdTolerance = 1e-6;  // central differences, step 1e-5 (simulator_blocks_test.cc)

/// Sent bytes of one bucket on a stage (0 when absent).
int64_t SentOf(const StageComparison& s, Axis axis, Collective kind, Pass pass, CommWhat what) {
  const CommAgreement* a = FindComm(s, axis, kind, pass, what);
  return a == nullptr ? 0 : a->measured_sent;
}

/// Token ids and targets of one sequence of SmallDims.
std::vector<int64_t> Ids(const Dims& d, int64_t mul, int64_t add) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < d.tokens(); ++t) ids.push_back((t * mul + add) % d.vocab);
  return ids;
}

/// The embedding's and head's parameter gradients against finite differences
/// of the loss through both.
void ExpectEmbeddingMatchesFd(const Dims& d, const std::string& what) {
  OnOneRank([&](Ctx& ctx) {
    Embedding<double> emb(ctx, d, 7, 0.8);
    Head<double> head(ctx, d, 7, 0.8);
    const std::vector<int64_t> ids = Ids(d, 5, 3), targets = Ids(d, 7, 1);
    const auto loss = [&] {  // each evaluation is its own micro-batch: FD runs forwards only
      ++ctx.microbatch;
      return head.Forward(ctx, emb.Forward(ctx, ids), targets);
    };
    loss();
    emb.Backward(ctx, head.Backward(ctx));
    for (Param<double>* p : emb.params()) {
      EXPECT_LT(FdRelError(p->grad.m, Numeric(&p->value.m, loss)), kFdTolerance) << what << " " << p->name;
    }
  });
}

// ---- learned absolute position embeddings ------------------------------------

TEST(SimulatorOptions, LearnedPositionsAddTheRowOfEachTokensPosition) {
  // Megatron LanguageModelEmbedding: word row + position row. SmallDims rows
  // are position * batch + b, so row 7 is position 3 of sequence 1.
  Dims d = SmallDims();
  d.learned_positions = d.seq;
  OnOneRank([&](Ctx& ctx) {
    Embedding<double> emb(ctx, d, 7, 0.8);
    ASSERT_EQ(emb.params().size(), 2u);
    const Param<double>& words = *emb.params()[0];
    const Param<double>& positions = *emb.params()[1];
    EXPECT_EQ(positions.value.m.rows(), d.seq);
    const std::vector<int64_t> ids = Ids(d, 5, 3);
    const Mat<double> x = emb.Forward(ctx, ids);
    const Mat<double> expected = words.value.m.row(ids[7]) + positions.value.m.row(3);
    EXPECT_EQ(x.row(7), expected);
  });
}

TEST(SimulatorOptions, LearnedPositionsMatchFiniteDifferences) {
  Dims d = SmallDims();
  d.learned_positions = d.seq + 2;  // a table longer than the sequence: the last rows get no gradient
  ExpectEmbeddingMatchesFd(d, "learned positions");
}

TEST(SimulatorOptions, LearnedPositionsStepAgreesAtTp4Sp) {
  const Recipe r = OneStage({{"model.pattern", "AD"}, {"model.learned_positions", "131072"}});
  ASSERT_EQ(r.model.learned_positions, r.training.seq_len);  // ScaleRecipe: one row per scaled position
  const SimComparison c = ExpectStepAgrees(r);
  // With learned positions Megatron all-reduces the lookup (the whole
  // sequence) instead of reduce-scattering it: 8 tokens x h 16 x bf16 =
  // 256 B, a ring all-reduce over 4 ranks sends 2 x 3/4 of it, once per
  // micro-batch (2).
  const StageComparison& s = Stage(c, 0);
  EXPECT_EQ(SentOf(s, Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kEmbedding), 2 * 384);
  EXPECT_EQ(SentOf(s, Axis::kTp, Collective::kReduceScatter, Pass::kForward, CommWhat::kEmbedding), 0);
  // The position gradient is whole on every TP rank (added before the scatter
  // to the sequence): the replicated-gradient all-reduce does not grow.
  const SimComparison without = ExpectStepAgrees(OneStage({{"model.pattern", "AD"}}));
  const auto replicated = [](const SimComparison& x) {
    return SentOf(Stage(x, 0), Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads);
  };
  EXPECT_GT(replicated(c), 0);
  EXPECT_EQ(replicated(c), replicated(without));
  // The table, 8 positions x h 16 in bf16, is a replicated parameter.
  EXPECT_EQ(FindMemory(s, "replicated_params").measured - FindMemory(Stage(without, 0), "replicated_params").measured,
            8 * 16 * 2);
}

TEST(SimulatorOptions, LearnedPositionsStepAgreesWithoutSpAndUnderCp) {
  // Without SP the lookup is all-reduced as before; under CP (load-balanced
  // chunks) each rank adds the rows of its global positions.
  ExpectStepAgrees(
      OneStage({{"model.pattern", "AD"}, {"model.learned_positions", "131072"}, {"parallel.sp", "false"}}));
  ExpectStepAgrees(OneStage(
      {{"model.pattern", "AD"}, {"model.learned_positions", "131072"}, {"parallel.tp", "2"}, {"parallel.cp", "2"}}));
}

TEST(SimulatorOptions, LearnedPositionsStepAgreesOverPipelineStagesAndZero3) {
  // The table lives on the first stage only; ZeRO 3 shards it with the
  // embedding's unit.
  const Recipe r = testing_sim::ScaledDefault(
      {{"model.pattern", "AD"}, {"model.learned_positions", "131072"}, {"parallel.pp", "2"}, {"parallel.zero", "3"}},
      /*max_world=*/16);
  ExpectStepAgrees(r);
}

// ---- replicated word embedding -----------------------------------------------

TEST(SimulatorOptions, ReplicatedEmbeddingMatchesFiniteDifferences) {
  Dims d = SmallDims();
  d.replicated_embedding = true;
  d.vocab_logical = d.vocab;
  ExpectEmbeddingMatchesFd(d, "replicated");
  d.learned_positions = d.seq;
  ExpectEmbeddingMatchesFd(d, "replicated + positions");
}

TEST(SimulatorOptions, ReplicatedEmbeddingStepAgreesWithAndWithoutSp) {
  for (const char* sp : {"true", "false"}) {
    for (const char* positions : {"0", "131072"}) {
      const Recipe r = OneStage({{"model.pattern", "AD"},
                                 {"parallel.embedding", "replicated"},
                                 {"parallel.sp", sp},
                                 {"model.learned_positions", positions}});
      const SimComparison c = ExpectStepAgrees(r);
      const StageComparison& s = Stage(c, 0);
      // Every TP rank looks up its own rows: no embedding collective.
      for (Collective k : {Collective::kAllReduce, Collective::kReduceScatter}) {
        EXPECT_EQ(SentOf(s, Axis::kTp, k, Pass::kForward, CommWhat::kEmbedding), 0) << sp;
      }
      EXPECT_EQ(SentOf(s, Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kEmbedding), 0) << sp;
    }
  }
}

TEST(SimulatorOptions, ReplicatedEmbeddingGradientIsAllReducedUnderSp) {
  // Vocabulary 40 (unpadded: the table is whole) x h 16 = 640 fp32 gradient
  // elements join the replicated all-reduce over TP under SP: a ring over 4
  // ranks sends 2 x 3/4 x 2,560 B = 3,840 B more. The table itself, 640 bf16
  // elements, moves from the TP-sharded parameters (vocabulary padded to 64,
  // 16 rows per rank: 512 B) to the replicated ones (1,280 B).
  const SimComparison rep = ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"parallel.embedding", "replicated"}}));
  const SimComparison vp = ExpectStepAgrees(OneStage({{"model.pattern", "AD"}}));
  const auto replicated = [](const SimComparison& x) {
    return SentOf(Stage(x, 0), Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads);
  };
  EXPECT_EQ(replicated(rep) - replicated(vp), 3840);
  EXPECT_EQ(
      FindMemory(Stage(rep, 0), "replicated_params").measured - FindMemory(Stage(vp, 0), "replicated_params").measured,
      1280);
  EXPECT_EQ(
      FindMemory(Stage(vp, 0), "tp_sharded_params").measured - FindMemory(Stage(rep, 0), "tp_sharded_params").measured,
      512);
}

// ---- the shared expert's sigmoid gate ------------------------------------------

TEST(SimulatorOptions, SharedGateMatchesFiniteDifferences) {
  Dims d = SmallDims();
  d.shared_gate = true;
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance, "shared gate");
  });
}

TEST(SimulatorOptions, SharedGateIsOneReplicatedRow) {
  // Megatron SharedExpertMLP.gate_weight [1, h], beside the block's others.
  Dims d = SmallDims();
  const auto elements = [&](bool gate) {
    d.shared_gate = gate;
    int64_t n = 0;
    OnOneRank([&](Ctx& ctx) {
      auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
      for (Param<double>* p : block->params()) n += p->value.m.size();
    });
    return n;
  };
  EXPECT_EQ(elements(true) - elements(false), d.hidden);
}

TEST(SimulatorOptions, SharedGateStepAgreesAtTp4SpAndEp) {
  const Recipe gated = OneStage({{"model.pattern", "AE"},
                                 {"model.moe.shared_gate", "true"},
                                 {"parallel.ep", "2"},
                                 {"model.moe.pad_to_capacity", "true"}});
  ASSERT_GT(gated.model.moe.SharedWidth(), 0);
  const SimComparison c = ExpectStepAgrees(gated);
  const SimComparison plain = ExpectStepAgrees(
      OneStage({{"model.pattern", "AE"}, {"parallel.ep", "2"}, {"model.moe.pad_to_capacity", "true"}}));
  int64_t moe_layers = 0;
  for (BlockKind k : gated.model.layers) moe_layers += k == BlockKind::kMoe ? 1 : 0;
  ASSERT_GT(moe_layers, 0);
  // The product keeps the shared output (h 16) and the score (1) per token of
  // the rank's SP rows (8 tokens / 4), bf16: 2 x 17 x 2 = 68 B per E layer
  // for each micro-batch in flight (one on a one-stage pipeline).
  EXPECT_EQ(FindMemory(Stage(c, 0), "activations E").measured - FindMemory(Stage(plain, 0), "activations E").measured,
            68 * moe_layers);
  // Its gradient is partial over TP under SP: h fp32 more per E layer in the
  // replicated all-reduce.
  EXPECT_GT(SentOf(Stage(c, 0), Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads),
            SentOf(Stage(plain, 0), Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads));
}

TEST(SimulatorOptions, SharedGateStepAgreesWithoutSp) {
  ExpectStepAgrees(OneStage({{"model.pattern", "AE"},
                             {"model.moe.shared_gate", "true"},
                             {"parallel.tp", "1"},
                             {"parallel.cp", "2"},
                             {"parallel.ep", "2"}}));
}

// ---- the unfused attention core (training.flash_attention: false) -------------

TEST(SimulatorOptions, UnfusedCoreKeepsTheSoftmaxRowsOfTheCausalMask) {
  // One head, positions 0..2, head_dim 2, q = k = 0: every visible key scores
  // alike, so the kept probabilities are 1; 1/2, 1/2; 1/3, 1/3, 1/3 and 0
  // above the diagonal, and O is the running mean of v.
  OnOneRank([&](Ctx& ctx) {
    const AttnShape shape{1, 2, 1};
    const Mat<double> q = Mat<double>::Zero(3, 2), k = Mat<double>::Zero(3, 2);
    Mat<double> v(3, 2);
    v << 3, 0, 1, 6, 2, 3;
    Mat<double> probs;
    const Mat<double> o = UnfusedAttentionForward(ctx, shape, q, k, v, &probs);
    Mat<double> expected(3, 3);
    expected << 1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3;
    EXPECT_LT((probs - expected).cwiseAbs().maxCoeff(), 1e-15);
    Mat<double> mean(3, 2);
    mean << 3, 0, 2, 3, 2, 3;
    EXPECT_LT((o - mean).cwiseAbs().maxCoeff(), 1e-15);
  });
}

TEST(SimulatorOptions, UnfusedAttentionMatchesFiniteDifferences) {
  Dims d = SmallDims();  // GQA: 4 query heads on 2 KV heads
  d.flash_attention = false;
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('A', ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance, "unfused GQA");
  });
  d = SmallMlaDims();
  d.flash_attention = false;
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('A', ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance, "unfused MLA");
  });
}

TEST(SimulatorOptions, UnfusedAttentionStepAgreesAtTp4Sp) {
  for (const char* sp : {"true", "false"}) {
    ExpectStepAgrees(OneStage({{"model.pattern", "AD"},
                               {"training.flash_attention", "false"},
                               {"training.recompute", "none"},
                               {"parallel.sp", sp}}));
  }
}

TEST(SimulatorOptions, UnfusedAttentionKeepsTheScoresAndExpandedKv) {
  // Per attention layer and micro-batch, tp 4, 8 tokens of seq 8: flash keeps
  // K and V on the KV heads and an fp32 lse per query head; the unfused core
  // keeps K and V on every query head (Megatron repeat_interleaves them) and
  // the bf16 softmax, s = 8 per token and head. The default recipe has
  // heads/kv_heads to spare: per rank h_q = heads/4, h_kv = kv_heads/4.
  const Recipe flash = OneStage({{"model.pattern", "AD"}, {"training.recompute", "none"}});
  const Recipe unfused =
      OneStage({{"model.pattern", "AD"}, {"training.recompute", "none"}, {"training.flash_attention", "false"}});
  const int64_t hq = flash.model.attention.heads / 4, hkv = flash.model.attention.kv_heads / 4;
  const int64_t dh = flash.model.attention.head_dim, tokens = 8;
  ASSERT_GT(hq, hkv);
  int64_t layers = 0;
  for (BlockKind k : flash.model.layers) layers += k == BlockKind::kAttention ? 1 : 0;
  const int64_t per_layer = tokens * (2 * (hq - hkv) * dh * 2 + hq * 8 * 2 - hq * 4);
  const auto a = [](const Recipe& r) { return FindMemory(Stage(ExpectStepAgrees(r), 0), "activations A").measured; };
  EXPECT_EQ(a(unfused) - a(flash), per_layer * layers);
}

TEST(SimulatorOptions, UnfusedCoreRerunIsRefused) {
  EXPECT_THROW(Simulate(OneStage({{"model.pattern", "AD"},
                                  {"training.flash_attention", "false"},
                                  {"training.recompute", "selective"},
                                  {"training.recompute_modules", "[core_attn]"}})),
               SimUnsupported);
}

TEST(SimulatorOptions, UnfusedAttentionStepAgreesForMlaAndUnderFullRecompute) {
  // DeepSeek-V3's MLA on two 1F1B stages (simulator_mla_test.cc's MlaOnly).
  ExpectStepAgrees(testing_sim::ScaledRecipe("deepseek-v3-h200.yaml",
                                             {{"training.flash_attention", "false"},
                                              {"parallel.schedule", "1f1b"},
                                              {"parallel.pp", "2"},
                                              {"parallel.ep", "4"},
                                              {"parallel.cp", "1"},
                                              {"model.mtp_layers", "0"},
                                              {"model.moe.router", "softmax"},
                                              {"model.moe.router_bias", "false"}},
                                             /*max_world=*/32));
  ExpectStepAgrees(OneStage({{"model.pattern", "AD"},
                             {"training.flash_attention", "false"},
                             {"training.recompute", "full"},
                             {"training.recompute_layers", "1"}}));
}

// ---- deferred output-layer weight gradients (training.defer_head_wgrad) ---------

/// The default recipe on two 1F1B stages of tp 2 with SP, 4 micro-batches.
Recipe TwoStages(std::vector<Override> sets) {
  sets.push_back({"model.pattern", "AD"});
  sets.push_back({"parallel.pp", "2"});
  sets.push_back({"parallel.tp", "2"});
  sets.push_back({"parallel.schedule", "1f1b"});
  return testing_sim::ScaledDefault(sets, /*max_world=*/4);
}

TEST(SimulatorOptions, DeferredHeadWgradStepAgrees) {
  for (const char* limit : {"0", "1", "3", "9"}) {
    ExpectStepAgrees(TwoStages({{"training.defer_head_wgrad", "true"}, {"training.head_wgrad_deferral_limit", limit}}));
  }
}

TEST(SimulatorOptions, DeferredHeadWgradStepAgreesInterleaved) {
  ExpectStepAgrees(testing_sim::ScaledDefault({{"model.pattern", "AD"},
                                               {"parallel.pp", "2"},
                                               {"parallel.vpp", "2"},
                                               {"parallel.schedule", "interleaved"},
                                               {"training.defer_head_wgrad", "true"}},
                                              /*max_world=*/8));
}

TEST(SimulatorOptions, DeferredHeadWgradKeepsEachFinishedPairToTheFlush) {
  // The last stage's peak is its last micro-batch's head (logits live): the
  // three earlier backwards have deferred theirs, each keeping the head's
  // input (8 tokens / tp 2 x h 16, bf16 = 128 B) and the logits' gradient
  // (8 tokens x V_pad/t = 48/2 = 24, bf16 = 384 B): 3 x 512 B more.
  const Recipe plain = TwoStages({});
  const Recipe deferred = TwoStages({{"training.defer_head_wgrad", "true"}});
  ASSERT_EQ(deferred.micro_batches(), 4);
  const auto ends = [](const Recipe& r) { return FindMemory(Stage(ExpectStepAgrees(r), 1), "activations").measured; };
  EXPECT_EQ(ends(deferred) - ends(plain), 3 * 512);
}

// ---- the loss (training.cross_entropy) ---------------------------------------

TEST(SimulatorOptions, Fp32UpcastLossStepAgrees) {
  ExpectStepAgrees(TwoStages({{"training.cross_entropy", "fp32_upcast"}}));
  ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"training.cross_entropy", "fp32_upcast"}}));
}

TEST(SimulatorOptions, Fp32UpcastLossHoldsTwoFp32GradientsInItsBackward) {
  // The last stage peaks at its loss: beside the saved fp32 output, torch's
  // backward holds nll_loss's and log_softmax's fp32 gradients (8 B a
  // logit) where the vocab-parallel loss holds the bf16 logits (2 B), over
  // 8 tokens x V_pad/t = 48/2 = 24 logits: 6 x 192 = 1,152 B more.
  const Recipe plain = TwoStages({});
  const Recipe upcast = TwoStages({{"training.cross_entropy", "fp32_upcast"}});
  const auto ends = [](const Recipe& r) { return FindMemory(Stage(ExpectStepAgrees(r), 1), "activations").measured; };
  EXPECT_EQ(ends(upcast) - ends(plain), 1152);
}

}  // namespace
}  // namespace preflight::sim::simulator_options_test

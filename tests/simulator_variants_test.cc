// The block variants a recipe can name beyond the default ones: GELU and
// squared-ReLU FFNs (dense D, routed and shared experts) and qk_norm. Each is
// checked three ways: its hand-written backward against central finite
// differences (simulator_blocks_test.cc style), the sharded step against the
// unsharded one at tp/sp/cp/ep > 1 (fp64 1e-10), and the bytes and memory
// of that step against the planner and the estimator (ExpectStepAgrees).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "blocks.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "support/sim_checks.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_variants_test {
namespace {

using testing::ExpectBackwardMatchesFd;
using testing::FdRelError;
using testing::Numeric;
using testing::OnOneRank;
using testing::SmallDims;
using testing_sim::ExpectStepAgrees;
using testing_sim::FindComm;
using testing_sim::FindMemory;
using testing_sim::OneStage;
using testing_sim::Stage;

constexpr double kFdTolerance = 1e-6;  // central differences, step 1e-5 (simulator_blocks_test.cc)

void CheckBlock(char letter, const Dims& d, const std::string& what) {
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>(letter, ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance, what);
  });
}

// ---- the activations against their closed forms ----------------------------

TEST(SimulatorVariants, GeluIsTheExactErfForm) {
  // GELU(x) = x Phi(x); Phi(1) = 0.841344746068543, Phi(-2) = 0.0227501319481792
  // (standard normal table), GELU'(0) = Phi(0) = 1/2.
  Mat<double> a(1, 3);
  a << 1.0, -2.0, 0.0;
  const Mat<double> z = Activate(FfnActivation::kGelu, a, Mat<double>());
  EXPECT_NEAR(z(0, 0), 0.841344746068543, 1e-14);
  EXPECT_NEAR(z(0, 1), -2.0 * 0.0227501319481792, 1e-14);
  EXPECT_EQ(z(0, 2), 0.0);
  Mat<double> da, du;
  ActivateBackward(FfnActivation::kGelu, Mat<double>(Mat<double>::Ones(1, 3)), a, Mat<double>(), &da, &du);
  EXPECT_NEAR(da(0, 2), 0.5, 1e-15);
  // GELU'(1) = Phi(1) + phi(1) = 0.841344746068543 + 0.241970724519143.
  EXPECT_NEAR(da(0, 0), 0.841344746068543 + 0.241970724519143, 1e-14);
}

TEST(SimulatorVariants, SquaredReluSquaresThePositivePart) {
  Mat<double> a(1, 3);
  a << 3.0, -2.0, 0.5;
  const Mat<double> z = Activate(FfnActivation::kRelu2, a, Mat<double>());
  EXPECT_EQ(z(0, 0), 9.0);
  EXPECT_EQ(z(0, 1), 0.0);
  EXPECT_EQ(z(0, 2), 0.25);
  Mat<double> da, du;
  ActivateBackward(FfnActivation::kRelu2, Mat<double>(Mat<double>::Ones(1, 3)), a, Mat<double>(), &da, &du);
  EXPECT_EQ(da(0, 0), 6.0);  // d/dx x^2 = 2x
  EXPECT_EQ(da(0, 1), 0.0);
  EXPECT_EQ(da(0, 2), 1.0);
}

// ---- finite differences -----------------------------------------------------

TEST(SimulatorVariants, GeluAndSquaredReluMlpsMatchFiniteDifferences) {
  for (FfnActivation f : {FfnActivation::kGelu, FfnActivation::kRelu2}) {
    Dims d = SmallDims();
    d.mlp_activation = f;
    CheckBlock('D', d, Name(f));
  }
}

TEST(SimulatorVariants, GeluAndSquaredReluExpertsMatchFiniteDifferences) {
  for (FfnActivation f : {FfnActivation::kGelu, FfnActivation::kRelu2}) {
    Dims d = SmallDims();
    d.moe_activation = f;  // routed experts and the shared expert
    CheckBlock('E', d, Name(f));
  }
}

TEST(SimulatorVariants, QkNormAttentionMatchesFiniteDifferences) {
  Dims d = SmallDims();
  d.qk_norm = true;
  CheckBlock('A', d, "qk_norm");
}

TEST(SimulatorVariants, NonGatedMlpHasTwoMatrices) {
  // A non-gated FFN is up [h, f] and down [f, h] (plus the norm), as the
  // inventory lists it: no gate matrix.
  Dims d = SmallDims();
  d.mlp_activation = FfnActivation::kRelu2;
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('D', ctx, d, 0, 7, 0.8);
    int64_t elements = 0;
    for (Param<double>* p : block->params()) elements += p->value.m.size();
    EXPECT_EQ(elements, d.hidden + 2 * d.hidden * d.ffn);
  });
}

// ---- sharded steps against the reference, the planner and the estimator ----

TEST(SimulatorVariants, SquaredReluMlpStepAgreesAtTp4Sp) {
  ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.mlp.activation", "relu2"}}));
}

TEST(SimulatorVariants, GeluMlpStepAgreesAtTp4Sp) {
  ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.mlp.activation", "gelu"}}));
}

TEST(SimulatorVariants, SquaredReluExpertsAgreeExactlyOnExpertAxes) {
  // Padded to capacity so every expert-axis bucket is exact, with expert TP
  // and the shared expert (the default recipe has one).
  const Recipe r = OneStage({{"model.pattern", "AE"},
                             {"model.moe.activation", "relu2"},
                             {"parallel.ep", "2"},
                             {"parallel.expert_tp", "2"},
                             {"model.moe.pad_to_capacity", "true"}});
  ASSERT_GT(r.model.moe.SharedWidth(), 0);
  const SimComparison c = ExpectStepAgrees(r);
  const CommAgreement* g =
      FindComm(Stage(c, 0), Axis::kExpertTp, Collective::kAllGather, Pass::kForward, CommWhat::kMoeExperts);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->exact);
}

TEST(SimulatorVariants, GeluExpertsStepAgrees) {
  ExpectStepAgrees(OneStage({{"model.pattern", "AE"},
                             {"model.moe.activation", "gelu"},
                             {"parallel.ep", "2"},
                             {"model.moe.pad_to_capacity", "true"}}));
}

TEST(SimulatorVariants, NonGatedMlpSavesOneThirdLessThanSwiglu) {
  // Per token and TP rank, SwiGLU keeps a, u and z (3 f/t elements), a
  // non-gated FFN a and z (2 f/t): with f = 16, t = 4, bf16 and 8 tokens
  // per micro-batch the D block keeps 8 x 4 x 2 B = 64 B less per micro-batch.
  const auto d_activations = [](const std::string& act) {
    const Recipe r = OneStage({{"model.pattern", "AD"}, {"model.mlp.activation", act}});
    const SimComparison c = ExpectStepAgrees(r);
    return FindMemory(Stage(c, 0), "activations D").measured;
  };
  EXPECT_EQ(d_activations("swiglu") - d_activations("relu2"), 8 * 4 * 2);
}

TEST(SimulatorVariants, QkNormStepAgreesAtTp4Sp) {
  ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.attention.qk_norm", "true"}}));
}

TEST(SimulatorVariants, QkNormStepAgreesUnderContextParallelism) {
  for (const char* comm : {"p2p", "a2a"}) {
    ExpectStepAgrees(OneStage({{"model.pattern", "AD"},
                               {"model.attention.qk_norm", "true"},
                               {"parallel.tp", "1"},
                               {"parallel.cp", "4"},
                               {"parallel.cp_comm", comm}}));
  }
}

TEST(SimulatorVariants, QkNormGradsAllReducedOverTpWithoutSp) {
  // Without SP the block norms' gradients agree over TP, the qk norms' do
  // not (each rank normalizes its own heads): only they are all-reduced.
  // tp 4, head_dim 4: 2 x 4 fp32 per attention layer.
  for (const char* zero : {"1", "2"}) {
    const Recipe r = OneStage({{"model.pattern", "AD"},
                               {"model.attention.qk_norm", "true"},
                               {"parallel.sp", "false"},
                               {"parallel.zero", zero}});
    const SimComparison c = ExpectStepAgrees(r);
    int64_t attention_layers = 0;
    for (BlockKind k : r.model.layers) attention_layers += k == BlockKind::kAttention ? 1 : 0;
    ASSERT_GT(attention_layers, 0);
    const bool per_unit = std::string(zero) == "2";
    const CommAgreement* a = FindComm(Stage(c, 0), Axis::kTp, Collective::kAllReduce,
                                      per_unit ? Pass::kBackward : Pass::kOptimizer, CommWhat::kReplicatedGrads);
    ASSERT_NE(a, nullptr) << zero;
    // Ring all-reduce sends 2 (t-1)/t of the 8 x 4 B buffer per attention
    // layer (8 is a multiple of t, so no padding); ZeRO 2 once per unit and
    // micro-batch (2 micro-batches), ZeRO 1 once per step.
    const int64_t per_layer = 2 * 3 * 8 * 4 / 4;
    EXPECT_EQ(a->measured_sent, per_layer * attention_layers * (per_unit ? r.micro_batches() : 1)) << zero;
  }
}

// ---- tied embeddings -----------------------------------------------------------

TEST(SimulatorVariants, TiedEmbeddingMatchesFiniteDifferences) {
  // The head reads the embedding's weight: its gradient is the sum of the
  // lookup's and the head's parts.
  Dims d = SmallDims();
  d.tie_embeddings = true;
  OnOneRank([&](Ctx& ctx) {
    Embedding<double> emb(ctx, d, 7, 0.8);
    Head<double> head(ctx, d, 7, 0.8, &emb.weight());
    ASSERT_EQ(head.params().size(), 1u);  // the final norm; the weight is the embedding's
    std::vector<int64_t> ids, targets;
    for (int64_t t = 0; t < d.tokens(); ++t) {
      ids.push_back((t * 5 + 3) % d.vocab);
      targets.push_back((t * 7 + 1) % d.vocab);
    }
    const auto loss = [&] {  // each evaluation is its own micro-batch: FD runs forwards only
      ++ctx.microbatch;
      return head.Forward(ctx, emb.Forward(ctx, ids), targets);
    };
    loss();
    emb.Backward(ctx, head.Backward(ctx));
    EXPECT_LT(FdRelError(emb.weight().grad.m, Numeric(&emb.weight().value.m, loss)), kFdTolerance);
  });
}

/// Sent bytes of the tied-embedding all-reduce on a stage (0 when absent).
int64_t TiedSent(const StageComparison& s) {
  const CommAgreement* a =
      FindComm(s, Axis::kEmbedding, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kTiedEmbedding);
  return a == nullptr ? 0 : a->measured_sent;
}

TEST(SimulatorVariants, TiedEmbeddingOnOneStageIsOneTensor) {
  const Recipe r = OneStage({{"model.pattern", "AD"}, {"model.tie_embeddings", "true"}});
  const SimComparison c = ExpectStepAgrees(r);
  EXPECT_EQ(TiedSent(Stage(c, 0)), 0);
  // The untied recipe has a second V/t x h tensor (the head): vocab 40 padded
  // to 8 x 4 = 64, 16 rows of h 16 per rank, bf16 = 512 B more.
  const Recipe untied = OneStage({{"model.pattern", "AD"}});
  const SimComparison u = ExpectStepAgrees(untied);
  EXPECT_EQ(
      FindMemory(Stage(u, 0), "tp_sharded_params").measured - FindMemory(Stage(c, 0), "tp_sharded_params").measured,
      16 * 16 * 2);
}

TEST(SimulatorVariants, TiedEmbeddingCopiesSummedAcrossStages) {
  // pp 2: the first stage's embedding and the last stage's copy; their
  // gradients are all-reduced over the 2-rank embedding group once per step:
  // vocab 40 padded to 8 x 2 = 48, 24 rows of h 16 per rank, fp32 = 1536 B,
  // 2 (2-1)/2 x 1536 = 1536 B sent by each, on both stages.
  for (const char* vpp : {"1", "2"}) {
    const Recipe r =
        testing_sim::ScaledDefault({{"model.pattern", "AD"},
                                    {"model.tie_embeddings", "true"},
                                    {"parallel.pp", "2"},
                                    {"parallel.vpp", vpp},
                                    {"parallel.schedule", std::string(vpp) == "1" ? "1f1b" : "interleaved"},
                                    {"parallel.tp", "2"},
                                    {"parallel.ep", "1"}},
                                   /*max_world=*/4);
    ASSERT_EQ(r.world(), 4);
    const SimComparison c = ExpectStepAgrees(r);
    for (int64_t stage = 0; stage < 2; ++stage) EXPECT_EQ(TiedSent(Stage(c, stage)), 1536) << "vpp " << vpp;
  }
}

TEST(SimulatorVariants, TiedEmbeddingUnderZeroTwoIsRefused) {
  Recipe r = OneStage({{"model.pattern", "AD"}, {"model.tie_embeddings", "true"}});
  r.parallel.zero = 2;
  EXPECT_THROW(Simulate(r), SimUnsupported);
}

// ---- LayerNorm -------------------------------------------------------------------

TEST(SimulatorVariants, LayerNormOfARowByHand) {
  // x = [1, 2, 3, 4]: mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25;
  // weight 2, bias 0.5: y = 2 (x - 2.5) / sqrt(1.25 + eps) + 0.5.
  Mat<double> x(1, 4), wb(2, 4), stats;
  x << 1, 2, 3, 4;
  wb.row(0).setConstant(2.0);
  wb.row(1).setConstant(0.5);
  const Mat<double> y = NormForward(x, wb, 1e-5, &stats);
  ASSERT_EQ(stats.cols(), 2);  // mean and rstd: the estimator's 8 B per token
  EXPECT_NEAR(stats(0, 0), 2.5, 1e-15);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y(0, i), 2.0 * (x(0, i) - 2.5) / std::sqrt(1.25 + 1e-5) + 0.5, 1e-14);
}

TEST(SimulatorVariants, LayerNormBlocksMatchFiniteDifferences) {
  Dims d = SmallDims();
  d.norm = NormKind::kLayerNorm;
  for (char letter : {'A', 'D', 'E'}) CheckBlock(letter, d, std::string("layernorm ") + letter);
  OnOneRank([&](Ctx& ctx) {
    Head<double> head(ctx, d, 7, 0.8);
    ASSERT_EQ(head.params()[0]->value.m.rows(), 2);  // weight and bias
    Mat<double> x = testing::Random(d.tokens(), d.hidden, 11);
    std::vector<int64_t> targets;
    for (int64_t t = 0; t < d.tokens(); ++t) targets.push_back((t * 7 + 1) % d.vocab);
    const auto loss = [&] {
      ++ctx.microbatch;
      return head.Forward(ctx, x, targets);
    };
    loss();
    const Mat<double> dx = head.Backward(ctx);
    EXPECT_LT(FdRelError(dx, Numeric(&x, loss)), kFdTolerance);
    for (Param<double>* p : head.params()) {
      EXPECT_LT(FdRelError(p->grad.m, Numeric(&p->value.m, loss)), kFdTolerance) << p->name;
    }
  });
}

TEST(SimulatorVariants, LayerNormStepAgreesOnEveryBlockFamily) {
  // tp 4 + SP: the norms' weights and biases are replicated, their gradients
  // all-reduced over TP (2h per norm, as the inventory lists weight + bias).
  ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.norm", "layernorm"}}));
  ExpectStepAgrees(testing_sim::ScaledDefault(
      {{"model.pattern", "AEMR"}, {"model.norm", "layernorm"}, {"parallel.pp", "2"}, {"parallel.ep", "2"}},
      /*max_world=*/16));
}

TEST(SimulatorVariants, LayerNormAddsABiasPerNorm) {
  // Pattern AD's two pre-norms and the final norm each gain a bias of h = 16,
  // bf16: 3 x 16 x 2 B = 96 B more replicated parameters. (The extra fp32
  // mean per token is in the activations ExpectStepAgrees holds to fit.)
  const auto stage = [](const std::string& norm) {
    return Stage(ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.norm", norm}})), 0);
  };
  const StageComparison rms = stage("rmsnorm"), ln = stage("layernorm");
  EXPECT_EQ(FindMemory(ln, "replicated_params").measured - FindMemory(rms, "replicated_params").measured, 3 * 16 * 2);
}

// ---- linear biases ---------------------------------------------------------------

TEST(SimulatorVariants, LinearBiasesMatchFiniteDifferences) {
  for (FfnActivation f : {FfnActivation::kSwiglu, FfnActivation::kRelu2}) {
    Dims d = SmallDims();
    d.linear_bias = true;
    d.mlp_activation = d.moe_activation = f;
    for (char letter : {'A', 'D', 'E'}) CheckBlock(letter, d, std::string("bias ") + letter + " " + Name(f));
  }
}

TEST(SimulatorVariants, LinearBiasesStepAgreesWithAndWithoutSp) {
  // The row-parallel biases (attention out, MLP down) are added once, after
  // the reduction: replicated, their gradients partial over TP with SP
  // (all-reduced with the norms), whole without.
  for (const char* sp : {"true", "false"}) {
    ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.linear_bias", "true"}, {"parallel.sp", sp}}));
  }
  ExpectStepAgrees(OneStage({{"model.pattern", "AE"},
                             {"model.linear_bias", "true"},
                             {"parallel.ep", "2"},
                             {"model.moe.pad_to_capacity", "true"}}));
}

TEST(SimulatorVariants, LinearBiasParamsByHand) {
  // tp 4, pattern AD of the scaled default (32 heads, 8 KV heads of 4, h 16,
  // ffn 16): column-parallel biases qkv (32 + 2 x 8) x 4 / 4 = 48 and gate +
  // up 2 x 16 / 4 = 8 elements per rank; row-parallel (replicated) out and
  // down 2 x 16. bf16: 112 B and 64 B more than without biases.
  const auto params = [](const std::string& bias) {
    return Stage(ExpectStepAgrees(OneStage({{"model.pattern", "AD"}, {"model.linear_bias", bias}})), 0);
  };
  const StageComparison with = params("true"), without = params("false");
  EXPECT_EQ(FindMemory(with, "tp_sharded_params").measured - FindMemory(without, "tp_sharded_params").measured,
            (48 + 8) * 2);
  EXPECT_EQ(FindMemory(with, "replicated_params").measured - FindMemory(without, "replicated_params").measured,
            2 * 16 * 2);
}

TEST(SimulatorVariants, ExpertBiasesUnderExpertTpAreRefused) {
  const Recipe r = OneStage(
      {{"model.pattern", "AE"}, {"model.linear_bias", "true"}, {"parallel.ep", "2"}, {"parallel.expert_tp", "2"}});
  EXPECT_THROW(Simulate(r), SimUnsupported);
}

// ---- sigmoid router --------------------------------------------------------------

TEST(SimulatorVariants, SigmoidRouterMatchesFiniteDifferences) {
  for (int64_t k : {1, 2}) {
    Dims d = SmallDims();
    d.router_sigmoid = true;
    d.top_k = k;
    CheckBlock('E', d, "sigmoid top-" + std::to_string(k));
  }
}

TEST(SimulatorVariants, SigmoidRouterStepAgrees) {
  ExpectStepAgrees(OneStage({{"model.pattern", "AE"},
                             {"model.moe.router", "sigmoid"},
                             {"parallel.ep", "2"},
                             {"model.moe.pad_to_capacity", "true"}}));
}

TEST(SimulatorVariants, SigmoidRouterIsNotTheSoftmaxRouter) {
  // The same weights and input routed by the two score functions give other
  // probabilities (sigmoid(a) / (sigmoid(a) + sigmoid(b)) against
  // e^a / (e^a + e^b)), so the block outputs differ: the knob is read.
  const auto output = [](RouterScore router) {
    Dims d = SmallDims();
    d.router_sigmoid = router == RouterScore::kSigmoid;
    Mat<double> y;
    OnOneRank([&](Ctx& ctx) {
      auto block = MakeBlock<double>('E', ctx, d, 0, 7, 0.8);
      y = block->Forward(ctx, testing::Random(d.tokens(), d.hidden, 11));
    });
    return y;
  };
  EXPECT_GT(testing::Rel(output(RouterScore::kSigmoid), output(RouterScore::kSoftmax)), 1e-3);
}

}  // namespace
}  // namespace preflight::sim::simulator_variants_test

// training.recompute: selective_op, torchtitan's per-op selective
// checkpointing, executed for real: each transformer block one checkpoint
// whose policy keeps the block input, every other aten.mm output (wq, wv,
// w1, w2) and the SDPA output and log-sum-exp (torchtitan
// activation_checkpoint.py _custom_policy). The backward's rerun takes them
// back and reruns the rest; its numerics (fp64, against the unsharded run
// without recompute), saved and rerun memory (against fit and by hand) and
// FLOPs (against plan's recompute share and by hand) agree.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/estimator/memory_terms.h"
#include "preflight/recipe/recipe.h"
#include "preflight/simulator/sim.h"
#include "recompute.h"
#include "support/sim_recipes.h"

namespace preflight::sim::simulator_selective_op_test {
namespace {

using testing_sim::ExpectStepAgrees;
using testing_sim::FindMemory;
using testing_sim::ScaledRecipe;
using testing_sim::Stage;

/// Llama 3 8B scaled (h 16, head_dim 4, FFN 16, seq 8), `layers` transformer
/// layers (the scaled copy repeats the pattern once), pp `pp`, under `recompute`, at most `world` ranks.
Recipe Llama(const std::string& recompute, int64_t pp, int64_t layers = 2, std::vector<Override> sets = {},
             int64_t world = 2) {
  std::string pattern;
  for (int64_t i = 0; i < layers; ++i) pattern += "AD";
  sets.insert(sets.begin(),
              {{"training.recompute", recompute}, {"parallel.pp", std::to_string(pp)}, {"model.pattern", pattern}});
  return ScaledRecipe("llama3-8b-h200.yaml", sets, world);
}

TEST(SimulatorSelectiveOp, EachTransformerLayerIsOneCheckpoint) {
  // torchtitan's SelectiveAC wraps each block of model.layers: the A+D pair.
  TrainingConfig t;
  t.recompute = Recompute::kSelectiveOp;
  t.recompute_layers = 3;  // full recompute's knobs do not apply
  t.recompute_method = RecomputeMethod::kBlock;
  const std::vector<BlockKind> stack{BlockKind::kAttention, BlockKind::kDenseMlp,  BlockKind::kAttention,
                                     BlockKind::kDenseMlp,  BlockKind::kAttention, BlockKind::kDenseMlp};
  const std::vector<CheckpointGroup> layers{{0, 2}, {2, 4}, {4, 6}};
  EXPECT_EQ(CheckpointGroups(stack, 0, 6, t), layers);
  const std::vector<CheckpointGroup> chunk{{0, 2}};
  EXPECT_EQ(CheckpointGroups(stack, 2, 4, t), chunk);
}

TEST(SimulatorSelectiveOp, StepAgreesAtPp1AndPp2) {
  for (int64_t pp : {1, 2}) {
    SCOPED_TRACE(pp);
    const Recipe r = Llama("selective_op", pp);
    ASSERT_EQ(r.parallel.pp, pp);
    const SimComparison c = ExpectStepAgrees(r);
    EXPECT_GT(FindMemory(Stage(c, 0), "activations_rerun").measured, 0);
  }
}

TEST(SimulatorSelectiveOp, QkNormsAndTransformerEngineAgree) {
  // Qwen3's q_norm and k_norm read wq's and wk's outputs in backward: the
  // rerun keeps the saved wq output instead of freeing it.
  for (const char* te : {"true", "false"}) {
    SCOPED_TRACE(te);
    ExpectStepAgrees(
        Llama("selective_op", 2, 2, {{"model.attention.qk_norm", "true"}, {"training.transformer_engine", te}}));
  }
}

// pp 1, tp 1, one micro-batch in flight of T = 8 tokens, bf16 (2 B), h 16,
// 32 query heads and 8 KV heads of 4 (q = 128, kv = 32), FFN 16.
struct Sizes {
  int64_t tokens, h, q, kv, heads, f;
};

Sizes SizesOf(const Recipe& r) {
  const AttentionConfig& a = r.model.attention;
  return {r.training.seq_len * r.training.micro_batch,
          r.model.hidden,
          a.heads * a.head_dim,
          a.kv_heads * a.head_dim,
          a.heads,
          r.model.mlp.ffn_hidden};
}

TEST(SimulatorSelectiveOp, SavedAndRerunBytesByHand) {
  const Recipe r = Llama("selective_op", 1, 3, {{"training.transformer_engine", "false"}}, 1);
  const Sizes z = SizesOf(r);
  ASSERT_EQ(z.tokens, 8);
  ASSERT_EQ(z.h, 16);
  ASSERT_EQ(z.q, 128);
  ASSERT_EQ(z.kv, 32);
  ASSERT_EQ(z.f, 16);
  const SimulationReport rep = Simulate(r);
  // Kept per token of a block, docs/recipe.md: h (input) + q (wq) + kv (wv)
  // + q (SDPA output) at 2 B, 4 B of log-sum-exp per head; f (w1) + h (w2).
  const int64_t attention = (16 + 128 + 32 + 128) * 2 + 32 * 4;  // 736
  const int64_t mlp = (16 + 16) * 2;                             // 64
  const std::map<std::string, int64_t>& at_peak = rep.per_rank.at(0).activations_at_peak;
  EXPECT_EQ(at_peak.at("A"), 3 * 8 * attention);
  EXPECT_EQ(at_peak.at("D"), 3 * 8 * mlp);
  // fit's per-token saved set is the same hand count.
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kAttention, Recompute::kSelectiveOp, 1, 1).total(), attention);
  EXPECT_EQ(SavedBytesPerToken(r, BlockKind::kDenseMlp, Recompute::kSelectiveOp, 1, 1).total(), mlp);
  // The rerun allocates, per token: the attention norm's output h and rstd
  // (4 B; its input is the checkpoint), RoPE's q and k; the MLP's input h,
  // its norm's output h and rstd, w3's output u and SwiGLU's z (f each).
  // v, the SDPA's outputs and w1's are the saved ones, taken back.
  const int64_t rerun = (16 + 128 + 32) * 2 + 4 + (16 + 16 + 16 + 16) * 2 + 4;  // 488
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64);
  const MemoryAgreement& row = FindMemory(Stage(c, 0), "activations_rerun");
  EXPECT_EQ(row.measured, 8 * rerun);
  EXPECT_EQ(row.modeled, 8 * rerun);
  EXPECT_TRUE(c.memory_ok());
  // fit's peak nets out the saved outputs no backward reads (wq's q, w2's h),
  // which the rerun frees.
  EXPECT_EQ(SelectiveOpUnreadBytesPerToken(r, BlockKind::kAttention) +
                SelectiveOpUnreadBytesPerToken(r, BlockKind::kDenseMlp),
            (128 + 16) * 2);
}

TEST(SimulatorSelectiveOp, RerunFlopsAreThePlannedShare) {
  // Per micro-batch and layer the rerun runs wk, wo and w3 (2 T h kv, 2 T q
  // h, 2 T h f FLOPs) and neither the saved matmuls nor the SDPA: with T = 8,
  // 2 layers and 2 micro-batches, 2 x 2 x 2 x 8 x (16 x 32 + 128 x 16 + 16 x
  // 16) more FLOPs than without recompute.
  const Recipe op = Llama("selective_op", 1, 2, {}, 1), none = Llama("none", 1, 2, {}, 1);
  ASSERT_EQ(op.micro_batches(), 2);
  const Sizes z = SizesOf(op);
  const double extra = Simulate(op).flops - Simulate(none).flops;
  EXPECT_EQ(extra, 2.0 * 2 * 2 * 8 * (16 * 32 + 128 * 16 + 16 * 16));
  // plan reruns SelectiveOpRecomputedMatmulShare of each sublayer's matmul
  // FLOPs (planner/compute.cc SetRecompute).
  const double t2 = 2.0 * static_cast<double>(z.tokens);
  const double attention = t2 * static_cast<double>(z.h * z.q + 2 * z.h * z.kv + z.q * z.h);
  const double mlp = t2 * 3.0 * static_cast<double>(z.h * z.f);
  const double planned = SelectiveOpRecomputedMatmulShare(op, BlockKind::kAttention) * attention +
                         SelectiveOpRecomputedMatmulShare(op, BlockKind::kDenseMlp) * mlp;
  EXPECT_DOUBLE_EQ(extra, 2.0 * 2 * planned);
}

}  // namespace
}  // namespace preflight::sim::simulator_selective_op_test

// The A block under context parallelism (attention_core.h): every cp_comm
// mode, cp 2 and 4, with and without causal load balancing, and tp x cp =
// 2 x 2 with SP, against one rank; the bytes each rank sends per (pass,
// label) against K_c worked by hand (docs/formulas.md §7.2) and against the planner;
// the saved tensors against docs/formulas.md §3.2/3.4 and the estimator; and the two
// facts ring attention rests on: attention without the K,V exchange is
// wrong, and partial results merged by the log-sum-exp rule are exact.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "attention_core.h"
#include "preflight/inventory/inventory.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/recipe.h"
#include "support/sim_block_harness.h"
#include "support/sim_checks.h"

namespace preflight::sim::simulator_cp_attention_test {
namespace {

using testing::BlockLayout;
using testing::BlockRun;
using testing::ExpectSame;
using testing::GlobalValueInput;
using testing::Rel;
using testing::RunBlock;

// hidden h 16, n_q 8 query / n_kv 4 KV heads of d_h 4 (GQA, 2 query heads a
// group), s 16 positions, b 2 sequences; bf16 activations (beta_a 2).
Dims CpDims() {
  Dims d;
  d.hidden = 16;
  d.heads = 8;
  d.kv_heads = 4;
  d.head_dim = 4;
  d.ffn = 16;
  d.seq = 16;
  d.batch = 2;
  d.vocab = 32;
  return d;
}

constexpr double kTolerance = 1e-10;  // fp64, sharded vs one rank (docs/formulas.md §8)

/// Bytes rank `rank` sent on axis "cp" per (kind, pass, label).
using CpKey = std::tuple<CollectiveKind, Pass, CommWhat>;
std::map<CpKey, int64_t> CpSent(const BlockRun& run, int rank) {
  std::map<CpKey, int64_t> out;
  for (const CommCount& c : run.comm[static_cast<size_t>(rank)]) {
    if (c.axis == Axis::kCp && c.bytes_sent > 0) out[{c.kind, c.pass, c.what}] += c.bytes_sent;
  }
  return out;
}

struct Case {
  const char* name;
  int tp, cp;
  bool sp;
  CpComm comm;
  bool balanced;
  /// Bytes every CP rank sends per (kind, pass, label), by hand.
  std::map<CpKey, int64_t> sent;
  /// Activation bytes every rank keeps for the backward, by hand.
  int64_t saved;
};

constexpr auto kSend = CollectiveKind::kSend;
constexpr auto kAg = CollectiveKind::kAllGather;
constexpr auto kRs = CollectiveKind::kReduceScatter;
constexpr auto kA2a = CollectiveKind::kAllToAll;
constexpr auto kFwd = Pass::kForward;
constexpr auto kBwd = Pass::kBackward;

// K_c = 2*(s/c)*b*(n_kv/t)*d_h*beta_a (docs/formulas.md §7.2): one rank's K and V.
//   c 2, t 1: 2*8*2*4*4*2 = 1024.   c 4, t 1: 2*4*2*4*4*2 = 512.   c 2, t 2: 2*8*2*2*4*2 = 512.
// p2p (TE ring): fwd (c-1) K_c; bwd (c-1) K_c (K,V again) + (c-1) K_c (dK,dV home).
// all_gather: fwd AG (c-1) K_c; bwd AG (c-1) K_c again (TE saves only the local K,V) + RS (c-1) K_c.
// a2a: each all-to-all sends (c-1)/c of its buffer (s/c)*b*width/t*d_h*beta_a:
//   fwd Q, K, V, O: width 2 n_q + 2 n_kv = 24; bwd O, dO, dQ, dK, dV: 3 n_q + 2 n_kv = 32.
//   c 2, t 1: 1/2*16*24*4*2 = 1536 and 1/2*16*32*4*2 = 2048.
//   c 4, t 1: 3/4*8*24*4*2 = 1152 and 3/4*8*32*4*2 = 1536.
//   c 2, t 2: 1/2*16*12*4*2 = 768 and 1/2*16*16*4*2 = 1024.
// Saved (docs/formulas.md §3.2, flash attention, no recompute; 3.4: all /c): per token
// a residual 2h*beta_a + 4 (x and the norm output, the fp32 rstd) = 68, /t
// with SP, and a sharded (2n_q + 2n_kv)*d_h*beta_a + 4 n_q (q, k, v, o and the
// fp32 LSE) = 224, /t; over (s/c)*b tokens:
//   c 2, t 1: 16*68 + 16*224 = 4672.   c 4, t 1: 8*68 + 8*224 = 2336.
//   c 2, t 2, SP: 16*68/2 + 16*224/2 = 544 + 1792 = 2336.
const Case kCases[] = {
    {"P2pCp2Balanced",
     1,
     2,
     false,
     CpComm::kP2p,
     true,
     {{{kSend, kFwd, CommWhat::kAttentionKv}, 1024}, {{kSend, kBwd, CommWhat::kAttentionKv}, 2 * 1024}},
     4672},
    {"P2pCp2Unbalanced",
     1,
     2,
     false,
     CpComm::kP2p,
     false,
     {{{kSend, kFwd, CommWhat::kAttentionKv}, 1024}, {{kSend, kBwd, CommWhat::kAttentionKv}, 2 * 1024}},
     4672},
    {"P2pCp4Balanced",
     1,
     4,
     false,
     CpComm::kP2p,
     true,
     {{{kSend, kFwd, CommWhat::kAttentionKv}, 3 * 512}, {{kSend, kBwd, CommWhat::kAttentionKv}, 6 * 512}},
     2336},
    {"P2pCp4Unbalanced",
     1,
     4,
     false,
     CpComm::kP2p,
     false,
     {{{kSend, kFwd, CommWhat::kAttentionKv}, 3 * 512}, {{kSend, kBwd, CommWhat::kAttentionKv}, 6 * 512}},
     2336},
    {"P2pTp2Cp2Sp",
     2,
     2,
     true,
     CpComm::kP2p,
     true,
     {{{kSend, kFwd, CommWhat::kAttentionKv}, 512}, {{kSend, kBwd, CommWhat::kAttentionKv}, 2 * 512}},
     2336},
    {"AllGatherCp2Balanced",
     1,
     2,
     false,
     CpComm::kAllGather,
     true,
     {{{kAg, kFwd, CommWhat::kAttentionKv}, 1024},
      {{kAg, kBwd, CommWhat::kAttentionKv}, 1024},
      {{kRs, kBwd, CommWhat::kAttentionKv}, 1024}},
     4672},
    {"AllGatherCp4Unbalanced",
     1,
     4,
     false,
     CpComm::kAllGather,
     false,
     {{{kAg, kFwd, CommWhat::kAttentionKv}, 3 * 512},
      {{kAg, kBwd, CommWhat::kAttentionKv}, 3 * 512},
      {{kRs, kBwd, CommWhat::kAttentionKv}, 3 * 512}},
     2336},
    {"AllGatherTp2Cp2Sp",
     2,
     2,
     true,
     CpComm::kAllGather,
     true,
     {{{kAg, kFwd, CommWhat::kAttentionKv}, 512},
      {{kAg, kBwd, CommWhat::kAttentionKv}, 512},
      {{kRs, kBwd, CommWhat::kAttentionKv}, 512}},
     2336},
    {"A2aCp2Balanced",
     1,
     2,
     false,
     CpComm::kA2a,
     true,
     {{{kA2a, kFwd, CommWhat::kAttentionQkvo}, 1536}, {{kA2a, kBwd, CommWhat::kAttentionQkvo}, 2048}},
     4672},
    {"A2aCp2Unbalanced",
     1,
     2,
     false,
     CpComm::kA2a,
     false,
     {{{kA2a, kFwd, CommWhat::kAttentionQkvo}, 1536}, {{kA2a, kBwd, CommWhat::kAttentionQkvo}, 2048}},
     4672},
    {"A2aCp4Balanced",
     1,
     4,
     false,
     CpComm::kA2a,
     true,
     {{{kA2a, kFwd, CommWhat::kAttentionQkvo}, 1152}, {{kA2a, kBwd, CommWhat::kAttentionQkvo}, 1536}},
     2336},
    {"A2aTp2Cp2Sp",
     2,
     2,
     true,
     CpComm::kA2a,
     true,
     {{{kA2a, kFwd, CommWhat::kAttentionQkvo}, 768}, {{kA2a, kBwd, CommWhat::kAttentionQkvo}, 1024}},
     2336},
};

BlockLayout LayoutOfCase(const Case& c) {
  BlockLayout l;
  l.tp = c.tp;
  l.cp = c.cp;
  l.sp = c.sp;
  l.cp_comm = c.comm;
  l.load_balance = c.balanced;
  return l;
}

class CpAttention : public ::testing::TestWithParam<Case> {
 protected:
  static const BlockRun& Reference() {
    static const BlockRun ref = RunBlock('A', CpDims(), BlockLayout{}, X(), Dy());
    return ref;
  }
  static Mat<double> X() { return GlobalValueInput(CpDims().tokens(), CpDims().hidden, 1); }
  static Mat<double> Dy() { return GlobalValueInput(CpDims().tokens(), CpDims().hidden, 2); }
};

TEST_P(CpAttention, EqualsOneRank) {
  const Case& c = GetParam();
  const BlockRun run = RunBlock('A', CpDims(), LayoutOfCase(c), X(), Dy());
  ExpectSame(run, Reference(), c.name, kTolerance);
}

TEST_P(CpAttention, SendsTheHandCountedBytes) {
  const Case& c = GetParam();
  const BlockRun run = RunBlock('A', CpDims(), LayoutOfCase(c), X(), Dy());
  for (int r = 0; r < c.tp * c.cp; ++r) EXPECT_EQ(CpSent(run, r), c.sent) << "rank " << r;
}

TEST_P(CpAttention, SavesTheHandCountedActivations) {
  const Case& c = GetParam();
  const BlockRun run = RunBlock('A', CpDims(), LayoutOfCase(c), X(), Dy());
  for (int r = 0; r < c.tp * c.cp; ++r) EXPECT_EQ(run.activation_peak[static_cast<size_t>(r)], c.saved) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(All, CpAttention, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// ---- against the planner and the estimator ----------------------------------

/// A one-layer A model with CpDims' sizes on tp x cp GPUs, one micro-batch.
Recipe CpRecipe(const Case& c) {
  const std::string yaml = fmt::format(
      "name: cp\n"
      "model: {{pattern: A, repeat: 1, hidden: 16, vocab: 32, attention: {{heads: 8, kv_heads: 4, head_dim: 4}}}}\n"
      "training: {{seq_len: 16, micro_batch: 2, global_batch: 2, recompute: none}}\n"
      "parallel: {{tp: {}, sp: {}, cp: {}, cp_comm: {}, cp_load_balance: {}}}\n"
      "cluster: {{nodes: 1, gpus_per_node: {}}}\n",
      c.tp, c.sp, c.cp, c.comm == CpComm::kP2p ? "p2p" : c.comm == CpComm::kAllGather ? "all_gather" : "a2a",
      c.balanced, c.tp * c.cp);
  const LoadResult loaded = LoadRecipeFromString(yaml, "cp.yaml");
  EXPECT_TRUE(loaded.ok());
  return loaded.ok() ? *loaded.recipe : Recipe{};
}

Collective PlannerKind(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllGather: return Collective::kAllGather;
    case CollectiveKind::kReduceScatter: return Collective::kReduceScatter;
    case CollectiveKind::kAllToAll: return Collective::kAllToAll;
    default: return Collective::kSendRecv;
  }
}

// The hand counts above are the planner's items for the same layout (one A
// layer, one micro-batch), and the saved bytes the estimator's attention term.
TEST_P(CpAttention, AgreesWithPlannerAndEstimator) {
  const Case& c = GetParam();
  const Recipe recipe = CpRecipe(c);
  const Inventory inv = BuildInventory(recipe);
  const Layout layout = LayoutOf(recipe);
  const PlanTables tables = BuildPlanTables(inv);
  const Mesh mesh = PlaceRanks(layout, recipe.cluster.gpus_per_node);
  const StagePlan stages = EqualStagePlan(1, 1, 1);
  const std::vector<StageComm> comm = BuildStageComm(inv, tables, layout, stages, mesh.locality, CostModel{});
  std::map<std::tuple<Collective, Pass, CommWhat>, int64_t> planned;
  for (const CommItem& i : comm.at(0).items) {
    if (i.axis == Axis::kCp) planned[{i.kind, i.pass, i.what}] += i.send.count();
  }
  std::map<std::tuple<Collective, Pass, CommWhat>, int64_t> counted;
  for (const auto& [key, bytes] : c.sent) {
    const auto& [kind, pass, what] = key;
    counted[{PlannerKind(kind), pass == kFwd ? Pass::kForward : Pass::kBackward, what}] += bytes;
  }
  EXPECT_EQ(counted, planned);
  EXPECT_EQ(LayerActivations(recipe, layout, BlockKind::kAttention).count(), c.saved);
}

// ---- the facts ring attention rests on --------------------------------------

/// Runs the A block on `cp` ranks that each see only their own chunks (the
/// CP sequence layout, global RoPE positions, but no K,V exchange: cp_size 1
/// in the context), and returns the assembled output.
Mat<double> WithoutExchange(const Dims& d, int cp, bool balanced, const Mat<double>& x) {
  World world(cp);
  std::vector<const Group*> one(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) one[static_cast<size_t>(r)] = &world.NewGroup(Axis::kTp, {r});
  std::vector<Mat<double>> ys(static_cast<size_t>(cp));
  world.Run([&](Rank& rank) {
    const int r = rank.id();
    Ctx ctx;
    ctx.rank = &rank;
    ctx.tp = ctx.ep = ctx.etp = ctx.edp = one[static_cast<size_t>(r)];
    ctx.seq = SeqLayout::Make(d.seq, cp, r, balanced);
    auto block = MakeBlock<double>('A', ctx, d, 0, 7, 0.8);
    ys[static_cast<size_t>(r)] = block->Forward(ctx, testing::LocalRows(x, ctx.seq, d.batch, false, 1, 0));
  });
  Mat<double> y = Mat<double>::Zero(x.rows(), x.cols());
  for (int r = 0; r < cp; ++r) {
    testing::PutLocalRows(ys[static_cast<size_t>(r)], SeqLayout::Make(d.seq, cp, r, balanced), d.batch, false, 1, 0,
                          &y);
  }
  return y;
}

TEST(CpAttentionFacts, WithoutTheKvExchangeTheOutputIsWrong) {
  const Dims d = CpDims();
  const Mat<double> x = GlobalValueInput(d.tokens(), d.hidden, 1);
  const Mat<double> ref = RunBlock('A', d, BlockLayout{}, x, GlobalValueInput(d.tokens(), d.hidden, 2)).y;
  for (bool balanced : {true, false}) {
    // Every rank but the one holding chunk 0 misses keys before its chunks.
    EXPECT_GT(Rel(WithoutExchange(d, 2, balanced, x), ref), 1e-3) << balanced;
    EXPECT_GT(Rel(WithoutExchange(d, 4, balanced, x), ref), 1e-3) << balanced;
  }
}

// One query block against the whole sequence at once, and against the key
// blocks of each CP rank in ring order merged by the log-sum-exp rule: the
// same O and LSE (fp64, 1e-10).
TEST(CpAttentionFacts, RingStepsMergeExactly) {
  const Dims d = CpDims();
  const AttnShape shape{d.batch, d.head_dim, d.heads / d.kv_heads};
  World world(1);
  world.Run([&](Rank& rank) {
    Ctx ctx;
    ctx.rank = &rank;
    for (int cp : {2, 4}) {
      for (bool balanced : {true, false}) {
        for (int me = 0; me < cp; ++me) {
          const std::vector<int64_t> qpos = PositionsOf(d.seq, cp, me, balanced);
          const int64_t rows = static_cast<int64_t>(qpos.size()) * d.batch;
          const Mat<double> q = GlobalValueInput(rows, d.heads * d.head_dim, 30 + me);
          std::vector<int64_t> all;
          std::vector<Mat<double>> k_blocks, v_blocks;
          for (int j = 0; j < cp; ++j) {
            const std::vector<int64_t> p = PositionsOf(d.seq, cp, j, balanced);
            all.insert(all.end(), p.begin(), p.end());
            k_blocks.push_back(GlobalValueInput(rows, d.kv_heads * d.head_dim, 40 + j));
            v_blocks.push_back(GlobalValueInput(rows, d.kv_heads * d.head_dim, 50 + j));
          }
          Mat<double> k_all(rows * cp, d.kv_heads * d.head_dim), v_all(rows * cp, d.kv_heads * d.head_dim);
          for (int j = 0; j < cp; ++j) {
            k_all.middleRows(j * rows, rows) = k_blocks[static_cast<size_t>(j)];
            v_all.middleRows(j * rows, rows) = v_blocks[static_cast<size_t>(j)];
          }
          Mat<double> o_ref, lse_ref;
          AttendBlock(ctx, shape, q, qpos, k_all, v_all, all, &o_ref, &lse_ref);
          Mat<double> o = Mat<double>::Zero(rows, q.cols());
          Mat<double> lse = Mat<double>::Constant(rows, d.heads, -std::numeric_limits<double>::infinity());
          for (int i = 0; i < cp; ++i) {
            const int src = (me - i + cp) % cp;
            Mat<double> o_i, lse_i;
            AttendBlock(ctx, shape, q, qpos, k_blocks[static_cast<size_t>(src)], v_blocks[static_cast<size_t>(src)],
                        PositionsOf(d.seq, cp, src, balanced), &o_i, &lse_i);
            MergeAttention(shape, o_i, lse_i, &o, &lse);
          }
          EXPECT_LT(Rel(o, o_ref), kTolerance) << cp << balanced << me;
          EXPECT_LT(Rel(lse, lse_ref), kTolerance) << cp << balanced << me;
        }
      }
    }
  });
}

TEST(CpAttentionFacts, UnsupportedLayoutsSayWhy) {
  Dims d = CpDims();
  // Ulysses at tp 2 x cp 2 with 2 KV heads: kv_heads/tp = 1 does not split over cp.
  d.kv_heads = 2;
  try {
    CheckAttentionCp(d, 2, 2, CpComm::kA2a, true);
    ADD_FAILURE() << "no throw";
  } catch (const SimUnsupported& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads/tp = 1 must both be divisible"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(CheckAttentionCp(d, 2, 2, CpComm::kP2p, true));
  // seq 14 does not cut into 2 x cp = 4 balanced chunks; into cp = 2 it does.
  d.seq = 14;
  EXPECT_THROW(CheckAttentionCp(d, 1, 2, CpComm::kP2p, true), SimUnsupported);
  EXPECT_NO_THROW(CheckAttentionCp(d, 1, 2, CpComm::kP2p, false));
}

}  // namespace
}  // namespace preflight::sim::simulator_cp_attention_test

// The M block (Mamba-2 mixer): its SSD forms against each other, its
// backward against finite differences, its parameters against the
// inventory, its TP/SP/CP runs against one rank, its counted bytes against
// hand counts and the planner, and its saved activations against the
// estimator (docs/formulas.md §1.4, 3.2, 7.2, 8.2, 8.3).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "mamba.h"
#include "planner_tiny_model.h"
#include "preflight/inventory/inventory.h"
#include "preflight/estimator/memory_terms.h"
#include "support/sim_block_harness.h"
#include "support/sim_checks.h"

namespace preflight::sim::simulator_mamba_test {
namespace {

using testing::BlockLayout;
using testing::BlockRun;
using testing::Describe;
using testing::ExpectBackwardMatchesFd;
using testing::ExpectSame;
using testing::FdRelError;
using testing::MakeBlockLayout;
using testing::ModelLayout;
using testing::Numeric;
using testing::OnOneRank;
using testing::Random;
using testing::Rel;
using testing::RunBlock;
using testing::Sent;

// Sizes: h 8, d_i 16 = 8 heads of P 2, G 4 groups of N 3, conv K 4, chunk
// Q 3, seq 16, batch 2. Heads and groups allow tp 1/2/4, and with cp 2/4 both
// of Megatron's group rules: (G/t) % c == 0 splits groups, c % (G/t) == 0
// repeats B and C.
Dims MambaDims() {
  Dims d;
  d.hidden = 8;
  d.mamba_inner = 16;
  d.mamba_head_dim = 2;
  d.mamba_heads = 8;
  d.mamba_groups = 4;
  d.mamba_d_state = 3;
  d.mamba_d_conv = 4;
  d.mamba_chunk = 3;
  d.seq = 16;
  d.batch = 2;
  return d;
}

/// The recipe the Dims stand for (pattern "M"), for the inventory, the
/// estimator and the planner.
Recipe MambaRecipe(const Dims& d) {
  Recipe r;
  r.name = "mamba-test";
  r.source.file = "mamba-test.yaml";
  r.model.pattern = "M";
  r.model.repeat = 1;
  r.model.hidden = d.hidden;
  r.model.vocab = 64;
  r.model.mamba = MambaConfig{d.mamba_d_state, d.mamba_d_conv, d.mamba_inner / d.hidden,   d.mamba_head_dim,
                              d.mamba_groups,  d.mamba_chunk,  d.mamba_fused_norm_out_proj};
  r.training.seq_len = d.seq;
  r.training.micro_batch = d.batch;
  r.cluster.gpu = "h200";
  r.cluster.spec = *GpuPreset("h200");
  r.cluster.gpus_per_node = 8;
  r.training.optimizer.matrices = OptimizerKind::kMuon;  // as the simulated blocks (ctx.optimizer) run it
  return r;
}

/// The planner's send bytes of one bucket for the block's layout.
int64_t PlannerSent(const Dims& d, const BlockLayout& b, Axis axis, Collective kind, Pass pass, CommWhat what) {
  const Inventory inv = BuildInventory(MambaRecipe(d));
  const auto priced = preflight::testing::Price(inv, ModelLayout(d, b));
  return preflight::testing::Sent(priced.comm[0], axis, kind, pass, what);
}

// ---------------------------------------------------------------------------
// The SSD: sequential scan vs chunked form (docs/formulas.md §8.2's second oracle).

mamba::SsmInputs<double> RandomSsm(const mamba::SsmShape& s, int64_t len, uint64_t seed) {
  mamba::SsmInputs<double> in;
  const int64_t rows = len * s.batch;
  in.x = Random(rows, s.heads * s.head_dim, seed);
  in.dt = Random(rows, s.heads, seed + 1, 0.05, 0.6);
  in.b = Random(rows, s.groups * s.d_state, seed + 2);
  in.c = Random(rows, s.groups * s.d_state, seed + 3);
  in.a = Random(1, s.heads, seed + 4, -1.5, -0.1);
  in.d = Random(1, s.heads, seed + 5);
  return in;
}

TEST(SimulatorMamba, ChunkedSsdEqualsTheScan) {
  const mamba::SsmShape s{6, 3, 2, 4, 2};  // heads 6 in groups 3, P 2, N 4, batch 2
  const int64_t len = 11;
  const mamba::SsmInputs<double> in = RandomSsm(s, len, 21);
  const Mat<double> h0 = Random(s.state_rows(), s.state_cols(), 27);
  Mat<double> h_scan, h_chunk;
  const Mat<double> y = mamba::SsmScan(s, in, h0, &h_scan);
  // Chunks of 4 (the last one ragged: 11 = 4 + 4 + 3), 1 (the scan itself)
  // and 16 (one chunk, pure quadratic form).
  for (int64_t q : {4, 1, 16}) {
    EXPECT_LT(Rel(mamba::SsmChunked(s, in, q, h0, &h_chunk), y), 1e-12) << q;
    EXPECT_LT(Rel(h_chunk, h_scan), 1e-12) << q;
  }
}

TEST(SimulatorMamba, ScanFromAHandedOverStateEqualsOneRun) {
  // Running positions [0, 5) then [5, 11) from the state the first run ends
  // in is the whole run: the identity the CP hand-off rests on.
  const mamba::SsmShape s{4, 2, 2, 3, 1};
  const mamba::SsmInputs<double> in = RandomSsm(s, 11, 31);
  const Mat<double> zero = Mat<double>::Zero(s.state_rows(), s.state_cols());
  Mat<double> h_all, h_mid, h_end;
  const Mat<double> y = mamba::SsmScan(s, in, zero, &h_all);
  auto part = [&](int64_t from, int64_t n) {
    mamba::SsmInputs<double> p = in;
    p.x = in.x.middleRows(from, n);
    p.dt = in.dt.middleRows(from, n);
    p.b = in.b.middleRows(from, n);
    p.c = in.c.middleRows(from, n);
    return p;
  };
  const Mat<double> y1 = mamba::SsmChunked(s, part(0, 5), 3, zero, &h_mid);
  const Mat<double> y2 = mamba::SsmChunked(s, part(5, 6), 3, h_mid, &h_end);
  EXPECT_LT(Rel(y1, y.topRows(5)), 1e-12);
  EXPECT_LT(Rel(y2, y.bottomRows(6)), 1e-12);
  EXPECT_LT(Rel(h_end, h_all), 1e-12);
}

// ---------------------------------------------------------------------------
// Finite differences (the style of simulator_blocks_test.cc): L = sum(F * R),
// central differences with step 1e-5 leave ~1e-9 relative error; assert 1e-6.

constexpr double kFdTolerance = 1e-6;  // the step is testing::kFdStep = 1e-5

TEST(SimulatorMamba, ScanBackwardMatchesFiniteDifferencesIncludingStates) {
  // L = sum(y * R) + sum(h_final * S): checks every input gradient, the
  // initial-state gradient (sent back along the CP chain) and the path from
  // the final-state gradient (received from the next CP rank).
  const mamba::SsmShape s{4, 2, 2, 3, 2};
  const int64_t len = 5;
  mamba::SsmInputs<double> in = RandomSsm(s, len, 41);
  Mat<double> h0 = Random(s.state_rows(), s.state_cols(), 47);
  const Mat<double> r = Random(len * s.batch, s.heads * s.head_dim, 48);
  const Mat<double> sw = Random(s.state_rows(), s.state_cols(), 49);
  const auto loss = [&] {
    Mat<double> hf;
    const Mat<double> y = mamba::SsmScan(s, in, h0, &hf);
    return y.cwiseProduct(r).sum() + hf.cwiseProduct(sw).sum();
  };
  const mamba::SsmGrads<double> g = mamba::SsmScanBackward(s, in, h0, r, sw);
  EXPECT_LT(FdRelError(g.x, Numeric(&in.x, loss)), kFdTolerance);
  EXPECT_LT(FdRelError(g.dt, Numeric(&in.dt, loss)), kFdTolerance);
  EXPECT_LT(FdRelError(g.b, Numeric(&in.b, loss)), kFdTolerance);
  EXPECT_LT(FdRelError(g.c, Numeric(&in.c, loss)), kFdTolerance);
  EXPECT_LT(FdRelError(g.a, Numeric(&in.a, loss)), kFdTolerance);
  EXPECT_LT(FdRelError(g.d, Numeric(&in.d, loss)), kFdTolerance);
  EXPECT_LT(FdRelError(g.h0, Numeric(&h0, loss)), kFdTolerance);
}

void CheckBlockGradients(const Dims& d) {
  OnOneRank([&](Ctx& ctx) {
    auto block = MakeBlock<double>('M', ctx, d, 0, 7, 0.8);
    ExpectBackwardMatchesFd(ctx, *block, d, kFdTolerance);
  });
}

Dims FdDims() {
  Dims d = MambaDims();
  d.seq = 7;  // two full chunks of 3 and a ragged one
  return d;
}

TEST(SimulatorMamba, MegatronPathMatchesFiniteDifferences) { CheckBlockGradients(FdDims()); }

TEST(SimulatorMamba, FusedPathMatchesFiniteDifferences) {
  Dims d = FdDims();
  d.mamba_fused_norm_out_proj = true;
  CheckBlockGradients(d);
}

// ---------------------------------------------------------------------------
// Parameters: the inventory's names, shapes, split, optimizer and bytes.

/// Runs `body` on each rank of a tp-rank world (one TP group).
void OnTpRanks(int tp, const std::function<void(Ctx&)>& body) {
  World world(tp);
  std::vector<int> members;
  for (int r = 0; r < tp; ++r) members.push_back(r);
  const Group& g = world.NewGroup(Axis::kTp, members);
  std::vector<const Group*> one;
  for (int r = 0; r < tp; ++r) one.push_back(&world.NewGroup(Axis::kEp, {r}));
  world.Run([&](Rank& r) {
    Ctx ctx;
    ctx.rank = &r;
    ctx.tp = &g;
    ctx.ep = ctx.etp = ctx.edp = one[static_cast<size_t>(r.id())];
    ctx.tp_rank = r.id();
    ctx.tp_size = tp;
    body(ctx);
  });
}

TEST(SimulatorMamba, ParametersFollowTheInventory) {
  const Dims d = MambaDims();
  const Inventory inv = BuildInventory(MambaRecipe(d));
  ASSERT_EQ(inv.layers.size(), 1u);
  const std::vector<ParamTensor>& tensors = inv.layers[0].params;
  for (int tp : {1, 2, 4}) {
    OnTpRanks(tp, [&](Ctx& ctx) {
      ctx.optimizer.matrices = OptimizerKind::kMuon;
      auto block = MakeBlock<double>('M', ctx, d, 0, 7, 0.8);
      const auto params = block->params();
      ASSERT_EQ(params.size(), tensors.size());
      int64_t tp_bytes = 0, rep_bytes = 0;
      for (const ParamTensor& t : tensors) {
        const auto it =
            std::find_if(params.begin(), params.end(), [&](const Param<double>* p) { return p->name == t.name; });
        ASSERT_NE(it, params.end()) << t.name;
        const Param<double>& p = **it;
        EXPECT_EQ(p.rows * p.cols, t.elements()) << t.name;
        EXPECT_EQ(p.optimizer, t.optimizer) << t.name;
        EXPECT_EQ(p.shard == ShardKind::kReplicated, t.split == Split::kReplicated) << t.name;
        const int64_t bytes = t.elements() * SizeOf(t.dtype);
        if (t.split == Split::kReplicated) {
          rep_bytes += bytes;
        } else {
          tp_bytes += bytes / tp;
        }
      }
      // Hand count, bf16 params (2 B), A_log and D fp32 (4 B):
      //   REP: pre-norm h = 8 -> 16 B.
      //   TP: in_proj 8 x (2*16 + 2*12 + 8) = 512, conv (16 + 24) x (4 + 1) = 200,
      //   dt_bias 8, norm 16, out_proj 16 x 8 = 128: 864 x 2 = 1728 B; A_log + D 16 x 4 = 64 B.
      EXPECT_EQ(rep_bytes, 16);
      EXPECT_EQ(tp_bytes, (1728 + 64) / tp);
      EXPECT_EQ(ctx.mem()->live(SimCategory::kReplicatedParams), rep_bytes);
      EXPECT_EQ(ctx.mem()->live(SimCategory::kTpShardedParams), tp_bytes);
      EXPECT_EQ(ctx.mem()->peak(SimCategory::kTpShardedParams), tp_bytes);  // no transient double charge
    });
  }
}

TEST(SimulatorMamba, ParameterRolesFollowMegatron) {
  const Dims d = MambaDims();
  OnOneRank([&](Ctx& ctx) {
    ctx.optimizer.matrices = OptimizerKind::kMuon;
    auto block = MakeBlock<double>('M', ctx, d, 3, 7, 0.8);
    for (const Param<double>* p : block->params()) {
      if (p->name == "layers.3.mixer.in_proj.weight") {
        EXPECT_EQ(p->role, ParamRole::kMambaInProj);  // Megatron: in_proj.use_muon = False
        EXPECT_EQ(p->optimizer, OptimizerKind::kAdamW);
      } else if (p->name == "layers.3.mixer.out_proj.weight") {
        EXPECT_EQ(p->optimizer, OptimizerKind::kMuon);
      } else {
        EXPECT_EQ(p->role, ParamRole::kVector) << p->name;
      }
    }
  });
}

TEST(SimulatorMamba, RejectsWhatMegatronRejects) {
  const Dims ok = MambaDims();
  const Mat<double> x = Random(ok.tokens(), ok.hidden, 1), dy = Random(ok.tokens(), ok.hidden, 2);
  auto expect_unsupported = [&](const Dims& d, const BlockLayout& l, const std::string& needle) {
    try {
      RunBlock('M', d, l, x, dy);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Dims d = ok;
  d.mamba_groups = 3;  // 8 heads in 3 groups
  expect_unsupported(d, BlockLayout{}, "multiple of groups");
  d = ok;
  d.mamba_groups = 2;
  expect_unsupported(d, BlockLayout{4, 1}, "groups (2) must be divisible by tp (4)");
  BlockLayout a2a{2, 8};  // 8 heads over tp*cp = 16
  d = ok;
  d.seq = 32;
  expect_unsupported(d, a2a, "heads divisible by tp*cp");
  d = ok;
  d.mamba_heads = 24;
  d.mamba_inner = 48;
  d.mamba_groups = 12;  // G/t = 6 vs c = 4: neither divides the other
  expect_unsupported(d, BlockLayout{2, 4}, "groups/tp (6)");
  d = ok;
  d.mamba_fused_norm_out_proj = true;
  expect_unsupported(d, BlockLayout{1, 2}, "fused_norm_out_proj");
}

// ---------------------------------------------------------------------------
// TP and SP: sharded == one rank; bytes by hand and by the planner.

TEST(SimulatorMamba, TensorAndSequenceParallelEqualOneRank) {
  const Dims d = MambaDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun ref = RunBlock('M', d, BlockLayout{}, x, dy);
  // X = T h beta = 32 tokens x 8 x 2 B = 512 B per call (docs/formulas.md §7.2).
  const int64_t kX = 32 * 8 * 2;
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      BlockLayout l;
      l.tp = tp;
      l.sp = sp;
      const BlockRun run = RunBlock('M', d, l, x, dy);
      const std::string what = "tp" + std::to_string(tp) + (sp ? " sp" : "");
      ExpectSame(run, ref, what);
      const int64_t part = (tp - 1) * kX / tp;  // (t-1)/t X
      for (const auto& counts : run.comm) {
        using K = CollectiveKind;
        const auto sent = [&](K k, Pass p) { return Sent(counts, Axis::kTp, k, p, CommWhat::kMamba); };
        if (sp) {  // fwd AG + RS; bwd AG (dy) + AG (re-gather) + RS
          EXPECT_EQ(sent(K::kAllGather, Pass::kForward), part) << what;
          EXPECT_EQ(sent(K::kReduceScatter, Pass::kForward), part) << what;
          EXPECT_EQ(sent(K::kAllGather, Pass::kBackward), 2 * part) << what;
          EXPECT_EQ(sent(K::kReduceScatter, Pass::kBackward), part) << what;
        } else {  // one AR (2 (t-1)/t X) each way
          EXPECT_EQ(sent(K::kAllReduce, Pass::kForward), 2 * part) << what;
          EXPECT_EQ(sent(K::kAllReduce, Pass::kBackward), 2 * part) << what;
        }
        // The planner prices the same region (planner/comm.cc AddTp, family "mamba").
        if (sp) {
          EXPECT_EQ(sent(K::kAllGather, Pass::kBackward),
                    PlannerSent(d, l, Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kMamba));
        } else {
          EXPECT_EQ(sent(K::kAllReduce, Pass::kForward),
                    PlannerSent(d, l, Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kMamba));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Saved activations: the estimator's a_M (docs/formulas.md §3.2) byte for byte.

/// Hand count of a_M per rank (docs/formulas.md §3.2): residual terms x, n (h x 2 B) +
/// pre-norm rstd (4 B) per token, /t under SP; zxBCdt 2(2d_i + 2GN r_g + H),
/// out_x 2d_i, [MG: gated y + norm out 4d_i], group rstd 4G per token, /t.
int64_t HandActivations(const Dims& d, int tp, int cp, bool sp, int64_t repeat) {
  const int64_t tokens = d.seq * d.batch / cp;
  const int64_t h = d.hidden, di = d.mamba_inner, gn = d.mamba_groups * d.mamba_d_state, heads = d.mamba_heads;
  const int64_t residual = tokens * (4 * h + 4) / (sp ? tp : 1);
  int64_t sharded = 2 * (2 * di + 2 * gn * repeat + heads) + 2 * di + 4 * d.mamba_groups;
  if (!d.mamba_fused_norm_out_proj) sharded += 4 * di;
  return residual + tokens * sharded / tp;
}

TEST(SimulatorMamba, SavedActivationsEqualTheEstimator) {
  for (bool fused : {false, true}) {
    Dims d = MambaDims();
    d.mamba_fused_norm_out_proj = fused;
    const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
    for (const BlockLayout& l : {BlockLayout{1, 1}, BlockLayout{2, 1, false}, BlockLayout{2, 1, true}}) {
      const BlockRun run = RunBlock('M', d, l, x, dy);
      const int64_t hand = HandActivations(d, l.tp, l.cp, l.sp, 1);
      const int64_t model = LayerActivations(MambaRecipe(d), ModelLayout(d, l), BlockKind::kMamba).count();
      EXPECT_EQ(hand, model);
      for (int64_t peak : run.activation_peak)
        EXPECT_EQ(peak, hand) << "fused " << fused << " tp " << l.tp << " sp " << l.sp;
    }
  }
  // The worked numbers at tp 1 (MG path): T = 32, 32 x (36 + 240) = 8832 B:
  // 4h + 4 = 36; 2(32 + 24 + 8) + 32 + 64 + 16 = 240.
  EXPECT_EQ(HandActivations(MambaDims(), 1, 1, false, 1), 8832);
}

// ---------------------------------------------------------------------------
// CP, all-to-all (Megatron mamba_context_parallel.py).

TEST(SimulatorMamba, AllToAllContextParallelEqualsOneRank) {
  const Dims d = MambaDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun ref = RunBlock('M', d, BlockLayout{}, x, dy);
  struct Case {
    int tp, cp;
    bool balanced, sp;
    int64_t repeat;  // r_g = c / (G/t) when c > G/t (docs/formulas.md §1.4)
  };
  // G = 4: G/t = 4, 2, 1 at tp 1, 2, 4.
  const Case cases[] = {{1, 2, true, false, 1},  {1, 2, false, false, 1}, {1, 4, true, false, 1},
                        {1, 4, false, false, 1}, {2, 2, true, true, 1},   {2, 2, false, false, 1},
                        {2, 4, true, false, 2},  {4, 2, true, true, 2}};
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(c.tp, c.cp, c.sp, CpRecurrent::kAllToAll, c.balanced);
    const std::string what = Describe(l);
    const BlockRun run = RunBlock('M', d, l, x, dy);
    ExpectSame(run, ref, what);
    // Per rank per direction: (c-1)/c (s/c) b (3d_i + 2GN r_g + H) beta / t (docs/formulas.md §7.2):
    // zxBCdt out and y back in forward, dy out and d(zxBCdt) back in backward.
    const int64_t width = 3 * d.mamba_inner + 2 * d.mamba_groups * d.mamba_d_state * c.repeat + d.mamba_heads;
    const int64_t expected = (c.cp - 1) * (d.seq / c.cp) * d.batch * width * 2 / c.cp / c.tp;
    const int64_t planner = PlannerSent(d, l, Axis::kCp, Collective::kAllToAll, Pass::kForward, CommWhat::kMamba);
    EXPECT_EQ(planner, expected) << what;
    for (const auto& counts : run.comm) {
      EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kAllToAll, Pass::kForward, CommWhat::kMamba), expected) << what;
      EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kAllToAll, Pass::kBackward, CommWhat::kMamba), expected)
          << what;
    }
    // Saved: the same a_M with B and C repeated r_g times in zxBCdt (the estimator's r_g).
    const int64_t hand = HandActivations(d, c.tp, c.cp, c.sp, c.repeat);
    EXPECT_EQ(LayerActivations(MambaRecipe(d), ModelLayout(d, l), BlockKind::kMamba).count(), hand) << what;
    for (int64_t peak : run.activation_peak) EXPECT_EQ(peak, hand) << what;
  }
}

TEST(SimulatorMamba, FusedPathShardsLikeMegatronsPath) {
  // The fused path (norm and out_proj recomputed in backward) under TP, SP
  // and the CP hand-off equals its own one-rank run.
  Dims d = MambaDims();
  d.mamba_fused_norm_out_proj = true;
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun ref = RunBlock('M', d, BlockLayout{}, x, dy);
  ExpectSame(RunBlock('M', d, BlockLayout{2, 1, true}, x, dy), ref, "fused tp2 sp");
  ExpectSame(RunBlock('M', d, MakeBlockLayout(2, 2, true, CpRecurrent::kHandoff, true), x, dy), ref,
             "fused tp2 cp2 hand-off");
}

TEST(SimulatorMamba, AllToAllBytesByHand) {
  // tp 2, cp 4, balanced: G/t = 2 < c = 4, r_g = 2. Width 3 x 16 + 2 x 12 x 2 + 8 = 104;
  // 3/4 x (16/4 x 2 tokens) x 104 x 2 B / 2 = 6 x 104 = 624 B per rank per direction.
  const Dims d = MambaDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun run = RunBlock('M', d, MakeBlockLayout(2, 4, false, CpRecurrent::kAllToAll, true), x, dy);
  for (const auto& counts : run.comm) {
    EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kAllToAll, Pass::kForward, CommWhat::kMamba), 624);
    EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kAllToAll, Pass::kBackward, CommWhat::kMamba), 624);
  }
}

// ---------------------------------------------------------------------------
// CP, state hand-off [OURS].

/// Hand-off edges per CP rank (received = sent, per direction): balanced
/// layouts give rank r chunks r and 2c-1-r; each chunk whose predecessor
/// lives elsewhere is one edge.
int64_t Edges(int cp, int rank, bool balanced) {
  if (!balanced) return rank > 0 ? 1 : 0;
  const SeqLayout l = SeqLayout::Make(8 * cp, cp, rank, true);
  int64_t n = 0;
  for (int64_t c : l.chunks) n += c > 0 && l.OwnerOf(c - 1) != rank ? 1 : 0;
  return n;
}

TEST(SimulatorMamba, HandoffEdgesByHand) {
  // cp 4 balanced: rank 0 holds 0, 7; 1: 1, 6; 2: 2, 5; 3: 3, 4.
  // Rank 0 receives chunk 6's state (from 1); rank 3 receives chunk 2's (from 2);
  // ranks 1 and 2 receive two each. Senders mirror it.
  EXPECT_EQ(Edges(4, 0, true), 1);
  EXPECT_EQ(Edges(4, 1, true), 2);
  EXPECT_EQ(Edges(4, 2, true), 2);
  EXPECT_EQ(Edges(4, 3, true), 1);
  EXPECT_EQ(Edges(2, 0, true), 1);
  EXPECT_EQ(Edges(2, 1, true), 1);
}

TEST(SimulatorMamba, HandoffContextParallelEqualsOneRank) {
  const Dims d = MambaDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun ref = RunBlock('M', d, BlockLayout{}, x, dy);
  struct Case {
    int tp, cp;
    bool balanced, sp;
  };
  // cp 4 balanced: chunks of 2 positions, shorter than the conv's K-1 = 3,
  // so a tail spans two chunks on two ranks.
  const Case cases[] = {{1, 2, true, false}, {1, 2, false, false}, {1, 4, true, false}, {1, 4, false, false},
                        {2, 2, true, true},  {2, 2, false, false}, {2, 4, true, true}};
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(c.tp, c.cp, c.sp, CpRecurrent::kHandoff, c.balanced);
    const std::string what = Describe(l);
    const BlockRun run = RunBlock('M', d, l, x, dy);
    ExpectSame(run, ref, what);
    // Per edge: conv tail (K-1) b (d_i + 2GN)/t x 2 B + SSM state b (H/t) P N x 4 B.
    const int64_t tail =
        (d.mamba_d_conv - 1) * d.batch * (d.mamba_inner + 2 * d.mamba_groups * d.mamba_d_state) / c.tp * 2;
    const int64_t state = d.batch * d.mamba_heads / c.tp * d.mamba_head_dim * d.mamba_d_state * 4;
    int64_t worst = 0;
    for (int r = 0; r < c.tp * c.cp; ++r) {
      const int cp_rank = r / c.tp;
      // Sent forward = edges this rank's chunks hand on = edges it receives in backward.
      int64_t sent_fwd = 0;
      const SeqLayout s = SeqLayout::Make(d.seq, c.cp, cp_rank, c.balanced);
      for (int64_t ch : s.chunks) sent_fwd += ch + 1 < s.num_chunks() && s.OwnerOf(ch + 1) != cp_rank ? 1 : 0;
      const int64_t received = Edges(c.cp, cp_rank, c.balanced);
      const auto& counts = run.comm[static_cast<size_t>(r)];
      EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kSend, Pass::kForward, CommWhat::kMambaState),
                sent_fwd * (tail + state))
          << what << " rank " << r;
      EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kSend, Pass::kBackward, CommWhat::kMambaState),
                received * (tail + state))
          << what << " rank " << r;
      EXPECT_EQ(Sent(counts, Axis::kCp, CollectiveKind::kAllToAll, Pass::kForward, CommWhat::kMamba), 0) << what;
      // Saved: a_M (no repeat) + the received states.
      const int64_t hand = HandActivations(d, c.tp, c.cp, c.sp, 1) + received * (tail + state);
      EXPECT_EQ(run.activation_peak[static_cast<size_t>(r)], hand) << what << " rank " << r;
      worst = std::max(worst, hand);
    }
    // The estimator charges the worst rank.
    EXPECT_EQ(LayerActivations(MambaRecipe(d), ModelLayout(d, l), BlockKind::kMamba).count(), worst) << what;
  }
}

TEST(SimulatorMamba, HandoffBytesByHandAtCp4) {
  // tp 1, cp 4, balanced. Per edge: tail 3 x 2 x 40 x 2 B = 480, state 2 x 8 x 2 x 3 x 4 B = 384: 864 B.
  // Interior ranks send 2 messages' worth per direction, ranks 0 and 3 one.
  const Dims d = MambaDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun run = RunBlock('M', d, MakeBlockLayout(1, 4, false, CpRecurrent::kHandoff, true), x, dy);
  const int64_t expected[] = {864, 2 * 864, 2 * 864, 864};
  for (int r = 0; r < 4; ++r) {
    for (Pass pass : {Pass::kForward, Pass::kBackward}) {
      EXPECT_EQ(Sent(run.comm[static_cast<size_t>(r)], Axis::kCp, CollectiveKind::kSend, pass, CommWhat::kMambaState),
                expected[r]);
    }
  }
}

TEST(SimulatorMamba, ConvWidthOneHandsOnOnlyTheState) {
  // K = 1: no conv history, so an edge is the SSM state alone (b (H/t) P N x 4 = 384 B).
  Dims d = MambaDims();
  d.mamba_d_conv = 1;
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun run = RunBlock('M', d, MakeBlockLayout(1, 2, false, CpRecurrent::kHandoff, false), x, dy);
  ExpectSame(run, RunBlock('M', d, BlockLayout{}, x, dy), "K 1");
  EXPECT_EQ(Sent(run.comm[0], Axis::kCp, CollectiveKind::kSend, Pass::kForward, CommWhat::kMambaState), 384);
  EXPECT_EQ(Sent(run.comm[1], Axis::kCp, CollectiveKind::kSend, Pass::kBackward, CommWhat::kMambaState), 384);
}

TEST(SimulatorMamba, SplittingTheRecurrenceWithoutTheHandOffIsWrong) {
  // cp 2 without load balancing: rank 1 holds positions 8..15. Without the
  // hand-off it would run them from a zero conv history and a zero state,
  // which is the block run on those positions alone; with the hand-off it
  // equals the unsharded run. Compare the mixer's contribution y - x.
  const Dims d = MambaDims();
  const Mat<double> x = Random(d.tokens(), d.hidden, 1), dy = Random(d.tokens(), d.hidden, 2);
  const BlockRun ref = RunBlock('M', d, BlockLayout{}, x, dy);
  const BlockRun handoff = RunBlock('M', d, MakeBlockLayout(1, 2, false, CpRecurrent::kHandoff, false), x, dy);
  Dims half = d;
  half.seq = d.seq / 2;
  const int64_t rows = half.tokens();
  const Mat<double> x2 = x.bottomRows(rows);
  const BlockRun naive = RunBlock('M', half, BlockLayout{}, x2, Mat<double>(dy.bottomRows(rows)));
  const Mat<double> ref_f = ref.y.bottomRows(rows) - x2;
  const double naive_error = Rel(Mat<double>(naive.y - x2), ref_f);
  const double handoff_error = Rel(Mat<double>(handoff.y.bottomRows(rows) - x2), ref_f);
  // Measured: 0.39 for the zero-state restart, 1e-16 with the hand-off.
  EXPECT_GT(naive_error, 0.1) << "a zero-state restart should be far off";
  EXPECT_LT(handoff_error, 1e-10);
}

}  // namespace
}  // namespace preflight::sim::simulator_mamba_test

// Communication volumes per step against hand counts and the Megatron
// papers. The tiny model's sizes are in planner_tiny_model.h; every product
// is written out beside the expected value.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "planner_tiny_model.h"

namespace preflight::planner_comm_test {
namespace {

using testing::Price;
using testing::Received;
using testing::Sent;
using testing::TinyInventory;
using testing::TinyLayout;

// X = (s/c)*b*h*beta_a = 1024*2*64*2 = 262144 bytes.
constexpr int64_t kX = 262144;

// Megatron-LM (Shoeybi et al. 2019, Fig. 4; Narayanan et al. 2021 sec. 3.3):
// without SP a transformer layer (attention + MLP) does 4 all-reduces of X
// per micro-batch, 2 forward and 2 backward. Ring AR over t = 4 sends
// 2*3/4*X = 393216 each. Two A+D layers, 3 micro-batches:
// 2 layers * 3 mb * 4 AR * 393216 = 9437184.
TEST(PlannerComm, TensorParallelWithoutSpIsFourAllReducesPerLayer) {
  const auto inv = TinyInventory("ADAD");
  const auto p = Price(inv, TinyLayout(4, 1, 1, 1, 3));
  const auto& sc = p.comm[0];
  int64_t layer_ar = 0;
  for (CommWhat what : {CommWhat::kAttention, CommWhat::kMlp}) {
    for (Pass pass : {Pass::kForward, Pass::kBackward}) layer_ar += Sent(sc, Axis::kTp, Collective::kAllReduce, pass, what);
  }
  EXPECT_EQ(layer_ar, 2 * 3 * 4 * 393216);
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kAttention), 2 * 3 * 393216);
  // Embedding: fwd AR; head: bwd AR (one per micro-batch each).
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kEmbedding), 3 * 393216);
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kHead), 3 * 393216);
  // Vocab-parallel CE: 3 AR of s*b*4 = 8192 bytes: 2*3/4*8192 = 12288 each.
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kLoss), 3 * 3 * 12288);
}

// With SP each region is fwd AG + RS and bwd AG + RS + AG (re-gather of the
// saved input, docs/formulas.md §7.2): 5 * 3/4 * X = 5 * 196608 = 983040 per region
// per micro-batch, against Korthikanti's 4 (the same volume as 2 AR).
TEST(PlannerComm, TensorParallelWithSpIsFiveGathersPerRegion) {
  const auto inv = TinyInventory("ADAD");
  auto l = TinyLayout(4, 1, 1, 1, 3);
  l.sp = true;
  const auto p = Price(inv, l);
  const auto& sc = p.comm[0];
  int64_t attention = 0;
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    attention += Sent(sc, Axis::kTp, Collective::kAllGather, pass, CommWhat::kAttention) +
                 Sent(sc, Axis::kTp, Collective::kReduceScatter, pass, CommWhat::kAttention);
  }
  EXPECT_EQ(attention, 2 * 3 * 983040);
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kAttention), 2 * 3 * 2 * 196608);
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kAttention), 0);
  // SP all-reduce of replicated grads, once per step: norms 4*64 + final norm 64
  // = 320 fp32 = 1280 bytes; 2*3/4*1280 = 1920.
  EXPECT_EQ(Sent(sc, Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads), 1920);
}

// EP (docs/formulas.md §7.2): per MoE layer per micro-batch 2 A2A forward (dispatch,
// combine) and 2 backward of k*T*h*beta_a with T = s*b/(c*t) = 2048:
// 2*2048*64*2 = 524288 bytes, of which (e-1)/e = 3/4 leaves: 393216.
TEST(PlannerComm, ExpertParallelAllToAll) {
  const auto inv = TinyInventory("AE");
  auto l = TinyLayout(1, 1, 4, 1, 2);
  l.ep = 4;
  const auto p = Price(inv, l);
  const auto& sc = p.comm[0];
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    EXPECT_EQ(Sent(sc, Axis::kEp, Collective::kAllToAll, pass, CommWhat::kMoeDispatch), 2 * 393216);
    EXPECT_EQ(Sent(sc, Axis::kEp, Collective::kAllToAll, pass, CommWhat::kMoeCombine), 2 * 393216);
  }
  // Expert grads: experts 24576 / e = 6144 elements on the rank, d_e = 1: no DP traffic.
  EXPECT_EQ(sc.send_on(Axis::kExpertDp).count(), 0);
}

// Megatron's all-gather dispatcher (token_dispatcher.py
// MoEAllGatherTokenDispatcher) gathers every EP rank's T tokens and
// reduce-scatters the expert outputs back, mirrored in backward: the gathered
// size is e*T*h*beta_a = 4*2048*64*2 = 1048576, of which (e-1)/e = 3/4 leaves
// a rank per collective: 786432, twice the all-to-all's k = 2 copies. No
// all-to-all, and no expert-TP step at t_e = 1.
TEST(PlannerComm, ExpertParallelAllGatherDispatcher) {
  auto inv = TinyInventory("AE");
  inv.recipe.model.moe.dispatcher = MoeDispatcher::kAllGather;
  auto l = TinyLayout(1, 1, 4, 1, 2);
  l.ep = 4;
  const auto p = Price(inv, l);
  const auto& sc = p.comm[0];
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    EXPECT_EQ(Sent(sc, Axis::kEp, Collective::kAllGather, pass, CommWhat::kMoeDispatch), 2 * 786432);
    EXPECT_EQ(Sent(sc, Axis::kEp, Collective::kReduceScatter, pass, CommWhat::kMoeCombine), 2 * 786432);
    EXPECT_EQ(Sent(sc, Axis::kEp, Collective::kAllToAll, pass, CommWhat::kMoeDispatch), 0);
    EXPECT_EQ(Sent(sc, Axis::kExpertTp, Collective::kAllGather, pass, CommWhat::kMoeDispatch), 0);
  }
  // ETP 2 x EP 2: one gather over the 4 ranks sends (t_e*e - 1)*T*h*beta_a =
  // 3*262144 a micro-batch, priced as the ETP step (1/2 of 2*262144) then the
  // EP step (1/2 of 4*262144).
  auto g = TinyLayout(1, 1, 4, 1, 2);
  g.ep = 2;
  g.expert_tp = 2;
  const auto pg = Price(inv, g);
  const auto& gc = pg.comm[0];
  const int64_t etp = Sent(gc, Axis::kExpertTp, Collective::kAllGather, Pass::kForward, CommWhat::kMoeDispatch);
  const int64_t ep = Sent(gc, Axis::kEp, Collective::kAllGather, Pass::kForward, CommWhat::kMoeDispatch);
  EXPECT_EQ(etp, 2 * 262144);
  EXPECT_EQ(etp + ep, 2 * 3 * 262144);
}

// Expert TP 2 with EP 2 over 4 ranks: the received k*T tokens are gathered
// over ETP: gathered size 2*524288, each rank sends 1/2 of it = 524288 per
// AG and per RS, fwd and bwd.
TEST(PlannerComm, ExpertTensorParallelGathers) {
  const auto inv = TinyInventory("AE");
  auto l = TinyLayout(1, 1, 4, 1, 1);
  l.ep = 2;
  l.expert_tp = 2;
  const auto p = Price(inv, l);
  const auto& sc = p.comm[0];
  EXPECT_EQ(Sent(sc, Axis::kExpertTp, Collective::kAllGather, Pass::kForward, CommWhat::kMoeExperts), 524288);
  EXPECT_EQ(Sent(sc, Axis::kExpertTp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kMoeExperts), 524288);
  EXPECT_EQ(Sent(sc, Axis::kEp, Collective::kAllToAll, Pass::kForward, CommWhat::kMoeDispatch),
            262144);  // 1/2 * 524288
}

// PP (docs/formulas.md §7.2): one activation message X/t_sp per micro-batch per
// boundary forward and one gradient backward. pp 2, m 4, t 1: rank 0 sends
// 4 * 262144 forward and receives 4 gradients; rank 1 the mirror.
TEST(PlannerComm, PipelineP2pOneFOneB) {
  const auto inv = TinyInventory("DDDD");
  const auto p = Price(inv, TinyLayout(1, 1, 1, 2, 4));
  EXPECT_EQ(Sent(p.comm[0], Axis::kPp, Collective::kSendRecv, Pass::kForward, CommWhat::kActivations), 4 * kX);
  EXPECT_EQ(Received(p.comm[0], Axis::kPp, Pass::kForward, CommWhat::kActivations), 0);
  EXPECT_EQ(Received(p.comm[0], Axis::kPp, Pass::kBackward, CommWhat::kActivationGrads), 4 * kX);
  EXPECT_EQ(Sent(p.comm[1], Axis::kPp, Collective::kSendRecv, Pass::kBackward, CommWhat::kActivationGrads), 4 * kX);
  EXPECT_EQ(Sent(p.comm[1], Axis::kPp, Collective::kSendRecv, Pass::kForward, CommWhat::kActivations), 0);
}

// Interleaved, pp 2, vpp 2, m 4: rank 0 holds chunks 0 and 2, rank 1 chunks
// 1 and 3 (Megatron). Forward sends: rank 0 from chunks 0 and 2 (8), rank 1
// from chunk 1 only (4; chunk 3 is last). Backward sends: rank 0 from chunk
// 2 (4), rank 1 from chunks 1 and 3 (8). With SP on at t 2 the message is X/2.
TEST(PlannerComm, PipelineP2pInterleaved) {
  const auto inv = TinyInventory("DDDD");
  auto l = TinyLayout(2, 1, 1, 2, 4);
  l.vpp = 2;
  l.schedule = Schedule::kInterleaved;
  l.sp = true;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kPp, Collective::kSendRecv, Pass::kForward, CommWhat::kActivations), 8 * kX / 2);
  EXPECT_EQ(Sent(p.comm[1], Axis::kPp, Collective::kSendRecv, Pass::kForward, CommWhat::kActivations), 4 * kX / 2);
  EXPECT_EQ(Sent(p.comm[0], Axis::kPp, Collective::kSendRecv, Pass::kBackward, CommWhat::kActivationGrads), 4 * kX / 2);
  EXPECT_EQ(Sent(p.comm[1], Axis::kPp, Collective::kSendRecv, Pass::kBackward, CommWhat::kActivationGrads), 8 * kX / 2);
}

// CP p2p ring (docs/formulas.md §7.2): K_c = 2*(s/c)*b*(n_kv/t)*d_h*beta_a
// = 2*512*2*4*8*2 = 131072. Forward c-1 = 1 send per A layer per
// micro-batch; backward 2(c-1) = 2. m = 3, one A layer, no recompute.
TEST(PlannerComm, ContextParallelP2p) {
  const auto inv = TinyInventory("AD");
  auto l = TinyLayout(1, 2, 1, 1, 3);
  l.recompute = Recompute::kNone;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kSendRecv, Pass::kForward, CommWhat::kAttentionKv), 3 * 131072);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kSendRecv, Pass::kBackward, CommWhat::kAttentionKv), 3 * 2 * 131072);
}

// Mamba all-to-all CP (docs/formulas.md §7.2): (c-1)/c * (s/c)*b*(3d_i + 2GN*r_g + H)*beta_a/t.
// d_i 128, G 2, N 16, H 8, c 2, t 1 (groups/t = 2 = c, so r_g = 1):
// width 384 + 64 + 8 = 456; payload 512*2*456*2 = 933888; sent 1/2 = 466944.
TEST(PlannerComm, ContextParallelMambaAllToAll) {
  const auto inv = TinyInventory("MD");
  const auto p = Price(inv, TinyLayout(1, 2, 1, 1, 1));
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kAllToAll, Pass::kForward, CommWhat::kMamba), 466944);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kMamba), 466944);
}

// all_gather (TE AttnFuncWithCPAndKVAllGather): forward AG of K, V; the
// backward gathers them again (only the local K, V are saved) and
// reduce-scatters dK, dV. Gathered payload c*K_c = 2*131072 = 262144; each
// rank sends (c-1)/c of it = 131072 per A layer per micro-batch, m = 3.
TEST(PlannerComm, ContextParallelAllGather) {
  const auto inv = TinyInventory("AD");
  auto l = TinyLayout(1, 2, 1, 1, 3);
  l.cp_comm = CpComm::kAllGather;
  l.recompute = Recompute::kNone;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kAllGather, Pass::kForward, CommWhat::kAttentionKv), 3 * 131072);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kAllGather, Pass::kBackward, CommWhat::kAttentionKv), 3 * 131072);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kAttentionKv),
            3 * 131072);
}

// a2a (Ulysses, TE AttnFuncWithCPAndQKVOA2A): forward Q, K, V, O, width
// (2*8 + 2*4)*8 = 192; backward O, dO, dQ, dK, dV, width (3*8 + 2*4)*8 = 256.
// Payload (s/c)*b*width*beta_a/t: 512*2*192*2 = 393216 and 512*2*256*2 =
// 524288; each rank sends (c-1)/c = 1/2: 196608 and 262144.
TEST(PlannerComm, ContextParallelUlysses) {
  const auto inv = TinyInventory("AD");
  auto l = TinyLayout(1, 2, 1, 1, 1);
  l.cp_comm = CpComm::kA2a;
  l.recompute = Recompute::kNone;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kAllToAll, Pass::kForward, CommWhat::kAttentionQkvo), 196608);
  EXPECT_EQ(Sent(p.comm[0], Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kAttentionQkvo), 262144);
}

// Selective "core_attn" (Megatron's _checkpointed_attention_forward wraps
// TE's DotProductAttention, its CP exchange inside): backward reruns the
// core's forward exchange once more per A layer per micro-batch. The three
// cases above (m = 3, 3, 1): p2p backward 2(c-1) + (c-1) = 3 sends of K_c;
// all_gather backward 2 gathers; a2a backward 262144 + the forward's 196608.
TEST(PlannerComm, CoreAttentionRerunRepeatsTheCpExchangeInBackward) {
  const auto inv = TinyInventory("AD");
  auto l = TinyLayout(1, 2, 1, 1, 3);
  ASSERT_EQ(l.recompute, Recompute::kSelective);  // with the recipe's recompute_modules [core_attn]
  EXPECT_EQ(Sent(Price(inv, l).comm[0], Axis::kCp, Collective::kSendRecv, Pass::kBackward, CommWhat::kAttentionKv),
            3 * 3 * 131072);
  l.cp_comm = CpComm::kAllGather;
  const auto g = Price(inv, l);
  EXPECT_EQ(Sent(g.comm[0], Axis::kCp, Collective::kAllGather, Pass::kBackward, CommWhat::kAttentionKv),
            2 * 3 * 131072);
  EXPECT_EQ(Sent(g.comm[0], Axis::kCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kAttentionKv),
            3 * 131072);
  l.cp_comm = CpComm::kA2a;
  l.micro_batches = 1;
  EXPECT_EQ(Sent(Price(inv, l).comm[0], Axis::kCp, Collective::kAllToAll, Pass::kBackward, CommWhat::kAttentionQkvo),
            262144 + 196608);
}

// Full recompute reruns each layer's forward in backward, its TP
// collectives included (CheckpointFunction.backward calls the layer's
// forward, whose f/g operators communicate). Without SP: 4 AR per layer per
// micro-batch become 6; with SP each region's backward gains the forward's
// AG and RS. ADAD, t 4, m 3, as the two tests above.
TEST(PlannerComm, FullRecomputeRepeatsTheForwardTpCollectives) {
  const auto inv = TinyInventory("ADAD");
  auto l = TinyLayout(4, 1, 1, 1, 3);
  l.recompute = Recompute::kFull;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kAttention),
            2 * 2 * 3 * 393216);
  EXPECT_EQ(Sent(p.comm[0], Axis::kTp, Collective::kAllReduce, Pass::kForward, CommWhat::kAttention), 2 * 3 * 393216);
  // The head and the embedding are not checkpointed.
  EXPECT_EQ(Sent(p.comm[0], Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kHead), 3 * 393216);
  l.sp = true;
  const auto q = Price(inv, l);
  EXPECT_EQ(Sent(q.comm[0], Axis::kTp, Collective::kAllGather, Pass::kBackward, CommWhat::kMlp), 2 * 3 * 3 * 196608);
  EXPECT_EQ(Sent(q.comm[0], Axis::kTp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kMlp),
            2 * 3 * 2 * 196608);
}

// Hand-off chain edges (cp_recurrent: handoff). Balanced, c = 4: chunks
// 0..7 are held by ranks 0,1,2,3,3,2,1,0; the forward edges 0->1 (rank 0),
// 1->2 (1), 2->3 (2), 4->5 (3), 5->6 (2), 6->7 (1) cross ranks, 3->4 does
// not: ranks 0 and 3 send 1, ranks 1 and 2 send 2; 6 messages on the chain.
// c = 2: chunks held by 0,1,1,0: edges 0->1 (rank 0) and 2->3 (rank 1).
// Unbalanced: chunk r on rank r, every rank but the last sends 1.
TEST(PlannerComm, HandoffChainEdges) {
  struct Case {
    int64_t cp;
    bool balanced;
    std::vector<int64_t> sends;  // per CP rank
    int64_t most, chain;
  };
  const Case cases[] = {
      {2, true, {1, 1}, 1, 2},
      {2, false, {1, 0}, 1, 1},
      {4, true, {1, 2, 2, 1}, 2, 6},
      {4, false, {1, 1, 1, 0}, 1, 3},
      {1, true, {0}, 0, 0},
  };
  for (const Case& c : cases) {
    for (int64_t r = 0; r < c.cp; ++r) {
      EXPECT_EQ(CpHandoffSends(c.cp, c.balanced, r), c.sends[static_cast<size_t>(r)]) << c.cp << " " << r;
    }
    EXPECT_EQ(CpHandoffMaxSends(c.cp, c.balanced), c.most) << c.cp;
    EXPECT_EQ(CpHandoffChainMessages(c.cp, c.balanced), c.chain) << c.cp;
  }
  // Owner of each chunk, balanced c = 4 (TE / Megatron load balancing).
  const int64_t owners[] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(CpChunkOwner(4, true, j), owners[j]);
}

// Hand-off payload per chain edge per layer per micro-batch (tiny model,
// b = 2, beta_a = 2):
//  M: (d_conv-1)*(d_i + 2GN)/t*b*beta_a + b*(H/t)*P*N*4
//     t = 1: 3*(128 + 64)*2*2 = 2304 + 2*8*16*16*4 = 16384 -> 18688
//     t = 2: 3*96*2*2 = 1152 + 2*4*16*16*4 = 8192 -> 9344
//  R: (K_r-1)*(d_r/t)*b*beta_a + b*(d_r/t)*4
//     t = 1: 3*64*2*2 = 768 + 2*64*4 = 512 -> 1280
//     t = 2: 3*32*2*2 = 384 + 2*32*4 = 256 -> 640
// The busiest CP rank sends (HandoffChainEdges) 1 message per layer per
// micro-batch at c = 2 and at c = 4 unbalanced, 2 at c = 4 balanced; the
// backward as many. One M and one R layer, m = 3.
TEST(PlannerComm, ContextParallelHandoffBytes) {
  struct Case {
    const char* name;
    int64_t tp, cp;
    bool balanced;
    int64_t mamba, recurrent;  // bytes per pass
  };
  const Case cases[] = {
      {"cp2_balanced", 1, 2, true, 3 * 1 * 18688, 3 * 1 * 1280},
      {"cp2_unbalanced", 1, 2, false, 3 * 1 * 18688, 3 * 1 * 1280},
      {"cp4_balanced", 1, 4, true, 3 * 2 * 18688, 3 * 2 * 1280},
      {"cp4_unbalanced", 1, 4, false, 3 * 1 * 18688, 3 * 1 * 1280},
      {"tp2_cp2_balanced", 2, 2, true, 3 * 1 * 9344, 3 * 1 * 640},
  };
  const auto inv = TinyInventory("MRD");
  for (const Case& c : cases) {
    auto l = TinyLayout(c.tp, c.cp, 1, 1, 3);
    l.cp_recurrent = CpRecurrent::kHandoff;
    l.cp_load_balance = c.balanced;
    const auto p = Price(inv, l);
    const StageComm& sc = p.comm[0];
    for (Pass pass : {Pass::kForward, Pass::kBackward}) {
      EXPECT_EQ(Sent(sc, Axis::kCp, Collective::kSendRecv, pass, CommWhat::kMambaState), c.mamba) << c.name;
      EXPECT_EQ(Received(sc, Axis::kCp, pass, CommWhat::kMambaState), c.mamba) << c.name;
      EXPECT_EQ(Sent(sc, Axis::kCp, Collective::kSendRecv, pass, CommWhat::kRecurrentState), c.recurrent) << c.name;
      // The all-to-all items are gone in hand-off mode.
      EXPECT_EQ(Sent(sc, Axis::kCp, Collective::kAllToAll, pass, CommWhat::kMamba), 0) << c.name;
      EXPECT_EQ(Sent(sc, Axis::kCp, Collective::kAllToAll, pass, CommWhat::kRecurrent), 0) << c.name;
    }
  }
}

// Hand-off time (docs/plan.md, [OURS]): per layer per micro-batch per pass,
// one p2p step of the conv tails (all edges at once) plus the chain of
// state messages, each alpha + bytes / (0.8 * 450 GB/s) inside a node, all
// exposed. c = 4 balanced, M layer: tail 2304 B, state 16384 B, 6 chain
// messages; m = 3.
TEST(PlannerComm, ContextParallelHandoffTime) {
  const auto inv = TinyInventory("MD");
  auto l = TinyLayout(1, 4, 1, 1, 3);
  l.cp_recurrent = CpRecurrent::kHandoff;
  const auto p = Price(inv, l);
  const double bw = 0.8 * 450e9, alpha = 8e-6;
  const double per_layer = (alpha + 2304 / bw) + 6 * (alpha + 16384 / bw);
  for (const CommItem& i : p.comm[0].items) {
    if (i.what != CommWhat::kMambaState) continue;
    EXPECT_NEAR(i.seconds, 3 * per_layer, 1e-12);
    EXPECT_DOUBLE_EQ(i.exposed_seconds, i.seconds);
  }
}

// ZeRO-1 DP over d = 2 (docs/formulas.md §7.2 "DP"), one stage holding everything:
// dense elements = norms 64+64 + final norm 64 + TP 12288+24576
// + embedding 1024*64 (vocab 1000 padded to 128) + head 1024*64 = 168128.
// RS of fp32 grads: 1/2 * 168128*4 = 336256; AG of bf16 params 1/2 * 168128*2 = 168128.
// Muon gather (Moonshot): Muon matrices 36864 in fp32 momentum: 1/2 * 147456 = 73728.
TEST(PlannerComm, DataParallelZeroOneAndMuon) {
  const auto inv = TinyInventory("AD");
  const auto p = Price(inv, TinyLayout(1, 1, 2, 1, 1));
  const auto& sc = p.comm[0];
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kGrads), 336256);
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams), 168128);
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonGather), 73728);
}

// DDP (zero 0): ring all-reduce of the grads, 2*1/2 * 168128*4 = 672512, no param gather.
TEST(PlannerComm, DataParallelDdp) {
  const auto inv = TinyInventory("AD");
  auto l = TinyLayout(1, 1, 2, 1, 1);
  l.zero = 0;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kDpCp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kGrads), 672512);
  EXPECT_EQ(Sent(p.comm[0], Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams), 0);
}

// Padded buffers (simulator/dist_optimizer.h): the distributed optimizer
// keeps, per unit (the embedding, each layer, the head with the final norm),
// one flat buffer per (dense or expert, optimizer, element dtype) and pads it
// to n_pad = RoundUp(n, D); the ring collectives move the padded buffers.
// "ME" on dp 3 (tp 1, ep 1: D = 3 for dense and expert), with the Mamba
// layer's 20000 TP AdamW elements holding 16 fp32 ones (A_log and D) and the
// MoE experts set to an odd 24580:
//   embedding 1024*64 = 65536                 -> 65538
//   M: bf16 64 + 20000 - 16 = 20048           -> 20049; fp32 16 -> 18
//   E: REP 320                                -> 321;   experts (Muon) 24580 -> 24582
//   head 1024*64 + final norm 64 = 65600      -> 65601
// Dense grads, RS: 2/3 * (65538 + 20049 + 18 + 321 + 65601) * 4 = 2/3 * 606108 = 404072.
// Dense params, AG: 2/3 * ((65538 + 20049 + 321 + 65601) * 2 + 18 * 4) = 2/3 * 303090 = 202060.
// Expert grads and Muon gather: 2/3 * 24582 * 4 = 65552; expert params 2/3 * 24582 * 2 = 32776.
// Unpadded, 2/3 of 606088 or 98320 would not even be whole bytes.
Inventory OddDpInventory() {
  auto inv = TinyInventory("ME");
  inv.layers[0].totals.fp32_elements[1][0] = 16;
  inv.layers[1].totals.elements[2][1] = 24580;
  return inv;
}

TEST(PlannerComm, DataParallelPaddedBuffersZeroOne) {
  const auto p = Price(OddDpInventory(), TinyLayout(1, 1, 3, 1, 1));
  const auto& sc = p.comm[0];
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kGrads), 404072);
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams), 202060);
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonGather), 0);
  EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kExpertGrads), 65552);
  EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kExpertParams), 32776);
  EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonExpertGather), 65552);
}

// ZeRO 0: all-reduce of the padded grads, 2 * 2/3 of the payloads above.
TEST(PlannerComm, DataParallelPaddedBuffersDdp) {
  auto l = TinyLayout(1, 1, 3, 1, 1);
  l.zero = 0;
  const auto p = Price(OddDpInventory(), l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kDpCp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kGrads), 808144);
  EXPECT_EQ(Sent(p.comm[0], Axis::kExpertDp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kExpertGrads), 131104);
  EXPECT_EQ(Sent(p.comm[0], Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonExpertGather), 0);
}

// ZeRO 2 (DeepSpeed stage 2; simulator/dist_optimizer.h): each unit's grads
// are reduce-scattered after its backward in every micro-batch, so the grads
// payload above moves m = 2 times, in pass backward: 2 * 404072 = 808144
// dense, 2 * 65552 = 131104 expert. The parameters are gathered once per step
// as with ZeRO 1 (202060, 32776), and the Muon gathers are ZeRO 1's.
TEST(PlannerComm, ZeroTwoReducesEveryMicroBatch) {
  auto l = TinyLayout(1, 1, 3, 1, 2);
  l.zero = 2;
  const auto p = Price(OddDpInventory(), l);
  const auto& sc = p.comm[0];
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kGrads), 2 * 404072);
  EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kExpertGrads), 2 * 65552);
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kReduceScatter, Pass::kOptimizer, CommWhat::kGrads), 0);
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams), 202060);
  EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kExpertParams), 32776);
  EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kMuonExpertGather), 65552);
}

// ZeRO 3 (FSDP, reshard after forward): grads as ZeRO 2; each unit's params
// are gathered before its forward and again before its backward in every
// micro-batch (2 * 202060 dense, 2 * 32776 expert per pass), none after the step.
TEST(PlannerComm, ZeroThreeGathersEveryMicroBatchBothPasses) {
  auto l = TinyLayout(1, 1, 3, 1, 2);
  l.zero = 3;
  const auto p = Price(OddDpInventory(), l);
  const auto& sc = p.comm[0];
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kReduceScatter, Pass::kBackward, CommWhat::kGrads), 2 * 404072);
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, pass, CommWhat::kParams), 2 * 202060);
    EXPECT_EQ(Sent(sc, Axis::kExpertDp, Collective::kAllGather, pass, CommWhat::kExpertParams), 2 * 32776);
  }
  EXPECT_EQ(Sent(sc, Axis::kDpCp, Collective::kAllGather, Pass::kOptimizer, CommWhat::kParams), 0);
}

// Time of the unit-by-unit traffic (docs/plan.md): one collective per unit
// and group, each paying the ring latency alpha * (n - 1) = 8 us * 2 on the
// 3-rank group inside a node (NVLink 0.8 * 450 GB/s), and its wire time
// (2/3 of the payload). The forward gathers of the dense buffers: 4 units
// (embedding, M, E, head) per micro-batch, 303090 B in all; the first unit's
// gather (the embedding: 65538 * 2 B) waits for nothing to hide under.
TEST(PlannerComm, ZeroThreeGatherTimeCountsEveryUnit) {
  auto l = TinyLayout(1, 1, 3, 1, 2);
  l.zero = 3;
  const auto p = Price(OddDpInventory(), l);
  const double bw = 0.8 * 450e9, alpha = 8e-6;
  bool seen = false;
  for (const CommItem& i : p.comm[0].items) {
    if (i.axis != Axis::kDpCp || i.what != CommWhat::kParams || i.pass != Pass::kForward) continue;
    seen = true;
    EXPECT_NEAR(i.seconds, 2 * (4 * 2 * alpha + 202060 / bw), 1e-12);
    EXPECT_NEAR(i.unhidden_seconds, 2 * (2 * alpha + 87384 / bw), 1e-12);
  }
  EXPECT_TRUE(seen);
  // In backward the first gather is the head's (65601 * 2 B, 2/3 of it 87468 B).
  for (const CommItem& i : p.comm[0].items) {
    if (i.axis == Axis::kDpCp && i.what == CommWhat::kParams && i.pass == Pass::kBackward) {
      EXPECT_NEAR(i.unhidden_seconds, 2 * (2 * alpha + 87468 / bw), 1e-12);
    }
    // The last reduce-scatter of a micro-batch's backward is the embedding's
    // (65538 * 4 B, 2/3 of it 174768 B).
    if (i.axis == Axis::kDpCp && i.what == CommWhat::kGrads) {
      EXPECT_NEAR(i.unhidden_seconds, 2 * (2 * alpha + 174768 / bw), 1e-12);
    }
  }
}

// The overlap rule (docs/plan.md): per pass, the unit-by-unit traffic hides
// under the pass's compute except what waits for nothing (unhidden_seconds);
// exposed = max(sum of unhidden, sum of seconds - the pass's compute).
TEST(PlannerComm, ZeroThreeExposedTimeIsTheFloorOrTheExcess) {
  auto l = TinyLayout(1, 1, 3, 1, 2);
  l.zero = 3;
  const auto p = Price(OddDpInventory(), l);
  const StageTime& st = p.time.stages[0];
  double seconds[2] = {0, 0}, floor[2] = {0, 0}, exposed[2] = {0, 0};
  for (const CommItem& i : p.comm[0].items) {
    const bool per_unit = (i.what == CommWhat::kParams || i.what == CommWhat::kExpertParams ||
                           i.what == CommWhat::kGrads || i.what == CommWhat::kExpertGrads) &&
                          i.pass != Pass::kOptimizer;
    if (!per_unit) continue;
    const size_t k = i.pass == Pass::kForward ? 0 : 1;
    seconds[k] += i.seconds;
    floor[k] += i.unhidden_seconds;
    exposed[k] += i.exposed_seconds;
  }
  const double window[2] = {2 * st.forward_s, 2 * (st.backward_s + st.recompute_s)};
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_GT(floor[k], 0.0);
    EXPECT_NEAR(exposed[k], std::max(floor[k], seconds[k] - window[k]), 1e-12);
  }
}

// With SP, ZeRO 2/3 all-reduce each unit's replicated grads over TP before
// its reduce-scatter, each padded to a multiple of t, in every micro-batch:
// "AD" with the norms cut to 61 and 62: A 61 -> 64, D 62 -> 64, head's final
// norm 64 (the embedding has none): 192 fp32 = 768 B per micro-batch,
// 2 * 3/4 * 768 = 1152; 3 micro-batches: 3456. (ZeRO 1 pads the stage's sum
// once: 61 + 62 + 64 = 187 -> 188, 2 * 3/4 * 752 = 1128.)
TEST(PlannerComm, ZeroTwoReplicatedGradsPerUnit) {
  auto inv = TinyInventory("AD");
  inv.layers[0].totals.elements[0][0] = 61;
  inv.layers[1].totals.elements[0][0] = 62;
  auto l = TinyLayout(4, 1, 1, 1, 3);
  l.sp = true;
  EXPECT_EQ(
      Sent(Price(inv, l).comm[0], Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads),
      1128);
  l.zero = 2;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kTp, Collective::kAllReduce, Pass::kBackward, CommWhat::kReplicatedGrads), 3456);
  EXPECT_EQ(Sent(p.comm[0], Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads), 0);
}

// SP all-reduce of the replicated grads over TP, padded to a multiple of t:
// "AD" with the attention norm cut to 63: 63 + 64 + final norm 64 = 191 -> 192;
// 2 * 3/4 * 192 * 4 = 1152 (unpadded 1146).
TEST(PlannerComm, ReplicatedGradsPaddedToTp) {
  auto inv = TinyInventory("AD");
  inv.layers[0].totals.elements[0][0] = 63;
  auto l = TinyLayout(4, 1, 1, 1, 1);
  l.sp = true;
  const auto p = Price(inv, l);
  EXPECT_EQ(Sent(p.comm[0], Axis::kTp, Collective::kAllReduce, Pass::kOptimizer, CommWhat::kReplicatedGrads), 1152);
}

// Without SP only the per-head q and k norms' gradients differ over TP (each
// rank normalizes its own heads), and Megatron all-reduces them anyway
// (megatron/core/distributed/finalize_model_grads.py @ 00c2c0a,
// _allreduce_layernorm_grads: "config.sequence_parallel or config.qk_layernorm",
// params named q_layernorm / k_layernorm). "ADAD" with head_dim 8: 2 x 8 per
// attention layer, 2 layers = 32 fp32 = 128 B once per step (ZeRO 1),
// 2 * 3/4 * 128 = 192. ZeRO 2: each attention unit's 16 (a multiple of t)
// = 64 B, 2 * 3/4 * 64 = 96 per unit and micro-batch: 2 x 3 x 96 = 576.
// Without qk_norm, or with t = 1, nothing.
TEST(PlannerComm, QkNormGradsAllReducedOverTpWithoutSp) {
  auto inv = TinyInventory("ADAD");
  const auto ar = [&](const Layout& l, Pass pass) {
    return Sent(Price(inv, l).comm[0], Axis::kTp, Collective::kAllReduce, pass, CommWhat::kReplicatedGrads);
  };
  auto l = TinyLayout(4, 1, 1, 1, 3);
  EXPECT_EQ(ar(l, Pass::kOptimizer), 0);
  inv.recipe.model.attention.qk_norm = true;
  EXPECT_EQ(ar(l, Pass::kOptimizer), 192);
  EXPECT_EQ(ar(TinyLayout(1, 1, 1, 1, 3), Pass::kOptimizer), 0);
  l.zero = 2;
  EXPECT_EQ(ar(l, Pass::kBackward), 576);
  EXPECT_EQ(ar(l, Pass::kOptimizer), 0);
}

// Tied embedding with pp 2: first and last stage all-reduce the V/t*h
// gradient over their 2-rank group: 2*1/2 * 1024*64*4 = 262144 on each.
TEST(PlannerComm, TiedEmbeddingAllReduce) {
  auto inv = TinyInventory("DDDD");
  inv.recipe.model.tie_embeddings = true;
  inv.head.clear();
  const auto p = Price(inv, TinyLayout(1, 1, 1, 2, 2));
  EXPECT_EQ(p.comm[0].send_on(Axis::kEmbedding).count(), 262144);
  EXPECT_EQ(p.comm[1].send_on(Axis::kEmbedding).count(), 262144);
}

}  // namespace
}  // namespace preflight::planner_comm_test

// The per-rank geometry: how many tokens one rank of one stage holds and
// sends, after context, sequence and expert parallelism. The estimator prices
// memory from these counts and the planner prices bytes and time from them;
// no other file recomputes them, so the two views cannot drift apart.
#include "preflight/estimator/geometry.h"

#include <algorithm>
#include <cmath>

#include "preflight/estimator/memory_terms.h"

#include "internal.h"

namespace preflight {
namespace {

using estimator_detail::Add;
using estimator_detail::Mul;

/// The all-gather dispatcher's phases (Megatron-LM d98e8a6,
/// token_dispatcher.py MoEAllGatherTokenDispatcher): token_dispatch gathers
/// the G = T * t_e * e tokens of the ETP x EP group into Megatron's global
/// memory buffer (use_global_buffer=True: kept between steps, priced as a
/// library workspace, AllGatherTokensBuffer), with their routing map (bool)
/// and probabilities ([G, E] each, fp32 as the top-k probabilities here);
/// dispatch_postprocess permutes this rank's experts' R rows out of it.
/// combine_preprocess unpermutes the R expert outputs back to [G, h] and
/// token_combine reduce-scatters that to the T local rows. There is no send
/// or receive copy, expert-TP gather or sort by local expert.
MoeRouting AllGatherPhases(MoeRouting out, const MoeConfig& e, int64_t row, int64_t ep, int64_t expert_tp) {
  const int64_t gathered = Mul(Mul(out.tokens, expert_tp), ep);
  out.counts = Bytes(Mul(8, e.experts));
  out.gathered_routing = Bytes(Mul(Mul(gathered, e.experts), 4 + 1));
  out.dispatch_recv = Bytes(Mul(out.expert_tokens, row));
  out.combine_send = Bytes(Mul(out.expert_tokens, row));
  out.combine_recv = Bytes(Mul(gathered, row));
  out.unpermute_out = Bytes(Mul(out.tokens, row));
  return out;
}

}  // namespace

TokenGeometry TokensOf(const Recipe& r, const Layout& l) {
  TokenGeometry out;
  out.cp_rank = CeilDiv(Mul(r.training.seq_len, l.micro_batch), l.cp);
  out.router = CeilDiv(out.cp_rank, l.sequence_parallel() ? l.tp : 1);
  return out;
}

int64_t MoeCapacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor) {
  // Megatron: math.ceil((num_tokens / num_experts) * capacity_factor) with
  // num_tokens = T*k, in double precision as there.
  const double c = std::ceil(static_cast<double>(Mul(tokens, top_k)) / static_cast<double>(experts) * capacity_factor);
  if (!(c < 9.2e18)) throw ArithmeticOverflow("int64 overflow in MoE capacity");
  return static_cast<int64_t>(c);
}

MoeRouting RouteMoe(const ModelConfig& model, DType activations, int64_t tokens, int64_t ep, int64_t expert_tp) {
  const MoeConfig& e = model.moe;
  const int64_t beta = SizeOf(activations);
  const int64_t row = Mul(model.hidden, beta);  // one token's hidden vector
  const int64_t local_experts = CeilDiv(e.experts, ep);
  MoeRouting out;
  out.tokens = tokens;
  out.recv_worst = Mul(Mul(tokens, ep), std::min(e.top_k, local_experts));
  const int64_t routed = Mul(tokens, e.top_k);
  if (e.dropless) {
    out.send_tokens = routed;
    out.recv_tokens = std::min(out.recv_worst, CeilFraction(routed, e.dropless_skew));
    out.recv_per_peer = Bytes(Mul(CeilDiv(out.recv_tokens, ep), row));
  } else {
    out.capacity = MoeCapacity(tokens, e.top_k, e.experts, e.capacity_factor);
    // Each source rank sends at most C tokens to each of the E experts; this
    // rank's E/e experts receive at most C from each of the e source ranks.
    const int64_t slots = Mul(e.experts, out.capacity);
    if (e.pad_to_capacity) {
      out.send_tokens = slots;
      out.recv_tokens = slots;
      out.recv_per_peer = Bytes(Mul(Mul(local_experts, out.capacity), row));
    } else {
      out.send_tokens = std::min(routed, slots);
      out.recv_tokens = std::min(out.recv_worst, slots);
      out.recv_per_peer = Bytes(Mul(CeilDiv(out.recv_tokens, ep), row));
    }
  }
  out.expert_tokens = Mul(out.recv_tokens, expert_tp);
  out.topk_probs = Bytes(Mul(routed, 4));
  out.counts = Bytes(Mul(8, Add(e.experts, Mul(Mul(expert_tp, ep), e.experts))));
  if (e.dispatcher == MoeDispatcher::kAllGather) return AllGatherPhases(out, e, row, ep, expert_tp);
  out.dispatch_send = Bytes(Mul(out.send_tokens, row));
  out.dispatch_recv = Bytes(Mul(out.recv_tokens, row));
  if (expert_tp > 1) out.etp_gather = Bytes(Mul(out.expert_tokens, row));
  if (local_experts > 1) out.sort_copy = Bytes(Mul(out.expert_tokens, row));
  out.combine_send = Bytes(Mul(out.recv_tokens, row));
  out.combine_recv = Bytes(Mul(out.send_tokens, row));
  out.unpermute_out = Bytes(Mul(tokens, row));
  return out;
}

MoeRouting RouteMoeOn(const Recipe& r, const Layout& l) {
  return RouteMoe(r.model, r.training.precision.activations, TokensOf(r, l).router, l.ep, l.expert_tp);
}

}  // namespace preflight

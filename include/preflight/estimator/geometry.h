// The per-rank geometry shared by the estimator (memory) and the planner
// (traffic and time): token counts after context and sequence parallelism,
// and one MoE layer call's routing (capacity, tokens dispatched, received and
// combined, expert-TP gathered rows). The executor never reads it: it routes
// its own tokens, and `simulate` compares.
#pragma once

#include <cstdint>

#include "preflight/inventory/layout.h"
#include "preflight/recipe/recipe.h"
#include "preflight/recipe/units.h"

namespace preflight {

/// Tokens of one micro-batch on one rank, rounded up (the worst rank).
struct TokenGeometry {
  int64_t cp_rank = 0;  // s*b/c: one CP rank's tokens (attention, the CP exchanges)
  int64_t router = 0;   // cp_rank/t under sequence parallelism: the residual stream, the MoE router's T
};
TokenGeometry TokensOf(const Recipe& recipe, const Layout& layout);

/// Per-expert capacity C = ceil((T*k / E) * cf), computed in the order Megatron's
/// get_capacity uses (docs/formulas.md §5). T = tokens at this router call on this rank.
int64_t MoeCapacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor);

/// Token counts and buffer sizes of one MoE layer call on one rank (docs/formulas.md §5).
struct MoeRouting {
  int64_t tokens = 0;         // T: local tokens at the router
  int64_t capacity = 0;       // C per expert per source rank (0 when dropless)
  int64_t send_tokens = 0;    // N_send: token copies this rank dispatches
  int64_t recv_tokens = 0;    // N_recv: token copies this rank receives from the EP group
  int64_t recv_worst = 0;     // dropless worst case T*e*min(k, E/e)
  int64_t expert_tokens = 0;  // R = t_e * N_recv: tokens the local experts process
  Bytes recv_per_peer;        // (E/e)*C*h*beta under pad_to_capacity, else N_recv/e rows (one source rank's slice)
  Bytes topk_probs;           // T*k fp32 top-k values (transient)
  Bytes gathered_routing;     // all-gather dispatcher: [G, E] probs (fp32) + routing map (bool), G = T*t_e*e
  Bytes counts;               // tokens_per_expert + gathered counts over ETP x EP (int64)
  Bytes dispatch_send;        // permuted tokens = A2A send buffer
  Bytes dispatch_recv;        // A2A receive buffer
  Bytes etp_gather;           // ETP all-gather output (t_e > 1)
  Bytes sort_copy;            // sort_chunks copy by local expert (E/e > 1)
  Bytes combine_send;         // expert outputs back to their source ranks
  Bytes combine_recv;         // received outputs
  Bytes unpermute_out;        // T*h combined output
  Bytes dispatch_phase() const { return dispatch_send + dispatch_recv + etp_gather + sort_copy; }
  Bytes combine_phase() const { return sort_copy + combine_send + combine_recv + unpermute_out; }
  /// Peak transient: the larger phase plus the routing metadata live through both.
  Bytes peak() const {
    return topk_probs + counts + gathered_routing +
           (dispatch_phase() > combine_phase() ? dispatch_phase() : combine_phase());
  }
};
MoeRouting RouteMoe(const ModelConfig& model, DType activations, int64_t tokens, int64_t ep, int64_t expert_tp);
/// RouteMoe on the router tokens of `layout`: what the estimator's MoE
/// activations and routing scratch and the planner's EP and expert-TP
/// traffic all read.
MoeRouting RouteMoeOn(const Recipe& recipe, const Layout& layout);

}  // namespace preflight

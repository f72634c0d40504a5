// Per-micro-batch categories: activations (by family, pipeline ends, the
// one-layer transient), MoE routing scratch, and serving state.
#include <algorithm>

#include "internal.h"
#include "preflight/estimator/geometry.h"

namespace preflight::estimator_detail {

namespace {

/// Megatron's --defer-embedding-wgrad-compute: the output layer's forward
/// appends its input to embedding_activation_buffer and its backward appends
/// grad_output to grad_output_buffer instead of computing the weight gradient,
/// for the first wgrad_deferral_limit micro-batches (0 = all;
/// core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication);
/// the schedule computes them at the pipeline flush (finish_embedding_wgrad_compute),
/// so every finished pair is held to the end of the step: the SP-sharded input
/// [s/c/(SP ? t : 1), b, h] and the gradient [s/c, b, V_pad/t], both in the
/// activation dtype. The pairs grow with each head backward, so the last
/// stage peaks at its last head forward, when the `in_flight` micro-batches
/// live at the head have not run their backward: m - in_flight pairs are
/// finished (an in-flight micro-batch's input is its saved head input, one
/// storage, priced with the head's saved terms). The reference executor
/// measured the earlier count of every deferred micro-batch one pair high.
void PriceDeferredHeadWgrad(RankMemory& out, const Recipe& rc, const Layout& l, int64_t vocab, int64_t in_flight,
                            Sink* sink) {
  const TrainingConfig& t = rc.training;
  if (!t.defer_head_wgrad) return;
  const int64_t limit = t.head_wgrad_deferral_limit;
  const int64_t finished = std::max<int64_t>(0, l.micro_batches - in_flight);
  const int64_t deferred = limit == 0 ? finished : std::min(limit, finished);
  const int64_t tokens = TokensOf(rc, l).cp_rank;
  const int64_t beta = SizeOf(t.precision.activations);
  const int64_t per_micro_batch =
      Add(CeilDiv(Mul(Mul(tokens, rc.model.hidden), beta), l.sequence_parallel() ? l.tp : 1),
          Mul(Mul(tokens, CeilDiv(vocab, l.tp)), beta));
  const Bytes b(Mul(deferred, per_micro_batch));
  out.activations_ends += b;
  if (sink) {
    Note(sink, Category::kActivations,
         "last stage: deferred output-layer weight gradients (input and grad_output per deferred micro-batch)",
         "deferred * s*b/c * (h/(SP ? t : 1) + V_pad/t) * beta; deferred = min(limit or m, m - in_flight)",
         Inputs({{"s", t.seq_len},
                 {"b", l.micro_batch},
                 {"c", l.cp},
                 {"t", l.tp},
                 {"h", rc.model.hidden},
                 {"V_pad", vocab},
                 {"deferred", deferred},
                 {"in_flight", in_flight},
                 {"micro_batches", l.micro_batches}}),
         b);
  }
}

/// MTP modules (Megatron multi_token_prediction.py), per micro-batch in flight
/// at the head: each keeps its transformer layer's activations (the A and FFN
/// families' per-layer sets); its embedding lookup's token ids (the shifted
/// ids, as the first stage's); enorm's input and statistics, hnorm's
/// statistics (its input is the previous head's final-norm output, which
/// that head's output layer already saves: one storage), eh_proj's 2h input
/// (the concatenation), so 3h + two norms' statistics per token split like
/// the residual stream under SP; and its final_layernorm and head as the main
/// head's (final-norm input and output, statistics, fp32 cross-entropy).
/// Under full uniform recompute Megatron checkpoints each module from enorm
/// to its final norm (MultiTokenPredictionLayer._checkpointed_forward): it
/// keeps the ids, the checkpoint's embedding input, and the output layer's
/// input and softmax; its backward reruns the rest, a rerun transient beside
/// the layers' (the module's two sublayers unrecomputed, the concatenation,
/// the final norm's input, three norms' statistics). Under block full
/// recompute Megatron skips the MTP recompute: everything, unrecomputed.
void PriceMtp(RankMemory& out, const Walk& w, const Inventory& inv, const Layout& l, ActivationRates& rates,
              Sink* sink) {
  const Recipe& rc = inv.recipe;
  const int64_t n = rc.model.mtp_layers;
  if (n == 0) return;
  const int64_t h = rc.model.hidden, beta = SizeOf(rc.training.precision.activations);
  const int64_t stats = rc.model.norm == NormKind::kLayerNorm ? 8 : 4;  // fp32 rstd [and mean]
  const int64_t tokens = TokensOf(rc, l).cp_rank;
  const auto residual = [&](int64_t per_token) {
    return Bytes(CeilDiv(Mul(tokens, per_token), l.sequence_parallel() ? l.tp : 1));
  };
  const int a = FamilyIndex(BlockKind::kAttention), f = FamilyIndex(inv.mtp_ffn);
  const bool full = l.recompute == Recompute::kFull;
  const bool checkpointed = full && rc.training.recompute_method == RecomputeMethod::kUniform;
  Bytes per_module;
  if (checkpointed) {
    const Bytes softmax(Mul(tokens, Mul(PaddedVocab(rc.model, l.tp) / l.tp, 4)));
    per_module = rates.Embedding() + residual(Mul(2, Mul(h, beta))) + softmax;
    const Bytes rerun =
        rates.Unrecomputed(a) + rates.Unrecomputed(f) + residual(Add(Mul(3, Mul(h, beta)), Mul(3, stats)));
    out.activations_rerun = std::max(out.activations_rerun, rerun);
    out.activations_transient =
        std::max(out.activations_transient, rerun + std::max(rates.Workspace(a), rates.Workspace(f)));
  } else {
    const Bytes layer = full ? rates.Unrecomputed(a) + rates.Unrecomputed(f) : rates.Layer(a) + rates.Layer(f);
    per_module = layer + rates.Embedding() + residual(Add(Mul(3, Mul(h, beta)), Mul(2, stats))) + rates.HeadSaved();
  }
  const Bytes b = per_module * Mul(n, w.head_units);
  out.activations_ends += b;
  if (sink) {
    Note(sink, Category::kActivations,
         "last stage: MTP modules (layer, token ids, norms and projection inputs, head and loss)",
         checkpointed ? "mtp_layers * head_in_flight * (8*s*b/c + s*b/c*2h*beta/(SP ? t : 1) + s*b/c*V_pad/t*4); "
                        "rerun: layer A + layer FFN + s*b/c*(3h*beta + 3*stats)/(SP ? t : 1)"
                      : "mtp_layers * head_in_flight * (layer A + layer FFN + 8*s*b/c + s*b/c*(3h*beta + "
                        "2*stats)/(SP ? t : 1) + head inputs and CE)",
         Inputs({{"mtp_layers", n}, {"head_in_flight", w.head_units}, {"per_module", per_module.count()}}), b);
  }
}

}  // namespace

/// Framework layers of two sublayers (attention + MLP): a transformer stack.
bool PairedLayers(const Inventory& inv) {
  return inv.layer_starts.size() >= 2 && inv.layer_starts.size() - 1 < inv.layers.size();
}

namespace {

/// Framework layers one full-recompute checkpoint reruns together: a uniform
/// group of recompute_layers (at most a chunk), else one.
int64_t RecomputeGroup(const Recipe& rc, const Walk& w) {
  if (rc.training.recompute_method != RecomputeMethod::kUniform) return 1;
  return std::max<int64_t>(1, std::min(rc.training.recompute_layers, w.chunk_layers));
}

/// Under Ulysses CP the attention core's rerun ("core_attn") all-to-alls the
/// kept q, k, v to the head split, and TE's AttnFuncWithCPAndQKVOA2A keeps
/// those copies for its backward beside the checkpoint's inputs: as many
/// elements again (dot_product_attention/context_parallel.py). MLA's core
/// is the same TE attention on its q, k (d_nope + d_rope a head) and v (d_v).
Bytes UlyssesCoreRerunCopies(const Recipe& rc, const Layout& l) {
  if (l.recompute != Recompute::kSelective || l.cp <= 1 || l.cp_comm != CpComm::kA2a ||
      !Reruns(rc.training, l.recompute, RecomputeModule::kCoreAttn)) {
    return Bytes(0);
  }
  int64_t elements = 0;  // q, k, v per token, all heads
  if (rc.model.mla) {
    const MlaConfig& a = *rc.model.mla;
    elements = CheckedMul(a.heads, 2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.v_head_dim);
  } else {
    const AttentionConfig& a = rc.model.attention;
    elements = CheckedMul(a.heads + 2 * a.kv_heads, a.head_dim);
  }
  const int64_t per_token = CheckedMul(elements, SizeOf(rc.training.precision.activations));
  return Bytes(CeilDiv(CheckedMul(TokensOf(rc, l).cp_rank, per_token), l.tp));
}

/// Activation offloading: what the in-flight layers moved to host memory
/// (RankMemory::host) and what of it the device still holds at the peak
/// (Megatron-LM fine_grained_activation_offload.py). The device keeps the
/// last group of each module name: in the first micro-batch on every stage
/// (post_warmup_callback), in every micro-batch on the last (should_bulk_offload).
/// Nothing comes back on top of them: a group is reloaded as the backward of
/// a group after it ends (on_group_start_backward -> bulk_reload), its
/// tensors freed. A micro-batch that offloaded every group gets as many of
/// its last groups back early, during the previous backward's last groups
/// (bulk_reload -> pre_reload_last_layer), so each held one keeps as much.
void PriceActivationOffload(RankMemory& out, const Walk& w, const Layout& l, ActivationRates& rates, Sink* sink) {
  Bytes held;
  for (int f = 0; f < 5; ++f) {
    if (w.layer_count[f] == 0) continue;
    // Under full recompute only the layers the block method leaves without a
    // checkpoint save tensors inside the modules' scopes.
    const bool full = l.recompute == Recompute::kFull;
    const int64_t units = full ? w.stored_units[f] : w.units[f];
    if (units > 0) held += rates.Offloaded(f, full) * units;
  }
  if (held.count() == 0) return;
  // Early on the first micro-batch keeps its last group of each name; once
  // backwards run, the chunk whose backward is next has its last groups back
  // (as many as the margin), which weigh more where a chunk's layers run
  // fewer groups than the margin.
  out.activations_offload_kept = std::max(w.offload.kept, w.offload.ahead) + w.offload.in_flight;
  const Bytes off_host = std::min(w.offload.kept, w.offload.ahead);
  out.host += held - off_host;
  if (sink) {
    Note(sink, Category::kActivations,
         "activation offload: the last group of each module name, or a chunk's last groups reloaded ahead (as many "
         "as the most names a chunk runs), stays on the device",
         "max(sum over module names of its last group, max over chunks of its last margin groups) + the filling "
         "micro-batch's group in flight (on the device until its module commits it)",
         Inputs({{"offloaded_to_host", (held - off_host).count()},
                 {"kept", w.offload.kept.count()},
                 {"ahead", w.offload.ahead.count()},
                 {"in_flight", w.offload.in_flight.count()}}),
         out.activations_offload_kept);
  }
}

/// The part of a family's activations that Flextron's soft masks add
/// (memory_terms.cc FlextronTokenBytes; Megatron-LM
/// megatron/elastification/flextron_elasticity_hooks.py).
void NoteFlextron(Sink* sink, const Recipe& rc, const Layout& l, const Walk& w, int f) {
  const Bytes flex = FlextronLayerActivations(rc, l, kAllBlockKinds[f]) * w.units[f];
  if (!sink || flex.count() == 0) return;
  std::string formula = "(s*b/c * [rep / (SP ? t : 1) + sharded / t]";
  if (kAllBlockKinds[f] == BlockKind::kMoe && rc.model.moe.grouped_gemm) formula += " + R*(2h + 2*fc1/t_e)*beta";
  formula += ") * layer-micro-batches";
  Note(sink, Category::kActivations,
       Cat({"of which Flextron soft-mask copies ", FamilyName(f), " (each masked product's input)"}), formula,
       Inputs({{"n_e", rc.training.flextron_emb_choices},
               {"n_m", rc.training.flextron_mamba_choices},
               {"layer-micro-batches", w.units[f]}}),
       flex);
}

}  // namespace

void PriceActivations(RankMemory& out, const Walk& w, const Inventory& inv, const Layout& l, ActivationRates& rates,
                      Sink* sink) {
  const Recipe& rc = inv.recipe;
  Bytes sum;
  for (int f = 0; f < 5; ++f) {
    if (w.layer_count[f] == 0) continue;
    const BlockKind kind = kAllBlockKinds[f];
    const Bytes per_layer = rates.Layer(f);
    const int64_t stored = w.stored_units[f];
    out.activations_by_family[static_cast<size_t>(f)] =
        per_layer * (w.units[f] - stored) + (stored > 0 ? rates.Stored(f) * stored : Bytes(0));
    sum += out.activations_by_family[static_cast<size_t>(f)];
    // The transient of one layer at a time: under full recompute, the layers
    // being recomputed (one, or a uniform group of recompute_layers: an upper
    // bound for mixed families) hold their whole no-recompute activation set
    // during their backward less the checkpoint they rerun from (its storage:
    // CheckpointFunction.backward reruns on detach_variable(saved inputs),
    // megatron/core/tensor_parallel/random.py), under selective recompute what
    // its rerun modules regenerate; Mamba and CP attention add their kernel
    // workspaces.
    Bytes rerun;
    if (l.recompute == Recompute::kFull) rerun = rates.Unrecomputed(f) * RecomputeGroup(rc, w) - per_layer;
    if (l.recompute == Recompute::kSelective || l.recompute == Recompute::kSelectiveOp) {
      rerun = rates.Unrecomputed(f) - per_layer;
    }
    if (kind == BlockKind::kAttention) rerun += UlyssesCoreRerunCopies(rc, l);
    out.activations_rerun = std::max(out.activations_rerun, rerun);
    out.activations_transient = std::max(out.activations_transient, rates.Workspace(f) + rerun);
    // A transformer layer recomputes attention and its MLP together: both
    // sublayers' activations are live in its backward, from the attention's
    // checkpoint. torchtitan's per-op policy checkpoints the whole block too
    // (activation_checkpoint.py SelectiveAC.apply wraps each transformer
    // block), less what the policy saved of either sublayer.
    const int attention = FamilyIndex(BlockKind::kAttention);
    const bool op = l.recompute == Recompute::kSelectiveOp;
    if ((l.recompute == Recompute::kFull || op) && PairedLayers(inv) && kind != BlockKind::kAttention) {
      const Bytes pair_rerun =
          op ? rates.Unrecomputed(attention) + rates.Unrecomputed(f) - rates.Layer(attention) - per_layer
             : (rates.Unrecomputed(attention) + rates.Unrecomputed(f)) * RecomputeGroup(rc, w) - rates.Layer(attention);
      out.activations_rerun = std::max(out.activations_rerun, pair_rerun);
      out.activations_transient =
          std::max(out.activations_transient, pair_rerun + std::max(rates.Workspace(attention), rates.Workspace(f)));
    }
    if (sink) {
      const TokenBytes tb =
          SavedBytesPerToken(rc, kind, l.recompute, l.tp, kind == BlockKind::kMamba ? MambaRepeatCp(l) : l.cp);
      std::string formula = "[ceil(s*b/c * rep / (SP ? t : 1)) + ceil(s*b/c * sharded / t)";
      if (kind == BlockKind::kMoe && l.recompute != Recompute::kFull) {
        formula += " + R*(h + 3f_e/t_e)*beta + N_send*(h*beta + 4)";
      }
      const Bytes handoff = kind == BlockKind::kRecurrent ? RecurrentHandoffStateBytes(rc, l) : Bytes(0);
      if (handoff.count() > 0) formula += " + handoff_states";
      formula += "] * layer-micro-batches";
      auto in = Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"c", l.cp}, {"t", l.tp},
                        {"SP", l.sequence_parallel() ? 1 : 0}, {"rep", tb.replicated}, {"sharded", tb.sharded},
                        {"per_layer", per_layer.count()}, {"layers", w.layer_count[f]},
                        {"layer-micro-batches", w.units[f]}});
      if (kind == BlockKind::kMoe && l.recompute != Recompute::kFull) {
        const MoeRouting mr = RouteMoeOn(rc, l);
        in.append(" ").append(Inputs({{"R", mr.expert_tokens}, {"N_send", mr.send_tokens}, {"h", rc.model.hidden},
                                      {"f_e", rc.model.moe.ffn_hidden},
                            {"t_e", l.expert_tp}}));
      }
      if (handoff.count() > 0) in.append(" ").append(Inputs({{"handoff_states", handoff.count()}}));
      in.append(Cat({" recompute=", Name(l.recompute), " schedule=", Name(l.schedule)}));
      Note(sink, Category::kActivations,
           Cat({"activations ", FamilyName(f), " (x", std::to_string(w.layer_count[f]), " layers)"}),
           formula, in, out.activations_by_family[static_cast<size_t>(f)]);
    }
    NoteFlextron(sink, rc, l, w, f);
  }
  if (w.embedding) {
    const Bytes first = rates.Embedding() * w.embedding_units;
    out.activations_ends += first;
    if (sink) {
      Note(sink, Category::kActivations, "first stage: token ids (int64) [+ embedding dropout mask]",
           "(8*s*b/c [+ s*b/c*h/(SP ? t : 1)]) * micro-batches in flight",
           Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"c", l.cp},
                   {"in_flight", w.embedding_units}}),
           first);
    }
  }
  if (w.head) {
    const int64_t vocab = PaddedVocab(rc.model, l.tp);
    const Bytes last = rates.HeadSaved() * w.head_units + (w.loss_transient_live ? rates.LossTransient() : Bytes(0));
    out.activations_ends += last;
    PriceDeferredHeadWgrad(out, rc, l, vocab, w.head_units, sink);
    PriceMtp(out, w, inv, l, rates, sink);
    if (sink) {
      const bool upcast = rc.training.cross_entropy == CrossEntropy::kFp32Upcast;
      Note(sink, Category::kActivations,
           upcast ? "last stage: final-norm and head inputs, log_softmax's fp32 output (per micro-batch in flight), "
                    "nll_loss's and log_softmax's fp32 gradients (while the loss's backward runs, if that is the peak)"
                  : "last stage: final-norm and head inputs, fp32 CE softmax (per micro-batch in flight), transient "
                    "logits (while the head's forward runs, if that is the peak)",
           upcast ? "s*b/c * [((2h*beta + stats)/(SP ? t : 1) + V_pad/t*4) * head_in_flight + V_pad/t*8 * logits_live]"
                  : "s*b/c * [((2h*beta + stats)/(SP ? t : 1) + V_pad/t*4) * head_in_flight + V_pad/t*beta * "
                    "logits_live]",
           Inputs({{"s", rc.training.seq_len},
                   {"b", l.micro_batch},
                   {"c", l.cp},
                   {"t", l.tp},
                   {"h", rc.model.hidden},
                   {"V_pad", vocab},
                   {"head_in_flight", w.head_units},
                   {"logits_live", w.loss_transient_live ? 1 : 0}}),
           last);
      const Bytes flex = FlextronFinalNormActivations(rc, l) * w.head_units;
      if (flex.count() > 0) {
        Note(sink, Category::kActivations,
             "of which Flextron soft-mask copies of the final-norm output (n_e scaled copies)",
             "n_e * s*b/c * h*beta / (SP ? t : 1) * head_in_flight",
             Inputs({{"n_e", rc.training.flextron_emb_choices}, {"head_in_flight", w.head_units}}), flex);
      }
    }
  }
  sum += out.activations_ends;
  sum += out.activations_transient;
  PriceActivationOffload(out, w, l, rates, sink);
  sum += out.activations_offload_kept;
  if (sink && out.activations_transient.count() > 0) {
    Note(sink, Category::kActivations, "one-layer transient (largest on this rank)",
         l.recompute == Recompute::kFull
             ? "max over layers of (no-recompute layer activations - checkpoint + workspace)"
         : l.recompute == Recompute::kSelectiveOp
             ? "max over blocks of (no-recompute block activations - what the per-op policy keeps + workspace)"
             : "max over families of workspace (Mamba SSD states, CP ring KV)",
         Inputs({{"s", rc.training.seq_len}, {"b", l.micro_batch}, {"t", l.tp}, {"c", l.cp}}),
         out.activations_transient);
  }
  out.bytes[static_cast<int>(Category::kActivations)] = sum;
}

namespace {

/// One MoE layer's routing scratch in three lines (they sum to the
/// category): the top-k probabilities, the routing counts (their EP x ETP
/// count surface named), and the larger of the dispatch and combine phases
/// with the per-local-expert rows named. A local expert receives up to C
/// rows from each of the e source ranks (C is per expert per source rank,
/// Megatron get_capacity on local tokens), e*C in all, not C; and the
/// phases also hold this rank's own send copy, the sort-by-expert copy and
/// the unpermuted output (token_dispatcher.py).
void NoteRoutingScratch(Sink* sink, const MoeRouting& mr, const Recipe& rc, const Layout& l) {
  const MoeConfig& e = rc.model.moe;
  const int64_t local_experts = std::max<int64_t>(1, e.experts / l.ep);
  Note(sink, Category::kRoutingScratch, "MoE top-k probabilities (fp32)", "T*k*4",
       Inputs({{"T", mr.tokens}, {"k", e.top_k}}), mr.topk_probs);
  if (e.dispatcher == MoeDispatcher::kAllGather) {
    const int64_t gathered = Mul(Mul(mr.tokens, l.expert_tp), l.ep);
    Note(sink, Category::kRoutingScratch, "MoE routing counts: tokens_per_expert", "8E (int64)",
         Inputs({{"E", e.experts}}), mr.counts);
    Note(sink, Category::kRoutingScratch, "MoE all-gather dispatcher: gathered routing probs (fp32) and map (bool)",
         "G*E*(4+1), G = T*t_e*e", Inputs({{"T", mr.tokens}, {"t_e", l.expert_tp}, {"e", l.ep}, {"E", e.experts}}),
         mr.gathered_routing);
    Note(sink, Category::kRoutingScratch,
         "MoE all-gather dispatcher, combine (the larger phase): expert outputs, unpermuted to the gathered rows, "
         "reduce-scattered to the local rows (the gathered tokens are Megatron's global buffer, a library workspace)",
         "(R + G + T) * h*beta",
         Inputs({{"R", mr.expert_tokens}, {"G", gathered}, {"T", mr.tokens}, {"h", rc.model.hidden}}),
         mr.peak() - mr.topk_probs - mr.counts - mr.gathered_routing);
    return;
  }
  Note(sink, Category::kRoutingScratch, "MoE routing counts: tokens_per_expert + the count surface over ETP x EP",
       "8E + 8*t_e*e*E (int64)",
       Inputs({{"E", e.experts},
               {"e", l.ep},
               {"t_e", l.expert_tp},
               {"count_surface", Mul(Mul(8, l.expert_tp), Mul(l.ep, e.experts))}}),
       mr.counts);
  const std::string mode = e.dropless          ? "dropless: N_recv = min(ceil(skew*T*k), T*e*min(k,E/e))"
                           : e.pad_to_capacity ? "padded: N_send = N_recv = E*C"
                                               : "capacity: N_send = min(T*k, E*C), N_recv = min(T*e*min(k,E/e), E*C)";
  Note(sink, Category::kRoutingScratch,
       Cat({"MoE dispatch/combine rows, the larger phase (", mode,
            "; a local expert takes up to C from each of the e source ranks)"}),
       "max(dispatch: N_send + N_recv [+ t_e*N_recv ETP] [+ t_e*N_recv sort], combine: [t_e*N_recv sort] + N_recv + "
       "N_send + T) * h*beta",
       Cat({Inputs({{"T", mr.tokens},
                    {"k", e.top_k},
                    {"E", e.experts},
                    {"e", l.ep},
                    {"t_e", l.expert_tp},
                    {"local_experts", local_experts},
                    {"C", mr.capacity},
                    {"N_send", mr.send_tokens},
                    {"N_recv", mr.recv_tokens},
                    {"N_recv_per_local_expert", CeilDiv(mr.recv_tokens, local_experts)},
                    {"N_recv_worst", mr.recv_worst},
                    {"h", rc.model.hidden}}),
            " cf=", Decimal(e.capacity_factor), " skew=", Decimal(e.dropless_skew)}),
       mr.peak() - mr.topk_probs - mr.counts);
}

}  // namespace

void PriceRoutingScratch(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, ActivationRates& rates,
                         Sink* sink) {
  if (!MoeOnRank(w, rc)) return;
  out.bytes[static_cast<int>(Category::kRoutingScratch)] = rates.RoutingPeak();
  if (sink) NoteRoutingScratch(sink, RouteMoeOn(rc, l), rc, l);
}

void PriceServing(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, Sink* sink) {
  if (!rc.serving) return;
  const ServingConfig& sv = *rc.serving;
  const DType conv = rc.training.precision.activations;
  // Context parallelism splits each sequence's positions, and with them the
  // KV cache (a rank keeps the KV of the positions it holds; ring attention
  // passes the others). Mamba and R state is per sequence, not per position.
  const int64_t context_per_rank = CeilDiv(sv.context, l.cp);
  const int64_t tokens = Mul(sv.batch, context_per_rank);
  const int64_t n_a = w.own_layers[FamilyIndex(BlockKind::kAttention)];
  const int64_t n_m = w.own_layers[FamilyIndex(BlockKind::kMamba)];
  const int64_t n_r = w.own_layers[FamilyIndex(BlockKind::kRecurrent)];
  const Bytes kv(Mul(Mul(n_a, tokens), KvBytesPerToken(rc.model, l.tp, sv.kv_dtype)));
  const Bytes mamba(Mul(Mul(n_m, sv.batch), MambaStateBytesPerSequence(rc.model, l.tp, conv, sv.ssm_dtype)));
  const Bytes recurrent(Mul(Mul(n_r, sv.batch), RecurrentStateBytesPerSequence(rc.model, l.tp, conv)));
  out.bytes[static_cast<int>(Category::kServingState)] = kv + mamba + recurrent;
  if (!sink) return;
  if (n_a > 0) {
    Note(sink, Category::kServingState, "KV cache (attention layers only)",
         rc.model.mla ? "n_A * batch * ceil(context/c) * (d_c + d_rope) * beta_kv (latent, replicated per TP rank)"
                      : "n_A * batch * ceil(context/c) * 2 * max(n_kv/t, 1) * d_h * beta_kv",
         Inputs({{"n_A", n_a},
                 {"batch", sv.batch},
                 {"context", sv.context},
                 {"c", l.cp},
                 {"t", l.tp},
                 {"per_token", KvBytesPerToken(rc.model, l.tp, sv.kv_dtype)}}),
         kv);
  }
  if (n_m > 0) {
    Note(sink, Category::kServingState, "Mamba conv + SSM state",
         "n_M * batch * [(K-1)*(d_i + 2GN)/t*beta_conv + (H/t)*P*N*beta_ssm]",
         Inputs({{"n_M", n_m}, {"batch", sv.batch}, {"t", l.tp},
                 {"per_sequence", MambaStateBytesPerSequence(rc.model, l.tp, conv, sv.ssm_dtype)}}),
         mamba);
  }
  if (n_r > 0) {
    Note(sink, Category::kServingState, "RG-LRU conv + recurrent state",
         "n_R * batch * ((K_r-1)*beta_conv + 4) * d_r/t",
         Inputs({{"n_R", n_r}, {"batch", sv.batch}, {"t", l.tp},
                 {"per_sequence", RecurrentStateBytesPerSequence(rc.model, l.tp, conv)}}),
         recurrent);
  }
}

}  // namespace preflight::estimator_detail

// Activation bytes per micro-batch of the pieces of a model chunk (layers,
// embedding ids, head terms), as the interleaved replay and the activation
// category read them.
#include "internal.h"
#include "preflight/estimator/geometry.h"

namespace preflight::estimator_detail {

Bytes ActivationRates::Layer(int f) {
  // What stays on the device: offloaded modules' tensors wait in host memory.
  return Once(layer_[static_cast<size_t>(f)], [&] {
    return LayerActivations(inv_.recipe, l_, kAllBlockKinds[static_cast<size_t>(f)]) - Offloaded(f, false);
  });
}

Bytes ActivationRates::Stored(int f) {
  return Once(stored_[static_cast<size_t>(f)], [&] { return Unrecomputed(f) - Offloaded(f, true); });
}

Bytes ActivationRates::Unrecomputed(int f) {
  return Once(unrecomputed_[static_cast<size_t>(f)], [&] {
    Layout none = l_;
    none.recompute = Recompute::kNone;
    return LayerActivations(inv_.recipe, none, kAllBlockKinds[static_cast<size_t>(f)]);
  });
}

Bytes ActivationRates::Offloaded(int f, bool none) {
  return Once(offloaded_[none ? 1 : 0][static_cast<size_t>(f)], [&] {
    Layout l = l_;
    if (none) l.recompute = Recompute::kNone;
    return LayerOffloaded(inv_.recipe, l, kAllBlockKinds[static_cast<size_t>(f)]);
  });
}

Bytes ActivationRates::Workspace(int f) {
  return Once(workspace_[static_cast<size_t>(f)],
              [&] { return LayerWorkspace(inv_.recipe, l_, kAllBlockKinds[static_cast<size_t>(f)]); });
}

Bytes ActivationRates::RoutingPeak() {
  return Once(routing_, [&] { return RouteMoeOn(inv_.recipe, l_).peak(); });
}

Bytes ActivationRates::Embedding() {
  return Once(embedding_, [&] { return FirstStageActivations(inv_.recipe, l_); });
}

Bytes ActivationRates::LossTransient() {
  return Once(loss_transient_,
              [&] { return LossTransientActivations(inv_.recipe, l_, PaddedVocab(inv_.recipe.model, l_.tp)); });
}

Bytes ActivationRates::HeadSaved() {
  return Once(head_saved_, [&] {
    return LastStageActivations(inv_.recipe, l_, PaddedVocab(inv_.recipe.model, l_.tp)) - LossTransient();
  });
}

ChunkActivation ActivationRates::Chunk(const StageChunk& c) {
  ChunkActivation a;
  KeptCounts kept;
  const bool kept_counted =
      CountKept(inv_, c.first_layer, c.first_layer, c.end_layer, l_.recompute, inv_.recipe.training, &kept);
  if (kept_counted) {
    for (size_t f = 0; f < 5; ++f) {  // integer sums: by family, as exact as layer by layer
      const int family = static_cast<int>(f);
      if (kept.policy[f] > 0) a.saved = Add(a.saved, Mul(kept.policy[f], Layer(family).count()));
      if (kept.all[f] > 0) a.saved = Add(a.saved, Mul(kept.all[f], Stored(family).count()));
    }
  }
  const bool full = l_.recompute == Recompute::kFull;
  for (int64_t i = kept_counted ? c.end_layer : c.first_layer; i < c.end_layer; ++i) {
    const preflight::Layer& layer = inv_.layers.at(static_cast<size_t>(i));
    const int f = FamilyIndex(layer.kind);
    switch (KeptBy(layer, full ? LayerInChunk(inv_, c.first_layer, i) : 0, l_.recompute, inv_.recipe.training)) {
      case Kept::kPolicy: a.saved = Add(a.saved, Layer(f).count()); break;
      case Kept::kAll: a.saved = Add(a.saved, Stored(f).count()); break;
      case Kept::kNothing: break;
    }
  }
  if (c.owns_embedding) a.saved = Add(a.saved, Embedding().count());
  if (c.owns_head) {
    a.saved = Add(a.saved, HeadSaved().count());
    a.transient = LossTransient().count();
  }
  return a;
}

const StageChunk& ChunkOfRank(const StagePlan& plan, int64_t p, int64_t r, int64_t vi) {
  const size_t at = static_cast<size_t>(vi * p + r);
  if (at < plan.chunks.size() && plan.chunks[at].pipeline_rank == r && plan.chunks[at].virtual_index == vi) {
    return plan.chunks[at];
  }
  for (const StageChunk& c : plan.chunks) {
    if (c.pipeline_rank == r && c.virtual_index == vi) return c;
  }
  return plan.chunks.at(at);  // a plan without the chunk is a bug
}

ChunkActivations::ChunkActivations(const StagePlan& plan, int64_t p, int64_t r, int64_t v, ActivationRates& rates)
    : plan_(plan), p_(p), r_(r), rates_(rates) {
  for (int64_t vi = 0; vi < std::min(v, kCachedChunks); ++vi) {
    cached_[static_cast<size_t>(vi)] = rates_.Chunk(ChunkOfRank(plan_, p_, r_, vi));
  }
}

ChunkActivation ChunkActivations::Uncached(int64_t vi) const { return rates_.Chunk(ChunkOfRank(plan_, p_, r_, vi)); }

}  // namespace preflight::estimator_detail

// Activation bytes per micro-batch of the pieces of a model chunk (layers,
// embedding ids, head terms), as the interleaved replay and the activation
// category read them.
#include "internal.h"

namespace preflight::estimator_detail {

Bytes ActivationRates::Layer(int f) {
  const size_t i = static_cast<size_t>(f);
  if (!layer_known_[i]) {
    // What stays on the device: offloaded modules' tensors wait in host memory.
    layer_[i] =
        (LayerActivations(inv_.recipe, l_, kAllBlockKinds[i]) - LayerOffloaded(inv_.recipe, l_, kAllBlockKinds[i]))
            .count();
    layer_known_[i] = true;
  }
  return Bytes(layer_[i]);
}

Bytes ActivationRates::Stored(int f) {
  const size_t i = static_cast<size_t>(f);
  if (!stored_known_[i]) {
    Layout none = l_;
    none.recompute = Recompute::kNone;
    stored_[i] =
        (LayerActivations(inv_.recipe, none, kAllBlockKinds[i]) - LayerOffloaded(inv_.recipe, none, kAllBlockKinds[i]))
            .count();
    stored_known_[i] = true;
  }
  return Bytes(stored_[i]);
}

Bytes ActivationRates::Embedding() {
  if (embedding_ < 0) embedding_ = FirstStageActivations(inv_.recipe, l_).count();
  return Bytes(embedding_);
}

Bytes ActivationRates::HeadLogits() {
  if (head_logits_ < 0) {
    head_logits_ = HeadLogitsActivations(inv_.recipe, l_, PaddedVocab(inv_.recipe.model, l_.tp)).count();
  }
  return Bytes(head_logits_);
}

Bytes ActivationRates::HeadSaved() {
  if (head_saved_ < 0) {
    const Bytes last = LastStageActivations(inv_.recipe, l_, PaddedVocab(inv_.recipe.model, l_.tp));
    head_saved_ = (last - HeadLogits()).count();
  }
  return Bytes(head_saved_);
}

ChunkActivation ActivationRates::Chunk(const StageChunk& c) {
  ChunkActivation a;
  const bool full = l_.recompute == Recompute::kFull;
  for (int64_t i = c.first_layer; i < c.end_layer; ++i) {
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
    a.transient = HeadLogits().count();
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

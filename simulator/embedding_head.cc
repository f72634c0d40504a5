// Vocab-parallel embedding, and the final norm + column-parallel head +
// vocab-parallel cross-entropy (docs/formulas.md §8.3, Megatron cross_entropy.py).
#include <cmath>
#include <limits>
#include <string>

#include "preflight/simulator/sim.h"

#include "blocks.h"
#include "dropout.h"

namespace preflight::sim {

template <class T>
Embedding<T>::Embedding(Ctx& ctx, const Dims& d, uint64_t seed, double scale, bool positions) : d_(d) {
  if (d.replicated_embedding) {  // every row on every TP rank (the inventory's logical vocabulary)
    weight_ = MakeParam<T>(ctx, "embedding.weight", d.vocab_logical, d.hidden, ShardKind::kReplicated, Init::kMatrix,
                           seed, scale);
  } else {
    weight_ = MakeParam<T>(ctx, "embedding.weight", d.vocab, d.hidden, ShardKind::kRows, Init::kMatrix, seed, scale);
  }
  if (positions && d.learned_positions > 0) {
    positions_ = MakeParam<T>(ctx, "embedding.positions.weight", d.learned_positions, d.hidden, ShardKind::kReplicated,
                              Init::kMatrix, seed, scale);
    // A vocab-parallel lookup is all-reduced before the positions are added,
    // so each TP rank's position gradient is the whole one (see Forward).
    positions_->tp_whole = !d.replicated_embedding;
  }
}

template <class T>
Mat<T> Embedding<T>::Forward(Ctx& ctx, const std::vector<int64_t>& ids, int64_t slot) {
  Mat<T> x = Lookup(ctx, ids, slot);
  if (ctx.dropout == 0) return x;
  // Megatron's embedding_dropout (language_model_embedding.py), after the SP
  // scatter: a mask of this rank's rows, kept for backward (1 byte each).
  Tensor<T>& mask = masks_.Open(ctx.microbatch * kSlots + slot);
  mask = Tensor<T>(ctx.mem(), SimCategory::kActivations, 1,
                   ResidualDropoutMask<T>(ctx, DropoutSite::kEmbedding, slot, d_.batch, x.rows(), x.cols()));
  return x.cwiseProduct(mask.m);
}

template <class T>
void Embedding<T>::Backward(Ctx& ctx, const Mat<T>& dx, int64_t slot) {
  if (ctx.dropout == 0) return LookupBackward(ctx, dx, slot);
  const Tensor<T> mask = masks_.Close(ctx.microbatch * kSlots + slot);
  LookupBackward(ctx, dx.cwiseProduct(mask.m), slot);
}

template <class T>
Mat<T> Embedding<T>::Lookup(Ctx& ctx, const std::vector<int64_t>& ids, int64_t slot) {
  // Token ids stay alive for the backward (int64, docs/formulas.md §3.4).
  ctx.rank->set_what(CommWhat::kEmbedding);
  ids_.Open(ctx.microbatch * kSlots + slot) = IndexTensor(ctx.mem(), SimCategory::kActivations, ids);
  if (d_.replicated_embedding) {
    // Only this rank's rows (its SP slice): no collective.
    const int64_t rows = LocalRowCount(ctx, static_cast<int64_t>(ids.size())), first = LocalRowOffset(ctx, rows);
    Mat<T> x(rows, d_.hidden);
    for (int64_t t = 0; t < rows; ++t) x.row(t) = weight_->value.m.row(ids[static_cast<size_t>(first + t)]);
    if (positions_) AddPositions(ctx, first, &x);
    return x;
  }
  const int64_t rows = weight_->value.m.rows(), first = ctx.tp_rank * rows;
  Tensor<T> partial(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation,
                    Mat<T>::Zero(static_cast<int64_t>(ids.size()), d_.hidden));
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t local = ids[t] - first;
    if (local >= 0 && local < rows) partial.m.row(static_cast<int64_t>(t)) = weight_->value.m.row(local);
  }
  if (!positions_) return ReduceFromTpForward(ctx, partial.m);
  // Megatron LanguageModelEmbedding.forward with learned_absolute positions:
  // reduce_scatter_embeddings is off, so VocabParallelEmbedding all-reduces
  // the whole sequence, the position rows are added, and with SP
  // scatter_to_sequence_parallel_region keeps this rank's slice (no
  // communication forward; an all-gather backward).
  if (ctx.tp_size > 1) ctx.rank->AllReduce(*ctx.tp, partial.m.data(), partial.m.size(), ctx.bytes.activation);
  AddPositions(ctx, 0, &partial.m);
  if (!ctx.sp) return partial.m;
  const int64_t local = LocalRowCount(ctx, partial.m.rows());
  return partial.m.middleRows(LocalRowOffset(ctx, local), local);
}

template <class T>
int64_t Embedding<T>::LocalRowCount(const Ctx& ctx, int64_t rows) {
  return ctx.sp ? rows / ctx.tp_size : rows;
}

template <class T>
int64_t Embedding<T>::LocalRowOffset(const Ctx& ctx, int64_t local_rows) {
  return ctx.sp ? ctx.tp_rank * local_rows : 0;
}

template <class T>
void Embedding<T>::AddPositions(const Ctx& ctx, int64_t first_row, Mat<T>* x) const {
  // Row r of the rank's rows is local position r / batch (SeqLayout), at its
  // global position under CP (Megatron slices position_ids per CP rank).
  for (int64_t r = 0; r < x->rows(); ++r) {
    x->row(r) += positions_->value.m.row(ctx.seq.Position((first_row + r) / d_.batch));
  }
}

template <class T>
void Embedding<T>::LookupBackward(Ctx& ctx, const Mat<T>& dx, int64_t slot) {
  ctx.rank->set_what(CommWhat::kEmbedding);
  const IndexTensor ids = ids_.Close(ctx.microbatch * kSlots + slot);
  if (d_.replicated_embedding) {
    // This rank's rows only: with SP a partial gradient, all-reduced over TP
    // with the other replicated parameters (DistOptimizer::AllReduceReplicated).
    const int64_t first = LocalRowOffset(ctx, dx.rows());
    for (int64_t t = 0; t < dx.rows(); ++t) weight_->grad.m.row(ids.v[static_cast<size_t>(first + t)]) += dx.row(t);
    if (positions_) AddPositionGrads(ctx, first, dx);
    return;
  }
  // g' (an all-gather with SP): also the backward of the positions' scatter.
  const Mat<T> dfull = ReduceFromTpBackward(ctx, dx);
  if (positions_) AddPositionGrads(ctx, 0, dfull);
  const int64_t rows = weight_->value.m.rows(), first = ctx.tp_rank * rows;
  for (size_t t = 0; t < ids.v.size(); ++t) {
    const int64_t local = ids.v[t] - first;
    if (local >= 0 && local < rows) weight_->grad.m.row(local) += dfull.row(static_cast<int64_t>(t));
  }
}

template <class T>
void Embedding<T>::AddPositionGrads(const Ctx& ctx, int64_t first_row, const Mat<T>& dx) {
  for (int64_t r = 0; r < dx.rows(); ++r) {
    positions_->grad.m.row(ctx.seq.Position((first_row + r) / d_.batch)) += dx.row(r);
  }
}

template <class T>
Head<T>::Head(Ctx& ctx, const Dims& d, uint64_t seed, double scale, Param<T>* shared, const std::string& norm)
    : d_(d), weight_(shared) {
  norm_ = MakeNorm<T>(ctx, d, norm, seed, scale);
  if (weight_ != nullptr) return;
  if (d.tie_embeddings) {
    // Megatron's last-stage copy of the word embeddings (LanguageModule
    // setup_embeddings_and_output_layer): the embedding's value, kept in step
    // by summing the two copies' gradients (DistOptimizer, Param::tied).
    own_ = MakeParam<T>(ctx, "embedding.weight", d.vocab, d.hidden, ShardKind::kRows, Init::kMatrix, seed, scale);
    own_->tied = true;
  } else {
    own_ = MakeParam<T>(ctx, "head.weight", d.vocab, d.hidden, ShardKind::kRows, Init::kMatrix, seed,
                        scale / std::sqrt(double(d.hidden)));
  }
  weight_ = own_.get();
}

template <class T>
double Head<T>::Forward(Ctx& ctx, const Mat<T>& x, const std::vector<int64_t>& targets, const std::vector<T>* weights,
                        Mat<T>* normed, bool normed_input) {
  const SimCategory act = SimCategory::kActivations;
  const int64_t ab = ctx.bytes.activation;
  ctx.rank->set_what(CommWhat::kHead);
  Saved& s = saved_.Open(ctx.microbatch);
  s.targets = targets;
  if (normed_input) {
    s.n = Tensor<T>(ctx.mem(), act, ab, x);
  } else {
    SavePreNorm(ctx, x, norm_->value.m, d_.norm_eps, &s.x, &s.n, &s.rstd);
  }
  if (normed != nullptr) *normed = s.n.m;
  if (weights != nullptr) s.weights = *weights;
  Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
  // The bf16 logits are transient but live at the stage's activation peak (docs/formulas.md §3.4: 2V/t per token).
  Tensor<T> logits(ctx.mem(), SimCategory::kActivations, ab, MatMulTransB(ctx, n_full.m, weight_->value.m));
  n_full.Release();
  const int64_t tokens = logits.m.rows(), cols = logits.m.cols(), first = ctx.tp_rank * cols;
  // Three fp32 all-reduces over TP: max, sum of exp, target logit (0 off-shard).
  std::vector<T> mx(static_cast<size_t>(tokens)), sum(static_cast<size_t>(tokens)), target(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) mx[static_cast<size_t>(t)] = logits.m.row(t).maxCoeff();
  ctx.rank->set_what(CommWhat::kLoss);
  if (ctx.tp_size > 1) ctx.rank->AllReduce(*ctx.tp, mx.data(), tokens, 4, ReduceOp::kMax);
  Mat<T> e(tokens, cols);
  for (int64_t t = 0; t < tokens; ++t) {
    e.row(t) = (logits.m.row(t).array() - mx[static_cast<size_t>(t)]).exp().matrix();
    sum[static_cast<size_t>(t)] = e.row(t).sum();
    const int64_t local = targets[static_cast<size_t>(t)] - first;
    target[static_cast<size_t>(t)] = local >= 0 && local < cols ? logits.m(t, local) : T(0);
  }
  if (ctx.tp_size > 1) {
    ctx.rank->AllReduce(*ctx.tp, sum.data(), tokens, 4);
    ctx.rank->AllReduce(*ctx.tp, target.data(), tokens, 4);
  }
  double loss = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const size_t i = static_cast<size_t>(t);
    e.row(t) /= sum[i];
    const double ce = static_cast<double>(std::log(sum[i]) + mx[i] - target[i]);
    loss += s.weights.empty() ? ce : static_cast<double>(s.weights[i]) * ce;
  }
  // torch cross_entropy(logits.float()) (training.cross_entropy:
  // fp32_upcast): log_softmax writes its output beside the logits and their
  // fp32 copy; Megatron's vocab-parallel loss turns its copy into the softmax.
  Tensor<T> upcast;
  if (d_.cross_entropy == CrossEntropy::kFp32Upcast && ab < 4) upcast = Tensor<T>(ctx.mem(), act, 4, logits.m);
  // Kept for the backward, 4 B a logit: the softmax, or log_softmax's output
  // (the executor keeps the softmax either way).
  s.softmax = Tensor<T>(ctx.mem(), act, 4, std::move(e));
  upcast.Release();
  s.tokens = tokens;
  return s.weights.empty() ? loss / static_cast<double>(tokens) : loss;
}

template <class T>
Mat<T> Head<T>::Backward(Ctx& ctx, const Mat<T>* dnormed) {
  ctx.rank->set_what(CommWhat::kHead);
  const int64_t ab = ctx.bytes.activation;
  Saved s = saved_.Close(ctx.microbatch);
  const int64_t rows = s.softmax.m.rows(), cols = s.softmax.m.cols(), first = ctx.tp_rank * cols;
  const T mean = T(1) / T(s.tokens);
  if (d_.cross_entropy == CrossEntropy::kFp32Upcast) {
    // torch's backward of nll_loss then log_softmax: both fp32 gradients
    // [tokens, V/t] live beside the saved output before the cast back
    // (aten nll_loss_backward, _log_softmax_backward_data).
    Tensor<T> dnll(ctx.mem(), SimCategory::kActivations, 4, Mat<T>::Zero(rows, cols));
    Tensor<T> dlog_softmax(ctx.mem(), SimCategory::kActivations, 4, Mat<T>::Zero(rows, cols));
  }
  Tensor<T> dlogits(ctx.mem(), SimCategory::kTemporaries, ab, s.softmax.m * mean);
  for (int64_t t = 0; t < rows; ++t) {
    const T scale = s.weights.empty() ? mean : s.weights[static_cast<size_t>(t)];
    if (!s.weights.empty()) dlogits.m.row(t) = s.softmax.m.row(t) * scale;
    const int64_t local = s.targets[static_cast<size_t>(t)] - first;
    if (local >= 0 && local < cols) dlogits.m(t, local) -= scale;
  }
  s.softmax.Release();
  // Megatron's LinearWithGradAccumulationAndAsyncCommunication.backward with
  // --defer-embedding-wgrad-compute: the first wgrad_deferral_limit
  // micro-batches (0: all) append grad_output (the logits' gradient, in the
  // activation dtype) to grad_output_buffer and skip the input's gather and
  // the weight gradient; the forward appended the input.
  const int64_t limit = d_.head_wgrad_deferred;
  const bool defer = limit == 0 || deferred_count_ < limit;
  if (!defer) {
    Tensor<T> n_full = TpRegionInput(ctx, s.n.m);
    weight_->grad.m += MatMulTransA(ctx, dlogits.m, n_full.m);
  }
  Mat<T> dn = CopyToTpBackward(ctx, MatMul(ctx, dlogits.m, weight_->value.m));
  if (defer) {  // kept to the flush: the logits' gradient becomes an activation
    ++deferred_count_;
    Mat<T> g = std::move(dlogits.m);
    dlogits.Release();
    deferred_.emplace_back(std::move(s.n), Tensor<T>(ctx.mem(), SimCategory::kActivations, ab, std::move(g)));
  } else {
    dlogits.Release();
  }
  if (dnormed != nullptr) dn += *dnormed;
  if (s.x.m.size() == 0) return dn;  // a normed_input forward: the norm's backward is its caller's
  return NormBackward(dn, s.x.m, s.rstd.m, norm_->value.m, &norm_->grad.m);
}

template <class T>
void Head<T>::DrainDeferred(Ctx& ctx) {
  ctx.rank->set_what(CommWhat::kHead);
  for (auto& [n, g] : deferred_) {
    Tensor<T> n_full = TpRegionInput(ctx, n.m);
    weight_->grad.m += MatMulTransA(ctx, g.m, n_full.m);
  }
  deferred_.clear();
  deferred_count_ = 0;
}

template <class T>
std::unique_ptr<Block<T>> MakeBlock(char letter, Ctx& ctx, const Dims& d, int64_t layer, uint64_t seed,
                                    double scale) {
  std::unique_ptr<Block<T>> block;
  if (letter == 'E') {
    block = MakeMoeBlock<T>(ctx, d, layer, seed, scale);
  } else if (letter == 'M') {
    block = MakeMambaBlock<T>(ctx, d, layer, seed, scale);
  } else if (letter == 'R') {
    block = MakeRecurrentBlock<T>(ctx, d, layer, seed, scale);
  } else if (letter == 'A' && d.mla) {
    block = MakeMlaBlock<T>(ctx, d, layer, seed, scale);
  } else if (letter == 'A' || letter == 'D') {
    block = MakeDenseBlock<T>(letter, ctx, d, layer, seed, scale);
  } else {
    throw SimUnsupported(std::string("block '") + letter + "' is not in the executor");
  }
  block->set_dropout_key(layer, d.batch);
  return block;
}

template class Embedding<double>;
template class Embedding<float>;
template class Head<double>;
template class Head<float>;
template std::unique_ptr<Block<double>> MakeBlock<double>(char, Ctx&, const Dims&, int64_t, uint64_t, double);
template std::unique_ptr<Block<float>> MakeBlock<float>(char, Ctx&, const Dims&, int64_t, uint64_t, double);

}  // namespace preflight::sim

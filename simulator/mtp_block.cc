// Multi-token prediction (Megatron multi_token_prediction.py, DeepSeek-V3
// arXiv:2412.19437 §2.2): one module per depth on the last pipeline stage.
#include <cmath>
#include <string>

#include "blocks.h"

namespace preflight::sim {
namespace {

/// Gathers each TP rank's columns of `local` [rows, c] into [rows, c * tp]
/// (gather_from_tensor_model_parallel_region: an all-gather of the last
/// dimension; its backward keeps this rank's columns, no collective).
template <class T>
Mat<T> GatherColumns(Ctx& ctx, const Mat<T>& local) {
  if (ctx.tp_size == 1) return local;
  const int64_t rows = local.rows(), cols = local.cols();
  Mat<T> blocks(rows * ctx.tp_size, cols);  // rank i's [rows, cols] block at rows i * rows
  ctx.rank->AllGather(*ctx.tp, local.data(), blocks.data(),
                      std::vector<int64_t>(static_cast<size_t>(ctx.tp_size), rows * cols), ctx.bytes.activation);
  Mat<T> full(rows, cols * ctx.tp_size);
  for (int i = 0; i < ctx.tp_size; ++i) full.middleCols(i * cols, cols) = blocks.middleRows(i * rows, rows);
  return full;
}

}  // namespace

template <class T>
MtpModule<T>::MtpModule(Ctx& ctx, const Dims& d, int64_t depth, char ffn, int64_t layer, uint64_t seed, double scale,
                        Param<T>* output, bool checkpointed)
    : d_(d), checkpointed_(checkpointed) {
  const std::string p = "mtp." + std::to_string(depth - 1) + ".";
  enorm_ = MakeNorm<T>(ctx, d, p + "enorm", seed, scale);
  hnorm_ = MakeNorm<T>(ctx, d, p + "hnorm", seed, scale);
  eh_proj_ = MakeParam<T>(ctx, p + "eh_proj.weight", 2 * d.hidden, d.hidden, ShardKind::kColumns, Init::kMatrix, seed,
                          scale / std::sqrt(2.0 * static_cast<double>(d.hidden)));
  WithRole(ctx, *eh_proj_, ParamRole::kMatrix);
  attention_ = MakeBlock<T>('A', ctx, d, layer, seed, scale);
  ffn_ = MakeBlock<T>(ffn, ctx, d, layer + 1, seed, scale);
  head_ = std::make_unique<Head<T>>(ctx, d, seed, scale, output, p + "final_layernorm");
}

template <class T>
Mat<T> MtpModule<T>::Inner(Ctx& ctx, const Mat<T>& h, const Mat<T>& e) {
  const SimCategory act = SimCategory::kActivations;
  const int64_t ab = ctx.bytes.activation, hd = d_.hidden;
  Saved& s = saved_.Open(ctx.microbatch);
  Mat<T> stats;
  s.e = Tensor<T>(ctx.mem(), act, ab, e);
  const Mat<T> ne = NormForward(e, enorm_->value.m, d_.norm_eps, &stats);
  s.e_stats = Tensor<T>(ctx.mem(), act, 4, std::move(stats));
  s.h = h;
  const Mat<T> nh = NormForward(h, hnorm_->value.m, d_.norm_eps, &stats);
  s.h_stats = Tensor<T>(ctx.mem(), act, 4, std::move(stats));
  Mat<T> cat(e.rows(), 2 * hd);
  cat << ne, nh;  // torch.cat((decoder_input, hidden_states), -1)
  s.cat = Tensor<T>(ctx.mem(), act, ab, std::move(cat));
  ctx.rank->set_what(CommWhat::kMtpProjection);
  Tensor<T> cat_full = TpRegionInput(ctx, s.cat.m);
  Tensor<T> y(ctx.mem(), SimCategory::kTemporaries, ab, GatherColumns(ctx, MatMul(ctx, cat_full.m, eh_proj_->value.m)));
  cat_full.Release();
  // scatter_to_sequence_parallel_region: this rank's rows, no collective.
  Mat<T> x = ctx.sp ? Mat<T>(y.m.middleRows(ctx.tp_rank * e.rows(), e.rows())) : y.m;
  y.Release();
  x = attention_->Forward(ctx, x);
  return ffn_->Forward(ctx, x);
}

template <class T>
Mat<T> MtpModule<T>::InnerBackward(Ctx& ctx, const Mat<T>& dx_in, Mat<T>* de) {
  Saved s = saved_.Close(ctx.microbatch);
  Mat<T> dx = ffn_->Backward(ctx, dx_in);
  dx = attention_->Backward(ctx, dx);
  ctx.rank->set_what(CommWhat::kMtpProjection);
  // The scatter's backward gathers the rows (SP); the column gather's keeps
  // this rank's columns.
  const Mat<T> dy = ReduceFromTpBackward(ctx, dx);
  const int64_t cols = d_.hidden / ctx.tp_size;
  const Mat<T> dy_local = dy.middleCols(ctx.tp_rank * cols, cols);
  const Mat<T> dcat = ColumnParallelBackward<T>(ctx, s.cat.m, {{eh_proj_.get(), &dy_local}});
  s.cat.Release();
  *de = NormBackward<T>(dcat.leftCols(d_.hidden), s.e.m, s.e_stats.m, enorm_->value.m, &enorm_->grad.m);
  return NormBackward<T>(dcat.rightCols(d_.hidden), s.h, s.h_stats.m, hnorm_->value.m, &hnorm_->grad.m);
}

template <class T>
double MtpModule<T>::Forward(Ctx& ctx, const Mat<T>& h, const Mat<T>& e, const std::vector<int64_t>& targets,
                             const std::vector<T>& weights, Mat<T>* normed) {
  if (!checkpointed_) return head_->Forward(ctx, Inner(ctx, h, e), targets, &weights, normed);
  Kept& k = kept_.Open(ctx.microbatch);
  k.e = Tensor<T>(ctx.mem(), SimCategory::kActivations, ctx.bytes.activation, e);
  k.h = h;
  Mat<T> n;
  {
    // Under torch.no_grad (CheckpointFunction.forward): nothing kept.
    NoGradForward no_grad;
    MemoryTracker& mem = ctx.rank->memory();
    mem.set_saved_category(SimCategory::kTemporaries);
    Mat<T> stats;
    n = NormForward(Inner(ctx, h, e), head_->norm().value.m, d_.norm_eps, &stats);
    mem.set_saved_category(SimCategory::kActivations);
  }
  return head_->Forward(ctx, n, targets, &weights, normed, /*normed_input=*/true);
}

template <class T>
Mat<T> MtpModule<T>::Backward(Ctx& ctx, const Mat<T>* dnormed, Mat<T>* de) {
  if (!checkpointed_) return InnerBackward(ctx, head_->Backward(ctx, dnormed), de);
  const Mat<T> dn = head_->Backward(ctx, dnormed);
  // The rerun (CheckpointFunction.backward) on the kept inputs, its saved
  // sets charged as rerun memory; the first, enorm's input, is the kept
  // embedding itself.
  Kept k = kept_.Close(ctx.microbatch);
  MemoryTracker& mem = ctx.rank->memory();
  mem.set_saved_category(SimCategory::kRecomputed);
  mem.ExpectAlias(k.e.alloc.bytes());
  const Mat<T> x = Inner(ctx, k.h, k.e.m);
  Tensor<T> x_kept(ctx.mem(), SimCategory::kActivations, ctx.bytes.activation, x);
  Mat<T> stats;
  NormForward(x, head_->norm().value.m, d_.norm_eps, &stats);
  Tensor<T> stats_kept(ctx.mem(), SimCategory::kActivations, 4, std::move(stats));
  mem.set_saved_category(SimCategory::kActivations);
  k.e.Release();
  const Mat<T> dx = NormBackward(dn, x_kept.m, stats_kept.m, head_->norm().value.m, &head_->norm().grad.m);
  x_kept.Release();
  stats_kept.Release();
  return InnerBackward(ctx, dx, de);
}

template <class T>
std::vector<Param<T>*> MtpModule<T>::params() {
  std::vector<Param<T>*> out{enorm_.get(), hnorm_.get(), eh_proj_.get()};
  for (Block<T>* b : {attention_.get(), ffn_.get()}) {
    for (Param<T>* p : b->params()) out.push_back(p);
  }
  for (Param<T>* p : head_->params()) out.push_back(p);
  return out;
}

template class MtpModule<double>;
template class MtpModule<float>;

}  // namespace preflight::sim

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
                        Param<T>* output)
    : d_(d) {
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
double MtpModule<T>::Forward(Ctx& ctx, const Mat<T>& h, const Mat<T>& e, const std::vector<int64_t>& targets,
                             const std::vector<T>& weights, Mat<T>* normed) {
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
  x = ffn_->Forward(ctx, x);
  return head_->Forward(ctx, x, targets, &weights, normed);
}

template <class T>
Mat<T> MtpModule<T>::Backward(Ctx& ctx, const Mat<T>* dnormed, Mat<T>* de) {
  Saved s = saved_.Close(ctx.microbatch);
  Mat<T> dx = head_->Backward(ctx, dnormed);
  dx = ffn_->Backward(ctx, dx);
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

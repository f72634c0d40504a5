#include "dropout.h"

namespace preflight::sim {
namespace {
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

bool DropoutKeeps(const Ctx& ctx, DropoutSite site, int64_t layer, int64_t a, int64_t b, int64_t c) {
  uint64_t z = Mix(ctx.dropout_seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(site));
  for (int64_t part : {layer, ctx.data_index, a, b, c})
    z = Mix(z + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(part + 1));
  return static_cast<double>(z >> 11) * 0x1.0p-53 >= ctx.dropout;
}

template <class T>
Mat<T> ResidualDropoutMask(const Ctx& ctx, DropoutSite site, int64_t layer, int64_t batch, int64_t rows, int64_t cols) {
  const T scale = T(DropoutScale(ctx));
  const int64_t first = ctx.sp ? ctx.tp_rank * rows : 0;  // SP: this rank's slice of the CP rank's rows
  Mat<T> mask(rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t local = first + i;
    const int64_t pos = ctx.seq.Position(local / batch), b = local % batch;
    for (int64_t j = 0; j < cols; ++j) mask(i, j) = DropoutKeeps(ctx, site, layer, pos, b, j) ? scale : T(0);
  }
  return mask;
}

template <class T>
void Block<T>::DropBranch(Ctx& ctx, Mat<T>* y) {
  Tensor<T>& mask = masks_.Open(ctx.microbatch);
  mask = Tensor<T>(ctx.mem(), SimCategory::kActivations, 1,
                   ResidualDropoutMask<T>(ctx, DropoutSite::kHidden, layer_, batch_, y->rows(), y->cols()));
  *y = y->cwiseProduct(mask.m);
}

template <class T>
Mat<T> Block<T>::DropBranchBackward(Ctx& ctx, const Mat<T>& dy) {
  const Tensor<T> mask = masks_.Close(ctx.microbatch);
  return dy.cwiseProduct(mask.m);
}

template void Block<double>::DropBranch(Ctx&, Mat<double>*);
template void Block<float>::DropBranch(Ctx&, Mat<float>*);
template Mat<double> Block<double>::DropBranchBackward(Ctx&, const Mat<double>&);
template Mat<float> Block<float>::DropBranchBackward(Ctx&, const Mat<float>&);
template Mat<double> ResidualDropoutMask<double>(const Ctx&, DropoutSite, int64_t, int64_t, int64_t, int64_t);
template Mat<float> ResidualDropoutMask<float>(const Ctx&, DropoutSite, int64_t, int64_t, int64_t, int64_t);

}  // namespace preflight::sim

// Parameters, matrix products with FLOP counts, the TP conjugate operators and
// RMSNorm (MATH.md 8.1, 8.3).
#include <cmath>
#include <random>

#include "blocks.h"

namespace preflight::sim {

namespace {
// FNV-1a: a stable hash, so initial values do not depend on the standard library.
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

SimCategory ParamCategory(ShardKind k) {
  switch (k) {
    case ShardKind::kReplicated: return SimCategory::kReplicatedParams;
    case ShardKind::kColumns:
    case ShardKind::kRows: return SimCategory::kTpShardedParams;
    case ShardKind::kExpertColumns:
    case ShardKind::kExpertRows: return SimCategory::kEpShardedParams;
  }
  return SimCategory::kReplicatedParams;
}

std::vector<int64_t> RowCounts(int n, int64_t rows_each, int64_t cols) {
  return std::vector<int64_t>(static_cast<size_t>(n), rows_each * cols);
}
}  // namespace

Mat<double> GlobalValue(const std::string& name, int64_t rows, int64_t cols, Init init, uint64_t seed,
                        double scale) {
  std::mt19937_64 gen(Fnv1a(name) ^ (seed * 0x9e3779b97f4a7c15ull));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Mat<double> m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) {
    m.data()[i] = init == Init::kNormWeight ? 1.0 + 0.2 * u(gen) : scale * u(gen);
  }
  return m;
}

template <class T>
std::unique_ptr<Param<T>> MakeParam(const Ctx& ctx, const std::string& name, int64_t rows, int64_t cols,
                                    ShardKind shard, Init init, uint64_t seed, double scale, int64_t expert) {
  const Mat<double> global = GlobalValue(name, rows, cols, init, seed, scale);
  Mat<double> local;
  switch (shard) {
    case ShardKind::kReplicated: local = global; break;
    case ShardKind::kColumns: {
      const int64_t c = cols / ctx.tp_size;
      local = global.middleCols(ctx.tp_rank * c, c);
      break;
    }
    case ShardKind::kRows: {
      const int64_t r = rows / ctx.tp_size;
      local = global.middleRows(ctx.tp_rank * r, r);
      break;
    }
    case ShardKind::kExpertColumns: {
      const int64_t c = cols / ctx.etp_size;
      local = global.middleCols(ctx.etp_rank * c, c);
      break;
    }
    case ShardKind::kExpertRows: {
      const int64_t r = rows / ctx.etp_size;
      local = global.middleRows(ctx.etp_rank * r, r);
      break;
    }
  }
  auto p = std::make_unique<Param<T>>();
  p->name = name;
  p->rows = rows;
  p->cols = cols;
  p->shard = shard;
  p->expert = expert;
  p->value = Tensor<T>(ctx.mem(), ParamCategory(shard), ctx.bytes.param, local.template cast<T>());
  p->grad = Tensor<T>(ctx.mem(), SimCategory::kGradients, ctx.bytes.grad, Mat<T>::Zero(local.rows(), local.cols()));
  return p;
}

template <class T>
Mat<T> MatMul(Ctx& ctx, const Mat<T>& a, const Mat<T>& b) {
  ctx.rank->AddFlops(2.0 * static_cast<double>(a.rows()) * static_cast<double>(a.cols()) * static_cast<double>(b.cols()));
  return a * b;
}
template <class T>
Mat<T> MatMulTransB(Ctx& ctx, const Mat<T>& a, const Mat<T>& b) {
  ctx.rank->AddFlops(2.0 * static_cast<double>(a.rows()) * static_cast<double>(a.cols()) * static_cast<double>(b.rows()));
  return a * b.transpose();
}
template <class T>
Mat<T> MatMulTransA(Ctx& ctx, const Mat<T>& a, const Mat<T>& b) {
  ctx.rank->AddFlops(2.0 * static_cast<double>(a.rows()) * static_cast<double>(a.cols()) * static_cast<double>(b.cols()));
  return a.transpose() * b;
}

namespace {
template <class T>
Mat<T> GatherRows(Ctx& ctx, const Mat<T>& local) {
  Mat<T> full(local.rows() * ctx.tp_size, local.cols());
  ctx.rank->AllGather(*ctx.tp, local.data(), full.data(), RowCounts(ctx.tp_size, local.rows(), local.cols()),
                      ctx.bytes.activation);
  return full;
}
template <class T>
Mat<T> ScatterRows(Ctx& ctx, const Mat<T>& full) {
  const int64_t rows = full.rows() / ctx.tp_size;
  Mat<T> local(rows, full.cols());
  ctx.rank->ReduceScatter(*ctx.tp, full.data(), local.data(), RowCounts(ctx.tp_size, rows, full.cols()),
                          ctx.bytes.activation);
  return local;
}
template <class T>
Mat<T> AllReduceTp(Ctx& ctx, const Mat<T>& full) {
  Mat<T> out = full;
  ctx.rank->AllReduce(*ctx.tp, out.data(), static_cast<int64_t>(out.size()), ctx.bytes.activation);
  return out;
}
}  // namespace

template <class T>
Mat<T> CopyToTpForward(Ctx& ctx, const Mat<T>& local) {
  return ctx.sp ? GatherRows(ctx, local) : local;
}
template <class T>
Mat<T> CopyToTpBackward(Ctx& ctx, const Mat<T>& dfull) {
  if (ctx.tp_size == 1) return dfull;
  return ctx.sp ? ScatterRows(ctx, dfull) : AllReduceTp(ctx, dfull);
}
template <class T>
Mat<T> ReduceFromTpForward(Ctx& ctx, const Mat<T>& partial) {
  if (ctx.tp_size == 1) return partial;
  return ctx.sp ? ScatterRows(ctx, partial) : AllReduceTp(ctx, partial);
}
template <class T>
Mat<T> ReduceFromTpBackward(Ctx& ctx, const Mat<T>& dlocal) {
  return ctx.sp ? GatherRows(ctx, dlocal) : dlocal;
}

template <class T>
Mat<T> RmsNormForward(const Mat<T>& x, const Mat<T>& w, double eps, Mat<T>* rstd) {
  const int64_t h = x.cols();
  rstd->resize(x.rows(), 1);
  Mat<T> y(x.rows(), h);
  for (int64_t i = 0; i < x.rows(); ++i) {
    const T r = T(1) / std::sqrt(x.row(i).squaredNorm() / T(h) + T(eps));
    (*rstd)(i, 0) = r;
    y.row(i) = (x.row(i) * r).cwiseProduct(w.row(0));
  }
  return y;
}

template <class T>
Mat<T> RmsNormBackward(const Mat<T>& dy, const Mat<T>& x, const Mat<T>& rstd, const Mat<T>& w, Mat<T>* dw) {
  // MATH.md 8.1: dx = r (g.w - xhat mean(g.w.xhat)), dw = sum_tokens g.xhat.
  const int64_t h = x.cols();
  Mat<T> dx(x.rows(), h);
  for (int64_t i = 0; i < x.rows(); ++i) {
    const T r = rstd(i, 0);
    const auto xhat = (x.row(i) * r).eval();
    const auto gw = dy.row(i).cwiseProduct(w.row(0)).eval();
    const T mean = gw.cwiseProduct(xhat).sum() / T(h);
    dx.row(i) = r * (gw - xhat * mean);
    dw->row(0) += dy.row(i).cwiseProduct(xhat);
  }
  return dx;
}

#define PREFLIGHT_INSTANTIATE(T)                                                                                \
  template std::unique_ptr<Param<T>> MakeParam<T>(const Ctx&, const std::string&, int64_t, int64_t, ShardKind, \
                                                  Init, uint64_t, double, int64_t);                            \
  template Mat<T> MatMul<T>(Ctx&, const Mat<T>&, const Mat<T>&);                                               \
  template Mat<T> MatMulTransB<T>(Ctx&, const Mat<T>&, const Mat<T>&);                                         \
  template Mat<T> MatMulTransA<T>(Ctx&, const Mat<T>&, const Mat<T>&);                                         \
  template Mat<T> CopyToTpForward<T>(Ctx&, const Mat<T>&);                                                     \
  template Mat<T> CopyToTpBackward<T>(Ctx&, const Mat<T>&);                                                    \
  template Mat<T> ReduceFromTpForward<T>(Ctx&, const Mat<T>&);                                                 \
  template Mat<T> ReduceFromTpBackward<T>(Ctx&, const Mat<T>&);                                                \
  template Mat<T> RmsNormForward<T>(const Mat<T>&, const Mat<T>&, double, Mat<T>*);                            \
  template Mat<T> RmsNormBackward<T>(const Mat<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&, Mat<T>*);
PREFLIGHT_INSTANTIATE(double)
PREFLIGHT_INSTANTIATE(float)
#undef PREFLIGHT_INSTANTIATE

}  // namespace preflight::sim

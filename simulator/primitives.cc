// Parameters, matrix products with FLOP counts, the TP conjugate operators and
// RMSNorm (docs/formulas.md §8.1, 8.3).
#include <cmath>

#include "blocks.h"

namespace preflight::sim {

namespace {
thread_local NoGradForward* g_no_grad = nullptr;
}  // namespace

NoGradForward::NoGradForward() {
  if (g_no_grad != nullptr) throw std::logic_error("a no-grad forward is already open on this rank");
  g_no_grad = this;
}

NoGradForward::~NoGradForward() {
  Drop();
  g_no_grad = nullptr;
}

NoGradForward* NoGradForward::Current() { return g_no_grad; }

void NoGradForward::Drop() {
  for (auto& drop : drops_) drop();
  drops_.clear();
}

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

std::vector<int64_t> RowCounts(int n, int64_t rows_each, int64_t cols) {
  return std::vector<int64_t>(static_cast<size_t>(n), rows_each * cols);
}
}  // namespace

namespace {
// Element `index` of a tensor as a pure function of (name, seed, index)
// (splitmix64 finaliser), so a rank computes only its own shard.
double Element(uint64_t key, int64_t index, Init init, double scale) {
  uint64_t z = key + static_cast<uint64_t>(index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const double u = 2.0 * (static_cast<double>(z >> 11) * 0x1.0p-53) - 1.0;  // [-1, 1)
  return init == Init::kNormWeight ? 1.0 + 0.2 * u : scale * u;
}
uint64_t KeyOf(const std::string& name, uint64_t seed) { return Fnv1a(name) ^ (seed * 0xd1b54a32d192ed03ull); }

/// Rows [r0, r0 + nr) and columns [c0, c0 + nc) of the global tensor.
Mat<double> SliceOf(const std::string& name, int64_t cols, Init init, uint64_t seed, double scale, int64_t r0,
                  int64_t nr, int64_t c0, int64_t nc) {
  const uint64_t key = KeyOf(name, seed);
  Mat<double> m(nr, nc);
  for (int64_t i = 0; i < nr; ++i) {
    for (int64_t j = 0; j < nc; ++j) m(i, j) = Element(key, (r0 + i) * cols + c0 + j, init, scale);
  }
  return m;
}
}  // namespace

SeqLayout SeqLayout::Make(int64_t seq, int cp_size, int cp_rank, bool load_balanced) {
  SeqLayout l;
  l.seq = seq;
  l.cp_size = cp_size;
  l.cp_rank = cp_rank;
  l.load_balanced = load_balanced && cp_size > 1;
  l.chunk_len = seq / l.num_chunks();
  l.chunks.push_back(cp_rank);
  if (l.load_balanced) l.chunks.push_back(2 * cp_size - 1 - cp_rank);
  return l;
}

int SeqLayout::OwnerOf(int64_t c) const {
  if (!load_balanced) return static_cast<int>(c);
  return static_cast<int>(c < cp_size ? c : 2 * cp_size - 1 - c);
}

Mat<double> GlobalValue(const std::string& name, int64_t rows, int64_t cols, Init init, uint64_t seed,
                        double scale) {
  return SliceOf(name, cols, init, seed, scale, 0, rows, 0, cols);
}

OptimizerKind OptimizerFor(ParamRole role, const OptimizerConfig& config) {
  if (config.matrices != OptimizerKind::kMuon) return OptimizerKind::kAdamW;
  switch (role) {
    case ParamRole::kMatrix: return OptimizerKind::kMuon;
    case ParamRole::kMambaInProj: return config.mamba_in_proj;
    case ParamRole::kRouter: return config.router;
    case ParamRole::kVector: return OptimizerKind::kAdamW;
  }
  return OptimizerKind::kAdamW;
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

bool SplitsColumns(ShardKind k) { return k == ShardKind::kColumns || k == ShardKind::kExpertColumns; }

std::vector<std::pair<int64_t, int64_t>> ShardRanges(int64_t extent, const std::vector<int64_t>& segments, int parts,
                                                     int index) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const std::vector<int64_t> whole = {extent};
  int64_t offset = 0;
  for (int64_t seg : segments.empty() ? whole : segments) {
    const int64_t len = seg / parts;
    out.push_back({offset + index * len, len});
    offset += seg;
  }
  return out;
}

template <class T>
void PutShard(ShardKind kind, const std::vector<int64_t>& segments, int parts, int index, const Mat<T>& shard,
              Mat<T>* global) {
  const bool by_cols = SplitsColumns(kind);
  int64_t at = 0;  // position in the shard
  for (const auto& [offset, len] : ShardRanges(by_cols ? global->cols() : global->rows(), segments, parts, index)) {
    if (by_cols) {
      global->middleCols(offset, len) = shard.middleCols(at, len);
    } else {
      global->middleRows(offset, len) = shard.middleRows(at, len);
    }
    at += len;
  }
}

Mat<double> AssembleShards(ShardKind kind, int64_t rows, int64_t cols, const std::vector<int64_t>& segments,
                           const std::vector<const Mat<double>*>& shards) {
  if (kind == ShardKind::kReplicated || shards.size() == 1) return *shards.at(0);
  const int parts = static_cast<int>(shards.size());
  Mat<double> m(rows, cols);
  for (int i = 0; i < parts; ++i) PutShard(kind, segments, parts, i, *shards[static_cast<size_t>(i)], &m);
  return m;
}

template <class T>
std::unique_ptr<Param<T>> MakeParam(const Ctx& ctx, const std::string& name, int64_t rows, int64_t cols,
                                    ShardKind shard, Init init, uint64_t seed, double scale, int64_t expert,
                                    std::vector<int64_t> segments) {
  // This rank's shard of the global tensor: whole, or its ranges of the split dimension.
  Mat<double> local;
  if (shard == ShardKind::kReplicated) {
    local = SliceOf(name, cols, init, seed, scale, 0, rows, 0, cols);
  } else {
    const bool expert_split = shard == ShardKind::kExpertColumns || shard == ShardKind::kExpertRows;
    const int parts = expert_split ? ctx.etp_size : ctx.tp_size;
    const int index = expert_split ? ctx.etp_rank : ctx.tp_rank;
    const bool by_cols = SplitsColumns(shard);
    const auto ranges = ShardRanges(by_cols ? cols : rows, segments, parts, index);
    int64_t extent = 0;
    for (const auto& r : ranges) extent += r.second;
    local.resize(by_cols ? rows : extent, by_cols ? extent : cols);
    int64_t at = 0;
    for (const auto& [offset, len] : ranges) {
      if (by_cols) {
        local.middleCols(at, len) = SliceOf(name, cols, init, seed, scale, 0, rows, offset, len);
      } else {
        local.middleRows(at, len) = SliceOf(name, cols, init, seed, scale, offset, len, 0, cols);
      }
      at += len;
    }
  }
  auto p = std::make_unique<Param<T>>();
  p->name = name;
  p->rows = rows;
  p->cols = cols;
  p->shard = shard;
  p->segments = std::move(segments);
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
  // docs/formulas.md §8.1: dx = r (g.w - xhat mean(g.w.xhat)), dw = sum_tokens g.xhat.
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

template <class T>
Mat<T> LayerNormForward(const Mat<T>& x, const Mat<T>& wb, double eps, Mat<T>* stats) {
  const int64_t h = x.cols();
  stats->resize(x.rows(), 2);
  Mat<T> y(x.rows(), h);
  for (int64_t i = 0; i < x.rows(); ++i) {
    const T mean = x.row(i).sum() / T(h);
    const auto centered = (x.row(i).array() - mean).matrix().eval();
    const T r = T(1) / std::sqrt(centered.squaredNorm() / T(h) + T(eps));
    (*stats)(i, 0) = mean;
    (*stats)(i, 1) = r;
    y.row(i) = (centered * r).cwiseProduct(wb.row(0)) + wb.row(1);
  }
  return y;
}

template <class T>
Mat<T> LayerNormBackward(const Mat<T>& dy, const Mat<T>& x, const Mat<T>& stats, const Mat<T>& wb, Mat<T>* dwb) {
  // xhat = (x - mean) r, g = dy.w: dx = r (g - mean(g) - xhat mean(g.xhat));
  // dw = sum_tokens dy.xhat, db = sum_tokens dy.
  const int64_t h = x.cols();
  Mat<T> dx(x.rows(), h);
  for (int64_t i = 0; i < x.rows(); ++i) {
    const T r = stats(i, 1);
    const auto xhat = ((x.row(i).array() - stats(i, 0)) * r).matrix().eval();
    const auto g = dy.row(i).cwiseProduct(wb.row(0)).eval();
    const T mean_g = g.sum() / T(h), mean_gx = g.cwiseProduct(xhat).sum() / T(h);
    dx.row(i) = r * ((g.array() - mean_g).matrix() - xhat * mean_gx);
    dwb->row(0) += dy.row(i).cwiseProduct(xhat);
    dwb->row(1) += dy.row(i);
  }
  return dx;
}

template <class T>
std::unique_ptr<Param<T>> MakeNorm(const Ctx& ctx, const Dims& d, const std::string& prefix, uint64_t seed,
                                   double scale) {
  if (d.norm != NormKind::kLayerNorm) {
    return MakeParam<T>(ctx, prefix + ".weight", 1, d.hidden, ShardKind::kReplicated, Init::kNormWeight, seed, scale);
  }
  auto p = MakeParam<T>(ctx, prefix + ".weight_and_bias", 2, d.hidden, ShardKind::kReplicated, Init::kNormWeight, seed,
                        scale);
  p->value.m.row(1) = GlobalValue(prefix + ".bias", 1, d.hidden, Init::kMatrix, seed, scale).template cast<T>();
  p->row_tensors = true;
  return p;
}

template <class T>
Mat<T> NormForward(const Mat<T>& x, const Mat<T>& w, double eps, Mat<T>* stats) {
  return w.rows() == 2 ? LayerNormForward(x, w, eps, stats) : RmsNormForward(x, w, eps, stats);
}

template <class T>
Mat<T> NormBackward(const Mat<T>& dy, const Mat<T>& x, const Mat<T>& stats, const Mat<T>& w, Mat<T>* dw) {
  return w.rows() == 2 ? LayerNormBackward(dy, x, stats, w, dw) : RmsNormBackward(dy, x, stats, w, dw);
}

namespace {
/// The pre-norm's output and fp32 statistics (rstd, or mean and rstd) of
/// x, charged to `category`.
template <class T>
void PreNormInto(Ctx& ctx, SimCategory category, const Mat<T>& x, const Mat<T>& w, double eps, Tensor<T>* n,
                 Tensor<T>* stats) {
  Mat<T> s;
  *n = Tensor<T>(ctx.mem(), category, ctx.bytes.activation, NormForward(x, w, eps, &s));
  *stats = Tensor<T>(ctx.mem(), category, 4, std::move(s));
}
}  // namespace

template <class T>
void SavePreNorm(Ctx& ctx, const Mat<T>& x, const Mat<T>& w, double eps, Tensor<T>* saved_x, Tensor<T>* saved_n,
                 Tensor<T>* saved_stats, bool discarded) {
  *saved_x = Tensor<T>(ctx.mem(), SimCategory::kActivations, ctx.bytes.activation, x);
  PreNormInto(ctx, discarded ? SimCategory::kTemporaries : SimCategory::kActivations, x, w, eps, saved_n, saved_stats);
}

template <class T>
void RerunPreNorm(Ctx& ctx, const Mat<T>& x, const Mat<T>& w, double eps, Tensor<T>* n, Tensor<T>* stats) {
  PreNormInto(ctx, SimCategory::kRecomputed, x, w, eps, n, stats);
}

template <class T>
Tensor<T> TpRegionInput(Ctx& ctx, const Mat<T>& local) {
  return Tensor<T>(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, CopyToTpForward(ctx, local));
}

template <class T>
Mat<T> ColumnParallelBackward(Ctx& ctx, const Mat<T>& n, const std::vector<ColumnGrad<T>>& parts) {
  Tensor<T> n_full = TpRegionInput(ctx, n);
  for (const ColumnGrad<T>& p : parts) p.weight->grad.m += MatMulTransA(ctx, n_full.m, *p.dout);
  n_full.Release();
  Mat<T> dn = MatMulTransB(ctx, *parts.front().dout, parts.front().weight->value.m);
  for (size_t i = 1; i < parts.size(); ++i) dn += MatMulTransB(ctx, *parts[i].dout, parts[i].weight->value.m);
  return CopyToTpBackward(ctx, dn);
}

#define PREFLIGHT_INSTANTIATE(T)                                                                                      \
  template void PutShard<T>(ShardKind, const std::vector<int64_t>&, int, int, const Mat<T>&, Mat<T>*);                \
  template std::unique_ptr<Param<T>> MakeParam<T>(const Ctx&, const std::string&, int64_t, int64_t, ShardKind, Init,  \
                                                  uint64_t, double, int64_t, std::vector<int64_t>);                   \
  template Mat<T> MatMul<T>(Ctx&, const Mat<T>&, const Mat<T>&);                                                      \
  template Mat<T> MatMulTransB<T>(Ctx&, const Mat<T>&, const Mat<T>&);                                                \
  template Mat<T> MatMulTransA<T>(Ctx&, const Mat<T>&, const Mat<T>&);                                                \
  template Mat<T> CopyToTpForward<T>(Ctx&, const Mat<T>&);                                                            \
  template Mat<T> CopyToTpBackward<T>(Ctx&, const Mat<T>&);                                                           \
  template Mat<T> ReduceFromTpForward<T>(Ctx&, const Mat<T>&);                                                        \
  template Mat<T> ReduceFromTpBackward<T>(Ctx&, const Mat<T>&);                                                       \
  template Mat<T> RmsNormForward<T>(const Mat<T>&, const Mat<T>&, double, Mat<T>*);                                   \
  template Mat<T> RmsNormBackward<T>(const Mat<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&, Mat<T>*);            \
  template void SavePreNorm<T>(Ctx&, const Mat<T>&, const Mat<T>&, double, Tensor<T>*, Tensor<T>*, Tensor<T>*, bool); \
  template Mat<T> NormForward<T>(const Mat<T>&, const Mat<T>&, double, Mat<T>*);                                      \
  template Mat<T> NormBackward<T>(const Mat<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&, Mat<T>*);               \
  template std::unique_ptr<Param<T>> MakeNorm<T>(const Ctx&, const Dims&, const std::string&, uint64_t, double);      \
  template void RerunPreNorm<T>(Ctx&, const Mat<T>&, const Mat<T>&, double, Tensor<T>*, Tensor<T>*);                  \
  template Tensor<T> TpRegionInput<T>(Ctx&, const Mat<T>&);                                                           \
  template Mat<T> ColumnParallelBackward<T>(Ctx&, const Mat<T>&, const std::vector<ColumnGrad<T>>&);
PREFLIGHT_INSTANTIATE(double)
PREFLIGHT_INSTANTIATE(float)
#undef PREFLIGHT_INSTANTIATE

}  // namespace preflight::sim

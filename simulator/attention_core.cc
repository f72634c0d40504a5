// The attention core under context parallelism (see attention_core.h for
// the modes and their TransformerEngine sources). Everything here moves what
// the computation needs; the counters measure it (docs/architecture.md).
#include "attention_core.h"
#include "dropout.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace preflight::sim {
namespace {

using Positions = std::vector<int64_t>;

template <class T>
T NegInf() {
  return -std::numeric_limits<T>::infinity();
}

/// Rows of batch element `b` of head `h` of a tensor with `width` columns a
/// head (columns h*width ..).
template <class T>
Mat<T> Take(const AttnShape& s, const Mat<T>& m, int64_t b, int64_t h, int64_t width) {
  const int64_t len = m.rows() / s.batch;
  Mat<T> out(len, width);
  for (int64_t i = 0; i < len; ++i) out.row(i) = m.row(i * s.batch + b).segment(h * width, width);
  return out;
}

template <class T>
void Put(const AttnShape& s, Mat<T>* m, int64_t b, int64_t h, const Mat<T>& part, bool add) {
  const int64_t width = part.cols();
  for (int64_t i = 0; i < part.rows(); ++i) {
    auto dst = m->row(i * s.batch + b).segment(h * width, width);
    if (add) {
      dst += part.row(i);
    } else {
      dst = part.row(i);
    }
  }
}

/// Causal softmax probabilities of one head over the keys visible to each
/// query (kpos <= qpos, global positions); `lse` gets the row log-sum-exp,
/// -inf (and a zero row) when no key is visible.
template <class T>
Mat<T> Probs(Ctx& ctx, const AttnShape& shape, const Mat<T>& qh, const Mat<T>& kh, const Positions& qpos,
             const Positions& kpos, Mat<T>* lse) {
  const T inv = T(1) / std::sqrt(T(shape.head_dim));
  Mat<T> s = MatMulTransB(ctx, qh, kh) * inv;
  lse->resize(s.rows(), 1);
  for (int64_t a = 0; a < s.rows(); ++a) {
    const int64_t pa = qpos[static_cast<size_t>(a)];
    T mx = NegInf<T>();
    for (int64_t b = 0; b < s.cols(); ++b) {
      if (kpos[static_cast<size_t>(b)] <= pa) mx = std::max(mx, s(a, b));
    }
    if (mx == NegInf<T>()) {
      (*lse)(a, 0) = mx;
      s.row(a).setZero();
      continue;
    }
    T sum = 0;
    for (int64_t b = 0; b < s.cols(); ++b) {
      if (kpos[static_cast<size_t>(b)] <= pa) sum += std::exp(s(a, b) - mx);
    }
    (*lse)(a, 0) = mx + std::log(sum);
    for (int64_t b = 0; b < s.cols(); ++b) {
      s(a, b) = kpos[static_cast<size_t>(b)] <= pa ? std::exp(s(a, b) - (*lse)(a, 0)) : T(0);
    }
  }
  return s;
}

/// The same probabilities from a known row log-sum-exp (the flash backward:
/// with the final lse over all keys, exp(S - lse) is the true probability
/// even when only one block of keys is at hand).
template <class T>
Mat<T> ProbsGiven(Ctx& ctx, const AttnShape& shape, const Mat<T>& qh, const Mat<T>& kh, const Positions& qpos,
                  const Positions& kpos, const Vec<T>& lse) {
  const T inv = T(1) / std::sqrt(T(shape.head_dim));
  Mat<T> s = MatMulTransB(ctx, qh, kh) * inv;
  for (int64_t a = 0; a < s.rows(); ++a) {
    const int64_t pa = qpos[static_cast<size_t>(a)];
    for (int64_t b = 0; b < s.cols(); ++b) {
      s(a, b) = kpos[static_cast<size_t>(b)] <= pa ? std::exp(s(a, b) - lse(a)) : T(0);
    }
  }
  return s;
}

/// Adds one block of keys' gradient contributions (docs/formulas.md §8.1): dS =
/// P (dP - rowsum(dO O)), dq += dS k / sqrt(d_h), dk += dS^T q / sqrt(d_h)
/// (summed over the group's query heads), dv += P^T dO.
template <class T>
void AttendBlockBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Positions& qpos, const Mat<T>& k,
                         const Mat<T>& v, const Positions& kpos, const Mat<T>& o, const Mat<T>& lse,
                         const Mat<T>& dout, Mat<T>* dq, Mat<T>* dk, Mat<T>* dv) {
  const T inv = T(1) / std::sqrt(T(shape.head_dim));
  const int64_t heads = q.cols() / shape.head_dim;
  const int64_t len = q.rows() / shape.batch;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / shape.rep;
      const int64_t dk_h = shape.head_dim, dv_h = shape.vdim();
      const Mat<T> qh = Take(shape, q, b, h, dk_h), kh = Take(shape, k, b, g, dk_h), vh = Take(shape, v, b, g, dv_h);
      const Mat<T> oh = Take(shape, o, b, h, dv_h), doh = Take(shape, dout, b, h, dv_h);
      Vec<T> l(len);
      for (int64_t i = 0; i < len; ++i) l(i) = lse(i * shape.batch + b, h);
      const Mat<T> p = ProbsGiven(ctx, shape, qh, kh, qpos, kpos, l);
      const Mat<T> dp = MatMulTransB(ctx, doh, vh);
      Mat<T> ds(p.rows(), p.cols());
      for (int64_t a = 0; a < p.rows(); ++a) {
        const T delta = doh.row(a).dot(oh.row(a));
        ds.row(a) = p.row(a).cwiseProduct((dp.row(a).array() - delta).matrix());
      }
      Put(shape, dq, b, h, Mat<T>(MatMul(ctx, ds, kh) * inv), true);
      Put(shape, dk, b, g, Mat<T>(MatMulTransA(ctx, ds, qh) * inv), true);
      Put(shape, dv, b, g, MatMulTransA(ctx, p, doh), true);
    }
  }
}

/// Global positions of every CP rank's local positions, in member order:
/// the row order of a gathered or all-to-all'd whole-sequence tensor.
Positions AllPositions(const Ctx& ctx) {
  Positions out;
  for (int j = 0; j < ctx.cp_size; ++j) {
    const Positions p = PositionsOf(ctx.seq.seq, ctx.cp_size, j, ctx.seq.load_balanced);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

/// Global positions of this rank's `rows` / batch local positions (ctx.seq;
/// the identity when no CP layout is set).
Positions LocalPositions(const Ctx& ctx, const AttnShape& shape, int64_t rows) {
  Positions out(static_cast<size_t>(rows / shape.batch));
  for (size_t p = 0; p < out.size(); ++p) out[p] = ctx.seq.Position(static_cast<int64_t>(p));
  return out;
}

/// [K | V] in one buffer, the message TE's ring passes (p2p_comm_buffers).
template <class T>
Mat<T> Pack(const Mat<T>& k, const Mat<T>& v) {
  Mat<T> kv(k.rows(), k.cols() + v.cols());
  kv.leftCols(k.cols()) = k;
  kv.rightCols(v.cols()) = v;
  return kv;
}

/// Labels the CP collectives that follow; restores "attention" on exit.
class CpLabel {
 public:
  CpLabel(Ctx& ctx, CommWhat what) : ctx_(ctx) { ctx_.rank->set_what(what); }
  ~CpLabel() { ctx_.rank->set_what(CommWhat::kAttention); }
  CpLabel(const CpLabel&) = delete;
  CpLabel& operator=(const CpLabel&) = delete;

 private:
  Ctx& ctx_;
};

std::vector<int64_t> EqualCounts(int n, int64_t each) { return std::vector<int64_t>(static_cast<size_t>(n), each); }

// ---- p2p ring (AttnFuncWithCPAndKVP2P) --------------------------------------

/// The K,V blocks going round the CP ring (TE's p2p_comm_buffers): at step
/// i this rank holds the [K | V] block of CP rank r - i; SendOn passes it to
/// r + 1 and TakeNext receives the next from r - 1, except at the last step
/// (c - 1 sends per pass). Two buffers in flight (docs/formulas.md §3.4 CP transient).
template <class T>
class KvRing {
 public:
  KvRing(Ctx& ctx, const Mat<T>& k, const Mat<T>& v)
      : ctx_(ctx),
        next_(ctx.cp->members[static_cast<size_t>((ctx.cp_rank + 1) % ctx.cp_size)]),
        prev_(ctx.cp->members[static_cast<size_t>((ctx.cp_rank + ctx.cp_size - 1) % ctx.cp_size)]),
        k_cols_(k.cols()),
        kv_(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, Pack(k, v)),
        incoming_(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, Mat<T>(kv_.m.rows(), kv_.m.cols())) {}

  Mat<T> k() const { return kv_.m.leftCols(k_cols_); }
  Mat<T> v() const { return kv_.m.rightCols(kv_.m.cols() - k_cols_); }
  /// Global positions of the block held at step i.
  Positions KeyPositions(int i) const {
    const int source = (ctx_.cp_rank - i + ctx_.cp_size) % ctx_.cp_size;
    return PositionsOf(ctx_.seq.seq, ctx_.cp_size, source, ctx_.seq.load_balanced);
  }
  void SendOn(int i) {
    if (i + 1 < ctx_.cp_size) SendToNext(kv_.m);
  }
  void TakeNext(int i) {
    if (i + 1 >= ctx_.cp_size) return;
    RecvFromPrev(&incoming_.m);
    std::swap(kv_.m, incoming_.m);
  }
  /// A block-sized message to r + 1 / from r - 1 (the backward's dK,dV).
  void SendToNext(const Mat<T>& m) {
    ctx_.rank->Send(Axis::kCp, next_, m.data(), static_cast<int64_t>(m.size()), ctx_.bytes.activation);
  }
  void RecvFromPrev(Mat<T>* m) {
    ctx_.rank->Recv(Axis::kCp, prev_, m->data(), static_cast<int64_t>(m->size()), ctx_.bytes.activation);
  }

 private:
  Ctx& ctx_;
  int next_ = 0, prev_ = 0;  // global ranks of the ring neighbours
  int64_t k_cols_ = 0;
  Tensor<T> kv_, incoming_;
};

/// Step i attends the local queries to the K,V block of rank r - i, then
/// sends that block on to r + 1 (c - 1 sends of K_c) and takes the next
/// from r - 1; the partial outputs merge by the log-sum-exp rule.
template <class T>
void RingForward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v, Mat<T>* o,
                 Mat<T>* lse) {
  CpLabel label(ctx, CommWhat::kAttentionKv);
  const Positions qpos = LocalPositions(ctx, shape, q.rows());
  KvRing<T> ring(ctx, k, v);
  const int64_t heads = q.cols() / shape.head_dim;
  *o = Mat<T>::Zero(q.rows(), heads * shape.vdim());
  *lse = Mat<T>::Constant(q.rows(), heads, NegInf<T>());
  for (int i = 0; i < ctx.cp_size; ++i) {
    ring.SendOn(i);
    Mat<T> o_i, lse_i;
    AttendBlock(ctx, shape, q, qpos, ring.k(), ring.v(), ring.KeyPositions(i), &o_i, &lse_i);
    MergeAttention(shape, o_i, lse_i, o, lse);
    ring.TakeNext(i);
  }
}

/// The backward ring: the K,V blocks go round again (c - 1 sends) and each
/// block's dK,dV accumulates along the ranks that attended to it and returns
/// to its owner (c - 1 sends): the owner keeps its own contribution; ranks
/// r+1 .. r+c-1 add theirs in turn, the last sending the sum home.
template <class T>
void RingBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                  const Mat<T>& lse, const Mat<T>& o, const Mat<T>& dout, Mat<T>* dq, Mat<T>* dk, Mat<T>* dv) {
  CpLabel label(ctx, CommWhat::kAttentionKv);
  const Positions qpos = LocalPositions(ctx, shape, q.rows());
  KvRing<T> ring(ctx, k, v);
  const int64_t kw = k.cols(), vw = v.cols();
  Tensor<T> dkv_in(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, Mat<T>(k.rows(), kw + vw));
  *dq = Mat<T>::Zero(q.rows(), q.cols());
  Mat<T> own;  // this rank's contribution to its own dK,dV
  for (int i = 0; i < ctx.cp_size; ++i) {
    ring.SendOn(i);
    Mat<T> dk_i = Mat<T>::Zero(k.rows(), kw), dv_i = Mat<T>::Zero(v.rows(), vw);
    AttendBlockBackward(ctx, shape, q, qpos, ring.k(), ring.v(), ring.KeyPositions(i), o, lse, dout, dq, &dk_i, &dv_i);
    Mat<T> dkv_i = Pack(dk_i, dv_i);
    if (i == 0) {
      own = std::move(dkv_i);
    } else {
      if (i >= 2) {  // what ranks src+1 .. r-1 accumulated for this block
        ring.RecvFromPrev(&dkv_in.m);
        dkv_i += dkv_in.m;
      }
      ring.SendToNext(dkv_i);
    }
    ring.TakeNext(i);
  }
  if (ctx.cp_size > 1) {  // this rank's block comes home with everyone else's share
    ring.RecvFromPrev(&dkv_in.m);
    own += dkv_in.m;
  }
  *dk = own.leftCols(kw);
  *dv = own.rightCols(vw);
}

// ---- all-gather (AttnFuncWithCPAndKVAllGather) ------------------------------

/// Every CP rank's [K | V], in member order.
template <class T>
Mat<T> GatherKv(Ctx& ctx, const Mat<T>& k, const Mat<T>& v) {
  const Mat<T> local = Pack(k, v);
  Mat<T> all(local.rows() * ctx.cp_size, local.cols());
  ctx.rank->AllGather(*ctx.cp, local.data(), all.data(), EqualCounts(ctx.cp_size, static_cast<int64_t>(local.size())),
                      ctx.bytes.activation);
  return all;
}

template <class T>
void GatherForward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v, Mat<T>* o,
                   Mat<T>* lse) {
  CpLabel label(ctx, CommWhat::kAttentionKv);
  Tensor<T> all(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, GatherKv(ctx, k, v));
  AttendBlock(ctx, shape, q, LocalPositions(ctx, shape, q.rows()), Mat<T>(all.m.leftCols(k.cols())),
              Mat<T>(all.m.rightCols(v.cols())), AllPositions(ctx), o, lse);
}

/// TE keeps only the local K,V: gather them again, then reduce-scatter the
/// whole-sequence dK,dV so each rank gets the sum for its own positions.
template <class T>
void GatherBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                    const Mat<T>& lse, const Mat<T>& o, const Mat<T>& dout, Mat<T>* dq, Mat<T>* dk, Mat<T>* dv) {
  CpLabel label(ctx, CommWhat::kAttentionKv);
  const int64_t ab = ctx.bytes.activation;
  Tensor<T> all(ctx.mem(), SimCategory::kTemporaries, ab, GatherKv(ctx, k, v));
  const int64_t kw = k.cols(), vw = v.cols();
  *dq = Mat<T>::Zero(q.rows(), q.cols());
  Mat<T> dk_all = Mat<T>::Zero(all.m.rows(), kw), dv_all = Mat<T>::Zero(all.m.rows(), vw);
  AttendBlockBackward(ctx, shape, q, LocalPositions(ctx, shape, q.rows()), Mat<T>(all.m.leftCols(kw)),
                      Mat<T>(all.m.rightCols(vw)), AllPositions(ctx), o, lse, dout, dq, &dk_all, &dv_all);
  Tensor<T> dkv_all(ctx.mem(), SimCategory::kTemporaries, ab, Pack(dk_all, dv_all));
  Mat<T> dkv(k.rows(), kw + vw);
  ctx.rank->ReduceScatter(*ctx.cp, dkv_all.m.data(), dkv.data(),
                          EqualCounts(ctx.cp_size, static_cast<int64_t>(dkv.size())), ab);
  *dk = dkv.leftCols(kw);
  *dv = dkv.rightCols(vw);
}

// ---- a2a, Ulysses (AttnFuncWithCPAndQKVOA2A) --------------------------------

/// Sequence split -> head split: this rank's rows of every head group go to
/// the group's CP rank; it receives every rank's rows of its own group of
/// `heads` heads of `width` columns (member order: the AllPositions row order).
template <class T>
Mat<T> ToHeads(Ctx& ctx, const Mat<T>& local, int64_t heads, int64_t width) {
  const int c = ctx.cp_size;
  const int64_t w = heads * width, rows = local.rows();
  Tensor<T> send(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, Mat<T>(rows * c, w));
  for (int j = 0; j < c; ++j) send.m.middleRows(j * rows, rows) = local.middleCols(j * w, w);
  Mat<T> out(rows * c, w);
  const std::vector<int64_t> counts = EqualCounts(c, rows * w);
  ctx.rank->AllToAll(*ctx.cp, send.m.data(), counts, out.data(), counts, ctx.bytes.activation);
  return out;
}

/// Head split -> sequence split: the rows of rank j go back to rank j; this
/// rank's rows of group j land in group j's columns.
template <class T>
Mat<T> ToSequence(Ctx& ctx, const Mat<T>& split, int64_t heads, int64_t width) {
  const int c = ctx.cp_size;
  const int64_t w = heads * width, rows = split.rows() / c;
  Tensor<T> recv(ctx.mem(), SimCategory::kTemporaries, ctx.bytes.activation, Mat<T>(rows * c, w));
  const std::vector<int64_t> counts = EqualCounts(c, rows * w);
  ctx.rank->AllToAll(*ctx.cp, split.data(), counts, recv.m.data(), counts, ctx.bytes.activation);
  Mat<T> local(rows, w * c);
  for (int j = 0; j < c; ++j) local.middleCols(j * w, w) = recv.m.middleRows(j * rows, rows);
  return local;
}

template <class T>
Mat<T> UlyssesForward(Ctx& ctx, const AttnShape& shape, Mat<T> q, Mat<T> k, Mat<T> v, AttnState<T>* state) {
  CpLabel label(ctx, CommWhat::kAttentionQkvo);
  const int64_t hq = q.cols() / shape.head_dim / ctx.cp_size, hkv = k.cols() / shape.head_dim / ctx.cp_size;
  const int64_t dk = shape.head_dim, dv = shape.vdim();
  state->q = ToHeads(ctx, q, hq, dk);
  state->k = ToHeads(ctx, k, hkv, dk);
  state->v = ToHeads(ctx, v, hkv, dv);
  const Positions all = AllPositions(ctx);
  Mat<T> o_heads;
  AttendBlock(ctx, shape, state->q, all, state->k, state->v, all, &o_heads, &state->lse);
  return ToSequence(ctx, o_heads, hq, dv);
}

/// TE saves O on the sequence split: O and dO go to the head split, the
/// attention backward runs there, and dQ, dK, dV come back.
template <class T>
void UlyssesBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                     const Mat<T>& lse, const Mat<T>& o, const Mat<T>& dout, Mat<T>* dq, Mat<T>* dk, Mat<T>* dv) {
  CpLabel label(ctx, CommWhat::kAttentionQkvo);
  const int64_t hq = q.cols() / shape.head_dim, hkv = k.cols() / shape.head_dim;
  const int64_t ab = ctx.bytes.activation, wk = shape.head_dim, wv = shape.vdim();
  Tensor<T> o_heads(ctx.mem(), SimCategory::kTemporaries, ab, ToHeads(ctx, o, hq, wv));
  Tensor<T> do_heads(ctx.mem(), SimCategory::kTemporaries, ab, ToHeads(ctx, dout, hq, wv));
  Mat<T> dq_h = Mat<T>::Zero(q.rows(), q.cols()), dk_h = Mat<T>::Zero(k.rows(), k.cols()),
         dv_h = Mat<T>::Zero(v.rows(), v.cols());
  const Positions all = AllPositions(ctx);
  AttendBlockBackward(ctx, shape, q, all, k, v, all, o_heads.m, lse, do_heads.m, &dq_h, &dk_h, &dv_h);
  *dq = ToSequence(ctx, dq_h, hq, wk);
  *dk = ToSequence(ctx, dk_h, hkv, wk);
  *dv = ToSequence(ctx, dv_h, hkv, wv);
}

}  // namespace

std::vector<int64_t> PositionsOf(int64_t seq, int cp_size, int cp_rank, bool load_balanced) {
  const SeqLayout s = SeqLayout::Make(seq, cp_size, cp_rank, load_balanced);
  Positions out(static_cast<size_t>(s.local_len()));
  for (int64_t p = 0; p < s.local_len(); ++p) out[static_cast<size_t>(p)] = s.Position(p);
  return out;
}

void CheckAttentionCp(const Dims& d, int tp, int cp, CpComm comm, bool load_balanced) {
  if (cp <= 1) return;
  const int64_t chunks = load_balanced ? 2 * cp : cp;
  if (d.seq % chunks != 0) {
    throw SimUnsupported("context parallelism cuts the sequence into " + std::to_string(chunks) +
                         " chunks; the scaled sequence length " + std::to_string(d.seq) + " does not divide");
  }
  if (comm == CpComm::kA2a && ((d.heads / tp) % cp != 0 || (d.kv_heads / tp) % cp != 0)) {
    throw SimUnsupported("cp_comm a2a (Ulysses) splits the attention heads over cp = " + std::to_string(cp) +
                         ": heads/tp = " + std::to_string(d.heads / tp) + " and kv_heads/tp = " +
                         std::to_string(d.kv_heads / tp) + " must both be divisible by it");
  }
}

template <class T>
void AttendBlock(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const std::vector<int64_t>& qpos, const Mat<T>& k,
                 const Mat<T>& v, const std::vector<int64_t>& kpos, Mat<T>* o, Mat<T>* lse) {
  const int64_t heads = q.cols() / shape.head_dim;
  o->resize(q.rows(), heads * shape.vdim());
  lse->resize(q.rows(), heads);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / shape.rep;
      Mat<T> l;
      const Mat<T> p =
          Probs(ctx, shape, Take(shape, q, b, h, shape.head_dim), Take(shape, k, b, g, shape.head_dim), qpos, kpos, &l);
      Put(shape, o, b, h, MatMul(ctx, p, Take(shape, v, b, g, shape.vdim())), false);
      for (int64_t i = 0; i < l.rows(); ++i) (*lse)(i * shape.batch + b, h) = l(i, 0);
    }
  }
}

template <class T>
void MergeAttention(const AttnShape& shape, const Mat<T>& o_i, const Mat<T>& lse_i, Mat<T>* o, Mat<T>* lse) {
  for (int64_t row = 0; row < lse->rows(); ++row) {
    for (int64_t h = 0; h < lse->cols(); ++h) {
      const T a = (*lse)(row, h), b = lse_i(row, h);
      if (b == NegInf<T>()) continue;  // this block hides every key from the row
      const int64_t w = shape.vdim();
      auto dst = o->row(row).segment(h * w, w);
      const auto src = o_i.row(row).segment(h * w, w);
      if (a == NegInf<T>()) {
        dst = src;
        (*lse)(row, h) = b;
        continue;
      }
      const T hi = std::max(a, b), lo = std::min(a, b);
      const T merged = hi + std::log1p(std::exp(lo - hi));
      dst = dst * std::exp(a - merged) + src * std::exp(b - merged);
      (*lse)(row, h) = merged;
    }
  }
}

template <class T>
Mat<T> AttentionCoreForward(Ctx& ctx, const AttnShape& shape, Mat<T> q, Mat<T> k, Mat<T> v, AttnState<T>* state) {
  Mat<T> o;
  if (ctx.cp_size <= 1 || ctx.cp_comm == CpComm::kP2p || ctx.cp_comm == CpComm::kAllGather) {
    if (ctx.cp_size <= 1) {
      const Positions pos = LocalPositions(ctx, shape, q.rows());
      AttendBlock(ctx, shape, q, pos, k, v, pos, &o, &state->lse);
    } else if (ctx.cp_comm == CpComm::kP2p) {
      RingForward(ctx, shape, q, k, v, &o, &state->lse);
    } else {
      GatherForward(ctx, shape, q, k, v, &o, &state->lse);
    }
    state->q = std::move(q);
    state->k = std::move(k);
    state->v = std::move(v);
    return o;
  }
  return UlyssesForward(ctx, shape, std::move(q), std::move(k), std::move(v), state);
}

template <class T>
void AttentionCoreBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                           const Mat<T>& lse, const Mat<T>& o, const Mat<T>& dout, Mat<T>* dq, Mat<T>* dk, Mat<T>* dv) {
  if (ctx.cp_size <= 1) {
    const Positions pos = LocalPositions(ctx, shape, q.rows());
    *dq = Mat<T>::Zero(q.rows(), q.cols());
    *dk = Mat<T>::Zero(k.rows(), k.cols());
    *dv = Mat<T>::Zero(v.rows(), v.cols());
    AttendBlockBackward(ctx, shape, q, pos, k, v, pos, o, lse, dout, dq, dk, dv);
    return;
  }
  switch (ctx.cp_comm) {
    case CpComm::kP2p: return RingBackward(ctx, shape, q, k, v, lse, o, dout, dq, dk, dv);
    case CpComm::kAllGather: return GatherBackward(ctx, shape, q, k, v, lse, o, dout, dq, dk, dv);
    case CpComm::kA2a: return UlyssesBackward(ctx, shape, q, k, v, lse, o, dout, dq, dk, dv);
  }
}

template <class T>
void RerunAttentionCore(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v, Mat<T>* o,
                        Tensor<T>* lse, Tensor<T>* qc, Tensor<T>* kc, Tensor<T>* vc) {
  const SimCategory rerun = SimCategory::kRecomputed;
  const int64_t ab = ctx.bytes.activation;
  AttnState<T> core;
  *o = AttentionCoreForward(ctx, shape, q, k, v, &core);
  if (ctx.cp_size > 1 && ctx.cp_comm == CpComm::kA2a) {
    *qc = Tensor<T>(ctx.mem(), rerun, ab, std::move(core.q));
    *kc = Tensor<T>(ctx.mem(), rerun, ab, std::move(core.k));
    *vc = Tensor<T>(ctx.mem(), rerun, ab, std::move(core.v));
  }
  *lse = Tensor<T>(ctx.mem(), rerun, 4, std::move(core.lse));
}

template <class T>
Mat<T> UnfusedAttentionForward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                               Mat<T>* probs, const AttnDropout* drop, Mat<T>* mask, Mat<T>* dropped) {
  const int64_t heads = q.cols() / shape.head_dim, len = q.rows() / shape.batch;
  const Positions pos = LocalPositions(ctx, shape, q.rows());
  Mat<T> o(q.rows(), heads * shape.vdim());
  probs->resize(shape.batch * heads * len, len);
  if (drop != nullptr) {
    mask->resize(probs->rows(), len);
    dropped->resize(probs->rows(), len);
  }
  const T scale = T(DropoutScale(ctx));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      Mat<T> lse;  // the unfused softmax keeps its output, not this
      const Mat<T> p =
          Probs(ctx, shape, Take(shape, q, b, h, shape.head_dim), Take(shape, k, b, h, shape.head_dim), pos, pos, &lse);
      probs->middleRows((b * heads + h) * len, len) = p;
      if (drop == nullptr) {
        Put(shape, &o, b, h, MatMul(ctx, p, Take(shape, v, b, h, shape.vdim())), false);
        continue;
      }
      Mat<T> m(len, len);
      const int64_t head = b * drop->heads + drop->first_head + h;  // global (batch row, head)
      for (int64_t i = 0; i < len; ++i) {
        for (int64_t j = 0; j < len; ++j) {
          const bool keep = DropoutKeeps(ctx, DropoutSite::kAttention, drop->layer, head, pos[static_cast<size_t>(i)],
                                         pos[static_cast<size_t>(j)]);
          m(i, j) = keep ? scale : T(0);
        }
      }
      const Mat<T> pd = p.cwiseProduct(m);
      Put(shape, &o, b, h, MatMul(ctx, pd, Take(shape, v, b, h, shape.vdim())), false);
      mask->middleRows((b * heads + h) * len, len) = m;
      dropped->middleRows((b * heads + h) * len, len) = pd;
    }
  }
  return o;
}

template <class T>
void UnfusedAttentionBackward(Ctx& ctx, const AttnShape& shape, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                              const Mat<T>& probs, const Mat<T>* mask, const Mat<T>* dropped, const Mat<T>& dout,
                              Mat<T>* dq, Mat<T>* dk, Mat<T>* dv) {
  const T inv = T(1) / std::sqrt(T(shape.head_dim));
  const int64_t heads = q.cols() / shape.head_dim, len = q.rows() / shape.batch;
  *dq = Mat<T>::Zero(q.rows(), q.cols());
  *dk = Mat<T>::Zero(k.rows(), k.cols());
  *dv = Mat<T>::Zero(v.rows(), v.cols());
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const Mat<T> p = probs.middleRows((b * heads + h) * len, len);
      const Mat<T> doh = Take(shape, dout, b, h, shape.vdim());
      Mat<T> dp = MatMulTransB(ctx, doh, Take(shape, v, b, h, shape.vdim()));
      // With dropout the bmm read the dropped probabilities p * m: dp goes
      // back through the mask, and dV comes from the dropped ones.
      if (mask != nullptr) dp = dp.cwiseProduct(mask->middleRows((b * heads + h) * len, len));
      const Mat<T> pv = mask != nullptr ? Mat<T>(dropped->middleRows((b * heads + h) * len, len)) : p;
      const Vec<T> rowsum = dp.cwiseProduct(p).rowwise().sum();
      const Mat<T> ds = p.cwiseProduct((dp.colwise() - rowsum).matrix());
      Put(shape, dq, b, h, Mat<T>(MatMul(ctx, ds, Take(shape, k, b, h, shape.head_dim)) * inv), true);
      Put(shape, dk, b, h, Mat<T>(MatMulTransA(ctx, ds, Take(shape, q, b, h, shape.head_dim)) * inv), true);
      Put(shape, dv, b, h, MatMulTransA(ctx, pv, doh), true);
    }
  }
}

#define PREFLIGHT_INSTANTIATE(T)                                                                                    \
  template void RerunAttentionCore<T>(Ctx&, const AttnShape&, const Mat<T>&, const Mat<T>&, const Mat<T>&, Mat<T>*, \
                                      Tensor<T>*, Tensor<T>*, Tensor<T>*, Tensor<T>*);                              \
  template Mat<T> AttentionCoreForward<T>(Ctx&, const AttnShape&, Mat<T>, Mat<T>, Mat<T>, AttnState<T>*);           \
  template void AttentionCoreBackward<T>(Ctx&, const AttnShape&, const Mat<T>&, const Mat<T>&, const Mat<T>&,       \
                                         const Mat<T>&, const Mat<T>&, const Mat<T>&, Mat<T>*, Mat<T>*, Mat<T>*);   \
  template void AttendBlock<T>(Ctx&, const AttnShape&, const Mat<T>&, const std::vector<int64_t>&, const Mat<T>&,   \
                               const Mat<T>&, const std::vector<int64_t>&, Mat<T>*, Mat<T>*);                       \
  template void MergeAttention<T>(const AttnShape&, const Mat<T>&, const Mat<T>&, Mat<T>*, Mat<T>*);                \
  template Mat<T> UnfusedAttentionForward<T>(Ctx&, const AttnShape&, const Mat<T>&, const Mat<T>&, const Mat<T>&,   \
                                             Mat<T>*, const AttnDropout*, Mat<T>*, Mat<T>*);                        \
  template void UnfusedAttentionBackward<T>(Ctx&, const AttnShape&, const Mat<T>&, const Mat<T>&, const Mat<T>&,    \
                                            const Mat<T>&, const Mat<T>*, const Mat<T>*, const Mat<T>&, Mat<T>*,    \
                                            Mat<T>*, Mat<T>*);
PREFLIGHT_INSTANTIATE(double)
PREFLIGHT_INSTANTIATE(float)
#undef PREFLIGHT_INSTANTIATE

}  // namespace preflight::sim

// Runs one block of the reference executor on tp x cp simulated ranks and
// assembles global results, for block-level equivalence tests (sharded ==
// one rank, docs/formulas.md §8.3). Header-only: only simulator tests, which see the
// executor's internal headers and Eigen, include it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "blocks.h"
#include "world.h"

namespace preflight::sim::testing {

struct BlockLayout {
  int tp = 1, cp = 1;
  bool sp = false;
  CpComm cp_comm = CpComm::kP2p;
  CpRecurrent cp_recurrent = CpRecurrent::kAllToAll;
  bool load_balance = true;
  int world() const { return tp * cp; }
};

struct BlockRun {
  Mat<double> y, dx;                            // global row order (row = position * batch + b)
  std::map<std::string, Mat<double>> grads;     // global tensors, summed over CP (and over TP for REP under SP)
  std::vector<std::vector<CommCount>> comm;     // per rank; rank = tp_index + tp * cp_index
  std::vector<int64_t> activation_peak;         // per rank, modeled bytes
};

/// The rows a rank holds: its CP positions (`seq`), `batch` rows each, then
/// under SP its 1/tp slice of those rows.
inline Mat<double> LocalRows(const Mat<double>& global, const SeqLayout& seq, int64_t batch, bool sp, int tp,
                             int tp_rank) {
  Mat<double> cp_rows(seq.local_len() * batch, global.cols());
  for (int64_t p = 0; p < seq.local_len(); ++p) {
    for (int64_t b = 0; b < batch; ++b) cp_rows.row(p * batch + b) = global.row(seq.Position(p) * batch + b);
  }
  if (!sp) return cp_rows;
  const int64_t n = cp_rows.rows() / tp;
  return cp_rows.middleRows(tp_rank * n, n);
}

/// Writes a rank's rows (LocalRows layout) back into `global`.
inline void PutLocalRows(const Mat<double>& local, const SeqLayout& seq, int64_t batch, bool sp, int tp, int tp_rank,
                         Mat<double>* global) {
  const int64_t per_rank = sp ? seq.local_len() * batch / tp : seq.local_len() * batch;
  for (int64_t i = 0; i < local.rows(); ++i) {
    const int64_t r = (sp ? tp_rank * per_rank : 0) + i;
    global->row(seq.Position(r / batch) * batch + r % batch) = local.row(i);
  }
}

/// Makes one rank's block (layer 0) from its context.
using BlockFactory = std::function<std::unique_ptr<Block<double>>(Ctx& ctx, const Dims& d, uint64_t seed, double scale)>;

/// Forward + backward of the block `make` builds on l.world() ranks with
/// input `x` and output gradient `dy` (global rows), micro-batch 0.
inline BlockRun RunBlockWith(const BlockFactory& make, const Dims& d, const BlockLayout& l, const Mat<double>& x,
                             const Mat<double>& dy, uint64_t seed = 7, double scale = 0.8) {
  const int n = l.world();
  World world(n);
  std::vector<const Group*> tp_of(static_cast<size_t>(n)), cp_of(static_cast<size_t>(n)), one_of(static_cast<size_t>(n));
  for (int c = 0; c < l.cp; ++c) {
    std::vector<int> m;
    for (int t = 0; t < l.tp; ++t) m.push_back(t + l.tp * c);
    const Group& g = world.NewGroup(Axis::kTp, m);
    for (int r : m) tp_of[static_cast<size_t>(r)] = &g;
  }
  for (int t = 0; t < l.tp; ++t) {
    std::vector<int> m;
    for (int c = 0; c < l.cp; ++c) m.push_back(t + l.tp * c);
    const Group& g = world.NewGroup(Axis::kCp, m);
    for (int r : m) cp_of[static_cast<size_t>(r)] = &g;
  }
  for (int r = 0; r < n; ++r) one_of[static_cast<size_t>(r)] = &world.NewGroup(Axis::kEp, {r});

  struct Out {
    Mat<double> y, dx;
    std::map<std::string, std::pair<Param<double>*, Mat<double>>> grads;
  };
  std::vector<Out> outs(static_cast<size_t>(n));
  std::vector<std::unique_ptr<Block<double>>> blocks(static_cast<size_t>(n));
  const bool sp = l.sp && l.tp > 1;
  world.Run([&](Rank& rank) {
    const int r = rank.id(), t = r % l.tp, c = r / l.tp;
    Ctx ctx;
    ctx.rank = &rank;
    ctx.tp = tp_of[static_cast<size_t>(r)];
    ctx.cp = cp_of[static_cast<size_t>(r)];
    ctx.ep = ctx.etp = ctx.edp = one_of[static_cast<size_t>(r)];
    ctx.tp_rank = t;
    ctx.tp_size = l.tp;
    ctx.cp_rank = c;
    ctx.cp_size = l.cp;
    ctx.sp = sp;
    ctx.cp_comm = l.cp_comm;
    ctx.cp_recurrent = l.cp_recurrent;
    ctx.seq = SeqLayout::Make(d.seq, l.cp, c, l.load_balance);
    auto& block = blocks[static_cast<size_t>(r)];
    block = make(ctx, d, seed, scale);
    Out& o = outs[static_cast<size_t>(r)];
    rank.set_pass(Pass::kForward);
    o.y = block->Forward(ctx, LocalRows(x, ctx.seq, d.batch, sp, l.tp, t));
    rank.set_pass(Pass::kBackward);
    o.dx = block->Backward(ctx, LocalRows(dy, ctx.seq, d.batch, sp, l.tp, t));
    for (Param<double>* p : block->params()) o.grads[p->name] = {p, p->grad.m};
  });

  BlockRun run;
  run.y = Mat<double>::Zero(x.rows(), x.cols());
  run.dx = Mat<double>::Zero(x.rows(), x.cols());
  for (int r = 0; r < n; ++r) {
    const int t = r % l.tp, c = r / l.tp;
    const SeqLayout seq = SeqLayout::Make(d.seq, l.cp, c, l.load_balance);
    PutLocalRows(outs[static_cast<size_t>(r)].y, seq, d.batch, sp, l.tp, t, &run.y);
    PutLocalRows(outs[static_cast<size_t>(r)].dx, seq, d.batch, sp, l.tp, t, &run.dx);
    run.comm.push_back(world.rank(r).Counts());
    run.activation_peak.push_back(world.rank(r).memory().peak(SimCategory::kActivations));
  }
  for (const auto& [name, first] : outs[0].grads) {
    const Param<double>& p = *first.first;
    Mat<double> sum = Mat<double>::Zero(p.rows, p.cols);
    for (int c = 0; c < l.cp; ++c) {
      std::vector<const Mat<double>*> shards;
      for (int t = 0; t < l.tp; ++t) shards.push_back(&outs[static_cast<size_t>(t + l.tp * c)].grads.at(name).second);
      if (p.shard != ShardKind::kReplicated) {
        sum += AssembleShards(p.shard, p.rows, p.cols, p.segments, shards);
      } else if (sp) {
        for (const Mat<double>* s : shards) sum += *s;  // partial over each rank's SP rows
      } else {
        sum += *shards[0];  // every TP rank saw all rows
      }
    }
    run.grads[name] = sum;
  }
  return run;
}

/// RunBlockWith for block `letter` of MakeBlock.
inline BlockRun RunBlock(char letter, const Dims& d, const BlockLayout& l, const Mat<double>& x, const Mat<double>& dy,
                         uint64_t seed = 7, double scale = 0.8) {
  const BlockFactory make = [letter](Ctx& ctx, const Dims& dims, uint64_t s, double sc) {
    return MakeBlock<double>(letter, ctx, dims, 0, s, sc);
  };
  return RunBlockWith(make, d, l, x, dy, seed, scale);
}

}  // namespace preflight::sim::testing

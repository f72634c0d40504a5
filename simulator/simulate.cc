// The verifier: runs one forward + backward of a (scaled) recipe on the
// layout's simulated ranks and on one unsharded rank, gathers the shards and
// compares (MATH.md 8.3, "Equivalence tests").
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "blocks.h"
#include "preflight/sim.h"

namespace preflight {
namespace sim {
namespace {

std::vector<char> LayerLetters(const Recipe& r) {
  std::vector<char> out;
  for (BlockKind k : r.model.layers) out.push_back(Letter(k));
  if (out.empty()) {
    for (int64_t i = 0; i < r.model.repeat; ++i) {
      for (char c : r.model.pattern) out.push_back(c);
    }
  }
  return out;
}

/// Layout of part 1: pp = cp = dp = 1, so the world is the TP group and the
/// expert groups fold inside it (MATH.md 7.3: i_etp = i mod t_e,
/// i_ep = (i / t_e) mod e, i_edp = i / (t_e e)).
struct Topology {
  int tp = 1, ep = 1, etp = 1, edp = 1;
  bool sp = false;
  int64_t vocab_tp = 1;  // the layout's TP degree, for vocabulary padding (same in the reference)
  int EtpRank(int i) const { return i % etp; }
  int EpRank(int i) const { return (i / etp) % ep; }
  int EdpRank(int i) const { return i / (etp * ep); }
  int RankOf(int etp_rank, int ep_rank, int edp_rank) const { return etp_rank + etp * (ep_rank + ep * edp_rank); }
};

void Require(bool ok, const std::string& why) {
  if (!ok) throw SimUnsupported(why);
}

Topology CheckSupported(const Recipe& r, const std::vector<char>& letters) {
  const ParallelConfig& p = r.parallel;
  Require(p.pp == 1, "the executor runs pp = 1 only (pipeline stages are part 2); got parallel.pp = " + std::to_string(p.pp));
  Require(p.cp == 1, "the executor runs cp = 1 only (context parallel is part 2); got parallel.cp = " + std::to_string(p.cp));
  Require(r.world() == p.tp * p.cp * p.pp,
          "the executor runs dp = 1 only (data parallel is part 2): the world (cluster.nodes x gpus_per_node = " +
              std::to_string(r.world()) + ") must equal parallel.tp = " + std::to_string(p.tp));
  Require(!r.model.mla.has_value(), "MLA attention is not in the executor yet");
  Require(!r.model.tie_embeddings, "tied embeddings are not in the executor yet (set model.tie_embeddings: false)");
  Require(p.tp >= 1 && p.tp <= 64, "parallel.tp must be in 1..64 for the executor");
  Require(r.model.norm == NormKind::kRmsNorm, "only RMSNorm is in the executor (model.norm)");
  Require(r.training.dropout == 0.0, "dropout is not in the executor (training.dropout must be 0)");
  Require(r.training.flash_attention,
          "the executor saves what flash attention saves (q, k, v, out, lse); set training.flash_attention: true");
  Require(!r.model.attention.qk_norm, "qk_norm is not in the executor yet");
  bool has_moe = false;
  for (char c : letters) {
    Require(c == 'A' || c == 'D' || c == 'E',
            std::string("block '") + c + "' is not in the executor yet (part 1 runs A, D and E blocks)");
    has_moe = has_moe || c == 'E';
  }
  const ModelConfig& m = r.model;
  Require(m.attention.heads % p.tp == 0 && m.attention.kv_heads % p.tp == 0,
          "attention heads and kv_heads must be divisible by parallel.tp");
  Require(m.attention.heads % m.attention.kv_heads == 0, "attention.heads must be a multiple of kv_heads");
  Require(m.attention.head_dim % 2 == 0, "attention.head_dim must be even (RoPE rotates halves)");
  Require(m.mlp.ffn_hidden % p.tp == 0, "mlp.ffn_hidden must be divisible by parallel.tp");
  Require(m.mlp.activation == FfnActivation::kSwiglu, "only the SwiGLU MLP is in the executor (mlp.activation)");
  Topology t;
  t.tp = static_cast<int>(p.tp);
  t.sp = p.sp && p.tp > 1;
  t.vocab_tp = p.tp;
  if (has_moe) {
    Require(m.moe.router == RouterScore::kSoftmax, "only the softmax router is in the executor yet");
    Require(!m.moe.router_bias && !m.moe.shared_gate, "router bias and the shared-expert gate are not in the executor yet");
    Require(p.tp == 1 || t.sp, "MoE with tp > 1 needs sequence parallel (Megatron requires it)");
    Require(m.moe.experts % p.ep == 0, "moe.experts must be divisible by parallel.ep");
    Require(m.moe.ffn_hidden % p.expert_tp == 0, "moe.ffn_hidden must be divisible by parallel.expert_tp");
    Require(p.tp % (p.ep * p.expert_tp) == 0,
            "with dp = 1 the expert groups fold inside TP: parallel.ep x expert_tp must divide parallel.tp");
    Require(m.moe.SharedWidth() % p.tp == 0, "the shared expert width must be divisible by parallel.tp");
    Require(m.moe.top_k >= 1 && m.moe.top_k <= m.moe.experts, "moe.top_k must be in 1..experts");
    t.ep = static_cast<int>(p.ep);
    t.etp = static_cast<int>(p.expert_tp);
  }
  // The expert groups fold inside TP (dp = 1): without MoE layers ep = etp = 1
  // and every rank is its own expert-data-parallel peer, so the groups still
  // cover every rank (they carry no traffic then).
  t.edp = t.tp / (t.ep * t.etp);
  if (t.sp) Require(r.training.seq_len * r.training.micro_batch % p.tp == 0, "seq_len must be divisible by parallel.tp with SP");
  return t;
}

Dims DimsOf(const Recipe& r, int64_t tp) {
  const ModelConfig& m = r.model;
  Dims d;
  d.hidden = m.hidden;
  d.heads = m.attention.heads;
  d.kv_heads = m.attention.kv_heads;
  d.head_dim = m.attention.head_dim;
  d.ffn = m.mlp.ffn_hidden;
  d.experts = m.moe.experts;
  d.top_k = m.moe.top_k;
  d.expert_ffn = m.moe.ffn_hidden;
  d.shared_ffn = m.moe.SharedWidth();
  d.capacity_factor = m.moe.capacity_factor;
  d.dropless = m.moe.dropless;
  d.pad_to_capacity = m.moe.pad_to_capacity;
  // Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by x TP (MATH.md 0).
  d.vocab = RoundUp(m.vocab, m.vocab_pad_multiple * tp);
  const MambaConfig& mc = m.mamba;
  d.mamba_inner = mc.expand * m.hidden;
  d.mamba_head_dim = mc.head_dim;
  d.mamba_heads = mc.head_dim > 0 ? d.mamba_inner / mc.head_dim : 0;
  d.mamba_groups = mc.groups;
  d.mamba_d_state = mc.d_state;
  d.mamba_d_conv = mc.d_conv;
  d.mamba_chunk = mc.chunk;
  d.mamba_fused_norm_out_proj = mc.fused_norm_out_proj;
  d.recurrent_width = m.recurrent.width;
  d.recurrent_heads = m.recurrent.heads;
  d.recurrent_d_conv = m.recurrent.d_conv;
  d.seq = r.training.seq_len;
  d.batch = r.training.micro_batch;
  return d;
}

/// One rank's results, in double whatever the run precision.
struct RankResult {
  double loss = 0;
  Mat<double> output;  // final hidden state, this rank's rows
  std::map<std::string, std::pair<ShardKind, Mat<double>>> grads;
  int64_t dropped = 0;
  double flops = 0;
};

template <class T>
void Coalesced(Ctx& ctx, const Group& g, const std::vector<Param<T>*>& params, int64_t elem_bytes) {
  // One flat buffer, as Megatron's coalesced grad all-reduce.
  int64_t n = 0;
  for (Param<T>* p : params) n += p->grad.m.size();
  if (n == 0 || g.size() == 1) return;
  std::vector<T> flat;
  flat.reserve(static_cast<size_t>(n));
  for (Param<T>* p : params) flat.insert(flat.end(), p->grad.m.data(), p->grad.m.data() + p->grad.m.size());
  Allocation scratch(ctx.mem(), SimCategory::kTemporaries, n * elem_bytes);
  ctx.rank->AllReduce(g, flat.data(), n, elem_bytes);
  int64_t at = 0;
  for (Param<T>* p : params) {
    std::copy(flat.begin() + at, flat.begin() + at + p->grad.m.size(), p->grad.m.data());
    at += p->grad.m.size();
  }
}

struct Data {
  std::vector<int64_t> ids, targets;
};

Data MakeData(const Recipe& r, uint64_t seed) {
  std::mt19937_64 gen(seed ^ 0xda7aull);
  std::uniform_int_distribution<int64_t> u(0, r.model.vocab - 1);
  Data d;
  const int64_t tokens = r.training.seq_len * r.training.micro_batch;
  for (int64_t t = 0; t < tokens; ++t) d.ids.push_back(u(gen));
  for (int64_t t = 0; t < tokens; ++t) d.targets.push_back(u(gen));
  return d;
}

ModeledBytes BytesOf(const Recipe& r) {
  ModeledBytes b;
  b.activation = SizeOf(r.training.precision.activations);
  b.param = SizeOf(r.training.precision.params);
  b.grad = SizeOf(r.training.precision.grads);
  return b;
}

/// The program every rank runs: build its shards, forward, backward, grad sync.
template <class T>
RankResult RunRank(Rank& rank, const Recipe& r, const std::vector<char>& letters, const Topology& topo,
                   const Group& tp, const Group& ep, const Group& etp, const Group& edp, int64_t router_groups,
                   const Data& data, const SimOptions& opt) {
  Ctx ctx;
  ctx.rank = &rank;
  ctx.tp = &tp;
  ctx.ep = &ep;
  ctx.etp = &etp;
  ctx.edp = &edp;
  ctx.tp_size = topo.tp;
  ctx.tp_rank = tp.IndexOf(rank.id());
  ctx.ep_size = topo.ep;
  ctx.ep_rank = topo.EpRank(rank.id());
  ctx.etp_size = topo.etp;
  ctx.etp_rank = topo.EtpRank(rank.id());
  ctx.sp = topo.sp;
  ctx.router_groups = router_groups;
  ctx.bytes = BytesOf(r);
  ctx.optimizer = r.training.optimizer;
  ctx.seq = SeqLayout::Make(r.training.seq_len, 1, 0, false);
  const Dims d = DimsOf(r, topo.vocab_tp);

  Embedding<T> embedding(ctx, d, opt.seed, opt.init_scale);
  std::vector<std::unique_ptr<Block<T>>> blocks;
  for (size_t i = 0; i < letters.size(); ++i) {
    blocks.push_back(MakeBlock<T>(letters[i], ctx, d, static_cast<int64_t>(i), opt.seed, opt.init_scale));
  }
  Head<T> head(ctx, d, opt.seed, opt.init_scale);

  rank.set_pass(SimPass::kForward);
  rank.memory().set_owner("ends");
  Mat<T> x = embedding.Forward(ctx, data.ids);
  for (size_t i = 0; i < blocks.size(); ++i) {
    rank.memory().set_owner(std::string(1, letters[i]));
    x = blocks[i]->Forward(ctx, x);
  }
  RankResult out;
  out.output = x.template cast<double>();
  rank.memory().set_owner("ends");
  out.loss = head.Forward(ctx, x, data.targets);

  rank.set_pass(SimPass::kBackward);
  Mat<T> dx = head.Backward(ctx);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) dx = (*it)->Backward(ctx, dx);
  embedding.Backward(ctx, dx);

  // Gradient sync before the optimizer: with SP, REP grads are partial sums
  // over each rank's tokens (MATH.md 8.3 (4)); expert grads are partial over
  // the expert-data-parallel ranks that route different tokens.
  rank.set_pass(SimPass::kOptimizer);
  std::vector<Param<T>*> all = {&embedding.weight()};
  for (auto& b : blocks) {
    for (Param<T>* p : b->params()) all.push_back(p);
  }
  for (Param<T>* p : head.params()) all.push_back(p);
  std::vector<Param<T>*> rep, experts;
  for (Param<T>* p : all) {
    if (p->shard == ShardKind::kReplicated) rep.push_back(p);
    if (p->expert >= 0) experts.push_back(p);
  }
  rank.set_what("replicated_grads");
  if (topo.sp) Coalesced(ctx, tp, rep, ctx.bytes.grad);
  rank.set_what("expert_grads");
  Coalesced(ctx, edp, experts, ctx.bytes.grad);

  for (Param<T>* p : all) {
    out.grads[p->name] = {p->shard, p->grad.m.template cast<double>()};
  }
  out.dropped = ctx.dropped_pairs;
  out.flops = rank.flops();
  return out;
}

struct RunOutput {
  std::vector<RankResult> ranks;
  std::vector<RankMeasurement> measured;
};

template <class T>
RunOutput RunWorld(const Recipe& r, const std::vector<char>& letters, const Topology& topo, int64_t router_groups,
                   const Data& data, const SimOptions& opt) {
  const int n = topo.tp;
  World world(n);
  std::vector<int> all(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  const Group& tp = world.NewGroup("tp", all);
  std::vector<const Group*> ep(static_cast<size_t>(n)), etp(static_cast<size_t>(n)), edp(static_cast<size_t>(n));
  // EP group: same (etp, edp), ep varies. ETP: same (ep, edp). EDP: same (etp, ep).
  for (int a = 0; a < topo.etp; ++a) {
    for (int c = 0; c < topo.edp; ++c) {
      std::vector<int> m;
      for (int b = 0; b < topo.ep; ++b) m.push_back(topo.RankOf(a, b, c));
      const Group& g = world.NewGroup("ep", m);
      for (int rk : m) ep[static_cast<size_t>(rk)] = &g;
    }
  }
  for (int b = 0; b < topo.ep; ++b) {
    for (int c = 0; c < topo.edp; ++c) {
      std::vector<int> m;
      for (int a = 0; a < topo.etp; ++a) m.push_back(topo.RankOf(a, b, c));
      const Group& g = world.NewGroup("etp", m);
      for (int rk : m) etp[static_cast<size_t>(rk)] = &g;
    }
  }
  for (int a = 0; a < topo.etp; ++a) {
    for (int b = 0; b < topo.ep; ++b) {
      std::vector<int> m;
      for (int c = 0; c < topo.edp; ++c) m.push_back(topo.RankOf(a, b, c));
      const Group& g = world.NewGroup("edp", m);
      for (int rk : m) edp[static_cast<size_t>(rk)] = &g;
    }
  }
  RunOutput out;
  out.ranks.resize(static_cast<size_t>(n));
  world.Run([&](Rank& rank) {
    const size_t i = static_cast<size_t>(rank.id());
    out.ranks[i] = RunRank<T>(rank, r, letters, topo, tp, *ep[i], *etp[i], *edp[i], router_groups, data, opt);
  });
  for (int i = 0; i < n; ++i) {
    const Rank& rank = world.rank(i);
    RankMeasurement m;
    m.rank = i;
    m.comm = rank.Counts();
    for (int c = 0; c < kNumSimCategories; ++c) {
      m.peak_bytes[static_cast<size_t>(c)] = rank.memory().peak(static_cast<SimCategory>(c));
      m.final_bytes[static_cast<size_t>(c)] = rank.memory().live(static_cast<SimCategory>(c));
    }
    m.peak_total_bytes = rank.memory().peak_total();
    m.activations_at_peak = rank.memory().activations_at_peak();
    out.measured.push_back(std::move(m));
  }
  return out;
}

ErrorStat Compare(const std::string& name, const Mat<double>& got, const Mat<double>& ref) {
  ErrorStat e;
  e.name = name;
  e.elements = ref.size();
  if (got.rows() != ref.rows() || got.cols() != ref.cols()) {
    e.max_abs = e.max_rel = std::numeric_limits<double>::infinity();
    return e;
  }
  e.max_abs = ref.size() == 0 ? 0.0 : (got - ref).cwiseAbs().maxCoeff();
  const double scale = ref.size() == 0 ? 0.0 : ref.cwiseAbs().maxCoeff();
  e.max_rel = e.max_abs / std::max(scale, 1e-300);
  if (e.max_abs == 0.0) e.max_rel = 0.0;
  return e;
}

/// The global gradient of `name` assembled from the ranks' shards.
Mat<double> Gather(const std::string& name, const RunOutput& run, const Topology& topo) {
  // Every rank holding a shard of `name`, in rank order.
  std::vector<std::pair<int, const Mat<double>*>> shards;
  ShardKind kind = ShardKind::kReplicated;
  for (size_t i = 0; i < run.ranks.size(); ++i) {
    const auto it = run.ranks[i].grads.find(name);
    if (it == run.ranks[i].grads.end()) continue;
    kind = it->second.first;
    shards.push_back({static_cast<int>(i), &it->second.second});
  }
  if (shards.empty()) return Mat<double>();
  switch (kind) {
    case ShardKind::kReplicated: return *shards[0].second;
    case ShardKind::kColumns: {
      Mat<double> m(shards[0].second->rows(), shards[0].second->cols() * topo.tp);
      for (const auto& [rk, g] : shards) m.middleCols(rk * g->cols(), g->cols()) = *g;
      return m;
    }
    case ShardKind::kRows: {
      Mat<double> m(shards[0].second->rows() * topo.tp, shards[0].second->cols());
      for (const auto& [rk, g] : shards) m.middleRows(rk * g->rows(), g->rows()) = *g;
      return m;
    }
    case ShardKind::kExpertColumns:
    case ShardKind::kExpertRows: {
      const bool cols = kind == ShardKind::kExpertColumns;
      const Mat<double>& g0 = *shards[0].second;
      Mat<double> m(cols ? g0.rows() : g0.rows() * topo.etp, cols ? g0.cols() * topo.etp : g0.cols());
      for (const auto& [rk, g] : shards) {
        if (topo.EdpRank(rk) != 0) continue;  // replicas over EDP hold the same (all-reduced) grad
        const int part = topo.EtpRank(rk);
        if (cols) {
          m.middleCols(part * g->cols(), g->cols()) = *g;
        } else {
          m.middleRows(part * g->rows(), g->rows()) = *g;
        }
      }
      return m;
    }
  }
  return Mat<double>();
}

template <class T>
SimulationReport SimulateAs(const Recipe& recipe, const SimOptions& opt) {
  const std::vector<char> letters = LayerLetters(recipe);
  const Topology topo = CheckSupported(recipe, letters);
  const Data data = MakeData(recipe, opt.seed);
  const RunOutput sharded = RunWorld<T>(recipe, letters, topo, 1, data, opt);
  Topology one;  // the unsharded reference: one rank, every group of size 1
  one.vocab_tp = topo.vocab_tp;
  // Capacity per router-call group: the reference routes the tokens in the
  // same groups the sharded ranks see (each rank's SP slice), MATH.md 8.3 (3).
  const RunOutput reference = RunWorld<T>(recipe, letters, one, topo.sp ? topo.tp : 1, data, opt);

  SimulationReport rep;
  rep.recipe_name = recipe.name;
  rep.ranks = topo.tp;
  rep.loss_sharded = sharded.ranks[0].loss;
  rep.loss_reference = reference.ranks[0].loss;
  rep.loss = Compare("loss", Mat<double>::Constant(1, 1, rep.loss_sharded), Mat<double>::Constant(1, 1, rep.loss_reference));
  Mat<double> out;
  if (topo.sp) {
    const int64_t rows = sharded.ranks[0].output.rows();
    out.resize(rows * topo.tp, sharded.ranks[0].output.cols());
    for (int i = 0; i < topo.tp; ++i) out.middleRows(i * rows, rows) = sharded.ranks[static_cast<size_t>(i)].output;
  } else {
    out = sharded.ranks[0].output;
  }
  rep.output = Compare("output", out, reference.ranks[0].output);
  for (const auto& [name, g] : reference.ranks[0].grads) {
    rep.gradients.push_back(Compare(name, Gather(name, sharded, topo), g.second));
    if (rep.gradients.back().max_rel >= rep.worst_gradient.max_rel) rep.worst_gradient = rep.gradients.back();
  }
  for (const RankResult& rr : sharded.ranks) {
    rep.dropped_pairs += rr.dropped;
    rep.flops += rr.flops;
  }
  rep.dropped_pairs_reference = reference.ranks[0].dropped;
  rep.per_rank = sharded.measured;
  return rep;
}

}  // namespace
}  // namespace sim

SimulationReport Simulate(const Recipe& recipe, const SimOptions& options) {
  if (options.precision == SimPrecision::kFp32) return sim::SimulateAs<float>(recipe, options);
  return sim::SimulateAs<double>(recipe, options);
}

}  // namespace preflight

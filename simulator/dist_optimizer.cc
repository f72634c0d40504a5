#include "dist_optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>

namespace preflight::sim {

template <class T>
struct DistOptimizer<T>::Buffer {
  std::vector<Param<T>*> params;
  bool expert = false, muon = false;
  int64_t param_bytes = 2;      // bytes of one parameter element (Megatron keeps a buffer per dtype)
  const Group* group = nullptr;
  int size = 1, index = 0;      // group size D and this rank's position
  int64_t n = 0, n_pad = 0;     // real and padded elements
  int64_t share = 0;            // n_pad / D
  int64_t own_first = 0, own_real = 0;  // this rank's real elements [own_first, own_first + own_real)
  int64_t host_real = 0;                // of them, the first host_real keep their state on the host (offloads)
  std::vector<T> grad_share;    // reduced gradients of the share (ZeRO >= 1)
  std::vector<T> param_share;   // the owned parameter values (ZeRO >= 1)
  std::vector<T> master, m, v, momentum;  // optimizer state (full with ZeRO 0, the owned real elements otherwise)
  std::vector<Allocation> held;  // state, and the owned grad / param shares under ZeRO 2 / 3
  /// Layer-wise: the [offset, offset + length) ranges of the tensors dealt to this rank.
  std::vector<std::pair<int64_t, int64_t>> dealt;
  int64_t DealtElements() const {
    int64_t sum = 0;
    for (const auto& r : dealt) sum += r.second;
    return sum;
  }
};

namespace {

/// Host bytes of one offloaded element: an fp32 parameter, its fp32 gradient
/// and Adam's m and v (HybridDeviceOptimizer's pinned fp32 copies; FSDP2's
/// fp32 sharded parameter, its gradient and the state torch.optim keeps).
constexpr int64_t kHostBytesPerElement = 16;
/// Bytes of one element copied over the host link: fp32 gradients down, fp32
/// parameters up.
constexpr int64_t kHostCopyBytes = 4;

template <class T>
std::vector<T> Flatten(const std::vector<Param<T>*>& params, Tensor<T> Param<T>::*field, int64_t padded) {
  std::vector<T> flat;
  flat.reserve(static_cast<size_t>(padded));
  for (Param<T>* p : params) {
    const Mat<T>& m = (p->*field).m;
    flat.insert(flat.end(), m.data(), m.data() + m.size());
  }
  flat.resize(static_cast<size_t>(padded), T(0));
  return flat;
}

template <class T>
void Unflatten(const std::vector<T>& flat, const std::vector<Param<T>*>& params, Tensor<T> Param<T>::*field) {
  int64_t at = 0;
  for (Param<T>* p : params) {
    Mat<T>& m = (p->*field).m;
    std::copy(flat.begin() + at, flat.begin() + at + m.size(), m.data());
    at += m.size();
  }
}

/// Bytes one element of a parameter's copy takes (its value tensor's tag).
template <class T>
int64_t ParamElementBytes(const Param<T>& p) {
  return p.value.m.size() == 0 ? 0 : p.value.alloc.bytes() / p.value.m.size();
}

bool TpSharded(ShardKind k) { return k == ShardKind::kColumns || k == ShardKind::kRows; }
bool ExpertSharded(ShardKind k) { return k == ShardKind::kExpertColumns || k == ShardKind::kExpertRows; }

template <class T>
Mat<T> TakeShard(const Param<T>& p, const Mat<T>& global, int parts, int index) {
  const bool by_cols = SplitsColumns(p.shard);
  const auto ranges = ShardRanges(by_cols ? p.cols : p.rows, p.segments, parts, index);
  int64_t extent = 0;
  for (const auto& r : ranges) extent += r.second;
  Mat<T> local(by_cols ? p.rows : extent, by_cols ? extent : p.cols);
  int64_t at = 0;
  for (const auto& [offset, len] : ranges) {
    if (by_cols) {
      local.middleCols(at, len) = global.middleCols(offset, len);
    } else {
      local.middleRows(at, len) = global.middleRows(offset, len);
    }
    at += len;
  }
  return local;
}

/// Megatron's layer-wise deal (layer_wise_optimizer.py
/// _shard_params_ping_pong): the tensors sorted by size, smallest first,
/// the i-th to member loop[i mod 2D] of the loop 0, 1, ..., D-1, D-1, ..., 0.
/// Python's sort is stable over the optimizers' param groups in order, and
/// Megatron lists the Muon optimizer's groups first (optimizer/__init__.py:
/// the linear weights carry no override, sorted ahead of the scalar
/// optimizer's), so of equal sizes Muon's come first, then the model's order.
/// Returns the member of each tensor.
std::vector<int> DealPingPong(const std::vector<std::pair<int64_t, bool>>& sizes_muon, int members) {
  std::vector<size_t> order(sizes_muon.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(sizes_muon[a].first, !sizes_muon[a].second) <
           std::make_pair(sizes_muon[b].first, !sizes_muon[b].second);
  });
  std::vector<int> member(sizes_muon.size(), 0);
  const size_t period = 2 * static_cast<size_t>(members);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t k = i % period;
    member[order[i]] = static_cast<int>(k < period / 2 ? k : period - 1 - k);
  }
  return member;
}

}  // namespace

template <class T>
DistOptimizer<T>::DistOptimizer(Ctx& ctx, const DistGroups& groups, std::vector<std::vector<Param<T>*>> units,
                                const OptimizerSettings& settings)
    : groups_(groups), settings_(settings), unit_params_(std::move(units)) {
  const bool sharded = settings.zero >= 1;
  if (settings.layer_wise) DealLayerWise(ctx);
  for (const std::vector<Param<T>*>& unit : unit_params_) {
    // Buffers in a fixed order: dense before expert, AdamW before Muon, by
    // parameter dtype (Mamba's A_log and D are fp32), a tied embedding's
    // copy last: Megatron gives the copies on the first and last stage a
    // bucket of their own (distrib_optimizer.py
    // _compute_per_buffer_param_layout, megatron_fsdp param_and_grad_buffer.py
    // _does_param_require_new_bucket: "shared_embedding"), so both stages
    // shard it alike and the embedding group can sum their shares.
    using Key = std::tuple<bool, bool, int64_t, bool>;
    const auto key_of = [](const Param<T>* p) {
      return Key(p->expert >= 0, p->optimizer == OptimizerKind::kMuon, ParamElementBytes(*p), p->tied);
    };
    std::vector<Key> keys;
    for (const Param<T>* p : unit) {
      if (std::find(keys.begin(), keys.end(), key_of(p)) == keys.end()) keys.push_back(key_of(p));
    }
    std::sort(keys.begin(), keys.end());
    std::vector<Buffer> buffers;
    for (const Key& key : keys) {
      Buffer b;
      for (Param<T>* p : unit) {
        if (key_of(p) == key) b.params.push_back(p);
      }
      std::tie(b.expert, b.muon, b.param_bytes, std::ignore) = key;
      b.group = b.expert ? groups.edp : groups.dp_cp;
      b.size = b.group->size();
      b.index = b.group->IndexOf(ctx.rank->id());
      for (Param<T>* p : b.params) b.n += p->value.m.size();
      b.n_pad = RoundUp(b.n, b.size);
      b.share = b.n_pad / b.size;
      b.own_first = static_cast<int64_t>(b.index) * b.share;
      b.own_real = std::clamp<int64_t>(b.n - b.own_first, 0, b.share);
      const std::vector<T> values = Flatten(b.params, &Param<T>::value, b.n);
      int64_t offset = 0;
      for (Param<T>* p : b.params) {
        if (settings.layer_wise && Owns(p)) {
          for (const auto& [first, n] : owned_.at(p)) b.dealt.emplace_back(offset + first, n);
        }
        offset += p->value.m.size();
      }
      const int64_t state_elems = sharded ? b.own_real : b.n;
      if (sharded) {
        b.param_share.assign(values.begin() + b.own_first, values.begin() + b.own_first + b.own_real);
        b.grad_share.assign(static_cast<size_t>(b.share), T(0));
      }
      if (settings.master_bytes > 0) b.master = sharded ? b.param_share : values;
      if (b.muon) {
        b.momentum.assign(static_cast<size_t>(state_elems), T(0));
      } else {
        b.m.assign(static_cast<size_t>(state_elems), T(0));
        b.v.assign(static_cast<size_t>(state_elems), T(0));
      }
      if (settings.zero >= 2) {
        // Only the owned share of the gradients lives between units (plus,
        // while a unit's backward runs, that unit's unsharded gradients);
        // FSDP's CPU offload keeps it on the host (PlaceState).
        for (Param<T>* p : b.params) p->grad.alloc.Release();
        if (!settings.fsdp_cpu_offload)
          b.held.emplace_back(ctx.mem(), SimCategory::kGradients, b.own_real * ctx.bytes.grad);
      }
      if (settings.zero >= 3) {
        // The parameters live as owned shares, each element charged to its
        // tensor's category; the full tensors only while gathered.
        int64_t at = 0;
        std::array<int64_t, kNumSimCategories> share_bytes{};
        for (Param<T>* p : b.params) {
          const int64_t first = std::max(at, b.own_first), end = std::min(at + p->value.m.size(), b.own_first + b.own_real);
          if (end > first) share_bytes[static_cast<size_t>(ParamCategory(p->shard))] += (end - first) * b.param_bytes;
          at += p->value.m.size();
          p->value.alloc.Release();
        }
        for (int c = 0; c < kNumSimCategories; ++c) {
          if (share_bytes[static_cast<size_t>(c)] > 0 && !settings.fsdp_cpu_offload) {
            b.held.emplace_back(ctx.mem(), static_cast<SimCategory>(c), share_bytes[static_cast<size_t>(c)]);
          }
        }
      }
      buffers.push_back(std::move(b));
    }
    units_.push_back(std::move(buffers));
  }
  PlaceState(ctx);
  gathered_.resize(units_.size());
  unit_grads_.resize(units_.size());
}

template <class T>
DistOptimizer<T>::~DistOptimizer() = default;

template <class T>
int64_t DistOptimizer<T>::SteppedElements(const Buffer& b) const {
  return settings_.layer_wise ? b.DealtElements() : settings_.zero >= 1 ? b.own_real : b.n;
}

template <class T>
void DistOptimizer<T>::PlaceState(Ctx& ctx) {
  // Megatron's HybridDeviceOptimizer (cpu_offloading/hybrid_optimizer.py
  // _get_sub_optimizer_param_groups) moves optimizer params to the host in
  // order until their elements reach offload_fraction x the optimizer's (one
  // HybridDeviceOptimizer per distributed optimizer: dense and expert). It
  // moves whole shard tensors; the executor's shares are flat buffers, so it
  // moves elements: the first ceil(fraction x owned) of the AdamW shares.
  std::array<int64_t, 2> to_host{};
  if (settings_.offload_fraction > 0 && settings_.zero >= 1) {
    for (int expert = 0; expert < 2; ++expert) {
      int64_t owned = 0;
      for (const auto& unit : units_) {
        for (const Buffer& b : unit) {
          if (!b.muon && b.expert == (expert == 1)) owned += b.own_real;
        }
      }
      const auto threshold = static_cast<int64_t>(std::ceil(static_cast<double>(owned) * settings_.offload_fraction));
      to_host[static_cast<size_t>(expert)] = std::min(owned, threshold);
    }
  }
  for (auto& unit : units_) {
    for (Buffer& b : unit) {
      int64_t& left = to_host[b.expert ? 1 : 0];
      // FSDP2's CPUOffloadPolicy keeps every owned share on the host.
      b.host_real = settings_.fsdp_cpu_offload ? b.own_real : b.muon ? 0 : std::min(left, b.own_real);
      if (!settings_.fsdp_cpu_offload) left -= b.host_real;
      const SimCategory cat = b.muon ? SimCategory::kOptimizerMuon : SimCategory::kOptimizerAdamW;
      const int64_t per_elem = settings_.master_bytes + (b.muon ? settings_.momentum_bytes : 8);
      b.held.emplace_back(ctx.mem(), cat, (SteppedElements(b) - b.host_real) * per_elem);
      if (b.host_real > 0) b.held.emplace_back(&ctx.rank->host_memory(), cat, b.host_real * kHostBytesPerElement);
    }
  }
}

template <class T>
void DistOptimizer<T>::DealLayerWise(Ctx& ctx) {
  // Megatron's tensors in the model's order: the executor's parameters, with
  // those Megatron fuses (Param::fused_tensor) as one and those it keeps
  // apart (Param::row_tensors: LayerNorm's weight and bias) split. Dense
  // tensors are dealt over d x c, expert ones over the expert-data-parallel group.
  for (int expert = 0; expert < 2; ++expert) {
    const Group* group = expert ? groups_.edp : groups_.dp_cp;
    std::vector<std::vector<Piece>> tensors;
    std::map<std::string, size_t> fused;
    for (const auto& unit : unit_params_) {
      for (Param<T>* p : unit) {
        if ((p->expert >= 0) != (expert == 1)) continue;
        if (p->row_tensors) {
          for (int64_t r = 0; r < p->value.m.rows(); ++r) {
            tensors.push_back({Piece{p, r * p->value.m.cols(), p->value.m.cols()}});
          }
          continue;
        }
        if (p->fused_tensor.empty() || fused.count(p->fused_tensor) == 0) {
          if (!p->fused_tensor.empty()) fused[p->fused_tensor] = tensors.size();
          tensors.emplace_back();
        }
        tensors[p->fused_tensor.empty() ? tensors.size() - 1 : fused.at(p->fused_tensor)].push_back(
            Piece{p, 0, p->value.m.size()});
      }
    }
    std::vector<std::pair<int64_t, bool>> sizes;
    for (const auto& t : tensors) {
      int64_t n = 0;
      for (const Piece& piece : t) n += piece.n;
      sizes.emplace_back(n, t.front().param->optimizer == OptimizerKind::kMuon);
    }
    const std::vector<int> member = DealPingPong(sizes, group->size());
    // Each member's tensors in deal order (its flattened all-gather chunk).
    std::vector<size_t> order(tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_pair(sizes[a].first, !sizes[a].second) < std::make_pair(sizes[b].first, !sizes[b].second);
    });
    auto& lists = dealt_[static_cast<size_t>(expert)];
    lists.assign(static_cast<size_t>(group->size()), {});
    const int me = group->IndexOf(ctx.rank->id());
    for (size_t i : order) {
      for (const Piece& piece : tensors[i]) {
        lists[static_cast<size_t>(member[i])].push_back(piece);
        if (member[i] == me) owned_[piece.param].emplace_back(piece.first, piece.n);
      }
    }
    // A parameter's owned ranges in element order (its buffer's dealt ranges).
    for (auto& [param, ranges] : owned_) std::sort(ranges.begin(), ranges.end());
  }
}

template <class T>
std::vector<std::pair<int64_t, int64_t>> DistOptimizer<T>::Stepped(const Buffer& b) const {
  if (settings_.layer_wise) return b.dealt;
  return {{0, b.n}};
}

template <class T>
void DistOptimizer<T>::GatherDealt(Ctx& ctx) {
  // allgather_params: each member's updated tensors, flattened in deal order,
  // gathered with uneven sizes, copied into the other members' tensors.
  for (int expert = 0; expert < 2; ++expert) {
    const Group* group = expert ? groups_.edp : groups_.dp_cp;
    if (group->size() == 1) continue;
    const auto& lists = dealt_[static_cast<size_t>(expert)];
    std::set<int64_t> widths;
    for (const auto& list : lists) {
      for (const Piece& piece : list) widths.insert(ParamElementBytes(*piece.param));
    }
    const int me = group->IndexOf(ctx.rank->id());
    for (int64_t width : widths) {
      std::vector<std::vector<Piece>> of_width(lists.size());
      std::vector<int64_t> counts(lists.size(), 0);
      for (size_t k = 0; k < lists.size(); ++k) {
        for (const Piece& piece : lists[k]) {
          if (ParamElementBytes(*piece.param) != width) continue;
          of_width[k].push_back(piece);
          counts[k] += piece.n;
        }
      }
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      if (*std::max_element(counts.begin(), counts.end()) == 0) continue;
      std::vector<T> mine;
      for (const Piece& piece : of_width[static_cast<size_t>(me)]) {
        const T* from = piece.param->value.m.data() + piece.first;
        mine.insert(mine.end(), from, from + piece.n);
      }
      std::vector<T> all(static_cast<size_t>(total));
      ctx.rank->set_what(expert ? CommWhat::kExpertParams : CommWhat::kParams);
      Allocation temp(ctx.mem(), SimCategory::kTemporaries, total * width);
      ctx.rank->AllGather(*group, mine.data(), all.data(), counts, width);
      int64_t at = 0;
      for (size_t k = 0; k < lists.size(); ++k) {
        for (const Piece& piece : of_width[k]) {
          if (static_cast<int>(k) != me) {
            std::copy(all.begin() + at, all.begin() + at + piece.n, piece.param->value.m.data() + piece.first);
          }
          at += piece.n;
        }
      }
    }
  }
}

template <class T>
void DistOptimizer<T>::Observe(const std::vector<Param<T>*>& params) {
  for (Param<T>* p : params) {
    auto [it, fresh] = observed_.try_emplace(p->name, p->grad.m.template cast<double>());
    if (!fresh) it->second += p->grad.m.template cast<double>();
  }
}

template <class T>
void DistOptimizer<T>::AllReduceReplicated(Ctx& ctx, const std::vector<Param<T>*>& params) {
  // With SP each TP rank holds partial gradients of the replicated parameters
  // (norms, router): one coalesced all-reduce over TP (Megatron
  // _allreduce_layernorm_grads), padded to a multiple of tp like the DP buffers.
  // Without SP only the qk norms' (tp_partial) gradients differ over TP.
  if (groups_.tp->size() == 1) return;
  std::vector<Param<T>*> rep;
  for (Param<T>* p : params) {
    if (p->shard == ShardKind::kReplicated && ((groups_.sp && !p->tp_whole) || p->tp_partial)) rep.push_back(p);
  }
  int64_t n = 0;
  for (Param<T>* p : rep) n += p->grad.m.size();
  if (n == 0) return;
  const int64_t padded = RoundUp(n, groups_.tp->size());
  std::vector<T> flat = Flatten(rep, &Param<T>::grad, padded);
  ctx.rank->set_what(CommWhat::kReplicatedGrads);
  Allocation temp(ctx.mem(), SimCategory::kTemporaries, padded * ctx.bytes.grad);
  ctx.rank->AllReduce(*groups_.tp, flat.data(), padded, ctx.bytes.grad);
  Unflatten(flat, rep, &Param<T>::grad);
}

template <class T>
void DistOptimizer<T>::AllReduceTied(Ctx& ctx, const std::vector<Param<T>*>& params) {
  // The first and last stage each hold a copy of a tied embedding (or of the
  // embedding MTP reads) and their stage's part of its gradient: Megatron sums
  // the copies' gradients over the embedding group (finalize_model_grads.py
  // _allreduce_word_embedding_grads, after the DP sync). ZeRO 0/1: Megatron
  // all-reduces the whole main_grad (V/t x h elements); summing before the DP
  // sync moves the same elements and gives the same sums, which the DP sync
  // then reduces.
  if (groups_.embedding == nullptr) return;
  ctx.rank->set_what(CommWhat::kTiedEmbedding);
  for (Param<T>* p : params) {
    if (p->tied) ctx.rank->AllReduce(*groups_.embedding, p->grad.m.data(), p->grad.m.size(), ctx.bytes.grad);
  }
}

template <class T>
void DistOptimizer<T>::AllReduceTiedShares(Ctx& ctx) {
  // ZeRO 2/3 (Megatron FSDP): the DP reduce-scatter has run; the copies'
  // buckets are sharded alike (the constructor's own buffer), so the group
  // sums each rank's share: _allreduce_embedding_grad all-reduces
  // main_grad._local_tensor under use_megatron_fsdp, the copy's real elements
  // in this rank's shard.
  if (groups_.embedding == nullptr) return;
  ctx.rank->set_what(CommWhat::kTiedEmbedding);
  for (auto& unit : units_) {
    for (Buffer& b : unit) {
      if (b.params.front()->tied)
        ctx.rank->AllReduce(*groups_.embedding, b.grad_share.data(), b.own_real, ctx.bytes.grad);
    }
  }
}

template <class T>
void DistOptimizer<T>::AllReduceMirror(Ctx& ctx) {
  // DualPipe keeps two copies of every stage, on pipeline ranks r and p-1-r,
  // each with the gradient of the micro-batches of its direction: the copies'
  // gradients are summed (deepseek-ai/DualPipe examples/example_dualpipe.py:
  // p0.grad += the mirror rank's p1.grad and back), here as one all-reduce of
  // each gradient buffer over the mirror pair, before the data-parallel sync.
  // Both ranks hold the same buffers in another unit order: by first name.
  // Under ZeRO 2/3 each copy's gradients were reduce-scattered unit by unit
  // in its backwards: the pair sums the owned shares instead (the same
  // position of the same buffer on both ranks; a sum of shares is the share
  // of the sum).
  if (groups_.mirror == nullptr) return;
  std::map<std::pair<std::string, bool>, Buffer*> by_name;
  for (auto& unit : units_) {
    for (Buffer& b : unit) by_name[{b.params.front()->name, b.muon}] = &b;
  }
  ctx.rank->set_what(CommWhat::kDualPipeCopyGrads);
  for (auto& [key, b] : by_name) {
    if (settings_.zero >= 2) {
      ctx.rank->AllReduce(*groups_.mirror, b->grad_share.data(), b->share, ctx.bytes.grad);
      continue;
    }
    std::vector<T> flat = Flatten(b->params, &Param<T>::grad, b->n_pad);
    Allocation temp(ctx.mem(), SimCategory::kTemporaries, b->n_pad * ctx.bytes.grad);
    ctx.rank->AllReduce(*groups_.mirror, flat.data(), b->n_pad, ctx.bytes.grad);
    Unflatten(flat, b->params, &Param<T>::grad);
  }
}

template <class T>
void DistOptimizer<T>::SyncGradients(Ctx& ctx, Buffer& b) {
  ctx.rank->set_what(b.expert ? CommWhat::kExpertGrads : CommWhat::kGrads);
  const double scale = b.expert ? settings_.expert_grad_scale : settings_.dense_grad_scale;
  std::vector<T> flat = Flatten(b.params, &Param<T>::grad, b.n_pad);
  Allocation temp(ctx.mem(), SimCategory::kTemporaries, b.n_pad * ctx.bytes.grad);
  if (settings_.zero == 0) {
    if (b.size > 1) ctx.rank->AllReduce(*b.group, flat.data(), b.n_pad, ctx.bytes.grad);
    for (T& x : flat) x *= T(scale);
    Unflatten(flat, b.params, &Param<T>::grad);
    return;
  }
  std::vector<T> share(static_cast<size_t>(b.share));
  if (b.size > 1) {
    ctx.rank->ReduceScatter(*b.group, flat.data(), share.data(), std::vector<int64_t>(static_cast<size_t>(b.size), b.share),
                            ctx.bytes.grad);
  } else {
    share = flat;
  }
  const Group* replicas = b.expert ? groups_.edp_replica : groups_.dp_replica;
  if (replicas != nullptr && replicas->size() > 1) {
    ctx.rank->set_what(b.expert ? CommWhat::kExpertReplicaGrads : CommWhat::kReplicaGrads);
    ctx.rank->AllReduce(*replicas, share.data(), b.share, ctx.bytes.grad);
  }
  for (int64_t i = 0; i < b.share; ++i) b.grad_share[static_cast<size_t>(i)] += T(scale) * share[static_cast<size_t>(i)];
  for (Param<T>* p : b.params) p->grad.m.setZero();
}

template <class T>
void DistOptimizer<T>::GatherUnit(Ctx& ctx, size_t unit) {
  if (settings_.zero < 3 || !gathered_[unit].empty()) return;
  std::array<int64_t, kNumSimCategories> bytes{};
  for (Buffer& b : units_[unit]) {
    // FSDP2's CPU offload: the fp32 shard comes up before each all-gather
    // (torch/distributed/fsdp/_fully_shard/_fsdp_param.py FSDPParam.all_gather_inputs).
    if (settings_.fsdp_cpu_offload) ctx.rank->CountHostCopy(/*to_host=*/false, b.share * kHostCopyBytes);
    GatherParams(ctx, b, /*into_values=*/true);
    for (Param<T>* p : b.params) {
      bytes[static_cast<size_t>(ParamCategory(p->shard))] += p->value.m.size() * b.param_bytes;
    }
  }
  for (int c = 0; c < kNumSimCategories; ++c) {
    if (bytes[static_cast<size_t>(c)] > 0) gathered_[unit].emplace_back(ctx.mem(), static_cast<SimCategory>(c), bytes[static_cast<size_t>(c)]);
  }
}

template <class T>
void DistOptimizer<T>::ReleaseUnit(size_t unit) {
  gathered_[unit].clear();
}

template <class T>
void DistOptimizer<T>::BeginUnitBackward(Ctx& ctx, size_t unit) {
  if (settings_.zero < 2) return;
  int64_t elements = 0;
  for (const Param<T>* p : unit_params_[unit]) elements += p->grad.m.size();
  unit_grads_[unit] = Allocation(ctx.mem(), SimCategory::kGradients, elements * ctx.bytes.grad);
}

template <class T>
void DistOptimizer<T>::ReduceUnitGradients(Ctx& ctx, size_t unit) {
  if (settings_.zero < 2) return;
  Observe(unit_params_[unit]);
  AllReduceReplicated(ctx, unit_params_[unit]);
  for (Buffer& b : units_[unit]) {
    SyncGradients(ctx, b);
    // FSDP2's CPU offload: each reduce-scatter's fp32 shard goes down to be
    // accumulated on the host (_fully_shard/_fsdp_collectives.py foreach_reduce).
    if (settings_.fsdp_cpu_offload) ctx.rank->CountHostCopy(/*to_host=*/true, b.share * kHostCopyBytes);
  }
  unit_grads_[unit].Release();
}

template <class T>
void DistOptimizer<T>::OwnedValues(Buffer& b) {
  // Without a master copy (fp32 parameters) the owned parameter values are
  // what the optimizer updates; `master` then only names that working copy.
  if (settings_.master_bytes > 0) return;
  b.master = settings_.zero >= 1 ? b.param_share : Flatten(b.params, &Param<T>::value, b.n);
}

template <class T>
void DistOptimizer<T>::StepAdamW(Ctx& ctx, Buffer& b) {
  OwnedValues(b);
  if (settings_.zero >= 1) {
    // Offloaded elements (the first host_real) step on the host: under
    // Megatron's optimizer offload their fp32 gradients go down first and
    // their fp32 parameters come back up after (hybrid_optimizer.py
    // _set_sub_optimizer_grads, param_copy_back_gpu_hook); under FSDP's CPU
    // offload the gradients are there already and the parameters stay.
    const int64_t h = b.host_real;
    const bool copies = h > 0 && !settings_.fsdp_cpu_offload;
    if (copies) ctx.rank->CountHostCopy(/*to_host=*/true, h * kHostCopyBytes);
    const std::vector<T> host_grads(b.grad_share.begin(), b.grad_share.begin() + h);
    AdamWStep(settings_.adamw, settings_.step, b.master.data(), host_grads.data(), b.m.data(), b.v.data(), h);
    AdamWStep(settings_.adamw, settings_.step, b.master.data() + h, b.grad_share.data() + h, b.m.data() + h,
              b.v.data() + h, b.own_real - h);
    if (copies) ctx.rank->CountHostCopy(/*to_host=*/false, h * kHostCopyBytes);
    b.param_share = b.master;
    return;
  }
  const std::vector<T> grads = Flatten(b.params, &Param<T>::grad, b.n);
  for (const auto& [at, n] : Stepped(b)) {
    AdamWStep(settings_.adamw, settings_.step, b.master.data() + at, grads.data() + at, b.m.data() + at,
              b.v.data() + at, n);
  }
  Unflatten(b.master, b.params, &Param<T>::value);
}

template <class T>
void DistOptimizer<T>::StepMuon(Ctx& ctx, Buffer& b) {
  const bool sharded = settings_.zero >= 1;
  const int64_t mb = settings_.momentum_bytes;
  // 1. Momentum on what this rank owns, then the full (rank-local) update input.
  std::vector<T> update(static_cast<size_t>(b.n_pad), T(0));
  if (!sharded) {
    const std::vector<T> grads = Flatten(b.params, &Param<T>::grad, b.n);
    for (const auto& [at, n] : Stepped(b)) {
      MuonMomentum(settings_.muon, grads.data() + at, b.momentum.data() + at, update.data() + at, n);
    }
  } else {
    std::vector<T> mine(static_cast<size_t>(b.share), T(0));
    MuonMomentum(settings_.muon, b.grad_share.data(), b.momentum.data(), mine.data(), b.own_real);
    ctx.rank->set_what(b.expert ? CommWhat::kMuonExpertGather : CommWhat::kMuonGather);
    Allocation temp(ctx.mem(), SimCategory::kTemporaries, b.n_pad * mb);
    if (b.size > 1) {
      ctx.rank->AllGather(*b.group, mine.data(), update.data(), std::vector<int64_t>(static_cast<size_t>(b.size), b.share),
                          mb);
    } else {
      update = mine;
    }
  }
  // 2. Each matrix's update in its global shape: TP-sharded matrices are
  // gathered over TP (expert matrices over expert TP), coalesced per buffer.
  std::vector<Mat<T>> local;
  int64_t at = 0;
  for (Param<T>* p : b.params) {
    Mat<T> u(p->grad.m.rows(), p->grad.m.cols());
    std::copy(update.begin() + at, update.begin() + at + u.size(), u.data());
    at += u.size();
    local.push_back(std::move(u));
  }
  const Group* tp_group = b.expert ? groups_.etp : groups_.tp;
  const int parts = tp_group->size();
  const int my_part = tp_group->IndexOf(ctx.rank->id());
  const auto gathered_kind = [&](ShardKind k) { return b.expert ? ExpertSharded(k) : TpSharded(k); };
  std::vector<std::vector<T>> gathered_parts(static_cast<size_t>(parts));
  if (parts > 1) {
    std::vector<T> mine;
    for (size_t i = 0; i < b.params.size(); ++i) {
      if (gathered_kind(b.params[i]->shard) && Owns(b.params[i])) {
        mine.insert(mine.end(), local[i].data(), local[i].data() + local[i].size());
      }
    }
    if (!mine.empty()) {
      ctx.rank->set_what(b.expert ? CommWhat::kMuonExpertTpGather : CommWhat::kMuonTpGather);
      const int64_t count = static_cast<int64_t>(mine.size());
      std::vector<T> all(static_cast<size_t>(count * parts));
      Allocation temp(ctx.mem(), SimCategory::kTemporaries, count * parts * mb);
      ctx.rank->AllGather(*tp_group, mine.data(), all.data(), std::vector<int64_t>(static_cast<size_t>(parts), count), mb);
      for (int r = 0; r < parts; ++r) {
        gathered_parts[static_cast<size_t>(r)].assign(all.begin() + r * count, all.begin() + (r + 1) * count);
      }
    }
  }
  // 3. Newton-Schulz on the global matrix, scaled; keep this rank's slice.
  std::vector<T> ortho;
  ortho.reserve(static_cast<size_t>(b.n));
  int64_t part_at = 0;
  for (size_t i = 0; i < b.params.size(); ++i) {
    const Param<T>& p = *b.params[i];
    if (!Owns(&p)) {  // layer-wise: another member steps it
      ortho.insert(ortho.end(), static_cast<size_t>(p.value.m.size()), T(0));
      continue;
    }
    Mat<T> global;
    const bool split = parts > 1 && gathered_kind(p.shard);
    if (split) {
      global.resize(p.rows, p.cols);
      for (int r = 0; r < parts; ++r) {
        Mat<T> piece(local[i].rows(), local[i].cols());
        std::copy(gathered_parts[static_cast<size_t>(r)].begin() + part_at,
                  gathered_parts[static_cast<size_t>(r)].begin() + part_at + piece.size(), piece.data());
        PutShard(p.shard, p.segments, parts, r, piece, &global);
      }
      part_at += local[i].size();
    } else {
      global = local[i];
    }
    double flops = 0;
    Mat<T> o = NewtonSchulz5(global, settings_.muon.ns_steps, &flops);
    ctx.rank->AddFlops(flops);
    o *= T(MuonScale(settings_.muon, p.rows, p.cols));
    const Mat<T> mine = split ? TakeShard(p, o, parts, my_part) : o;
    ortho.insert(ortho.end(), mine.data(), mine.data() + mine.size());
  }
  // 4. The update on the owned elements (scale 1: MuonScale is already in `ortho`).
  OwnedValues(b);
  if (sharded) {
    MuonApply(settings_.muon, 1.0, b.master.data(), ortho.data() + b.own_first, b.own_real);
    b.param_share = b.master;
  } else {
    for (const auto& [first, n] : Stepped(b)) {
      MuonApply(settings_.muon, 1.0, b.master.data() + first, ortho.data() + first, n);
    }
    Unflatten(b.master, b.params, &Param<T>::value);
  }
}

template <class T>
void DistOptimizer<T>::GatherParams(Ctx& ctx, Buffer& b, bool into_values) {
  ctx.rank->set_what(b.expert ? CommWhat::kExpertParams : CommWhat::kParams);
  std::vector<T> mine(static_cast<size_t>(b.share), T(0));
  std::copy(b.param_share.begin(), b.param_share.end(), mine.begin());
  std::vector<T> all(static_cast<size_t>(b.n_pad));
  if (b.size > 1) {
    Allocation temp(ctx.mem(), SimCategory::kTemporaries, b.n_pad * b.param_bytes);
    ctx.rank->AllGather(*b.group, mine.data(), all.data(), std::vector<int64_t>(static_cast<size_t>(b.size), b.share),
                        b.param_bytes);
  } else {
    all = mine;
  }
  if (into_values) Unflatten(all, b.params, &Param<T>::value);
}

template <class T>
void DistOptimizer<T>::Step(Ctx& ctx) {
  ctx.rank->set_pass(Pass::kOptimizer);
  if (settings_.zero < 2) {
    std::vector<Param<T>*> all;
    for (const auto& unit : unit_params_) all.insert(all.end(), unit.begin(), unit.end());
    Observe(all);
    AllReduceReplicated(ctx, all);
    AllReduceTied(ctx, all);
    AllReduceMirror(ctx);
    for (auto& unit : units_) {
      for (Buffer& b : unit) SyncGradients(ctx, b);
    }
  } else {
    AllReduceTiedShares(ctx);
    AllReduceMirror(ctx);
  }
  for (auto& unit : units_) {
    for (Buffer& b : unit) {
      // Megatron's mixed-precision step (ZeRO 0/1) gives each fp32 main param
      // model_grad.float() of a lower-precision gradient share
      // (_copy_model_grads_to_main_grads); it is freed at the next zero_grad,
      // after this step: held with the state, as a temporary of the step
      // (fit counts it only in the allocator's between-steps figure).
      // The host's elements get their fp32 gradient on the host (StepAdamW).
      if (settings_.zero <= 1 && settings_.master_bytes > 0 && ctx.bytes.grad < 4) {
        b.held.emplace_back(ctx.mem(), SimCategory::kTemporaries, (SteppedElements(b) - b.host_real) * 4);
      }
      if (b.muon) {
        StepMuon(ctx, b);
      } else {
        StepAdamW(ctx, b);
      }
    }
  }
  if (settings_.zero == 1 || settings_.zero == 2) {
    for (auto& unit : units_) {
      for (Buffer& b : unit) GatherParams(ctx, b, /*into_values=*/true);
    }
  }
  if (settings_.layer_wise) GatherDealt(ctx);
}

template <class T>
void DistOptimizer<T>::GatherForVerification(Ctx& ctx) {
  if (settings_.zero < 3) return;
  ctx.rank->set_counting(false);
  for (auto& unit : units_) {
    for (Buffer& b : unit) GatherParams(ctx, b, /*into_values=*/true);
  }
  ctx.rank->set_counting(true);
}

template class DistOptimizer<double>;
template class DistOptimizer<float>;

}  // namespace preflight::sim

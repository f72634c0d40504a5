// Template bodies of the collectives (included by world.h). Each executor
// runs under the matcher's lock with every member's buffers posted.
#pragma once

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace preflight::sim {
namespace detail {

template <class T>
void Combine(T* into, const T* from, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) into[i] = op == ReduceOp::kSum ? into[i] + from[i] : std::max(into[i], from[i]);
}

inline std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

/// Copies a chunk from member `src` to `dst`, counting it on both.
template <class T>
void Transfer(const T* from, T* to, int64_t n, Rank* src, Rank* dst, Axis axis, CollectiveKind kind,
              int64_t elem_bytes) {
  std::copy(from, from + n, to);
  src->CountSent(axis, kind, n * elem_bytes);
  dst->CountReceived(axis, kind, n * elem_bytes);
}

/// Ring reduce-scatter over `work` (one full buffer per member, chunked by
/// `counts`). After n-1 steps member i holds the reduced chunk i. Chunk c
/// accumulates in ring order c+1, c+2, ..., c: fixed, so results are deterministic.
template <class T>
void RingReduceScatter(std::vector<std::vector<T>>& work, const std::vector<int64_t>& counts,
                       const std::vector<Rank*>& ranks, Axis axis, CollectiveKind kind, int64_t elem_bytes,
                       ReduceOp op) {
  const int n = static_cast<int>(ranks.size());
  const std::vector<int64_t> off = Offsets(counts);
  std::vector<T> message;
  for (int step = 0; step < n - 1; ++step) {
    // All members send simultaneously: take every outgoing chunk first.
    std::vector<std::vector<T>> outgoing(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const int c = ((i - step - 1) % n + n) % n;
      const int dst = (i + 1) % n;
      auto& msg = outgoing[static_cast<size_t>(i)];
      msg.resize(static_cast<size_t>(counts[static_cast<size_t>(c)]));
      Transfer(work[static_cast<size_t>(i)].data() + off[static_cast<size_t>(c)], msg.data(),
               counts[static_cast<size_t>(c)], ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(dst)], axis,
               kind, elem_bytes);
    }
    for (int i = 0; i < n; ++i) {
      const int c = ((i - step - 1) % n + n) % n;
      const int dst = (i + 1) % n;
      Combine(work[static_cast<size_t>(dst)].data() + off[static_cast<size_t>(c)],
              outgoing[static_cast<size_t>(i)].data(), counts[static_cast<size_t>(c)], op);
    }
  }
}

/// Ring all-gather: member i starts with chunk i in `work[i]` and forwards, at
/// step k, the chunk (i - k) it got last step.
template <class T>
void RingAllGather(std::vector<std::vector<T>>& work, const std::vector<int64_t>& counts,
                   const std::vector<Rank*>& ranks, Axis axis, CollectiveKind kind, int64_t elem_bytes) {
  const int n = static_cast<int>(ranks.size());
  const std::vector<int64_t> off = Offsets(counts);
  for (int step = 0; step < n - 1; ++step) {
    for (int i = 0; i < n; ++i) {
      const int c = ((i - step) % n + n) % n;
      const int dst = (i + 1) % n;
      // Receivers only write chunk c, which the sender does not forward this step.
      Transfer(work[static_cast<size_t>(i)].data() + off[static_cast<size_t>(c)], work[static_cast<size_t>(dst)].data() + off[static_cast<size_t>(c)],
               counts[static_cast<size_t>(c)], ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(dst)], axis,
               kind, elem_bytes);
    }
  }
}

inline std::string CountsDiffer(const std::vector<Post*>& posts) {
  for (const Post* p : posts) {
    if (p->counts != posts[0]->counts) {
      return "ranks " + std::to_string(posts[0]->rank) + " and " + std::to_string(p->rank) +
             " disagree on the per-member element counts";
    }
  }
  if (posts[0]->counts.size() != posts.size()) return "per-member counts do not match the group size";
  return "";
}

}  // namespace detail
}  // namespace preflight::sim

#include "remote_inl.h"

namespace preflight::sim {

template <class T>
void Rank::AllReduce(const Group& g, T* data, int64_t count, int64_t elem_bytes, ReduceOp op) {
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kAllReduce;
  p.type = &typeid(T);
  p.op = op;
  p.elem_bytes = elem_bytes;
  p.count = count;
  p.out = data;
  if (world_->transport() != nullptr) return detail::RemoteAllReduce(*this, g, p, data);
  const Axis axis = g.axis;
  world_->Collective(g, std::move(p), [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
    const int n = static_cast<int>(posts.size());
    for (const Post* q : posts) {
      if (q->count != posts[0]->count) return std::string("all-reduce sizes differ: ") + std::to_string(posts[0]->count) + " vs " + std::to_string(q->count) + " elements (rank " + std::to_string(q->rank) + ")";
      if (q->op != posts[0]->op) return std::string("all-reduce operations differ (sum vs max)");
    }
    for (Rank* r : ranks) r->CountCall(axis, CollectiveKind::kAllReduce);
    const int64_t n_elems = posts[0]->count;
    // Ring all-reduce = ring reduce-scatter + ring all-gather over n near-equal chunks.
    std::vector<int64_t> chunks(static_cast<size_t>(n), n_elems / n);
    for (int i = 0; i < n_elems % n; ++i) ++chunks[static_cast<size_t>(i)];
    std::vector<std::vector<T>> work;
    for (const Post* q : posts) work.emplace_back(static_cast<T*>(q->out), static_cast<T*>(q->out) + n_elems);
    detail::RingReduceScatter(work, chunks, ranks, axis, CollectiveKind::kAllReduce, posts[0]->elem_bytes, posts[0]->op);
    detail::RingAllGather(work, chunks, ranks, axis, CollectiveKind::kAllReduce, posts[0]->elem_bytes);
    for (int i = 0; i < n; ++i) std::copy(work[static_cast<size_t>(i)].begin(), work[static_cast<size_t>(i)].end(), static_cast<T*>(posts[static_cast<size_t>(i)]->out));
    return std::string();
  });
}

template <class T>
void Rank::AllGather(const Group& g, const T* in, T* out, const std::vector<int64_t>& counts, int64_t elem_bytes) {
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kAllGather;
  p.type = &typeid(T);
  p.elem_bytes = elem_bytes;
  p.counts = counts;
  p.in = in;
  p.out = out;
  if (world_->transport() != nullptr) return detail::RemoteAllGather(*this, g, p, in, out);
  const Axis axis = g.axis;
  world_->Collective(g, std::move(p), [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
    std::string problem = detail::CountsDiffer(posts);
    if (!problem.empty()) return problem;
    for (Rank* r : ranks) r->CountCall(axis, CollectiveKind::kAllGather);
    const auto& split = posts[0]->counts;
    const std::vector<int64_t> off = detail::Offsets(split);
    std::vector<std::vector<T>> work(posts.size(), std::vector<T>(static_cast<size_t>(off.back())));
    for (size_t i = 0; i < posts.size(); ++i) {
      const T* src = static_cast<const T*>(posts[i]->in);
      std::copy(src, src + split[i], work[i].begin() + off[i]);
    }
    detail::RingAllGather(work, split, ranks, axis, CollectiveKind::kAllGather, posts[0]->elem_bytes);
    for (size_t i = 0; i < posts.size(); ++i) std::copy(work[i].begin(), work[i].end(), static_cast<T*>(posts[i]->out));
    return std::string();
  });
}

template <class T>
void Rank::ReduceScatter(const Group& g, const T* in, T* out, const std::vector<int64_t>& counts, int64_t elem_bytes) {
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kReduceScatter;
  p.type = &typeid(T);
  p.elem_bytes = elem_bytes;
  p.counts = counts;
  p.in = in;
  p.out = out;
  if (world_->transport() != nullptr) return detail::RemoteReduceScatter(*this, g, p, in, out);
  const Axis axis = g.axis;
  world_->Collective(g, std::move(p), [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
    std::string problem = detail::CountsDiffer(posts);
    if (!problem.empty()) return problem;
    for (Rank* r : ranks) r->CountCall(axis, CollectiveKind::kReduceScatter);
    const auto& split = posts[0]->counts;
    const std::vector<int64_t> off = detail::Offsets(split);
    std::vector<std::vector<T>> work;
    for (const Post* q : posts) work.emplace_back(static_cast<const T*>(q->in), static_cast<const T*>(q->in) + off.back());
    detail::RingReduceScatter(work, split, ranks, axis, CollectiveKind::kReduceScatter, posts[0]->elem_bytes, ReduceOp::kSum);
    for (size_t i = 0; i < posts.size(); ++i) {
      std::copy(work[i].begin() + off[i], work[i].begin() + off[i + 1], static_cast<T*>(posts[i]->out));
    }
    return std::string();
  });
}

template <class T>
void Rank::AllToAll(const Group& g, const T* in, const std::vector<int64_t>& send_counts, T* out,
                    const std::vector<int64_t>& recv_counts, int64_t elem_bytes) {
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kAllToAll;
  p.type = &typeid(T);
  p.elem_bytes = elem_bytes;
  p.counts = send_counts;
  p.recv_counts = recv_counts;
  p.in = in;
  p.out = out;
  if (world_->transport() != nullptr) return detail::RemoteAllToAll(*this, g, p, in, out);
  const Axis axis = g.axis;
  world_->Collective(g, std::move(p), [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
    const size_t n = posts.size();
    for (size_t i = 0; i < n; ++i) {
      if (posts[i]->counts.size() != n || posts[i]->recv_counts.size() != n) return std::string("all-to-all split lists do not match the group size");
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        if (posts[i]->counts[j] != posts[j]->recv_counts[i]) {
          return "rank " + std::to_string(posts[i]->rank) + " sends " + std::to_string(posts[i]->counts[j]) +
                 " elements to rank " + std::to_string(posts[j]->rank) + ", which expects " +
                 std::to_string(posts[j]->recv_counts[i]);
        }
      }
    }
    for (Rank* r : ranks) r->CountCall(axis, CollectiveKind::kAllToAll);
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int64_t> send_off = detail::Offsets(posts[i]->counts);
      for (size_t j = 0; j < n; ++j) {
        const std::vector<int64_t> recv_off = detail::Offsets(posts[j]->recv_counts);
        const T* from = static_cast<const T*>(posts[i]->in) + send_off[j];
        T* to = static_cast<T*>(posts[j]->out) + recv_off[i];
        if (i == j) {
          std::copy(from, from + posts[i]->counts[j], to);  // local copy, not on the wire
        } else {
          detail::Transfer(from, to, posts[i]->counts[j], ranks[i], ranks[j], axis, CollectiveKind::kAllToAll, posts[0]->elem_bytes);
        }
      }
    }
    return std::string();
  });
}

template <class T>
void Rank::Broadcast(const Group& g, T* data, int64_t count, int root, int64_t elem_bytes) {
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kBroadcast;
  p.type = &typeid(T);
  p.elem_bytes = elem_bytes;
  p.count = count;
  p.root = root;
  p.out = data;
  if (world_->transport() != nullptr) return detail::RemoteBroadcast(*this, g, p, data);
  const Axis axis = g.axis;
  world_->Collective(g, std::move(p), [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
    const int n = static_cast<int>(posts.size());
    for (const Post* q : posts) {
      if (q->count != posts[0]->count || q->root != posts[0]->root) return std::string("broadcast sizes or roots differ");
    }
    const int from_root = posts[0]->root;
    if (from_root < 0 || from_root >= n) return std::string("broadcast root out of range");
    for (Rank* r : ranks) r->CountCall(axis, CollectiveKind::kBroadcast);
    // Chain root -> root+1 -> ... (the ring broadcast): each member but the last forwards the buffer once.
    for (int step = 0; step < n - 1; ++step) {
      const size_t a = static_cast<size_t>((from_root + step) % n);
      const size_t b = static_cast<size_t>((from_root + step + 1) % n);
      detail::Transfer(static_cast<const T*>(posts[a]->out), static_cast<T*>(posts[b]->out), posts[0]->count, ranks[a],
                       ranks[b], axis, CollectiveKind::kBroadcast, posts[0]->elem_bytes);
    }
    return std::string();
  });
}

namespace detail {
/// Runs a matched send/recv pair: copies the eager sender's buffer into the
/// receiver's and counts it, the send under the sender's labels at posting.
template <class T>
std::string MatchSendRecv(Axis axis, const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
  const Post& send = *posts[0];
  const Post& recv = *posts[1];
  if (send.kind != CollectiveKind::kSend || recv.kind != CollectiveKind::kRecv) return std::string("send matched with a send");
  if (send.count != recv.count) {
    return "send of " + std::to_string(send.count) + " elements matched a recv of " + std::to_string(recv.count);
  }
  const T* from = static_cast<const T*>(send.in);
  std::copy(from, from + send.count, static_cast<T*>(recv.out));
  ranks[0]->CountSendAs(axis, send.pass, send.what, send.count * send.elem_bytes);
  ranks[1]->CountCall(axis, CollectiveKind::kRecv);
  ranks[1]->CountReceived(axis, CollectiveKind::kRecv, send.count * send.elem_bytes);
  return std::string();
}
}  // namespace detail

template <class T>
void Rank::Send(Axis axis, int dest, const T* data, int64_t count, int64_t elem_bytes, int64_t tag) {
  if (world_->transport() != nullptr) {
    Post p;
    p.rank = rank_;
    p.kind = CollectiveKind::kSend;
    p.elem_bytes = elem_bytes;
    p.count = count;
    p.pass = pass_;
    p.what = what_;
    return detail::RemoteSend(*this, axis, dest, tag, p, data);
  }
  auto copy = std::make_shared<std::vector<T>>(data, data + count);
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kSend;
  p.type = &typeid(T);
  p.elem_bytes = elem_bytes;
  p.count = count;
  p.in = copy->data();
  p.owned = copy;
  p.pass = pass_;
  p.what = what_;
  world_->PointToPoint(
      axis, rank_, dest, tag, std::move(p),
      [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
        return detail::MatchSendRecv<T>(axis, posts, ranks);
      },
      /*eager=*/true);
}

template <class T>
void Rank::Recv(Axis axis, int src, T* data, int64_t count, int64_t elem_bytes, int64_t tag) {
  Post p;
  p.rank = rank_;
  p.kind = CollectiveKind::kRecv;
  p.type = &typeid(T);
  p.elem_bytes = elem_bytes;
  p.count = count;
  p.out = data;
  if (world_->transport() != nullptr) return detail::RemoteRecv(*this, axis, src, tag, p, data);
  world_->PointToPoint(axis, src, rank_, tag, std::move(p), [axis](const std::vector<Post*>& posts, const std::vector<Rank*>& ranks) {
    return detail::MatchSendRecv<T>(axis, posts, ranks);
  });
}

}  // namespace preflight::sim

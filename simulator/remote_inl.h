// The collectives of the transport runtime (transport.h), from one rank's
// side: the same ring reduce-scatter and all-gather, chain broadcast and
// direct all-to-all and send/recv as world_inl.h runs for all members at
// once, step for step, so every reduction adds in the same order (results are
// bitwise the thread runtime's) and every chunk is counted on the same sender
// and receiver. Each message carries its operation's signature; a receiver
// whose own differs reports the mismatch, as the thread runtime's matcher does.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <typeinfo>
#include <vector>

namespace preflight::sim::detail {

/// One operation of the local rank on a group (or a point-to-point channel:
/// group == nullptr), with the signature every member must post alike.
struct Wire {
  Transport& transport;
  Rank& me;
  const Group* group;
  int64_t tag = 0;
  std::string signature;  // what must agree
  std::string pending;    // "<op> on <where> #<seq>" for hang reports

  int Global(int member) const { return group != nullptr ? group->members[static_cast<size_t>(member)] : member; }

  /// Sends `n` elements to member `to` (a global rank for point-to-point).
  template <class T>
  void Put(int to, const T* data, int64_t n) {
    const size_t head = sizeof(uint32_t) + signature.size();
    std::vector<char> message(head + static_cast<size_t>(n) * sizeof(T));
    const auto len = static_cast<uint32_t>(signature.size());
    std::memcpy(message.data(), &len, sizeof len);
    std::memcpy(message.data() + sizeof len, signature.data(), signature.size());
    if (n > 0) std::memcpy(message.data() + head, data, static_cast<size_t>(n) * sizeof(T));
    transport.Send(group, Global(to), tag, std::move(message));
  }

  /// The next message from member `from`: its elements, after checking that
  /// the sender posted the same operation.
  template <class T>
  std::vector<T> Take(int from) {
    const std::vector<char> message = transport.Recv(group, Global(from), tag, pending);
    uint32_t len = 0;
    std::string theirs;
    if (message.size() >= sizeof len) {
      std::memcpy(&len, message.data(), sizeof len);
      if (message.size() >= sizeof len + len) theirs.assign(message.data() + sizeof len, len);
    }
    if (theirs != signature || (message.size() - sizeof len - len) % sizeof(T) != 0) {
      throw SimError("mismatch on " + pending + ": rank " + std::to_string(me.id()) + " posted " + signature +
                     " but rank " + std::to_string(Global(from)) + " posted " + theirs);
    }
    std::vector<T> out((message.size() - sizeof len - len) / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), message.data() + sizeof len + len, out.size() * sizeof(T));
    return out;
  }
};

template <class T>
Wire MakeWire(Rank& me, const Group& g, const Post& post, bool counts_agree) {
  Transport& t = *me.world().transport();
  Wire w{t, me, &g, 0, {}, me.world().NextOnGroup(g, post)};
  if (g.IndexOf(me.id()) < 0)
    throw SimError("rank " + std::to_string(me.id()) + " is not in the group of " + w.pending);
  // The matcher's checks: kind, element type, modeled size, and the sizes
  // every member must give alike (an all-to-all's splits differ per member).
  Post shape = post;
  if (!counts_agree) shape.counts.clear(), shape.recv_counts.clear();
  w.signature = shape.Describe(Key(g.axis)) + " [" + typeid(T).name() + ", " + std::to_string(post.elem_bytes) +
                " B, op " + std::to_string(static_cast<int>(post.op)) + ", root " + std::to_string(post.root) + "]";
  return w;
}

inline int Mod(int a, int n) { return (a % n + n) % n; }

/// Checks a received chunk's size (a mismatch the signature cannot see).
template <class T>
void ExpectSize(const Wire& w, const std::vector<T>& got, int64_t want, int from) {
  if (static_cast<int64_t>(got.size()) != want) {
    throw SimError("mismatch on " + w.pending + ": rank " + std::to_string(w.Global(from)) + " sends " +
                   std::to_string(got.size()) + " elements to rank " + std::to_string(w.me.id()) + ", which expects " +
                   std::to_string(want));
  }
}

/// RingReduceScatter (world_inl.h) as member `i` runs it: at step s it sends
/// chunk i-s-1 to i+1 and adds chunk i-s-2 from i-1 into its own.
template <class T>
void RemoteRingReduceScatter(Wire& w, std::vector<T>& work, const std::vector<int64_t>& counts, int i,
                             CollectiveKind kind, int64_t elem_bytes, ReduceOp op) {
  const int n = static_cast<int>(counts.size());
  const Axis axis = w.group->axis;
  const std::vector<int64_t> off = Offsets(counts);
  for (int step = 0; step < n - 1; ++step) {
    const auto c_out = static_cast<size_t>(Mod(i - step - 1, n));
    w.Put(Mod(i + 1, n), work.data() + off[c_out], counts[c_out]);
    w.me.CountSent(axis, kind, counts[c_out] * elem_bytes);
    const auto c_in = static_cast<size_t>(Mod(i - step - 2, n));
    const std::vector<T> msg = w.Take<T>(Mod(i - 1, n));
    ExpectSize(w, msg, counts[c_in], Mod(i - 1, n));
    w.me.CountReceived(axis, kind, counts[c_in] * elem_bytes);
    Combine(work.data() + off[c_in], msg.data(), counts[c_in], op);
  }
}

/// RingAllGather as member `i` runs it: at step s it forwards chunk i-s and
/// receives chunk i-s-1.
template <class T>
void RemoteRingAllGather(Wire& w, std::vector<T>& work, const std::vector<int64_t>& counts, int i, CollectiveKind kind,
                         int64_t elem_bytes) {
  const int n = static_cast<int>(counts.size());
  const Axis axis = w.group->axis;
  const std::vector<int64_t> off = Offsets(counts);
  for (int step = 0; step < n - 1; ++step) {
    const auto c_out = static_cast<size_t>(Mod(i - step, n));
    w.Put(Mod(i + 1, n), work.data() + off[c_out], counts[c_out]);
    w.me.CountSent(axis, kind, counts[c_out] * elem_bytes);
    const auto c_in = static_cast<size_t>(Mod(i - step - 1, n));
    const std::vector<T> msg = w.Take<T>(Mod(i - 1, n));
    ExpectSize(w, msg, counts[c_in], Mod(i - 1, n));
    w.me.CountReceived(axis, kind, counts[c_in] * elem_bytes);
    std::copy(msg.begin(), msg.end(), work.begin() + off[c_in]);
  }
}

template <class T>
void RemoteAllReduce(Rank& me, const Group& g, const Post& post, T* data) {
  Wire w = MakeWire<T>(me, g, post, true);
  const int n = g.size();
  me.CountCall(g.axis, CollectiveKind::kAllReduce);
  std::vector<int64_t> chunks(static_cast<size_t>(n), post.count / n);
  for (int i = 0; i < post.count % n; ++i) ++chunks[static_cast<size_t>(i)];
  std::vector<T> work(data, data + post.count);
  const int i = g.IndexOf(me.id());
  RemoteRingReduceScatter(w, work, chunks, i, CollectiveKind::kAllReduce, post.elem_bytes, post.op);
  RemoteRingAllGather(w, work, chunks, i, CollectiveKind::kAllReduce, post.elem_bytes);
  std::copy(work.begin(), work.end(), data);
}

template <class T>
void RemoteAllGather(Rank& me, const Group& g, const Post& post, const T* in, T* out) {
  Wire w = MakeWire<T>(me, g, post, true);
  if (post.counts.size() != g.members.size()) throw SimError("per-member counts do not match the group size");
  me.CountCall(g.axis, CollectiveKind::kAllGather);
  const std::vector<int64_t> off = Offsets(post.counts);
  const int i = g.IndexOf(me.id());
  std::vector<T> work(static_cast<size_t>(off.back()));
  std::copy(in, in + post.counts[static_cast<size_t>(i)], work.begin() + off[static_cast<size_t>(i)]);
  RemoteRingAllGather(w, work, post.counts, i, CollectiveKind::kAllGather, post.elem_bytes);
  std::copy(work.begin(), work.end(), out);
}

template <class T>
void RemoteReduceScatter(Rank& me, const Group& g, const Post& post, const T* in, T* out) {
  Wire w = MakeWire<T>(me, g, post, true);
  if (post.counts.size() != g.members.size()) throw SimError("per-member counts do not match the group size");
  me.CountCall(g.axis, CollectiveKind::kReduceScatter);
  const std::vector<int64_t> off = Offsets(post.counts);
  const int i = g.IndexOf(me.id());
  std::vector<T> work(in, in + off.back());
  RemoteRingReduceScatter(w, work, post.counts, i, CollectiveKind::kReduceScatter, post.elem_bytes, ReduceOp::kSum);
  std::copy(work.begin() + off[static_cast<size_t>(i)], work.begin() + off[static_cast<size_t>(i) + 1], out);
}

/// Direct copies: at step k member i sends to i+k and receives from i-k.
template <class T>
void RemoteAllToAll(Rank& me, const Group& g, const Post& post, const T* in, T* out) {
  Wire w = MakeWire<T>(me, g, post, false);
  const size_t n = g.members.size();
  if (post.counts.size() != n || post.recv_counts.size() != n) {
    throw SimError("mismatch on " + w.pending + ": all-to-all split lists do not match the group size");
  }
  me.CountCall(g.axis, CollectiveKind::kAllToAll);
  const int i = g.IndexOf(me.id());
  const std::vector<int64_t> send_off = Offsets(post.counts);
  const std::vector<int64_t> recv_off = Offsets(post.recv_counts);
  const auto self = static_cast<size_t>(i);
  std::copy(in + send_off[self], in + send_off[self] + post.counts[self], out + recv_off[self]);  // not on the wire
  for (int k = 1; k < static_cast<int>(n); ++k) {
    const auto to = static_cast<size_t>(Mod(i + k, static_cast<int>(n)));
    const auto from = static_cast<size_t>(Mod(i - k, static_cast<int>(n)));
    w.Put(static_cast<int>(to), in + send_off[to], post.counts[to]);
    me.CountSent(g.axis, CollectiveKind::kAllToAll, post.counts[to] * post.elem_bytes);
    const std::vector<T> msg = w.Take<T>(static_cast<int>(from));
    ExpectSize(w, msg, post.recv_counts[from], static_cast<int>(from));
    me.CountReceived(g.axis, CollectiveKind::kAllToAll, post.recv_counts[from] * post.elem_bytes);
    std::copy(msg.begin(), msg.end(), out + recv_off[from]);
  }
}

/// The chain root -> root+1 -> ...: each member receives from its
/// predecessor and forwards to its successor, the last one only receives.
template <class T>
void RemoteBroadcast(Rank& me, const Group& g, const Post& post, T* data) {
  Wire w = MakeWire<T>(me, g, post, true);
  const int n = g.size();
  if (post.root < 0 || post.root >= n) throw SimError("mismatch on " + w.pending + ": broadcast root out of range");
  me.CountCall(g.axis, CollectiveKind::kBroadcast);
  const int i = g.IndexOf(me.id());
  const int k = Mod(i - post.root, n);
  if (k > 0) {
    const std::vector<T> msg = w.Take<T>(Mod(i - 1, n));
    ExpectSize(w, msg, post.count, Mod(i - 1, n));
    me.CountReceived(g.axis, CollectiveKind::kBroadcast, post.count * post.elem_bytes);
    std::copy(msg.begin(), msg.end(), data);
  }
  if (k < n - 1) {
    w.Put(Mod(i + 1, n), data, post.count);
    me.CountSent(g.axis, CollectiveKind::kBroadcast, post.count * post.elem_bytes);
  }
}

/// Point-to-point: the signature holds what both sides must agree on (the
/// element type and modeled size); the count is checked as MatchSendRecv does.
template <class T>
Wire P2pWire(Rank& me, Axis axis, int src, int dst, int64_t tag, const Post& post) {
  Transport& t = *me.world().transport();
  Wire w{t, me, nullptr, tag, {}, me.world().NextOnChannel(axis, src, dst, tag, post)};
  w.signature = std::string("point-to-point on ") + Key(axis) + " [" + typeid(T).name() + ", " +
                std::to_string(post.elem_bytes) + " B]";
  return w;
}

template <class T>
void RemoteSend(Rank& me, Axis axis, int dest, int64_t tag, const Post& post, const T* data) {
  Wire w = P2pWire<T>(me, axis, me.id(), dest, tag, post);
  w.Put(dest, data, post.count);
  // Counted at once under the labels of the send (the thread runtime counts
  // it at the match, under the same labels).
  me.CountSendAs(axis, post.pass, post.what, post.count * post.elem_bytes);
}

template <class T>
void RemoteRecv(Rank& me, Axis axis, int src, int64_t tag, const Post& post, T* data) {
  Wire w = P2pWire<T>(me, axis, src, me.id(), tag, post);
  const std::vector<T> msg = w.Take<T>(src);
  if (static_cast<int64_t>(msg.size()) != post.count) {
    throw SimError("mismatch on " + w.pending + ": send of " + std::to_string(msg.size()) +
                   " elements matched a recv of " + std::to_string(post.count));
  }
  std::copy(msg.begin(), msg.end(), data);
  me.CountCall(axis, CollectiveKind::kRecv);
  me.CountReceived(axis, CollectiveKind::kRecv, post.count * post.elem_bytes);
}

}  // namespace preflight::sim::detail

#include "world.h"

#include <algorithm>
#include <exception>
#include <new>
#include <sstream>
#include <thread>

namespace preflight {

const char* Name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
  }
  return "?";
}

const char* Key(SimCategory c) {
  switch (c) {
    case SimCategory::kReplicatedParams: return "replicated_params";
    case SimCategory::kTpShardedParams: return "tp_sharded_params";
    case SimCategory::kEpShardedParams: return "ep_sharded_params";
    case SimCategory::kGradients: return "gradients";
    case SimCategory::kOptimizerMuon: return "optimizer_muon";
    case SimCategory::kOptimizerAdamW: return "optimizer_adamw";
    case SimCategory::kActivations: return "activations";
    case SimCategory::kRoutingScratch: return "routing_scratch";
    case SimCategory::kTemporaries: return "temporaries";
    case SimCategory::kRecomputed: return "activations_rerun";
  }
  return "?";
}

namespace sim {

int Group::IndexOf(int rank) const {
  for (int i = 0; i < size(); ++i) {
    if (members[static_cast<size_t>(i)] == rank) return i;
  }
  return -1;
}

void MemoryTracker::Add(SimCategory c, int64_t bytes, const std::string& owner) {
  const int i = static_cast<int>(c);
  live_[i] += bytes;
  live_total_ += bytes;
  if (c == SimCategory::kActivations) {
    activations_live_[owner] += bytes;
    if (live_[i] > peak_[i]) activations_at_peak_ = activations_live_;
  }
  peak_[i] = std::max(peak_[i], live_[i]);
  peak_total_ = std::max(peak_total_, live_total_);
}

void MemoryTracker::ResetPeaks() {
  peak_ = live_;
  peak_total_ = live_total_;
  activations_at_peak_ = activations_live_;
}

void MemoryTracker::Remove(SimCategory c, int64_t bytes, const std::string& owner) {
  live_[static_cast<int>(c)] -= bytes;
  live_total_ -= bytes;
  if (c == SimCategory::kActivations) activations_live_[owner] -= bytes;
}

Allocation::Allocation(MemoryTracker* tracker, SimCategory c, int64_t bytes)
    : tracker_(tracker),
      category_(tracker != nullptr && c == SimCategory::kActivations ? tracker->saved_category() : c),
      bytes_(bytes),
      owner_(tracker != nullptr ? tracker->owner() : "") {
  if (tracker_ != nullptr && category_ == SimCategory::kRecomputed && tracker_->TakeAlias(bytes_)) bytes_ = 0;
  if (tracker_ != nullptr) tracker_->Add(category_, bytes_, owner_);
}
Allocation::Allocation(Allocation&& o) noexcept
    : tracker_(o.tracker_), category_(o.category_), bytes_(o.bytes_), owner_(std::move(o.owner_)) {
  o.tracker_ = nullptr;
  o.bytes_ = 0;
}
Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    Release();
    tracker_ = o.tracker_;
    category_ = o.category_;
    bytes_ = o.bytes_;
    owner_ = std::move(o.owner_);
    o.tracker_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
Allocation::~Allocation() { Release(); }
void Allocation::MoveTo(MemoryTracker* to) {
  if (tracker_ != nullptr) tracker_->Remove(category_, bytes_, owner_);
  tracker_ = to;
  if (tracker_ != nullptr) tracker_->Add(category_, bytes_, owner_);
}
void Allocation::Release() {
  if (tracker_ != nullptr) tracker_->Remove(category_, bytes_, owner_);
  tracker_ = nullptr;
  bytes_ = 0;
}

void Rank::CountCall(Axis axis, CollectiveKind k) {
  if (!counting_) return;
  CommCount& c = counts_[{axis, k, pass_, what_}];
  c.axis = axis;
  c.kind = k;
  c.pass = pass_;
  c.what = what_;
  ++c.calls;
}
void Rank::CountSent(Axis axis, CollectiveKind k, int64_t bytes) {
  if (!counting_) return;
  counts_[{axis, k, pass_, what_}].bytes_sent += bytes;
}
void Rank::CountReceived(Axis axis, CollectiveKind k, int64_t bytes) {
  if (!counting_) return;
  counts_[{axis, k, pass_, what_}].bytes_received += bytes;
}
void Rank::CountSendAs(Axis axis, Pass pass, CommWhat what, int64_t bytes) {
  CommCount& c = counts_[{axis, CollectiveKind::kSend, pass, what}];
  c.axis = axis;
  c.kind = CollectiveKind::kSend;
  c.pass = pass;
  c.what = what;
  ++c.calls;
  c.bytes_sent += bytes;
}
std::vector<CommCount> Rank::Counts() const {
  std::vector<CommCount> out;
  for (const auto& [key, c] : counts_) out.push_back(c);
  // Reports list buckets by their names (axis, kind, pass, what).
  std::sort(out.begin(), out.end(), [](const CommCount& x, const CommCount& y) {
    const std::string_view xa = Key(x.axis), ya = Key(y.axis), xw = Key(x.what), yw = Key(y.what);
    return std::tie(xa, x.kind, x.pass, xw) < std::tie(ya, y.kind, y.pass, yw);
  });
  return out;
}

std::string Post::Describe(const std::string& where) const {
  std::ostringstream os;
  os << Name(kind) << " on " << where;
  if (kind == CollectiveKind::kAllGather || kind == CollectiveKind::kReduceScatter ||
      kind == CollectiveKind::kAllToAll) {
    os << " (counts";
    for (int64_t c : counts) os << ' ' << c;
    if (kind == CollectiveKind::kAllToAll) {
      os << " / recv";
      for (int64_t c : recv_counts) os << ' ' << c;
    }
    os << ')';
  } else {
    os << " (" << count << " elements)";
  }
  return os.str();
}

World::World(int size, Transport* transport) : size_(size), pending_(static_cast<size_t>(size)), transport_(transport) {
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(this, r));
}

const Group& World::NewGroup(Axis axis, const std::vector<int>& members) {
  auto g = std::make_unique<Group>();
  g->id = static_cast<int>(groups_.size());
  g->axis = axis;
  g->members = members;
  groups_.push_back(std::move(g));
  Channel& ch = group_channels_[groups_.back()->id];
  ch.next_seq.assign(members.size(), 0);
  return *groups_.back();
}

void World::FailLocked(const std::string& message) {
  if (error_.empty()) error_ = message;
  cv_.notify_all();
}

void World::CheckDeadlockLocked() {
  if (!error_.empty() || blocked_ == 0 || blocked_ + finished_ != size_) return;
  std::ostringstream os;
  os << "deadlock: no pending operation can complete;";
  for (int r = 0; r < size_; ++r) {
    const std::string& p = pending_[static_cast<size_t>(r)];
    os << " rank " << r << (p.empty() ? " finished" : " waits in " + p) << ';';
  }
  FailLocked(os.str());
}

namespace {
std::string GroupName(Axis axis, const std::vector<int>& members) {
  std::ostringstream os;
  os << Key(axis) << " group [";
  for (size_t i = 0; i < members.size(); ++i) os << (i ? "," : "") << members[i];
  os << ']';
  return os.str();
}
}  // namespace

void World::Rendezvous(Channel& ch, const std::vector<int>& members, int index, Post post, const std::string& where,
                       const Executor& exec, bool eager) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.empty()) throw SimError(error_);
  const int n = static_cast<int>(members.size());
  const int64_t seq = ch.next_seq[static_cast<size_t>(index)]++;
  std::shared_ptr<Slot>& slot_ref = ch.slots[seq];
  if (!slot_ref) {
    slot_ref = std::make_shared<Slot>();
    slot_ref->posts.resize(static_cast<size_t>(n));
    slot_ref->arrived.assign(static_cast<size_t>(n), false);
    slot_ref->waiting.assign(static_cast<size_t>(n), false);
  }
  std::shared_ptr<Slot> slot = slot_ref;
  const std::string description = post.Describe(where) + " #" + std::to_string(seq);
  slot->posts[static_cast<size_t>(index)] = std::move(post);
  slot->arrived[static_cast<size_t>(index)] = true;
  ++slot->arrived_count;
  const auto leave = [&] {
    if (++slot->left == n) ch.slots.erase(seq);
  };
  if (slot->arrived_count == n) {
    std::vector<Post*> posts;
    std::vector<Rank*> ranks;
    for (int i = 0; i < n; ++i) {
      posts.push_back(&slot->posts[static_cast<size_t>(i)]);
      ranks.push_back(ranks_[static_cast<size_t>(members[static_cast<size_t>(i)])].get());
    }
    std::string problem;
    for (int i = 1; i < n && problem.empty(); ++i) {
      const Post& a = *posts[0];
      const Post& b = *posts[static_cast<size_t>(i)];
      const bool p2p_pair = a.kind == CollectiveKind::kSend && b.kind == CollectiveKind::kRecv;
      if ((a.kind != b.kind && !p2p_pair) || a.type != b.type || a.elem_bytes != b.elem_bytes) {
        problem = "mismatch on " + where + " #" + std::to_string(seq) + ": rank " + std::to_string(a.rank) +
                  " posted " + a.Describe(where) + " but rank " + std::to_string(b.rank) + " posted " +
                  b.Describe(where) + (a.type != b.type ? " (different element types)" : "") +
                  (a.elem_bytes != b.elem_bytes ? " (different modeled element sizes)" : "");
      }
    }
    if (problem.empty()) {
      problem = exec(posts, ranks);
      if (!problem.empty()) problem = "mismatch on " + where + " #" + std::to_string(seq) + ": " + problem;
    }
    if (!problem.empty()) {
      FailLocked(problem);
      throw SimError(error_);
    }
    // The waiting members are no longer blocked; un-count them here, before any
    // of them wakes, so the deadlock check never sees a stale blocked count.
    for (int i = 0; i < n; ++i) {
      const int r = members[static_cast<size_t>(i)];
      if (i != index && slot->waiting[static_cast<size_t>(i)]) {
        --blocked_;
        pending_[static_cast<size_t>(r)].clear();
      }
    }
    slot->done = true;
    leave();
    cv_.notify_all();
    return;
  }
  if (eager) {  // the post owns its data; the last member to arrive runs the operation
    leave();
    return;
  }
  slot->waiting[static_cast<size_t>(index)] = true;
  const int me = members[static_cast<size_t>(index)];
  pending_[static_cast<size_t>(me)] = description;
  ++blocked_;
  CheckDeadlockLocked();
  cv_.wait(lock, [&] { return slot->done || !error_.empty(); });
  if (!slot->done) throw SimError(error_);
  leave();
}

void World::Collective(const Group& g, Post post, const Executor& exec) {
  const int index = g.IndexOf(post.rank);
  if (index < 0) throw SimError("rank " + std::to_string(post.rank) + " is not in " + GroupName(g.axis, g.members));
  Rendezvous(group_channels_.at(g.id), g.members, index, std::move(post), GroupName(g.axis, g.members), exec);
}

void World::PointToPoint(Axis axis, int src, int dst, int64_t tag, Post post, const Executor& exec, bool eager) {
  Channel* ch = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ch = &p2p_channels_[{src, dst, tag}];
    if (ch->next_seq.empty()) ch->next_seq.assign(2, 0);
  }
  const int index = post.rank == src ? 0 : 1;
  const std::string where = std::string(Key(axis)) + " channel " + std::to_string(src) + "->" + std::to_string(dst) +
                            (tag != 0 ? " tag " + std::to_string(tag) : "");
  Rendezvous(*ch, {src, dst}, index, std::move(post), where, exec, eager);
}

std::string World::NextOnGroup(const Group& g, const Post& post) {
  const std::string where = GroupName(g.axis, g.members);
  return post.Describe(where) + " #" + std::to_string(group_seq_[g.id]++);
}

std::string World::NextOnChannel(Axis axis, int src, int dst, int64_t tag, const Post& post) {
  const std::string where = std::string(Key(axis)) + " channel " + std::to_string(src) + "->" + std::to_string(dst) +
                            (tag != 0 ? " tag " + std::to_string(tag) : "");
  return post.Describe(where) + " #" + std::to_string(p2p_seq_[{src, dst, tag}]++);
}

namespace {
/// The transport runtime's World::Run: the local rank only; a failure ends
/// the run with the thread runtime's message for it.
void RunLocal(Transport& t, const std::vector<std::unique_ptr<Group>>& groups, Rank& rank,
              const std::function<void(Rank&)>& program) {
  std::vector<const Group*> all;
  for (const auto& g : groups) all.push_back(g.get());
  t.Connect(all);
  const std::string who = "rank " + std::to_string(rank.id());
  try {
    program(rank);
  } catch (const SimError& e) {
    t.Fail(SimFailure::kFailed, e.what());
  } catch (const SimUnsupported& e) {
    t.Fail(SimFailure::kUnsupported, e.what());
  } catch (const std::bad_alloc&) {
    t.Fail(SimFailure::kOutOfMemory, who + " ran out of memory");
  } catch (const std::exception& e) {
    t.Fail(SimFailure::kFailed, who + " failed: " + e.what());
  }
}
}  // namespace

void World::Run(const std::function<void(Rank&)>& program) {
  if (transport_ != nullptr) {
    RunLocal(*transport_, groups_, *ranks_[static_cast<size_t>(transport_->rank())], program);
    return;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < size_; ++r) {
    threads.emplace_back([this, r, &program] {
      try {
        program(*ranks_[static_cast<size_t>(r)]);
      } catch (const SimError&) {
        // Already recorded in error_.
      } catch (const SimUnsupported& e) {
        // A block refused the layout: the caller gets the refusal itself.
        std::lock_guard<std::mutex> lock(mu_);
        if (!unsupported_) unsupported_ = std::current_exception();
        FailLocked("rank " + std::to_string(r) + " cannot run: " + e.what());
      } catch (const std::bad_alloc&) {
        // Out of memory is a resource limit, not a disagreement: the caller
        // gets the bad_alloc itself.
        std::lock_guard<std::mutex> lock(mu_);
        if (!unsupported_) unsupported_ = std::current_exception();
        FailLocked("rank " + std::to_string(r) + " ran out of memory");
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu_);
        FailLocked("rank " + std::to_string(r) + " failed: " + e.what());
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
      CheckDeadlockLocked();
    });
  }
  for (auto& t : threads) t.join();
  if (unsupported_) std::rethrow_exception(unsupported_);
  if (!error_.empty()) throw SimError(error_);
}

}  // namespace sim
}  // namespace preflight

// Simulated ranks and NCCL-like blocking collectives (the executor's runtime).
//
// A World runs N rank programs, one std::thread each (SPMD). Collectives
// rendezvous in a central matcher: the k-th operation a rank issues on a
// group matches the k-th operation of every other member. The last member to
// arrive checks that all posts agree (kind, dtype, sizes, root), then runs the
// algorithm for everyone while the others sleep, so results never depend on
// thread timing. When every rank that is not finished is blocked, nothing can
// progress: the matcher raises a deadlock error naming each blocked rank and
// its pending operation, instead of hanging.
//
// Byte counting: the algorithms move data chunk by chunk exactly as a ring
// (all-reduce = ring reduce-scatter + ring all-gather; all-gather and
// reduce-scatter = n-1 ring steps; broadcast = a chain from the root;
// all-to-all and send/recv = direct copies), and every chunk copy adds its
// size to the sender's bytes_sent and the receiver's bytes_received. Bytes are
// elements x the *modeled* element size the caller gives (bf16 = 2), not
// sizeof(double). No formula of the planner is used here (docs/architecture.md).
#pragma once

#include <condition_variable>
#include <exception>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <typeinfo>
#include <vector>

#include "preflight/simulator/sim.h"
#include "transport.h"

namespace preflight::sim {

/// A collective error: mismatch, deadlock, or a rank that failed. The message
/// names the ranks and their pending operations.
class SimError : public std::runtime_error {
 public:
  explicit SimError(const std::string& what) : std::runtime_error(what) {}
};

enum class ReduceOp { kSum, kMax };

/// A process group: global ranks in group order and the axis it belongs to.
struct Group {
  int id = 0;
  Axis axis = Axis::kTp;
  std::vector<int> members;
  int size() const { return static_cast<int>(members.size()); }
  /// Position of global rank `rank` in the group, or -1.
  int IndexOf(int rank) const;
};

/// Per-rank memory accounting by category, in modeled bytes.
class MemoryTracker {
 public:
  void Add(SimCategory c, int64_t bytes, const std::string& owner = "");
  void Remove(SimCategory c, int64_t bytes, const std::string& owner = "");
  /// Who allocates next (a block family letter, "ends"): activations are also
  /// kept per owner, and the split at the activation peak is recorded.
  void set_owner(const std::string& owner) { owner_ = owner; }
  const std::string& owner() const { return owner_; }
  /// Where the tensors a block keeps for its backward (allocated as
  /// kActivations) are charged: kActivations, kTemporaries in a forward that
  /// keeps nothing (a checkpointed layer's first forward runs under
  /// torch.no_grad), kRecomputed while a recompute rerun regenerates them.
  void set_saved_category(SimCategory c) { saved_category_ = c; }
  SimCategory saved_category() const { return saved_category_; }
  /// The first tensor the next rerun keeps (a block's pre-norm input, SavePreNorm)
  /// is the kept checkpoint input of `bytes` itself, charged nothing:
  /// Megatron's CheckpointFunction.backward reruns on detach_variable(saved
  /// inputs), which share the checkpoint's storage (megatron/core/tensor_parallel/random.py).
  void ExpectAlias(int64_t bytes) { alias_bytes_ = bytes; }
  /// True when `bytes` is the expected alias; any rerun tensor disarms it.
  bool TakeAlias(int64_t bytes) {
    const bool alias = alias_bytes_ >= 0 && bytes == alias_bytes_;
    alias_bytes_ = -1;
    return alias;
  }
  const std::map<std::string, int64_t>& activations_at_peak() const { return activations_at_peak_; }
  int64_t live(SimCategory c) const { return live_[static_cast<int>(c)]; }
  int64_t peak(SimCategory c) const { return peak_[static_cast<int>(c)]; }
  int64_t peak_total() const { return peak_total_; }
  /// Starts the peaks afresh from what is live now (the training step
  /// begins: what building the model held before sharding does not count).
  void ResetPeaks();
  int64_t live_total() const { return live_total_; }

 private:
  std::array<int64_t, kNumSimCategories> live_{};
  std::array<int64_t, kNumSimCategories> peak_{};
  int64_t live_total_ = 0;
  int64_t peak_total_ = 0;
  std::string owner_;
  SimCategory saved_category_ = SimCategory::kActivations;
  int64_t alias_bytes_ = -1;
  std::map<std::string, int64_t> activations_live_, activations_at_peak_;
};

/// RAII: `bytes` of category `c` live on a rank for the lifetime of the object.
class Allocation {
 public:
  Allocation() = default;
  Allocation(MemoryTracker* tracker, SimCategory c, int64_t bytes);
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  Allocation(Allocation&& o) noexcept;
  Allocation& operator=(Allocation&& o) noexcept;
  ~Allocation();
  void Release();
  int64_t bytes() const { return bytes_; }
  /// The same bytes, category and owner charged to `to` instead (activation
  /// offload: device <-> host).
  void MoveTo(MemoryTracker* to);
  /// Whether `t` holds the bytes now.
  bool on(const MemoryTracker* t) const { return tracker_ == t; }

 private:
  MemoryTracker* tracker_ = nullptr;
  SimCategory category_ = SimCategory::kTemporaries;
  int64_t bytes_ = 0;
  std::string owner_;
};

class World;

/// The view one rank program has of the world: its id, its pass, its
/// counters and memory. All collectives block until matched.
class Rank {
 public:
  Rank(World* world, int rank) : world_(world), rank_(rank) {}
  int id() const { return rank_; }
  World& world() { return *world_; }
  void set_pass(Pass p) { pass_ = p; }
  Pass pass() const { return pass_; }
  /// Labels the collectives that follow (CommCount::what).
  void set_what(CommWhat what) { what_ = what; }
  MemoryTracker& memory() { return memory_; }
  const MemoryTracker& memory() const { return memory_; }
  /// Host memory beside the device's: what an offload keeps in pinned host
  /// buffers (the offloaded optimizer state, FSDP's CPU shards), by category.
  MemoryTracker& host_memory() { return host_memory_; }
  const MemoryTracker& host_memory() const { return host_memory_; }
  /// Bytes copied over the host link (cudaMemcpy D2H / H2D), in the modeled
  /// element size; counted apart from the collectives.
  void CountHostCopy(bool to_host, int64_t bytes) { (to_host ? bytes_to_host_ : bytes_to_device_) += bytes; }
  int64_t bytes_to_host() const { return bytes_to_host_; }
  int64_t bytes_to_device() const { return bytes_to_device_; }

  /// In-place all-reduce of `count` elements.
  template <class T>
  void AllReduce(const Group& g, T* data, int64_t count, int64_t elem_bytes, ReduceOp op = ReduceOp::kSum);
  /// `out` receives the members' inputs concatenated in group order; member i
  /// contributes counts[i] elements (uneven gathers allowed, as torch's list form).
  template <class T>
  void AllGather(const Group& g, const T* in, T* out, const std::vector<int64_t>& counts, int64_t elem_bytes);
  /// `in` holds sum(counts) elements; member i receives the reduced block i
  /// (counts[i] elements) in `out`.
  template <class T>
  void ReduceScatter(const Group& g, const T* in, T* out, const std::vector<int64_t>& counts, int64_t elem_bytes);
  /// send_counts[j] elements go to member j (in order in `in`); recv_counts[j]
  /// elements arrive from member j (in order in `out`).
  template <class T>
  void AllToAll(const Group& g, const T* in, const std::vector<int64_t>& send_counts, T* out,
                const std::vector<int64_t>& recv_counts, int64_t elem_bytes);
  /// `data` of member `root` is copied to every member.
  template <class T>
  void Broadcast(const Group& g, T* data, int64_t count, int root, int64_t elem_bytes);
  /// Eager point-to-point (as NCCL's isend into a buffer, or Megatron's
  /// batched isend/irecv): the data is copied out and the call returns at
  /// once; the matching Recv takes it later. Pipeline schedules need this:
  /// with a blocking send, 1F1B's forward send and backward send would wait on
  /// each other. Bytes are counted when the Recv matches, under the sender's
  /// pass and label at the time of the Send.
  /// `tag` selects one of several FIFO channels between the same two ranks
  /// (a pipeline rank sends activations and gradients of several chunks and
  /// micro-batches to one neighbour; tags keep them apart, as NCCL's
  /// per-operation matching does).
  template <class T>
  void Send(Axis axis, int dest, const T* data, int64_t count, int64_t elem_bytes, int64_t tag = 0);
  template <class T>
  void Recv(Axis axis, int src, T* data, int64_t count, int64_t elem_bytes, int64_t tag = 0);

  /// Adds bytes to this rank's counters (called by the algorithms).
  void CountSent(Axis axis, CollectiveKind k, int64_t bytes);
  void CountReceived(Axis axis, CollectiveKind k, int64_t bytes);
  /// Marks one call in the (axis, kind, pass) bucket.
  void CountCall(Axis axis, CollectiveKind k);
  /// As CountCall + CountSent under an explicit pass and label (an eager send
  /// is counted after its rank moved on).
  void CountSendAs(Axis axis, Pass pass, CommWhat what, int64_t bytes);
  std::vector<CommCount> Counts() const;

  /// Verification traffic (a gather only the verifier needs) is not part of
  /// the modeled step: with counting off, collectives move data uncounted.
  void set_counting(bool on) { counting_ = on; }

  /// FLOP counter for the benchmark (2 x multiply-adds).
  void AddFlops(double f) { flops_ += f; }
  double flops() const { return flops_; }

 private:
  World* world_;
  int rank_;
  Pass pass_ = Pass::kForward;
  MemoryTracker memory_;
  MemoryTracker host_memory_;
  int64_t bytes_to_host_ = 0, bytes_to_device_ = 0;
  CommWhat what_ = CommWhat::kUnlabeled;
  std::map<std::tuple<Axis, CollectiveKind, Pass, CommWhat>, CommCount> counts_;
  double flops_ = 0.0;
  bool counting_ = true;
};

/// One rank's part of an operation, as posted to the matcher.
struct Post {
  int rank = 0;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  const std::type_info* type = nullptr;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int64_t elem_bytes = 0;
  int64_t count = 0;                 // AR / broadcast / p2p element count
  std::vector<int64_t> counts;       // AG/RS per-member counts; A2A send counts
  std::vector<int64_t> recv_counts;  // A2A
  const void* in = nullptr;
  void* out = nullptr;
  /// Eager sends: the copied data (`in` points into it) and the sender's
  /// pass and label when it posted.
  std::shared_ptr<const void> owned;
  Pass pass = Pass::kForward;
  CommWhat what = CommWhat::kUnlabeled;
  std::string Describe(const std::string& where) const;
};

/// Checks the matched posts (members in group order) and, when they agree,
/// runs the operation for all of them. Returns an error message, or "" on success.
using Executor = std::function<std::string(const std::vector<Post*>& posts, const std::vector<Rank*>& ranks)>;

class World {
 public:
  /// With a transport, this process runs only rank transport->rank() and
  /// collectives go through the transport (the MPI runtime).
  explicit World(int size, Transport* transport = nullptr);
  int size() const { return size_; }
  Transport* transport() const { return transport_; }
  /// Creates a group; call before Run (groups are fixed for the run).
  const Group& NewGroup(Axis axis, const std::vector<int>& members);
  /// Runs `program` on every rank, one thread each; rethrows the first error
  /// (mismatch, deadlock, or an exception a rank program threw) as SimError,
  /// except that a SimUnsupported thrown by a rank program is rethrown as is.
  /// With a transport: runs the local rank's program in this thread, and a
  /// failure ends the whole run through Transport::Fail.
  void Run(const std::function<void(Rank&)>& program);
  Rank& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  const Rank& rank(int r) const { return *ranks_[static_cast<size_t>(r)]; }

  /// Posts `post` for rank `post.rank` on group `g` and blocks until the
  /// operation ran; the last member to arrive calls `exec` for everyone.
  void Collective(const Group& g, Post post, const Executor& exec);
  /// Point-to-point rendezvous on the channel src -> dst. With `eager`, a
  /// member that arrives first does not wait (its post must own its data).
  void PointToPoint(Axis axis, int src, int dst, int64_t tag, Post post, const Executor& exec, bool eager = false);

  /// The transport runtime's names for a rank's next operation on a group or
  /// a point-to-point channel: "<op> on <where> #<seq>", as the thread runtime's.
  std::string NextOnGroup(const Group& g, const Post& post);
  std::string NextOnChannel(Axis axis, int src, int dst, int64_t tag, const Post& post);

 private:
  struct Slot {
    std::vector<Post> posts;
    std::vector<bool> arrived;
    std::vector<bool> waiting;  // members blocked in Rendezvous (not eager posters)
    int arrived_count = 0;
    int left = 0;  // members that returned after completion
    bool done = false;
  };
  struct Channel {
    std::map<int64_t, std::shared_ptr<Slot>> slots;
    std::vector<int64_t> next_seq;  // per member
  };
  void Rendezvous(Channel& ch, const std::vector<int>& members, int index, Post post, const std::string& where,
                  const Executor& exec, bool eager = false);
  void FailLocked(const std::string& message);
  void CheckDeadlockLocked();

  int size_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::map<int, Channel> group_channels_;
  std::map<std::tuple<int, int, int64_t>, Channel> p2p_channels_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> pending_;  // per rank: description while blocked, else empty
  int blocked_ = 0;
  int finished_ = 0;
  std::string error_;
  std::exception_ptr unsupported_;  // the first SimUnsupported (or bad_alloc) a rank program threw
  Transport* transport_ = nullptr;
  std::map<int, int64_t> group_seq_;                          // transport runtime: the local rank's
  std::map<std::tuple<int, int, int64_t>, int64_t> p2p_seq_;  // operations so far, per group / channel
};

}  // namespace preflight::sim

#include "world_inl.h"

// Internals of the capacity model shared by its translation units: the walk
// over a rank's chunks, the per-rank parameter tallies, and the text helpers of
// --explain. Not a public header.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "preflight/estimator/estimate.h"
#include "preflight/estimator/memory_terms.h"
#include "preflight/estimator/pipeline_replay.h"

namespace preflight::estimator_detail {

using Sink = std::vector<Explanation>;
inline constexpr int kRep = static_cast<int>(ShardClass::kReplicated);
inline constexpr int kTp = static_cast<int>(ShardClass::kTpSharded);
inline constexpr int kEp = static_cast<int>(ShardClass::kEpSharded);
inline constexpr int kAdam = static_cast<int>(OptimizerKind::kAdamW);
inline constexpr int kMuon = static_cast<int>(OptimizerKind::kMuon);

inline int64_t Mul(int64_t a, int64_t b) { return CheckedMul(a, b); }
inline int64_t Add(int64_t a, int64_t b) { return CheckedAdd(a, b); }

// ---- --explain text (slow path, only called with a sink) ----

/// Concatenation by append (GCC 12 raises a false -Wrestrict on "literal" + std::string).
std::string Cat(std::initializer_list<std::string_view> parts);
/// "k1=v1 k2=v2 ...".
std::string Inputs(std::initializer_list<std::pair<const char*, int64_t>> kv);
/// A recipe double with 4 significant digits.
std::string Decimal(double x);
/// The family letter ("A") of FamilyIndex f.
std::string FamilyName(int f);
void Note(Sink* sink, Category c, std::string item, std::string formula, std::string inputs, Bytes bytes);

// ---- the per-rank tallies ----

/// Local (this rank's) parameters: element counts [ShardClass][OptimizerKind]
/// (for grads and optimizer state), of them those stored in fp32 (the
/// distributed optimizer's buffers are per dtype), and parameter-copy bytes
/// [ShardClass] (from each tensor's own dtype: Mamba's A_log and D stay fp32).
struct LocalParams {
  std::array<std::array<int64_t, 2>, 3> elements{};
  std::array<std::array<int64_t, 2>, 3> fp32{};
  std::array<int64_t, 3> bytes{};
  /// Of `bytes`, the untrained buffers' (the router's expert bias): no
  /// gradient, no optimizer state, and under ZeRO 3 kept whole on every rank
  /// (FSDP shards parameters only; torch fully_shard leaves module buffers as
  /// they are), never in a share or a gathered unit.
  std::array<int64_t, 3> buffer_bytes{};
  /// The bytes a ZeRO 3 gather brings in: the parameters, not the buffers.
  std::array<int64_t, 3> Gathered() const {
    std::array<int64_t, 3> out{};
    for (size_t c = 0; c < 3; ++c) out[c] = bytes[c] - buffer_bytes[c];
    return out;
  }
};

inline int64_t ClassSum(const LocalParams& e, int c) { return Add(e.elements[c][0], e.elements[c][1]); }

/// FP4 GEMMs (training.precision.fp4): the Transformer Engine copies of this
/// rank's linear weights, rowwise and columnwise, per ShardClass, and under
/// fp4_params the parameter-copy bytes of those weights they replace.
struct Fp4Copies {
  std::array<int64_t, 3> copies{};
  std::array<int64_t, 3> replaced{};
};

/// Pricing context: degrees and per-element sizes fixed for one EstimateRank call.
struct Context {
  int64_t dense_group = 1;   // D_dense = d * c: Megatron shards dense state over DP x CP (docs/formulas.md §2.2)
  int64_t expert_group = 1;  // D_exp = d_e, the expert-data-parallel group
  int64_t beta_g = 4;
  int64_t beta_p = 2;        // bytes of a parameter element outside the fp32 buffers (precision.params)
  bool zero3 = false;        // track the ZeRO-3 gathered units (GatherPeak)
  bool fsdp_cpu_offload = false;  // ZeRO 3 shards on the host (parallel.fsdp_cpu_offload)
  Fp4Format fp4 = Fp4Format::kNone;  // training.precision.fp4
  bool fp4_params = false;           // training.precision.fp4_params
  /// parallel.optimizer_sharding: layer_wise (deal the tensors; it applies at zero 1 only).
  bool layer_wise = false;
  int64_t master = 0;    // bytes of an fp32 master element (0 without master copies)
  int64_t momentum = 4;  // bytes of a Muon momentum element
  int64_t group(int c) const { return c == kEp ? expert_group : dense_group; }
};

/// Optimizer-state bytes of one element owned by optimizer o (OptimizerKind
/// index): Muon's momentum or AdamW's two fp32 moments, plus the fp32 master.
inline int64_t StateBytesPerElement(int o, const Context& x) { return Add(o == kMuon ? x.momentum : 8, x.master); }

/// A ZeRO unit (one layer, the embedding, or the head with the final norm):
/// what ZeRO 2/3 hold of it unsharded during its backward.
struct UnitExtra {
  int64_t grads = 0;   // its local elements (every buffer) * beta_g
  int64_t layer = -1;  // layer index, -1 = embedding/head unit
};

/// What the busiest data-parallel rank (rank 0 of both groups) owns of the
/// zero-padded flat buffers (simulator/dist_optimizer.h: per unit one buffer
/// per dense or expert, optimizer, element dtype; rank 0 keeps ceil(n / D) of
/// each), summed over units.
struct Shares {
  /// Elements [OptimizerKind][dense 0 / expert 1]: optimizer state (ZeRO >= 1)
  /// and, summed over optimizers, the owned gradient shares (ZeRO >= 2).
  std::array<std::array<int64_t, 2>, 2> elements{};
  /// Bytes [dense, expert]: ceil(n / D) * the buffer's element bytes (beta_p,
  /// 4 for the fp32 buffers): the owned parameter shares (ZeRO 3 only, else 0).
  std::array<int64_t, 2> param_bytes{};
};

/// ZeRO 3 gathered parameters, per class [ShardClass], in bytes. The
/// executor gathers a unit with the next one of its chunk prefetched (in
/// backward the one before) and releases it after its compute, so at most two
/// adjacent units of one chunk are full at once; its per-class peak is the
/// most any adjacent pair (u, u+1) of a chunk holds (a one-unit chunk: that
/// unit). The embedding is the first unit of its chunk and the head (with the
/// final norm) the last; their bytes are known only after the walk, so the
/// walk keeps the layers next to them and Peak() adds them.
struct GatherPeak {
  std::array<int64_t, 3> pairs{};            // max over adjacent layer pairs of a chunk, a lone layer itself
  std::array<int64_t, 3> after_embedding{};  // the first layer of the embedding's chunk
  std::array<int64_t, 3> before_head{};      // the last layer of the head's chunk
  bool embedding_then_head = false;          // a chunk holding both ends and no layer
  std::array<int64_t, 3> prev{};             // the layer before, in `chunk`
  const StageChunk* chunk = nullptr;

  /// Layer i of chunk c, in execution order, with its full local bytes per class.
  void Layer(const StageChunk& c, int64_t i, const std::array<int64_t, 3>& full) {
    if (&c != chunk) {
      prev = {};
      chunk = &c;
    }
    for (size_t k = 0; k < 3; ++k) {
      pairs[k] = std::max(pairs[k], Add(prev[k], full[k]));
      prev[k] = full[k];
    }
    if (c.owns_embedding && i == c.first_layer) after_embedding = full;
    if (c.owns_head && i + 1 == c.end_layer) before_head = full;
  }
  /// Per class, the peak with the embedding and head units' full bytes.
  std::array<int64_t, 3> Peak(const std::array<int64_t, 3>& embedding, const std::array<int64_t, 3>& head) const {
    std::array<int64_t, 3> out{};
    for (size_t k = 0; k < 3; ++k) {
      const int64_t with_embedding = Add(embedding[k], embedding_then_head ? head[k] : after_embedding[k]);
      out[k] = std::max({pairs[k], with_embedding, Add(before_head[k], head[k])});
    }
    return out;
  }
};

/// Megatron's layer-wise distributed optimizer (parallel.optimizer_sharding:
/// layer_wise): the optimizer-state elements [OptimizerKind][dense 0 /
/// expert 1] of the whole tensors that the heaviest data-parallel rank and the
/// last one (Megatron logs the last global rank) own.
struct LayerWiseOwned {
  std::array<std::array<int64_t, 2>, 2> heaviest{};
  std::array<std::array<int64_t, 2>, 2> last{};
};

/// What one pass over the rank's chunks collects.
struct Walk {
  LocalParams layers;                    // every layer whose params live here
  std::array<int64_t, 5> layer_count{};  // per family, mirrored DualPipe stages included
  std::array<int64_t, 5> units{};        // per family: layers x micro-batches in flight at the activation peak
  std::array<int64_t, 5> stored_units{};  // of them, those keeping every activation (Kept::kAll)
  int64_t chunk_layers = 0;               // the most framework layers of one chunk on this rank
  std::array<int64_t, 5> own_layers{};   // per family, own stages only (serving state)
  bool embedding = false;
  bool head = false;
  int64_t embedding_units = 0;  // micro-batches in flight on the chunk owning the embedding, at the peak
  int64_t head_units = 0;       // micro-batches whose head/loss saved terms are live at the peak
  bool loss_transient_live = false;  // the loss's transient is live at the peak (the head runs)
  int64_t in_flight = 0;
  UnitExtra grad_unit;          // ZeRO 2/3: the unit with the most unsharded gradients
  Shares shares;                // ZeRO >= 1: the owned shares of every unit's buffers
  GatherPeak gather;            // ZeRO 3 (Context::zero3): the layers' part of the gathered peak
  std::array<int64_t, 3> gathered{};  // ZeRO 3: GatherPeak::Peak with the ends (set after EndsOf)
  Fp4Copies fp4;                      // the layers' FP4 weight copies
  LayerWiseOwned layer_wise;          // Context::layer_wise: set by LayerWiseOf after EndsOf
  OffloadOnRank offload;              // training.activation_offload's groups on the rank (set by WalkOf)
};

/// Activation bytes one micro-batch keeps per piece of a chunk, fixed for one
/// EstimateRank call; each figure is computed on first use.
/// Which of ActivationRates' rates a sublayer keeps for backward: nothing,
/// the layout's policy (ActivationRates::Layer) or every activation
/// (ActivationRates::Stored).
enum class Kept { kNothing, kPolicy, kAll };

/// Full recompute checkpoints framework layers, the input of a transformer
/// layer (Megatron checkpoints whole layers, recompute.py; Korthikanti et
/// al.: 2sbh a layer): uniform keeps the input of the first of every
/// recompute_layers layers of a chunk, block the inputs of the chunk's first
/// recompute_layers layers and every activation of the rest. `j` is the
/// sublayer's framework layer within its chunk (LayerInChunk).
inline Kept KeptBy(const Layer& layer, int64_t j, Recompute recompute, const TrainingConfig& t) {
  if (recompute != Recompute::kFull) return Kept::kPolicy;
  const int64_t n = t.recompute_layers;
  const bool block = t.recompute_method == RecomputeMethod::kBlock;
  if (block && j >= n) return Kept::kAll;
  return layer.starts_layer && (block || j % n == 0) ? Kept::kPolicy : Kept::kNothing;
}

/// The framework layer (Inventory::layer_starts) of sublayer `i`, counted
/// from the chunk that starts at sublayer `first`.
inline int64_t LayerInChunk(const Inventory& inv, int64_t first, int64_t i) {
  // The framework layers starting in (first, i].
  return inv.RangeLayerStarts(first + 1, i + 1);
}

/// Per family (FamilyIndex), the sublayers of a range that KeptBy keeps by the
/// policy and those it keeps whole.
struct KeptCounts {
  std::array<int64_t, 5> policy{};
  std::array<int64_t, 5> all{};
  bool operator==(const KeptCounts&) const = default;
};
/// KeptBy summed over the sublayers [first, end) of the chunk that starts at
/// `chunk_first`, from the inventory's prefix counts: O(families), not
/// O(layers). False, leaving `out` unspecified, when the counts do not give it
/// (an inventory without its prefix counts; full recompute's uniform method
/// over more than one layer, whose checkpoints depend on each layer's place).
bool CountKept(const Inventory& inv, int64_t chunk_first, int64_t first, int64_t end, Recompute recompute,
               const TrainingConfig& t, KeptCounts* out);

class ActivationRates {
 public:
  ActivationRates(const Inventory& inv, const Layout& l) : inv_(inv), l_(l) {}
  /// LayerActivations of family f (FamilyIndex) less LayerOffloaded.
  Bytes Layer(int f);
  /// The same without recompute: a layer full recompute's block method does
  /// not checkpoint.
  Bytes Stored(int f);
  /// FirstStageActivations: the embedding's token ids.
  Bytes Embedding();
  /// The head's saved terms (final-norm and head inputs, norm statistics, the
  /// loss's fp32 output): LastStageActivations less the loss's transient.
  Bytes HeadSaved();
  /// LossTransientActivations: live only while the head and its loss run.
  Bytes LossTransient();
  /// One micro-batch through chunk `c` (layers [first, end) and its ends).
  ChunkActivation Chunk(const StageChunk& c);
  /// LayerActivations of family f without recompute (what a recomputed layer
  /// holds again in its backward).
  Bytes Unrecomputed(int f);
  /// LayerOffloaded of family f under the layout's policy (`none`: without recompute).
  Bytes Offloaded(int f, bool none);
  /// LayerWorkspace of family f.
  Bytes Workspace(int f);
  /// The MoE routing scratch of one layer (RouteMoeOn's peak).
  Bytes RoutingPeak();
  /// Each pipeline rank's interleaved or DualPipe(V) replay (ForEachChunk),
  /// kept when set: it reads the plan and the activations only, so a rank's
  /// visit keys, its walk and the ZeRO groups of one layout share it
  /// (EstimateRanksByZero). One layout's schedule fills one of the two.
  struct Replays {
    std::vector<InterleavedPeak> peak;
    std::vector<DualPipeVPeak> dual;
    std::vector<char> known;
  };
  Replays* replays = nullptr;

 private:
  /// `slot` computed on first use: every figure depends on the layout only,
  /// and the ranks of one layout share them (EstimateRanks).
  template <class F>
  static Bytes Once(int64_t& slot, F&& compute) {
    if (slot < 0) slot = compute().count();
    return Bytes(slot);
  }
  const Inventory& inv_;
  const Layout& l_;
  std::array<int64_t, 5> layer_{-1, -1, -1, -1, -1}, stored_{-1, -1, -1, -1, -1};
  std::array<int64_t, 5> unrecomputed_{-1, -1, -1, -1, -1}, workspace_{-1, -1, -1, -1, -1};
  std::array<std::array<int64_t, 5>, 2> offloaded_{{{-1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1}}};
  int64_t embedding_ = -1, head_saved_ = -1, loss_transient_ = -1, routing_ = -1;
};

/// What the pipeline schedule keeps in flight on one rank (ForEachChunk).
struct InFlight {
  int64_t units = 0;         // most live (chunk, micro-batch) units at any time
  int64_t head_units = 1;    // micro-batches whose head saved terms are live at the activation peak
  bool loss_transient_live = true;  // the loss's transient is live at the peak (1F1B: the last stage peaks at its head)
};

/// Elements of the pipeline-end tensors on this rank, by item.
struct Ends {
  LocalParams embedding;
  LocalParams head;  // output head, or the tied copy on the last stage
  LocalParams final_norm;
  bool tied_copy = false;
  Fp4Copies mtp_fp4;  // the MTP modules' FP4 weight copies (last stage)
};

/// Local elements of one tensor on this layout (vocabulary rows padded; a
/// routed-expert stack: the rank's experts).
int64_t TensorLocalElements(const ParamTensor& t, const Inventory& inv, const Layout& l);

/// This rank's share of a layer's totals: each class /1, /t or /(e*t_e), rounded up.
LocalParams LocalOf(const ParamTotals& totals, const Layout& l);
void AddInto(LocalParams& into, const LocalParams& x);
/// A unit's unsharded gradients (every buffer) under `x`.
UnitExtra UnitOf(const LocalParams& e, const Context& x, int64_t layer);
/// Keeps the unit with the most unsharded gradients.
void Offer(Walk& w, const UnitExtra& u);
/// Adds one unit's owned shares (its buffers' ceil(n / D)) to `w`.
void AddUnitShares(Walk& w, const LocalParams& unit, const Context& x);
/// What a layer adds to the walk that depends only on its totals and the
/// layout, remembered per family: a family's layers usually have equal totals
/// (a sweep walks every layer of every layout; divisions are its cost), and
/// every rank of a layout reuses them.
struct LayerMemo {
  const ParamTotals* totals = nullptr;
  LocalParams local;
  UnitExtra unit;
  Shares shares;
  Fp4Copies fp4;
};
using LayerMemos = std::array<LayerMemo, 5>;

/// One pass over the layers on rank r (ForEachChunk), tallying params, units
/// and counts; `memo` holds the layout's per-family figures (shared by its ranks).
Walk WalkRank(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, bool regular, const Context& x,
              ActivationRates& rates, LayerMemos& memo);
/// What a walk reads of one visit (ForEachChunk) when VisitByFamilies
/// prices it: ranks with equal visits, in order, and equal in-flight figures
/// have equal walks (RankVisits).
struct VisitKey {
  std::array<int64_t, 5> counts{};
  KeptCounts kept;  // differs from counts under full recompute only
  /// ZeRO 3 (GatherByFamilies): the first and last sublayer's families,
  /// whether the visit goes on with the previous visit's chunk, and whether
  /// it holds the embedding's first or the head's last neighbour.
  struct Gather {
    int first = -1, last = -1;
    bool continues = false, after_embedding = false, before_head = false;
    bool operator==(const Gather&) const = default;
  } gather;
  int64_t layers = 0;  // framework layers starting in it
  int64_t in_flight = 0;
  bool mirrored = false, embedding = false, head = false;
  bool operator==(const VisitKey&) const = default;
};
/// Whether the sublayers alternate attention and an MLP (a transformer stack:
/// recipe/partition.h LayerStarts steps by two): every adjacent pair of a
/// range is then one of its attentions beside one of its MLPs, and ZeRO 3's
/// gathered pairs go by family counts (GatherByFamilies).
bool TransformerStack(const Inventory& inv);
/// Rank r's visits into `out` (cleared first; the Gather fields in a
/// transformer stack) and its InFlight, which do not depend on the ZeRO
/// stage; false when a visit would not go by family counts (non-uniform
/// family, kept layers not countable: CountKept) or when the schedule is
/// interleaved (its replay is the walk's cost). Under ZeRO 3 the visits
/// compare walks only in a transformer stack (elsewhere the gathered pairs
/// follow the layers' order).
bool RankVisits(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, bool regular,
                ActivationRates& rates, std::vector<VisitKey>* out, InFlight* in_flight);

/// Which Ends entry a pipeline-end tensor goes to.
enum class EndPart { kEmbedding, kFinalNorm, kHead, kTiedCopy };

/// Calls f(tensor, part) for each pipeline-end tensor rank `w` holds: the
/// word and position embeddings on the first stage; on the last the final
/// norms, the head, the MTP modules and, with tied weights (or MTP, which
/// embeds the shifted tokens: GPTModel builds its embedding on the MTP stage
/// too) and the ends on different ranks, Megatron's second V*h/t copy of the
/// word embedding, whose grad it all-reduces (docs/formulas.md §1.1).
template <class F>
void ForEachEndTensor(const Inventory& inv, const Walk& w, F&& f) {
  if (w.embedding) {
    f(inv.embedding, EndPart::kEmbedding);
    for (const ParamTensor& t : inv.positions) f(t, EndPart::kEmbedding);
  }
  if (!w.head) return;
  if (inv.final_norms.empty()) f(inv.final_norm, EndPart::kFinalNorm);
  for (const ParamTensor& t : inv.final_norms) f(t, EndPart::kFinalNorm);
  for (const ParamTensor& t : inv.head) f(t, EndPart::kHead);
  for (const ParamTensor& t : inv.mtp) f(t, EndPart::kHead);
  if (inv.recipe.model.embedding_on_last_stage() && !w.embedding) f(inv.embedding, EndPart::kTiedCopy);
}

/// The embedding, head (or tied copy) and final norm this rank holds.
Ends EndsOf(const Inventory& inv, const Layout& l, const Walk& w, const Context& x);

/// Adds the owned shares of this rank's embedding and head units to the walk:
/// ceil(n/D) of each buffer, the word embedding padded alone when the last
/// stage keeps a copy of it (Megatron's "shared_embedding" bucket).
void AddEndShares(Walk& w, const Inventory& inv, const Layout& l, const Context& x);

using preflight::DealtTensor;

/// Elements [OptimizerKind] that each of the `d` ranks owns (into `owned`,
/// resized to d) when Megatron's layer-wise optimizer deals `tensors`
/// (sorted here, SortForDeal; the i-th goes to DealMember(i, d)).
void DealPingPong(std::vector<DealtTensor>& tensors, int64_t d, std::vector<std::array<int64_t, 2>>* owned);

/// The layer-wise deal of rank r's tensors (its chunks' layers and the ends
/// EndsOf gives it): dense tensors over x.dense_group (d x c), expert ones
/// over x.expert_group; in each group the rank with the most optimizer-state
/// bytes (the two may be different global ranks: their sum bounds the
/// stage's worst rank from above) and the last rank. Allocates only when its
/// thread-local tensor lists grow.
LayerWiseOwned LayerWiseOf(const Inventory& inv, const Layout& l, const StagePlan& plan, int64_t r, bool regular,
                           const Walk& w, const Context& x);

/// What the last data-parallel rank holds less than the heaviest one: the
/// optimizer state of the tensors dealt to the heaviest beyond the last's
/// (0 unless the layer-wise deal applies: x.layer_wise at zero 1).
Bytes LayerWiseLastLess(const Walk& w, const Layout& l, const Context& x);

/// Chunk `vi` (virtual index) of pipeline rank r: plan.chunks[vi * p + r] by
/// the StagePlan contract, found by a scan if a plan breaks it.
const StageChunk& ChunkOfRank(const StagePlan& plan, int64_t p, int64_t r, int64_t vi);

/// Per-chunk activations of rank r's `v` chunks, cached for the first
/// kCachedChunks (the replay asks for each many times; deeper interleaving is
/// recomputed from the layers, allocation-free either way).
class ChunkActivations {
 public:
  static constexpr int64_t kCachedChunks = 64;
  ChunkActivations(const StagePlan& plan, int64_t p, int64_t r, int64_t v, ActivationRates& rates);
  ChunkActivation operator()(int64_t vi) const {
    return vi < kCachedChunks ? cached_[static_cast<size_t>(vi)] : Uncached(vi);
  }

 private:
  ChunkActivation Uncached(int64_t vi) const;
  const StagePlan& plan_;
  int64_t p_, r_;
  ActivationRates& rates_;
  std::array<ChunkActivation, kCachedChunks> cached_{};
};

/// The interleaved branch of ForEachChunk: replay, then visit each chunk with
/// its live micro-batches at the peak.
template <class F>
InFlight InterleavedChunks(const StagePlan& plan, const Layout& l, int64_t r, int64_t v, ActivationRates& rates,
                           F&& visit) {
  const int64_t p = l.pp;
  const int64_t m = l.micro_batches;
  const int64_t g = l.MicrobatchGroup();
  ActivationRates::Replays* kept = rates.replays;
  const size_t at = static_cast<size_t>(r);
  const bool known = kept != nullptr && at < kept->known.size() && kept->known[at] != 0;
  const InterleavedPeak peak =
      known ? kept->peak[at] : ReplayInterleaved(p, v, m, r, g, ChunkActivations(plan, p, r, v, rates));
  if (kept != nullptr && !known && at < kept->known.size()) {
    kept->peak[at] = peak;
    kept->known[at] = 1;
  }
  InFlight out;
  out.units = peak.units;
  for (int64_t vi = 0; vi < v; ++vi) {
    const StageChunk& c = ChunkOfRank(plan, p, r, vi);
    const int64_t live = InterleavedLiveAtPeak(peak, v, m, g, vi);
    visit(c, c.first_layer, c.end_layer, live, false, true);
    if (c.owns_head) {
      out.head_units = live;
      out.loss_transient_live = InterleavedTableChunk(v, m, g, peak.forward) == vi;
    }
  }
  return out;
}

/// Calls visit(chunk, first_layer, end_layer, in_flight, mirrored, ends) for
/// each range of layers on pipeline rank r with the micro-batches in flight on
/// it at the rank's activation peak (`ends`: the visit that handles the chunk's
/// embedding/head ownership), and returns what the schedule keeps in flight.
/// - 1F1B: min(m, p-r) (Megatron warmup p-r-1, plus one).
/// - Interleaved (more than one chunk on r): the replay of Megatron's order
///   (pipeline_replay.h) with each chunk's bytes from `rates`; each chunk's
///   count is its live micro-batches at the instant the live bytes peak, and
///   the head's logits count only when that instant is the head's forward.
/// - DualPipe: rank r also holds a copy of stage p-1-r (2x params) [DS3]; the
///   p+1 stage-micro-batches [DualPipe README] are split ceil/floor between the two.
/// - DualPipeV: 2p V-stages on p ranks, rank r holding stages r and 2p-1-r:
///   the replay of DualPipe's order (ReplayDualPipeV) with each chunk's bytes;
///   each chunk's count is its live micro-batches at the instant the live bytes
///   peak (the reference executor found the earlier fixed split, p+1 down and
///   p up, wrong: at the peak the down chunk of rank r holds 2p-r and the up
///   chunk r+1). A plan with one chunk on the rank (or m < 2p) keeps the
///   README's PP+1 with PP = 2p: p+1 on its first ceil(n/2) layers, p on the rest.
/// Whether every chunk of `plan` sits where the StagePlan contract puts it
/// (chunk vi of rank r at plan.chunks[vi * p + r]): then a rank's chunks, in
/// plan order, are found without scanning the plan (checked once per layout).
bool RegularPlan(const StagePlan& plan, int64_t p);

/// Calls f(chunk) for each chunk of rank r or (DualPipe's mirror) rank
/// `mirror`, in plan order.
template <class F>
void ChunksOf(const StagePlan& plan, int64_t p, bool regular, int64_t r, int64_t mirror, F&& f) {
  if (!regular) {
    for (const StageChunk& c : plan.chunks) {
      if (c.pipeline_rank == r || c.pipeline_rank == mirror) f(c);
    }
    return;
  }
  const int64_t lo = std::min(r, mirror < 0 ? r : mirror), hi = std::max(r, mirror);
  for (size_t at = 0; at < plan.chunks.size(); at += static_cast<size_t>(p)) {
    f(plan.chunks[at + static_cast<size_t>(lo)]);
    if (hi != lo) f(plan.chunks[at + static_cast<size_t>(hi)]);
  }
}

/// DualPipe(V)'s replay of rank r, `replay()`, or the one `rates.replays`
/// kept for it (InterleavedChunks keeps the interleaved one the same way).
template <class Replay>
DualPipeVPeak KeptDualReplay(ActivationRates& rates, int64_t r, const Replay& replay) {
  ActivationRates::Replays* kept = rates.replays;
  const size_t at = static_cast<size_t>(r);
  if (kept == nullptr || at >= kept->known.size() || at >= kept->dual.size()) return replay();
  if (kept->known[at] == 0) {
    kept->dual[at] = replay();
    kept->known[at] = 1;
  }
  return kept->dual[at];
}

template <class F>
InFlight ForEachChunk(const StagePlan& plan, const Layout& l, int64_t r, bool regular, ActivationRates& rates,
                      F&& visit) {
  const int64_t p = l.pp;
  const int64_t m = l.micro_batches;
  int64_t own = 0;
  if (regular) {
    own = static_cast<int64_t>(plan.chunks.size()) / p;
  } else {
    for (const StageChunk& c : plan.chunks) own += c.pipeline_rank == r ? 1 : 0;
  }
  InFlight out;
  if (l.schedule == Schedule::kDualPipe) {
    const int64_t mirror = p - 1 - r;
    // The rank's own stage and the mirror's copy, found as ChunksOf lists them.
    std::array<const StageChunk*, 2> stage{};
    ChunksOf(plan, p, regular, r, mirror, [&](const StageChunk& c) { stage[c.pipeline_rank == r ? 0 : 1] = &c; });
    if (m >= 2 * p && p % 2 == 0 && m % 2 == 0 && stage[0] != nullptr && stage[1] != nullptr) {
      // The replay of DualPipe's order with each of the rank's two stages' bytes.
      const DualPipeVPeak peak = KeptDualReplay(rates, r, [&] {
        const std::array<ChunkActivation, 2> bytes = {rates.Chunk(*stage[0]), rates.Chunk(*stage[1])};
        return ReplayDualPipe(p, m, r, [&](int64_t c) { return bytes[static_cast<size_t>(c)]; });
      });
      ChunksOf(plan, p, regular, r, mirror, [&](const StageChunk& c) {
        const size_t k = c.pipeline_rank == r ? 0 : 1;
        visit(c, c.first_layer, c.end_layer, peak.live[k], k == 1, true);
        if (c.owns_head) {
          out.head_units = peak.live[k];
          out.loss_transient_live = peak.running == static_cast<int64_t>(k);
        }
      });
      out.units = peak.units;
      return out;
    }
    const int64_t n = DualPipeInFlight(p, m);
    const int64_t own_share = CeilDiv(n, 2);
    ChunksOf(plan, p, regular, r, mirror, [&](const StageChunk& c) {
      if (c.pipeline_rank == r) {
        visit(c, c.first_layer, c.end_layer, own_share, false, true);
      } else {
        visit(c, c.first_layer, c.end_layer, n - own_share, true, true);
      }
    });
    out.units = n;
    return out;
  }
  if (l.schedule == Schedule::kDualPipeV && own == 2 && m >= 2 * p) {
    const DualPipeVPeak peak =
        KeptDualReplay(rates, r, [&] { return ReplayDualPipeV(p, m, r, ChunkActivations(plan, p, r, 2, rates)); });
    for (int64_t vi = 0; vi < 2; ++vi) {
      const StageChunk& c = ChunkOfRank(plan, p, r, vi);
      visit(c, c.first_layer, c.end_layer, peak.live[static_cast<size_t>(vi)], false, true);
      if (c.owns_head) {
        out.head_units = peak.live[static_cast<size_t>(vi)];
        out.loss_transient_live = peak.running == vi;
      }
    }
    out.units = peak.units;
    return out;
  }
  if (l.schedule == Schedule::kDualPipeV) {
    const int64_t down = DualPipeInFlight(p, m);
    const int64_t up = std::min(p, m);
    int64_t j = 0;
    ChunksOf(plan, p, regular, r, -1, [&](const StageChunk& c) {
      if (own == 1) {
        const int64_t mid = c.first_layer + CeilDiv(c.end_layer - c.first_layer, 2);
        visit(c, c.first_layer, mid, down, false, true);
        visit(c, mid, c.end_layer, up, false, false);
      } else {
        visit(c, c.first_layer, c.end_layer, j == 0 ? down : up, false, true);
      }
      ++j;
    });
    out.units = down + up;
    return out;
  }
  if (own <= 1) {
    out.units = OneFOneBInFlight(p, m, r);
    ChunksOf(plan, p, regular, r, -1,
             [&](const StageChunk& c) { visit(c, c.first_layer, c.end_layer, out.units, false, true); });
    return out;
  }
  return InterleavedChunks(plan, l, r, own, rates, visit);
}

// ---- the categories (each fills its own entries of `out`; `sink` may be null) ----

void PriceParams(RankMemory& out, const Walk& w, const Ends& ends, const Layout& l, const Context& x, Sink* sink);
void PriceGradients(RankMemory& out, const Walk& w, const Ends& ends, const Layout& l, const Context& x, Sink* sink);
void PriceOptimizer(RankMemory& out, const Walk& w, const Ends& ends, const Recipe& rc, const Layout& l,
                    const Context& x, Sink* sink);
/// The fp32 copies of lower-precision gradients Megatron's optimizer step
/// makes: allocated between steps, not at the activation peak, and in no
/// category (DeepSpeed frees its own after the step).
Bytes MainGradCopies(const Walk& w, const Ends& ends, const Recipe& rc, const Layout& l, const Context& x);
void PriceActivations(RankMemory& out, const Walk& w, const Inventory& inv, const Layout& l, ActivationRates& rates,
                      Sink* sink);
void PriceRoutingScratch(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, ActivationRates& rates,
                         Sink* sink);
void PriceServing(RankMemory& out, const Walk& w, const Recipe& rc, const Layout& l, Sink* sink);

/// Whether the rank runs MoE layers: its own, or MTP modules at the head
/// whose FFN is MoE (they repeat the model's last layer).
inline bool MoeOnRank(const Walk& w, const Recipe& rc) {
  if (w.layer_count[static_cast<size_t>(FamilyIndex(BlockKind::kMoe))] > 0) return true;
  return w.head && rc.model.mtp_layers > 0 && !rc.model.layers.empty() && rc.model.layers.back() == BlockKind::kMoe;
}

}  // namespace preflight::estimator_detail

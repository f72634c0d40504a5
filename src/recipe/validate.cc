// Semantic checks (docs/recipe.md "Diagnostics", docs/formulas.md §1 and 7.3). Each check
// names the key most likely to be wrong and what would be valid.
#include "validate.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "preflight/recipe/first_error.h"
#include "preflight/recipe/partition.h"
#include "recipe_bounds.h"
#include "schema.h"
#include "suggest.h"

namespace preflight::recipe_internal {
namespace {

bool Has(const std::vector<BlockKind>& layers, BlockKind kind) {
  return std::find(layers.begin(), layers.end(), kind) != layers.end();
}

std::string Str(int64_t v) { return std::to_string(v); }

class Validator {
 public:
  Validator(const Recipe& r, Reporter& ctx) : r_(r), ctx_(ctx), p_(r.parallel) {}

  void Run(bool layers_ok) {
    if (layers_ok) {
      const auto& layers = r_.model.layers;
      if (Has(layers, BlockKind::kAttention)) r_.model.mla ? CheckMla() : CheckAttention();
      if (Has(layers, BlockKind::kMamba)) CheckMamba();
      if (Has(layers, BlockKind::kRecurrent)) CheckRecurrent();
      if (Has(layers, BlockKind::kDenseMlp)) CheckDenseMlp();
      if (Has(layers, BlockKind::kMoe)) {
        CheckMoe();
      } else {
        WarnUnusedExpertParallelism();
      }
    }
    CheckSequence();
    CheckHeadWgrad();
    CheckEmbedding();
    CheckOverlap();
    CheckOffload();
    CheckFsdpCpuOffload();
    CheckOptimizerSharding();
    CheckFp4();
    if (layers_ok) CheckRecomputeModules();
    CheckRecomputeMethod();
    if (layers_ok) CheckSelectiveOp();
    CheckCrossEntropy();
    if (layers_ok) CheckActivationOffload();
    if (layers_ok) CheckMtp();
    if (layers_ok) CheckFlextron();
    if (CheckWorld()) {
      // Always: Megatron builds the expert mesh even without MoE layers and
      // raises unless world % (expert_tp * ep * pp) == 0 [MG parallel_state.py
      // initialize_model_parallel]; Recipe::expert_dp() must stay a positive
      // integer for every caller.
      CheckExpertMesh();
      CheckReplicas(layers_ok && Has(r_.model.layers, BlockKind::kMoe));
      if (CheckGlobalBatch()) CheckSchedule(layers_ok);
    }
    if (layers_ok) CheckPartition();
    if (!Bad({"parallel.sp", "parallel.tp"}) && ctx_.IsWritten("parallel.sp") && p_.sp && p_.tp == 1) {
      ctx_.WarningAt("parallel.sp", "true", "has no effect with parallel.tp = 1 (sequence parallelism splits over TP)");
    }
  }

 private:
  /// True when any of `keys` could not be read (so the check is skipped).
  bool Bad(std::initializer_list<const char*> keys) const {
    return std::any_of(keys.begin(), keys.end(), [this](const char* k) { return ctx_.IsBad(k); });
  }

  /// Reports "parallel.tp = t: must divide <what>; try ..." for divisors of n.
  void TpMustDivide(int64_t n, const std::string& what) {
    ctx_.ErrorAt("parallel.tp", Str(p_.tp), "must divide {}{}", what, TryDivisorsOf(n, p_.tp));
  }

  void CheckAttention() {
    const AttentionConfig& a = r_.model.attention;
    if (Bad({"model.attention"})) return;
    if (a.heads % a.kv_heads != 0) {
      ctx_.ErrorAt("model.attention.kv_heads", Str(a.kv_heads),
                   "must divide model.attention.heads ({}) for grouped-query attention{}", a.heads,
                   TryDivisorsOf(a.heads, a.kv_heads));
      return;
    }
    if (Bad({"parallel.tp"})) return;
    if (a.heads % p_.tp != 0 || a.kv_heads % p_.tp != 0) {
      const int64_t both = std::gcd(a.heads, a.kv_heads);
      TpMustDivide(both, fmt::format("model.attention.heads ({}) and kv_heads ({})", a.heads, a.kv_heads));
      return;
    }
    if (p_.cp > 1 && p_.cp_comm == CpComm::kA2a && !Bad({"parallel.cp", "parallel.cp_comm"})) {
      // Ulysses re-splits heads over CP: TE's flash_attn_a2a_communicate views
      // the local heads as [cp, heads/cp] for q, k and v alike.
      const int64_t local = std::gcd(a.heads, a.kv_heads) / p_.tp;
      if (local % p_.cp != 0) {
        ctx_.ErrorAt("parallel.cp", Str(p_.cp),
                     "cp_comm a2a splits the attention heads over cp: heads/tp ({}) and kv_heads/tp ({}) "
                     "must both be divisible by cp{}, or use cp_comm p2p",
                     a.heads / p_.tp, a.kv_heads / p_.tp, TryDivisorsOf(local, p_.cp));
      }
    }
  }

  void CheckMla() {
    if (Bad({"model.mla.heads", "parallel.tp"})) return;
    const int64_t heads = r_.model.mla->heads;
    if (heads % p_.tp != 0) {
      TpMustDivide(heads, fmt::format("model.mla.heads ({})", heads));
      return;
    }
    if (p_.cp > 1 && p_.cp_comm == CpComm::kA2a && !Bad({"parallel.cp", "parallel.cp_comm"}) &&
        (heads / p_.tp) % p_.cp != 0) {
      ctx_.ErrorAt("parallel.cp", Str(p_.cp),
                   "cp_comm a2a splits the attention heads over cp: model.mla.heads/tp ({}) must be "
                   "divisible by cp{}, or use cp_comm p2p",
                   heads / p_.tp, TryDivisorsOf(heads / p_.tp, p_.cp));
    }
  }

  void CheckMamba() {
    const MambaConfig& m = r_.model.mamba;
    if (Bad({"model.mamba", "model.hidden"})) return;
    const int64_t inner = m.Inner(r_.model.hidden);  // bounded: <= 2^34 either way
    if (m.heads == 0 && inner % m.head_dim != 0) {
      ctx_.ErrorAt("model.mamba.head_dim", Str(m.head_dim),
                   "must divide the Mamba inner width expand x hidden = {} x {} = {}{}, or set "
                   "model.mamba.heads",
                   m.expand, r_.model.hidden, inner, TryDivisorsOf(inner, m.head_dim));
      return;
    }
    const int64_t heads = m.Heads(r_.model.hidden);
    const std::string heads_from = m.heads > 0 ? "model.mamba.heads" : "expand x hidden / head_dim";
    if (heads % m.groups != 0) {
      ctx_.ErrorAt("model.mamba.groups", Str(m.groups), "must divide the Mamba head count {} = {}{}", heads_from, heads,
                   TryDivisorsOf(heads, m.groups));
      return;
    }
    if (Bad({"parallel.tp"})) return;
    if (heads % p_.tp != 0 || m.groups % p_.tp != 0) {
      TpMustDivide(m.groups,
                   fmt::format("the Mamba heads ({} = {}) and model.mamba.groups ({})", heads, heads_from, m.groups));
      return;
    }
    if (p_.cp <= 1 || Bad({"parallel.cp", "parallel.cp_recurrent"})) return;
    if (p_.cp_recurrent == CpRecurrent::kAllToAll) {
      CheckMambaCp(heads, m.groups);
    } else {
      CheckHandoffConvTail("model.mamba.d_conv", m.d_conv);
    }
  }

  /// Mamba all-to-all CP (docs/formulas.md §1.4): heads % (tp*cp) == 0, and the local
  /// groups g = groups/tp satisfy g % cp == 0 or cp % g == 0. The hand-off
  /// mode (parallel.cp_recurrent: handoff) has no head rule.
  void CheckMambaCp(int64_t heads, int64_t groups) {
    const int64_t local_heads = heads / p_.tp;
    const int64_t local_groups = groups / p_.tp;
    const auto valid = [&](int64_t c) {
      return local_heads % c == 0 && (local_groups % c == 0 || c % local_groups == 0);
    };
    if (valid(p_.cp)) return;
    ctx_.ErrorAt("parallel.cp", Str(p_.cp),
                 "Mamba all-to-all context parallelism needs heads/tp ({}) divisible by cp and groups/tp "
                 "({}) divisible by cp or dividing it (docs/formulas.md §1.4); {}, or set parallel.cp_recurrent: "
                 "handoff",
                 local_heads, local_groups, TryText(NearestValid(p_.cp, 1, local_heads, valid)));
  }

  /// Sequence chunks a CP rank's positions are cut into: 2*cp with causal
  /// load balancing (rank r holds chunks r and 2cp-1-r), else cp.
  int64_t CpChunks() const { return p_.cp_load_balance ? 2 * p_.cp : p_.cp; }

  /// The CP state hand-off [OURS] passes the causal conv's last d_conv - 1
  /// inputs from one sequence chunk to the next: a chunk must hold them, so
  /// seq_len / chunks >= d_conv - 1.
  void CheckHandoffConvTail(const char* conv_key, int64_t d_conv) {
    if (Bad({"training.seq_len", "parallel.cp_load_balance", conv_key})) return;
    const int64_t s = r_.training.seq_len;
    const int64_t tail = d_conv - 1;
    if (s % CpChunks() != 0 || s / CpChunks() >= tail) return;  // CheckSequence reports the first
    const int64_t per_rank_chunks = p_.cp_load_balance ? 2 : 1;
    const int64_t max_cp = tail > 0 ? s / (per_rank_chunks * tail) : p_.cp;
    ctx_.ErrorAt("parallel.cp", Str(p_.cp),
                 "the context-parallel state hand-off needs every sequence chunk (seq_len / {} = {} "
                 "positions) to hold the conv tail of {} - 1 = {} positions; {}",
                 CpChunks(), s / CpChunks(), conv_key, tail,
                 max_cp >= 1 ? fmt::format("use cp <= {}", max_cp) : std::string("use a longer training.seq_len"));
  }

  void CheckRecurrent() {
    const RecurrentConfig& rc = r_.model.recurrent;
    if (Bad({"model.recurrent"})) return;
    if (rc.width % rc.heads != 0) {
      ctx_.ErrorAt("model.recurrent.heads", Str(rc.heads),
                   "must divide model.recurrent.width ({}) into equal gate blocks{}", rc.width,
                   TryDivisorsOf(rc.width, rc.heads));
      return;
    }
    if (Bad({"parallel.tp"})) return;
    if (rc.heads % p_.tp != 0) {
      TpMustDivide(rc.heads, fmt::format("model.recurrent.heads ({} gate blocks)", rc.heads));
      return;
    }
    if (p_.cp <= 1 || Bad({"parallel.cp", "parallel.cp_recurrent"})) return;
    if (p_.cp_recurrent == CpRecurrent::kHandoff) {
      CheckHandoffConvTail("model.recurrent.d_conv", rc.d_conv);
      return;
    }
    // All-to-all CP [OURS, docs/formulas.md §7.2] splits the gate blocks over tp*cp.
    const int64_t local_blocks = rc.heads / p_.tp;
    if (local_blocks % p_.cp == 0) return;
    ctx_.ErrorAt("parallel.cp", Str(p_.cp),
                 "recurrent all-to-all context parallelism needs model.recurrent.heads/tp ({}) divisible "
                 "by cp{}, or set parallel.cp_recurrent: handoff",
                 local_blocks, TryDivisorsOf(local_blocks, p_.cp));
  }

  void CheckDenseMlp() {
    if (Bad({"model.mlp.ffn_hidden", "parallel.tp"})) return;
    const int64_t f = r_.model.mlp.ffn_hidden;
    if (f % p_.tp != 0) TpMustDivide(f, fmt::format("model.mlp.ffn_hidden ({}) of the dense D layers", f));
  }

  void CheckMoe() {
    const MoeConfig& e = r_.model.moe;
    if (Bad({"model.moe"})) return;
    if (e.top_k > e.experts) {
      ctx_.ErrorAt("model.moe.top_k", Str(e.top_k), "must not exceed model.moe.experts ({}); valid range is [1, {}]",
                   e.experts, e.experts);
    }
    const int64_t shared = e.SharedWidth();
    if (!Bad({"parallel.tp"}) && shared > 0 && shared % p_.tp != 0) {
      TpMustDivide(shared, fmt::format("the shared-expert FFN width ({})", shared));
    }
    if (!Bad({"parallel.ep"}) && e.experts % p_.ep != 0) {
      ctx_.ErrorAt("parallel.ep", Str(p_.ep), "must divide model.moe.experts ({}){}", e.experts,
                   TryDivisorsOf(e.experts, p_.ep));
    }
    if (!Bad({"parallel.expert_tp"}) && e.ffn_hidden % p_.expert_tp != 0) {
      ctx_.ErrorAt("parallel.expert_tp", Str(p_.expert_tp), "must divide model.moe.ffn_hidden ({}){}", e.ffn_hidden,
                   TryDivisorsOf(e.ffn_hidden, p_.expert_tp));
    }
    if (e.dispatcher == MoeDispatcher::kFlex) {
      ctx_.ErrorAt("model.moe.dispatcher", "flex",
                   "is not priced: DeepEP / HybridEP keep their own communication buffers outside this model; "
                   "valid: alltoall, allgather");
    }
    if (!Bad({"parallel.tp", "parallel.sp"}) && p_.tp > 1 && !p_.sp) {
      ctx_.ErrorAt("parallel.sp", "false",
                   "must be true: Megatron requires sequence parallelism for MoE layers when tp > 1 "
                   "(tp = {})",
                   p_.tp);
    }
  }

  void WarnUnusedExpertParallelism() {
    for (const char* key : {"parallel.ep", "parallel.expert_tp"}) {
      const int64_t value = std::string(key) == "parallel.ep" ? p_.ep : p_.expert_tp;
      if (value > 1 && !Bad({key})) {
        ctx_.WarningAt(key, Str(value), "has no effect: the layer list has no MoE (E) layers");
      }
    }
  }

  /// An MTP module's layer is an attention layer and the model's last FFN:
  /// a transformer stack's last layer, or a hybrid stack ending in D or E
  /// (Megatron's hybrid pattern after '/': "*-" or "*E" a depth).
  void CheckMtp() {
    const auto& layers = r_.model.layers;
    if (r_.model.mtp_layers == 0 || Bad({"model.mtp_layers"})) return;
    if (!layers.empty() && (layers.back() == BlockKind::kDenseMlp || layers.back() == BlockKind::kMoe)) return;
    ctx_.ErrorAt("model.mtp_layers", Str(r_.model.mtp_layers),
                 "an MTP module's layer is an attention layer and the model's last FFN (D or E), as Megatron's GPT "
                 "model builds it and a hybrid pattern's '/*-' or '/*E'; this layer list ends in another block");
  }

  /// Megatron's ModelParallelConfig raises "Cannot defer embedding wgrad
  /// compute when pipeline model parallel is not used".
  /// A tied output layer shares the word embedding's table: replicating it
  /// would replicate the output layer (full-vocabulary logits on every TP
  /// rank), which preflight does not price.
  void CheckEmbedding() {
    if (Bad({"parallel.embedding", "model.tie_embeddings"})) return;
    if (p_.embedding == EmbeddingSplit::kReplicated && r_.model.tie_embeddings) {
      ctx_.ErrorAt("parallel.embedding", "replicated",
                   "a tied output layer shares the table, so it would be replicated too (full-vocabulary logits on "
                   "every TP rank), which is not priced; untie the head (model.tie_embeddings: false) or keep "
                   "vocab_parallel");
    }
  }

  /// Megatron-LM's arguments.py: "Must use --overlap-param-gather with
  /// --overlap-grad-reduce" (the gather is issued by the reduce's buckets).
  void CheckOverlap() {
    if (Bad({"parallel.overlap_param_gather", "parallel.overlap_grad_reduce"})) return;
    if (p_.overlap_param_gather && !p_.overlap_grad_reduce) {
      ctx_.ErrorAt("parallel.overlap_param_gather", "true",
                   "the parameter gather overlaps through the gradient reduce's buckets (Megatron-LM asserts it); "
                   "set parallel.overlap_grad_reduce: true too, or turn this off");
    }
  }

  /// Megatron's optimizer CPU offload (HybridDeviceOptimizer) wraps Adam
  /// and runs on the distributed optimizer's path
  /// (--use-precision-aware-optimizer needs --use-distributed-optimizer).
  void CheckOffload() {
    const OptimizerConfig& o = r_.training.optimizer;
    if (o.offload_fraction <= 0 ||
        Bad({"training.optimizer.offload_fraction", "training.optimizer.matrices", "parallel.zero"})) {
      return;
    }
    if (o.matrices != OptimizerKind::kAdamW || o.other != OptimizerKind::kAdamW) {
      ctx_.ErrorAt("training.optimizer.offload_fraction", fmt::format("{}", o.offload_fraction),
                   "Megatron-LM offloads Adam state only (HybridDeviceOptimizer); set training.optimizer.matrices: "
                   "adamw, or offload_fraction: 0");
    } else if (p_.zero < 1) {
      ctx_.ErrorAt("training.optimizer.offload_fraction", fmt::format("{}", o.offload_fraction),
                   "Megatron-LM offloads the distributed optimizer's shards; set parallel.zero: 1 or more");
    }
  }

  /// Megatron reads --recompute-modules only under selective granularity and
  /// refuses moe_act without grouped GEMM and mla_up_proj without MLA
  /// (transformer_config.py); a module the stack has no layer for is a no-op
  /// there, and a warning here.
  void CheckRecomputeModules() {
    const ModuleSet set = r_.training.recompute_modules;
    const char* key = "training.recompute_modules";
    if (Bad({key, "training.recompute"}) || set == ModuleSet::Of(RecomputeModule::kCoreAttn)) return;
    const std::string text = RecomputeModulesText(set);
    if (r_.training.recompute != Recompute::kSelective) {
      if (ctx_.IsWritten(key)) {
        ctx_.ErrorAt(key, text,
                     "applies only under training.recompute: selective (it is {}); remove it "
                     "or set recompute: selective",
                     Name(r_.training.recompute));
      }
      return;
    }
    if (set.has(RecomputeModule::kMlaUpProj) && !r_.model.mla) {
      ctx_.ErrorAt(key, text, "lists mla_up_proj, which needs MLA attention (model.mla); Megatron-LM refuses it");
    }
    if (set.has(RecomputeModule::kMoeAct) && !r_.model.moe.grouped_gemm) {
      ctx_.ErrorAt(key, text, "lists moe_act, which needs model.moe.grouped_gemm: true; Megatron-LM refuses it");
    }
    const auto& layers = r_.model.layers;
    const bool moe = Has(layers, BlockKind::kMoe);
    const std::pair<RecomputeModule, const char*> needs[] = {
        {RecomputeModule::kCoreAttn, Has(layers, BlockKind::kAttention) ? nullptr : "attention (A) layers"},
        {RecomputeModule::kMlp, Has(layers, BlockKind::kDenseMlp) ? nullptr : "dense MLP (D) layers"},
        {RecomputeModule::kMoe, moe ? nullptr : "MoE (E) layers"},
        {RecomputeModule::kMoeAct, moe ? nullptr : "MoE (E) layers"},
        {RecomputeModule::kSharedExperts, moe && r_.model.moe.SharedWidth() > 0 ? nullptr : "shared experts"},
    };
    for (const auto& [module, missing] : needs) {
      if (set.has(module) && missing != nullptr) {
        ctx_.WarningAt(key, text,
                       fmt::format("lists {}, which has no effect: the model has no {}", Name(module), missing));
      }
    }
  }

  /// --recompute-method and --recompute-num-layers shape full recompute only.
  void CheckRecomputeMethod() {
    const TrainingConfig& t = r_.training;
    if (t.recompute == Recompute::kFull || Bad({"training.recompute"})) return;
    struct Key {
      const char* path;
      std::string value;
      bool set;  // not the default
    };
    const Key keys[] = {
        {"training.recompute_method", Name(t.recompute_method), t.recompute_method != RecomputeMethod::kUniform},
        {"training.recompute_layers", Str(t.recompute_layers), t.recompute_layers != 1}};
    for (const auto& [key, value, set] : keys) {
      if (set && ctx_.IsWritten(key) && !Bad({key})) {
        ctx_.ErrorAt(key, value,
                     "applies only under training.recompute: full (it is {}); remove it or set "
                     "recompute: full",
                     Name(t.recompute));
      }
    }
  }

  /// torchtitan's per-op policy is priced for what its saved set was traced
  /// on: Llama 3 / Qwen3 dense blocks (attention then MLP, one checkpoint
  /// each), PyTorch's flash SDPA, one GPU per sequence shard. Anything else
  /// would be a guess at which op outputs the policy keeps.
  void CheckSelectiveOp() {
    const TrainingConfig& t = r_.training;
    const char* key = "training.recompute";
    if (t.recompute != Recompute::kSelectiveOp || Bad({key})) return;
    const auto& layers = r_.model.layers;
    bool dense_blocks = layers.size() % 2 == 0 && !layers.empty();
    for (size_t i = 0; dense_blocks && i < layers.size(); ++i) {
      dense_blocks = layers[i] == (i % 2 == 0 ? BlockKind::kAttention : BlockKind::kDenseMlp);
    }
    const std::pair<bool, const char*> refusals[] = {
        {!dense_blocks || r_.model.mla.has_value(),
         "is priced for dense transformer blocks only (model.pattern \"AD\", GQA attention, no MLA): the "
         "matmul order of MoE, MLA, Mamba and recurrent blocks is not traced; use selective, full or none"},
        {r_.model.mlp.activation != FfnActivation::kSwiglu || r_.model.linear_bias,
         "is priced for bias-free SwiGLU MLPs (w1, w3, w2: the policy's matmul count; model.mlp.activation "
         "swiglu, model.linear_bias false)"},
        {t.dropout > 0, "is priced without dropout (torchtitan's blocks have none); set training.dropout: 0"},
        {!t.flash_attention, "needs training.flash_attention: true (the policy saves the flash SDPA outputs)"},
        {p_.tp > 1 || p_.cp > 1,
         "is priced without tensor or context parallelism (parallel.tp and parallel.cp must be 1: their "
         "collectives' saved outputs are not traced)"},
        {t.precision.fp4 != Fp4Format::kNone || t.precision.activations == DType::kFp8,
         "is priced for bf16 matmuls only (Float8 and FP4 linears run other ops the policy saves: "
         "training.precision.activations bf16, fp4 none)"},
        {!t.activation_offload.empty(), "is not priced with training.activation_offload (Megatron's); set it to []"},
        {t.flextron(), "is not priced with Flextron (training.flextron_emb_choices must be 0)"},
        {r_.model.mtp_layers > 0, "is not priced with MTP layers (model.mtp_layers must be 0)"},
    };
    for (const auto& [refused, why] : refusals) {
      if (refused) ctx_.ErrorAt(key, Name(t.recompute), "{}", why);
    }
  }

  /// fp32_upcast is torch's cross entropy as torchtitan calls it, priced for
  /// the main head; Megatron's MTP heads and deferred head wgrad run its own
  /// vocab-parallel loss.
  void CheckCrossEntropy() {
    const TrainingConfig& t = r_.training;
    const char* key = "training.cross_entropy";
    if (t.cross_entropy != CrossEntropy::kFp32Upcast || Bad({key})) return;
    if (r_.model.mtp_layers > 0 && !Bad({"model.mtp_layers"})) {
      ctx_.ErrorAt(key, Name(t.cross_entropy),
                   "is priced for the main head only: MTP modules (model.mtp_layers) compute Megatron's "
                   "vocab_parallel loss; set model.mtp_layers: 0 or training.cross_entropy: vocab_parallel");
    }
    if (t.defer_head_wgrad && !Bad({"training.defer_head_wgrad"})) {
      ctx_.ErrorAt(key, Name(t.cross_entropy),
                   "is not priced with training.defer_head_wgrad (Megatron's, whose loss is vocab_parallel)");
    }
  }

  /// Megatron runs fine-grained activation offloading on Transformer Engine
  /// layers only (arguments.py asserts --transformer-impl transformer_engine).
  void CheckActivationOffload() {
    const OffloadSet set = r_.training.activation_offload;
    const char* key = "training.activation_offload";
    if (set.empty() || Bad({key, "training.transformer_engine"})) return;
    const std::string text = OffloadModulesText(set);
    if (!r_.training.transformer_engine) {
      ctx_.ErrorAt(key, text,
                   "needs training.transformer_engine: true (Megatron-LM offloads activations of "
                   "Transformer Engine layers only)");
      return;
    }
    // transformer_config.py asserts it: the "moe" checkpoint wraps the whole
    // MoE forward, which then saves nothing inside the expert scopes.
    const TrainingConfig& t = r_.training;
    if (t.recompute == Recompute::kSelective && t.recompute_modules.has(RecomputeModule::kMoe) &&
        (set.has(OffloadModule::kExpertFc1) || set.has(OffloadModule::kMoeAct)) &&
        !Bad({"training.recompute", "training.recompute_modules"})) {
      ctx_.ErrorAt(key, text,
                   "lists expert_fc1 or moe_act, which Megatron-LM refuses while training.recompute_modules has moe "
                   "(the whole MoE layer is rerun); remove them, or moe from training.recompute_modules");
    }
    const bool moe = Has(r_.model.layers, BlockKind::kMoe);
    const bool attention = Has(r_.model.layers, BlockKind::kAttention);
    for (OffloadModule m : kAllOffloadModules) {
      const bool expert = m == OffloadModule::kExpertFc1 || m == OffloadModule::kMoeAct;
      const bool attn = m == OffloadModule::kAttnNorm || m == OffloadModule::kQkvLinear ||
                        m == OffloadModule::kCoreAttn || m == OffloadModule::kAttnProj;
      if (set.has(m) && ((expert && !moe) || (attn && !attention))) {
        ctx_.WarningAt(key, text,
                       fmt::format("lists {}, which has no effect: the model has no {} layers", Name(m),
                                   expert ? "MoE (E)" : "attention (A)"));
      }
    }
  }

  /// FP4 GEMMs need FP4 tensor cores (Blackwell) and Transformer Engine;
  /// Megatron refuses FP4 with FP8 (arguments.py: "--fp4-format and
  /// --fp8-format cannot be used simultaneously") and --fp4-param-gather
  /// without --fp4-format.
  void CheckFp4() {
    const PrecisionConfig& p = r_.training.precision;
    const char* key = "training.precision.fp4";
    if (p.fp4_params && p.fp4 == Fp4Format::kNone && !Bad({"training.precision.fp4_params", key})) {
      ctx_.ErrorAt("training.precision.fp4_params", "true",
                   "needs training.precision.fp4: nvfp4 or mxfp4 (the weights are kept in that format)");
    }
    if (p.fp4 == Fp4Format::kNone || Bad({key})) return;
    const std::string value = Name(p.fp4);
    if (r_.cluster.spec.fp4_dense_tflops <= 0 && !Bad({"cluster.gpu", "cluster.device"})) {
      std::vector<std::string> with;
      for (const std::string& name : GpuPresetNames()) {
        if (GpuPreset(name)->fp4_dense_tflops > 0) with.push_back(name);
      }
      ctx_.ErrorAt(key, value,
                   "needs FP4 tensor cores, and {} has none (fp4_dense_tflops 0); presets with them: {} "
                   "(or a cluster.device with fp4_dense_tflops > 0), or set fp4: none",
                   r_.cluster.gpu.empty() ? std::string("the cluster.device") : r_.cluster.gpu, fmt::join(with, ", "));
    }
    if (!r_.training.transformer_engine && !Bad({"training.transformer_engine"})) {
      ctx_.ErrorAt(key, value,
                   "needs training.transformer_engine: true (Megatron-LM runs FP4 through Transformer Engine)");
    }
    if (p.activations == DType::kFp8 && !Bad({"training.precision.activations"})) {
      ctx_.ErrorAt(key, value,
                   "excludes fp8 GEMMs (training.precision.activations: fp8); Megatron-LM takes one of "
                   "--fp4-format and --fp8-format");
    }
    if (p.params == DType::kFp8 && !Bad({"training.precision.params"})) {
      ctx_.ErrorAt(key, value,
                   "excludes fp8 parameters (training.precision.params: fp8); keep FP4 weights with "
                   "training.precision.fp4_params: true");
    }
    if (!r_.training.activation_offload.empty() && !Bad({"training.activation_offload"})) {
      ctx_.ErrorAt(key, value,
                   "is not priced with training.activation_offload (which FP4 copies leave the device is not "
                   "modeled); set activation_offload: []");
    }
    if (p_.zero >= 3 && !Bad({"parallel.zero"})) {
      ctx_.ErrorAt(key, value,
                   "is not priced under ZeRO 3 (where each layer's FP4 weight copies are gathered is not "
                   "modeled); use parallel.zero 0, 1 or 2");
    }
  }

  /// FSDP2 offloads the ZeRO-3 shards and steps AdamW on the CPU; Megatron's
  /// optimizer offload is the other, partial mechanism.
  void CheckFsdpCpuOffload() {
    const char* key = "parallel.fsdp_cpu_offload";
    if (!p_.fsdp_cpu_offload || Bad({key, "parallel.zero", "training.optimizer.matrices"})) return;
    const OptimizerConfig& o = r_.training.optimizer;
    if (p_.zero < 3) {
      ctx_.ErrorAt(key, "true", "offloads FSDP's parameter shards: set parallel.zero: 3, or turn it off");
    } else if (o.matrices != OptimizerKind::kAdamW || o.other != OptimizerKind::kAdamW) {
      ctx_.ErrorAt(key, "true", "prices the CPU AdamW step of FSDP2's offload; set training.optimizer.matrices: adamw");
    } else if (o.offload_fraction > 0) {
      ctx_.ErrorAt(key, "true",
                   "already moves the whole optimizer to the host; set training.optimizer.offload_fraction: 0");
    }
  }

  /// Megatron runs its layer-wise optimizer only for Muon, on a DDP without
  /// the distributed optimizer (arguments.py validate_args), and asserts one
  /// optimizer instance (layer_wise_optimizer.py LayerWiseDistributedOptimizer).
  void CheckOptimizerSharding() {
    const char* key = "parallel.optimizer_sharding";
    if (p_.optimizer_sharding != OptimizerSharding::kLayerWise ||
        Bad({key, "parallel.zero", "parallel.dp_replicate", "training.optimizer.matrices"})) {
      return;
    }
    if (p_.zero != 1) {
      ctx_.ErrorAt(key, "layer_wise",
                   "deals whole tensors' optimizer state to the data-parallel ranks, ZeRO 1 only "
                   "(parallel.zero is {}): set parallel.zero: 1, or optimizer_sharding: flat",
                   p_.zero);
    } else if (r_.training.optimizer.matrices != OptimizerKind::kMuon) {
      ctx_.ErrorAt(key, "layer_wise",
                   "is Megatron's optimizer for Muon (with Adam, --use-distributed-optimizer shards flat buffers): "
                   "set training.optimizer.matrices: muon, or optimizer_sharding: flat");
    } else if (p_.dp_replicate != 1) {
      ctx_.ErrorAt(key, "layer_wise",
                   "supports one optimizer instance (Megatron asserts num_distributed_optimizer_instances == 1): set "
                   "parallel.dp_replicate: 1, or optimizer_sharding: flat");
    }
  }

  /// Flextron's soft masks are priced for Megatron's hybrid layers as its
  /// hooks find them (flextron_elasticity_hooks.py): what else would move
  /// the copies they keep is refused rather than guessed.
  void CheckFlextron() {
    const TrainingConfig& t = r_.training;
    const char* emb = "training.flextron_emb_choices";
    const char* mamba = "training.flextron_mamba_choices";
    if (Bad({emb, mamba})) return;
    if (!t.flextron()) {
      if (t.flextron_mamba_choices > 0) {
        ctx_.ErrorAt(mamba, Str(t.flextron_mamba_choices),
                     "needs training.flextron_emb_choices > 0 (Flextron's masks are on only with its embedding "
                     "widths); set it to 0");
      }
      return;
    }
    const std::string value = Str(t.flextron_emb_choices);
    const auto& layers = r_.model.layers;
    if (Has(layers, BlockKind::kMamba) && t.flextron_mamba_choices == 0) {
      ctx_.ErrorAt(mamba, "0",
                   "must be at least 1 with Mamba (M) layers: their masks blend len(--mamba-int-list) "
                   "head counts");
    }
    if (Has(layers, BlockKind::kRecurrent)) {
      ctx_.ErrorAt(emb, value,
                   "is priced for Megatron's hybrid layers (M, A, D, E); remove the R layers or set it to 0");
    }
    if (r_.model.mla) {
      ctx_.ErrorAt(emb, value,
                   "is not priced with MLA attention (Flextron's hooks attach to SelfAttention only); "
                   "set it to 0");
    }
    if (Has(layers, BlockKind::kMamba) && r_.model.mamba.fused_norm_out_proj) {
      ctx_.ErrorAt(emb, value,
                   "needs model.mamba.fused_norm_out_proj: false (Flextron hooks Megatron's own Mamba "
                   "norm); set it to false");
    }
    if (t.recompute == Recompute::kSelective && !(t.recompute_modules == ModuleSet::Of(RecomputeModule::kCoreAttn))) {
      ctx_.ErrorAt(emb, value,
                   "is priced under selective recompute of core_attn only (which module's rerun frees "
                   "which mask copy is not traced); set training.recompute_modules: [core_attn]");
    }
    if (!t.activation_offload.empty()) {
      ctx_.ErrorAt(emb, value, "is not priced with activation offloading; set training.activation_offload: []");
    }
  }

  void CheckHeadWgrad() {
    if (!r_.training.defer_head_wgrad || Bad({"training.defer_head_wgrad", "parallel.pp"}) || p_.pp > 1) return;
    ctx_.ErrorAt("training.defer_head_wgrad", "true",
                 "needs parallel.pp > 1: the deferred weight gradients fill the pipeline flush, and Megatron refuses "
                 "the flag without pipeline parallelism; set it to false");
  }

  void CheckSequence() {
    const int64_t s = r_.training.seq_len;
    const int64_t positions = r_.model.learned_positions;
    if (positions > 0 && !Bad({"training.seq_len", "model.learned_positions"}) && positions < s) {
      ctx_.ErrorAt("model.learned_positions", Str(positions),
                   "must be 0 (no learned table) or at least training.seq_len ({}): a learned table "
                   "has one row per position",
                   s);
    }
    if (Bad({"training.seq_len", "parallel.cp", "parallel.tp", "parallel.sp", "parallel.cp_load_balance"})) return;
    if (p_.cp > 1 && p_.cp_load_balance && s % (2 * p_.cp) != 0) {
      ctx_.ErrorAt("training.seq_len", Str(s),
                   "must be a multiple of 2 x parallel.cp = {} (causal load balancing splits the "
                   "sequence into 2 x cp chunks){}",
                   2 * p_.cp, TryMultiplesOf(2 * p_.cp, s));
      return;
    }
    if (p_.cp > 1 && !p_.cp_load_balance && s % p_.cp != 0) {
      ctx_.ErrorAt("training.seq_len", Str(s),
                   "must be a multiple of parallel.cp = {} (context parallelism without load balancing "
                   "splits the sequence into cp chunks){}",
                   p_.cp, TryMultiplesOf(p_.cp, s));
      return;
    }
    if (p_.sp && p_.tp > 1 && (s / p_.cp) % p_.tp != 0) {
      const auto step = Mul(p_.cp, p_.tp);
      ctx_.ErrorAt("training.seq_len", Str(s),
                   "seq_len / cp = {} must be a multiple of parallel.tp ({}) with sequence parallelism{}", s / p_.cp,
                   p_.tp, step ? TryMultiplesOf(*step, s) : "");
    }
  }

  /// world % (tp*cp*pp) == 0; blames the first of tp, cp, pp that breaks it.
  bool CheckWorld() {
    if (Bad({"parallel.tp", "parallel.cp", "parallel.pp", "cluster.nodes", "cluster.gpus_per_node"})) return false;
    const int64_t world = r_.world();  // <= 2^34 by the ranges
    const auto tp_cp = Mul(p_.tp, p_.cp);
    const auto product = tp_cp ? Mul(*tp_cp, p_.pp) : std::nullopt;
    if (product && world % *product == 0) return true;
    const std::string world_text =
        fmt::format("the world size {} (cluster.nodes {} x gpus_per_node {})", world, r_.cluster.nodes,
                    r_.cluster.gpus_per_node);
    const char* key = "parallel.pp";
    int64_t value = p_.pp;
    int64_t others = 1;
    if (world % p_.tp != 0) {
      key = "parallel.tp";
      value = p_.tp;
    } else if (world % (p_.tp * p_.cp) != 0 || p_.cp > world) {
      key = "parallel.cp";
      value = p_.cp;
      others = p_.tp;
    } else {
      others = p_.tp * p_.cp;
    }
    const int64_t room = world / others;
    ctx_.ErrorAt(key, Str(value), "tp x cp x pp = {} x {} x {} must divide {}{}", p_.tp, p_.cp, p_.pp, world_text,
                 TryDivisorsOf(room, value));
    return false;
  }

  void CheckExpertMesh() {
    if (Bad({"parallel.ep", "parallel.expert_tp"})) return;
    const int64_t dense_ranks = p_.tp * p_.cp * r_.dp();  // = world / pp
    const auto expert = Mul(p_.ep, p_.expert_tp);
    if (expert && dense_ranks % *expert == 0) return;
    // Blame ep unless only expert_tp was changed from 1.
    const bool blame_ep = p_.ep > 1 || p_.expert_tp == 1;
    const int64_t other = blame_ep ? p_.expert_tp : p_.ep;
    const int64_t value = blame_ep ? p_.ep : p_.expert_tp;
    ctx_.ErrorAt(blame_ep ? "parallel.ep" : "parallel.expert_tp", Str(value),
                 "ep x expert_tp = {} x {} must divide tp x cp x dp = {} (the ranks of one pipeline "
                 "stage, Megatron's MoE folding){}",
                 p_.ep, p_.expert_tp, dense_ranks,
                 dense_ranks % other == 0 ? TryDivisorsOf(dense_ranks / other, value) : "");
  }

  /// HSDP replicas split the d*c ZeRO group, and the expert one, evenly
  /// (Megatron parallel_state.py asserts both; it builds the expert groups
  /// whether or not the model has MoE layers, and so does the mesh here).
  void CheckReplicas(bool moe) {
    const int64_t r = p_.dp_replicate;
    if (r == 1 || Bad({"parallel.dp_replicate", "parallel.ep", "parallel.expert_tp", "parallel.zero"})) return;
    if (p_.zero == 0) {
      ctx_.ErrorAt("parallel.dp_replicate", Str(r),
                   "needs parallel.zero >= 1: replicas of a ZeRO group shard inside and all-reduce across; with zero 0 "
                   "every rank already holds a full replica (Megatron asserts the distributed optimizer); set it to 1");
      return;
    }
    const int64_t dense = p_.cp * r_.dp();
    const int64_t expert = r_.expert_dp();
    const int64_t group = dense % r != 0 ? dense : expert % r != 0 ? expert : 0;
    if (group == 0) return;
    ctx_.ErrorAt("parallel.dp_replicate", Str(r),
                 "must divide the {} data-parallel group ({} ranks) into equal replicas{}{}",
                 group == dense ? "dense (dp x cp)" : "expert", group, TryDivisorsOf(group, r),
                 group != dense && !moe ? "; without E layers parallel.ep has no effect: set it to 1" : "");
  }

  bool CheckGlobalBatch() {
    if (Bad({"training.global_batch", "training.micro_batch"})) return false;
    const int64_t dp = r_.dp();
    const auto per_step = Mul(r_.training.micro_batch, dp);
    const int64_t gb = r_.training.global_batch;
    if (per_step && gb % *per_step == 0) return true;
    ctx_.ErrorAt("training.global_batch", Str(gb), "must be a multiple of micro_batch x dp = {} x {}{}",
                 r_.training.micro_batch, dp, per_step ? TryMultiplesOf(*per_step, gb) : "");
    return false;
  }

  void CheckSchedule(bool layers_ok) {
    if (Bad({"parallel.schedule", "parallel.vpp"})) return;
    const int64_t m = r_.micro_batches();
    const int64_t pp = p_.pp;
    const int64_t per_m = r_.training.micro_batch * r_.dp();  // checked in CheckGlobalBatch
    const std::string m_text =
        fmt::format("gives m = {} micro-batches per pipeline (global_batch / (micro_batch x dp))", m);
    if (p_.vpp > 1 && pp == 1) {
      ctx_.ErrorAt("parallel.vpp", Str(p_.vpp), "virtual pipeline stages need parallel.pp > 1; try vpp 1");
      return;
    }
    if (layers_ok && p_.partition == Partition::kBalanced && p_.stage_boundaries.empty()) {
      const int64_t layers = LayerCount(r_.model.layers);
      const auto chunks = Mul(pp, p_.vpp);
      if (!chunks || *chunks > layers) {
        const char* key = p_.vpp > 1 ? "parallel.vpp" : "parallel.pp";
        ctx_.ErrorAt(key, Str(p_.vpp > 1 ? p_.vpp : pp),
                     "pp x vpp = {} x {} model chunks exceed the {} layers; each chunk needs a layer", pp, p_.vpp,
                     layers);
        return;
      }
    }
    switch (p_.schedule) {
      case Schedule::k1F1B:
        if (m < pp) {
          ctx_.WarningAt("training.global_batch", Str(r_.training.global_batch),
                         fmt::format("{}, fewer than pp = {}: the 1F1B pipeline never fills", m_text, pp));
        }
        break;
      case Schedule::kInterleaved:
        if (p_.vpp == 1) {
          ctx_.ErrorAt("parallel.vpp", "1", "the interleaved schedule needs vpp > 1; try vpp 2, or schedule 1f1b");
        } else if (m < pp) {
          ctx_.ErrorAt("training.global_batch", Str(r_.training.global_batch),
                       "{}; the interleaved schedule needs at least pp = {} (Megatron); try global_batch {}", m_text,
                       pp, Mul(pp, per_m).value_or(0));
        }
        break;
      case Schedule::kDualPipe:
      case Schedule::kDualPipeV:
        CheckDualPipe(m, per_m);
        break;
    }
  }

  /// DualPipe (deepseek-ai/DualPipe dualpipe.py, DualPipe.step asserts):
  /// pp even, m even and m >= 2 pp. DualPipeV (dualpipev.py, DualPipeV.step)
  /// only asserts m >= 2 pp. Both place two model chunks on each rank.
  void CheckDualPipe(int64_t m, int64_t per_m) {
    const bool dualpipe = p_.schedule == Schedule::kDualPipe;
    const char* name = Name(p_.schedule);
    const int64_t pp = p_.pp;
    if (p_.vpp != 1) {
      ctx_.ErrorAt("parallel.vpp", Str(p_.vpp), "{} places two model chunks per rank itself; set vpp 1", name);
      return;
    }
    if (dualpipe && pp % 2 != 0) {
      ctx_.ErrorAt("parallel.pp", Str(pp), "dualpipe needs an even pp; try {} or {}", std::max<int64_t>(pp - 1, 2),
                   pp + 1);
      return;
    }
    const int64_t need = 2 * pp;  // pp <= 2^24
    if (m >= need && (!dualpipe || m % 2 == 0)) return;
    const int64_t m_try = std::max(need, m + (dualpipe ? m % 2 : 0));
    ctx_.ErrorAt("training.global_batch", Str(r_.training.global_batch),
                 "gives m = {} micro-batches per pipeline (global_batch / (micro_batch x dp)); {} needs {}"
                 "m >= 2 x pp = {}; try global_batch {}",
                 m, name, dualpipe ? "an even " : "", need, Mul(m_try, per_m).value_or(0));
  }

  /// The stage split: pinned boundaries, or the framework rule's (which
  /// refuses what Megatron-LM / torchtitan refuse, naming the key to change).
  void CheckPartition() {
    if (Bad({"parallel.stage_boundaries", "parallel.pp", "parallel.vpp", "parallel.schedule", "parallel.partition",
             "parallel.first_stage_layers", "parallel.last_stage_layers", "parallel.embedding_in_split",
             "parallel.loss_in_split"})) {
      return;
    }
    // Megatron's split keys shape nothing else: set beside pinned boundaries
    // or another partition they would be silently ignored.
    const bool megatron_rule = p_.stage_boundaries.empty() && p_.partition == Partition::kMegatron;
    for (const auto& [key, set] :
         {std::pair<const char*, bool>{"parallel.first_stage_layers", p_.first_stage_layers > 0},
          {"parallel.last_stage_layers", p_.last_stage_layers > 0},
          {"parallel.embedding_in_split", p_.embedding_in_split},
          {"parallel.loss_in_split", p_.loss_in_split}}) {
      if (set && !megatron_rule) {
        if (p_.stage_boundaries.empty()) {
          ctx_.ErrorAt(key, "", "shapes Megatron-LM's split; parallel.partition is {}", Name(p_.partition));
        } else {
          ctx_.ErrorAt(key, "", "shapes Megatron-LM's split; parallel.stage_boundaries pins the stages");
        }
        return;
      }
    }
    if (!p_.stage_boundaries.empty()) {
      CheckStageBoundaries();
      return;
    }
    if (p_.partition == Partition::kBalanced) return;
    const LayerSplit split = RecipeSplit(p_, r_.model.layers);
    if (!split.ok()) ctx_.ErrorAt(split.key, split.value, "{}", split.error);
  }

  void CheckStageBoundaries() {
    const std::vector<int64_t>& b = p_.stage_boundaries;
    const int64_t layers = LayerCount(r_.model.layers);
    const int64_t chunks = ChunkCountOf(p_.schedule, p_.pp, p_.vpp);
    if (static_cast<int64_t>(b.size()) != chunks - 1) {
      ctx_.ErrorAt("parallel.stage_boundaries", "",
                   "has {} entries; the {} model chunks (pp = {}, vpp = {}, schedule {}) need exactly {} "
                   "(the first layer of each chunk after the first)",
                   b.size(), chunks, p_.pp, p_.vpp, Name(p_.schedule), chunks - 1);
      return;
    }
    for (size_t i = 0; i < b.size(); ++i) {
      const std::string key = fmt::format("parallel.stage_boundaries[{}]", i);
      // Megatron's layouts allow a chunk without layers (a standalone
      // embedding or loss stage), so boundaries may repeat.
      const int64_t low = i == 0 ? 0 : b[i - 1];
      if (b[i] < low || b[i] > layers) {
        ctx_.ErrorAt(key, Str(b[i]),
                     "stage boundaries must not decrease and stay within [0, {}] layers; valid here: [{}, "
                     "{}]",
                     layers, low, layers);
        return;
      }
    }
  }

  const Recipe& r_;
  Reporter& ctx_;
  const ParallelConfig& p_;
};

}  // namespace

void Validate(const Recipe& recipe, bool layers_ok, Reporter& out) { Validator(recipe, out).Run(layers_ok); }

DiagnosticOrder OrderOf(const SourceMap& source, const std::string& file, SourceMark mark) {
  DiagnosticOrder order{-1, mark.line, mark.column};
  if (file != source.file) {
    // Position of the override on the command line.
    order.override_index = static_cast<int64_t>(source.overrides.size());
    for (size_t i = 0; i < source.overrides.size(); ++i) {
      if (source.overrides[i].second == file) {
        order.override_index = static_cast<int64_t>(i);
        break;
      }
    }
  }
  return order;
}

DiagnosticOrder OrderOf(const SourceMap& source, const std::string& key_path) {
  // As SourceMap::At locates it: an override has no mark; a key without a
  // line keeps the empty mark.
  if (const std::string* text = source.OverrideFor(key_path)) return OrderOf(source, *text, SourceMark{});
  const SourceMark mark = source.Find(key_path);
  return OrderOf(source, source.file, mark.line > 0 ? mark : SourceMark{});
}

void SortDiagnostics(const SourceMap& source, std::vector<Diagnostic>* ds) {
  std::stable_sort(ds->begin(), ds->end(), [&](const Diagnostic& a, const Diagnostic& b) {
    return OrderOf(source, a.file, a.mark) < OrderOf(source, b.file, b.mark);
  });
}

namespace {

/// The integer fields of a typed recipe with their key paths, for range
/// checks of recipes built or modified in code.
std::vector<std::pair<const char*, int64_t>> IntFields(const Recipe& r) {
  const ModelConfig& m = r.model;
  std::vector<std::pair<const char*, int64_t>> f = {
      {"model.hidden", m.hidden},
      {"model.vocab", m.vocab},
      {"model.vocab_pad_multiple", m.vocab_pad_multiple},
      {"model.attention.heads", m.attention.heads},
      {"model.attention.kv_heads", m.attention.kv_heads},
      {"model.attention.head_dim", m.attention.head_dim},
      {"model.mlp.ffn_hidden", m.mlp.ffn_hidden},
      {"model.moe.experts", m.moe.experts},
      {"model.moe.top_k", m.moe.top_k},
      {"model.moe.ffn_hidden", m.moe.ffn_hidden},
      {"model.moe.shared_experts", m.moe.shared_experts},
      {"model.moe.shared_ffn_hidden", m.moe.shared_ffn_hidden},
      {"model.moe.first_k_dense", m.moe.first_k_dense},
      {"model.moe.layer_freq", m.moe.layer_freq},
      {"model.moe.layer_offset", m.moe.layer_offset},
      {"model.mamba.d_state", m.mamba.d_state},
      {"model.mamba.d_conv", m.mamba.d_conv},
      {"model.mamba.expand", m.mamba.expand},
      {"model.mamba.heads", m.mamba.heads},
      {"model.mamba.head_dim", m.mamba.head_dim},
      {"model.mamba.groups", m.mamba.groups},
      {"model.mamba.chunk", m.mamba.chunk},
      {"model.recurrent.width", m.recurrent.width},
      {"model.recurrent.heads", m.recurrent.heads},
      {"model.recurrent.d_conv", m.recurrent.d_conv},
      {"training.seq_len", r.training.seq_len},
      {"training.micro_batch", r.training.micro_batch},
      {"training.global_batch", r.training.global_batch},
      {"parallel.tp", r.parallel.tp},
      {"parallel.cp", r.parallel.cp},
      {"parallel.pp", r.parallel.pp},
      {"parallel.vpp", r.parallel.vpp},
      {"parallel.ep", r.parallel.ep},
      {"parallel.expert_tp", r.parallel.expert_tp},
      {"parallel.zero", r.parallel.zero},
      {"cluster.nodes", r.cluster.nodes},
      {"cluster.gpus_per_node", r.cluster.gpus_per_node},
      {"cluster.capacity_mib", r.cluster.capacity_mib},
  };
  if (m.mla) {
    f.insert(f.end(), {{"model.mla.heads", m.mla->heads},
                       {"model.mla.q_lora_rank", m.mla->q_lora_rank},
                       {"model.mla.kv_lora_rank", m.mla->kv_lora_rank},
                       {"model.mla.qk_rope_head_dim", m.mla->qk_rope_head_dim},
                       {"model.mla.qk_nope_head_dim", m.mla->qk_nope_head_dim},
                       {"model.mla.v_head_dim", m.mla->v_head_dim}});
  }
  if (r.serving) {
    f.insert(f.end(), {{"serving.batch", r.serving->batch}, {"serving.context", r.serving->context}});
  }
  return f;
}

/// Range checks; true when every integer is inside its schema range.
bool CheckRanges(const Recipe& r, Reporter& out) {
  bool ok = true;
  const auto fields = IntFields(r);
  // IntFields lists the same paths for recipes of one shape (MLA or not,
  // serving or not): their ranges are looked up once per shape.
  static std::array<std::once_flag, 4> once;
  static std::array<std::vector<IntRange>, 4> shape_ranges;
  const size_t shape = (r.model.mla ? 1 : 0) + (r.serving ? 2 : 0);
  std::call_once(once[shape], [&] {
    for (const auto& field : fields) shape_ranges[shape].push_back(IntRangeOf(field.first));
  });
  const std::vector<IntRange>& ranges = shape_ranges[shape];
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& [path, value] = fields[i];
    const IntRange range = ranges[i];
    if (value >= range.min && value <= range.max) continue;
    ok = false;
    out.ErrorAt(path, std::to_string(value), "out of range; valid range is [{}, {}]", range.min, range.max);
  }
  if (ok && r.model.moe.layer_offset >= r.model.moe.layer_freq) {
    ok = false;
    out.ErrorAt("model.moe.layer_offset", std::to_string(r.model.moe.layer_offset),
                "must be less than model.moe.layer_freq ({})", r.model.moe.layer_freq);
  }
  return ok;
}

}  // namespace

}  // namespace preflight::recipe_internal

namespace preflight {

namespace {

/// ValidateRecipe's checks, reported to `out`.
void CheckRecipe(const Recipe& recipe, recipe_internal::Reporter& out) {
  if (!recipe_internal::CheckRanges(recipe, out)) return;
  const auto& layers = recipe.model.layers;
  const bool layers_ok = !layers.empty() && static_cast<int64_t>(layers.size()) <= recipe_internal::kMaxLayers;
  if (!layers_ok) {
    out.ErrorAt("model.layers", std::to_string(layers.size()), "the layer list must have 1 to {} layers",
                recipe_internal::kMaxLayers);
  }
  recipe_internal::Validate(recipe, layers_ok, out);
}

}  // namespace

std::vector<Diagnostic> ValidateRecipe(const Recipe& recipe) {
  std::vector<Diagnostic> out;
  recipe_internal::Reporter reporter(recipe.source, &out, nullptr);
  CheckRecipe(recipe, reporter);
  recipe_internal::SortDiagnostics(recipe.source, &out);
  return out;
}

std::optional<Diagnostic> FirstRecipeError(const Recipe& recipe) {
  std::vector<Diagnostic> out;
  recipe_internal::Reporter reporter(recipe.source, &out, nullptr, /*first_error_only=*/true);
  CheckRecipe(recipe, reporter);
  if (out.empty()) return std::nullopt;
  return std::move(out.front());
}

}  // namespace preflight

// Malformed recipes: each must fail with an exit-2 style diagnostic naming
// file, line, column (1-based, counted by hand from the YAML text in the
// case), key path and what would be valid (docs/recipe.md "Diagnostics").
// Unset keys take the header defaults: pattern AEMEAEMEAEMR x 4, hidden 4096,
// attention 32/8 heads, Mamba 128 heads / 8 groups, 64 experts, recurrent
// 4096 wide / 32 blocks, 8 x 8 H200s, global batch 512, micro-batch 1.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "preflight/recipe/recipe.h"

namespace preflight::recipe_errors_test {
namespace {

constexpr const char* kFile = "bad.yaml";

struct Case {
  const char* name;
  const char* yaml;
  int line;            // expected 1-based mark (0 = whole file)
  int column;
  const char* key_path;
  const char* message;  // substring of the message: what is wrong and what would be valid
};

const Case kCases[] = {
    // Wrong types.
    {"StringForInt", "parallel:\n  tp: four\n", 2, 7, "parallel.tp", "must be an integer in [1, 16777216]"},
    {"FloatForInt", "model:\n  hidden: 4.5\n", 2, 11, "model.hidden", "must be a whole number in [1, 16777216]"},
    {"ExponentForInt", "model:\n  hidden: 4e3\n", 2, 11, "model.hidden",
     "must be written as a plain decimal integer in [1, 16777216]"},
    {"HexForInt", "model:\n  hidden: 0x100\n", 2, 11, "model.hidden", "must be an integer in [1, 16777216]"},
    {"QuotedInt", "parallel: {tp: \"2\"}\n", 1, 16, "parallel.tp", "got a quoted string"},
    {"MapForInt", "model:\n  hidden: {a: 1}\n", 2, 11, "model.hidden",
     "must be an integer in [1, 16777216], got a map"},
    {"ListForSection", "parallel: [1, 2]\n", 1, 11, "parallel", "must be a map with keys tp, sp, cp, pp"},
    {"NullValue", "parallel:\n  tp:\n", 2, 3, "parallel.tp", "has no value; expected an integer in [1, 16777216]"},
    {"BadBool", "model: {tie_embeddings: maybe}\n", 1, 25, "model.tie_embeddings", "must be true or false"},
    {"ListForPattern", "model: {pattern: [A, M]}\n", 1, 18, "model.pattern",
     "must be a non-empty string of layer letters (valid letters: A (attention)"},
    {"NumberForEnum", "training: {recompute: 3}\n", 1, 23, "training.recompute",
     "must be one of: none, selective, full, selective_op"},
    // Negative, zero and out-of-range sizes.
    {"NegativeHidden", "model:\n  hidden: -4096\n", 2, 11, "model.hidden",
     "must be positive; valid range is [1, 16777216]"},
    {"ZeroVocab", "model:\n  vocab: 0\n", 2, 10, "model.vocab", "must be positive; valid range is [1, 4294967296]"},
    {"ZeroTp", "parallel: {tp: 0}\n", 1, 16, "parallel.tp", "must be positive"},
    {"NegativeSharedExperts", "model:\n  moe: {shared_experts: -1}\n", 2, 25, "model.moe.shared_experts",
     "must not be negative; valid range is [0, 1024]"},
    {"ZeroOutOfRange", "parallel: {zero: 4}\n", 1, 18, "parallel.zero", "out of range; valid range is [0, 3]"},
    {"Int64Overflow", "training: {global_batch: 99999999999999999999}\n", 1, 26, "training.global_batch",
     "out of range; valid range is [1, 1099511627776]"},
    {"DropoutOne", "training: {dropout: 1.0}\n", 1, 21, "training.dropout", "valid range is [0, 1)"},
    // Unknown keys.
    {"UnknownKeySuggestion", "model:\n  mamba: {d_stat: 128}\n", 2, 11, "model.mamba.d_stat",
     "unknown key; did you mean 'd_state'?"},
    {"UnknownKeyList", "parallel: {foo: 1}\n", 1, 12, "parallel.foo",
     "unknown key; valid keys in parallel: tp, sp, cp, pp, vpp, ep, expert_tp, zero, dp_replicate, optimizer_sharding, "
     "fsdp_cpu_offload, "
     "schedule, microbatch_group, order, "
     "cp_comm, "
     "cp_recurrent, cp_load_balance, stage_boundaries"},
    {"KeyInWrongSection", "model:\n  global_batch: 8\n", 2, 3, "model.global_batch",
     "unknown key in model; 'global_batch' belongs in training (valid keys here: pattern, repeat, layers"},
    {"MergeKey", "parallel:\n  <<: {tp: 2}\n", 2, 3, "parallel.<<", "YAML merge keys ('<<') are not supported"},
    {"UnknownTopLevelKey", "modle:\n  hidden: 8\n", 1, 1, "modle", "unknown key; did you mean 'model'?"},
    // Enums.
    {"BadEnum", "training: {recompute: partial}\n", 1, 23, "training.recompute",
     "must be one of: none, selective, full, selective_op"},
    {"EnumCase", "parallel: {schedule: 1F1B}\n", 1, 22, "parallel.schedule",
     "must be one of: 1f1b, interleaved, dualpipe, dualpipev; did you mean '1f1b'?"},
    {"BadOrder", "parallel: {order: dp-tp}\n", 1, 19, "parallel.order", "must be one of: tp-cp-dp-pp, tp-cp-pp-dp"},
    {"BadCpRecurrent", "parallel: {cp_recurrent: ring}\n", 1, 26, "parallel.cp_recurrent",
     "must be one of: all_to_all, handoff"},
    {"BadCpLoadBalance", "parallel: {cp_load_balance: maybe}\n", 1, 29, "parallel.cp_load_balance",
     "must be true or false"},
    {"MuonForOther", "training:\n  optimizer: {other: muon}\n", 2, 22, "training.optimizer.other",
     "must be one of: adamw"},
    {"UnknownGpu", "cluster: {gpu: v100}\n", 1, 16, "cluster.gpu",
     "unknown GPU; valid presets: h200, h100, h100-nvl, a100, b200, gb200"},
    // cluster.device: a custom device instead of a preset.
    {"DeviceAndGpu", "cluster:\n  gpu: h100\n  device: {based_on: h100}\n", 3, 3, "cluster.device",
     "mutually exclusive with cluster.gpu (line 2): name a preset or describe the device; to start from a preset, "
     "write cluster.device.based_on: h100"},
    // Missing figures: one error at the first, located at the device map, listing them all.
    {"DeviceMissingFigures", "cluster:\n  device: {name: mygpu, capacity_mib: 81920, bf16_dense_tflops: 500}\n", 2, 11,
     "cluster.device.hbm_gbps",
     "missing: a device without based_on gives every figure the step is priced with (missing here: hbm_gbps, "
     "nvlink_gbps_per_dir, ib_gbps_per_dir, rates.gemm, rates.gemm_memory, rates.hbm, rates.attention_fused, "
     "rates.attention_flash2, rates.attention_half_seq); add them, or start from a preset with based_on: one of "
     "h200, h100, h100-nvl, a100, b200, gb200"},
    {"DeviceMissingName", "cluster:\n  device: {capacity_mib: 81920}\n", 2, 11, "cluster.device.name",
     "(missing here: name, bf16_dense_tflops, "},
    {"DeviceEmpty", "cluster:\n  device:\n", 2, 3, "cluster.device.name", "(missing here: name, capacity_mib, "},
    {"DeviceNotAMap", "cluster: {device: h100}\n", 1, 19, "cluster.device",
     "must be a map with keys based_on, name, capacity_mib, bf16_dense_tflops"},
    {"DeviceUnknownBasedOn", "cluster:\n  device: {based_on: h300}\n", 2, 22, "cluster.device.based_on",
     "must be one of: h200, h100, h100-nvl, a100, b200, gb200; did you mean 'h200'?"},
    {"DeviceUnknownKey", "cluster:\n  device: {based_on: h100, hbm_gbs: 3000}\n", 2, 28, "cluster.device.hbm_gbs",
     "unknown key; did you mean 'hbm_gbps'?"},
    {"DeviceUnknownRate", "cluster:\n  device:\n    based_on: h100\n    rates: {gemm_bf16: 0.5}\n", 4, 13,
     "cluster.device.rates.gemm_bf16", "unknown key; valid keys in cluster.device.rates: gemm, gemm_fp8, gemm_memory"},
    {"DeviceZeroHbm", "cluster:\n  device: {based_on: h100, hbm_gbps: 0}\n", 2, 38, "cluster.device.hbm_gbps",
     "must be positive; valid range is (0, 1000000]"},
    {"DeviceNegativePeak", "cluster:\n  device: {based_on: h100, bf16_dense_tflops: -989}\n", 2, 47,
     "cluster.device.bf16_dense_tflops", "must be positive; valid range is (0, 1000000]"},
    {"DeviceZeroCapacity", "cluster:\n  device: {based_on: h100, capacity_mib: 0}\n", 2, 42,
     "cluster.device.capacity_mib", "must be positive; valid range is [1, 1099511627776]"},
    {"DeviceNegativeFp8", "cluster:\n  device: {based_on: h100, fp8_dense_tflops: -1}\n", 2, 46,
     "cluster.device.fp8_dense_tflops", "out of range; valid range is [0, 1000000]"},
    {"DeviceNegativeDomain", "cluster:\n  device: {based_on: h100, nvlink_domain: -8}\n", 2, 43,
     "cluster.device.nvlink_domain", "must not be negative; valid range is [0, 16777216]"},
    {"DeviceRateAboveOne", "cluster:\n  device:\n    based_on: h100\n    rates: {gemm: 1.2}\n", 4, 19,
     "cluster.device.rates.gemm", "out of range; valid range is (0, 1]"},
    {"DeviceRateZero", "cluster:\n  device:\n    based_on: h100\n    rates: {hbm: 0}\n", 4, 18,
     "cluster.device.rates.hbm", "must be positive; valid range is (0, 1]"},
    {"DeviceRateNotANumber", "cluster:\n  device:\n    based_on: h100\n    rates: {gemm: high}\n", 4, 19,
     "cluster.device.rates.gemm", "must be a number in (0, 1]"},
    // a100 has no fp8 tensor cores, hence no fp8 GEMM rate to inherit.
    {"DeviceFp8WithoutRate", "cluster:\n  device: {based_on: a100, fp8_dense_tflops: 624}\n", 2, 11,
     "cluster.device.rates.gemm_fp8",
     "missing: the device has fp8 tensor cores (fp8_dense_tflops 624), so fp8 GEMMs need their achieved fraction"},
    {"DeviceOffloadWithoutHostLink",
     "training:\n  optimizer: {offload_fraction: 0.5}\ncluster:\n  device:\n    name: g\n    capacity_mib: 81920\n"
     "    bf16_dense_tflops: 500\n    hbm_gbps: 3000\n    nvlink_gbps_per_dir: 300\n    ib_gbps_per_dir: 25\n"
     "    rates: {gemm: 0.7, gemm_memory: 0.6, hbm: 0.8, attention_fused: 0.6, attention_flash2: 0.4, "
     "attention_half_seq: 2400}\n",
     5, 5, "cluster.device.host_link_gbps_per_dir",
     "missing: training.optimizer.offload_fraction 0.5 keeps optimizer state in host memory, which needs the "
     "device's host_link_gbps_per_dir, a positive number"},
    // Layer pattern and list.
    {"BadPatternLetterQuoted", "model:\n  pattern: \"AEXM\"\n", 2, 15, "model.pattern",
     "bad layer letter 'X' at position 3; valid letters: A (attention), M (Mamba-2), E (MoE), R (recurrent), D "
     "(dense MLP)"},
    {"BadPatternLetterPlain", "model: {pattern: AEmE}\n", 1, 20, "model.pattern", "bad layer letter 'm' at position 3"},
    {"BadLayerListItem", "model:\n  layers: [A, M, Q]\n", 2, 18, "model.layers[2]", "layer 3 must be one letter"},
    {"LayersAndPattern", "model:\n  pattern: AM\n  layers: [A, M]\n", 3, 3, "model.layers",
     "mutually exclusive with model.pattern (line 2)"},
    {"TooManyLayers", "model: {pattern: AEME, repeat: 30000}\n", 1, 32, "model.repeat",
     "at most 100000 are supported; try repeat <= 25000"},
    {"LayerOffsetNotBelowFreq", "model:\n  moe: {layer_freq: 2, layer_offset: 2}\n", 2, 38, "model.moe.layer_offset",
     "must be less than model.moe.layer_freq (2); valid range is [0, 1]"},
    // Whole-file problems.
    {"EmptyFile", "", 0, 0, "", "the recipe is empty; expected a map with keys name, model, training"},
    {"CommentsOnly", "# nothing here\n", 0, 0, "", "the recipe is empty"},
    {"NotYamlUnclosedFlow", "model: [1, 2\nparallel: 3\n", 2, 9, "", "not valid YAML: end of sequence flow not found"},
    {"NotYamlMapValue", "a: b: c\n", 1, 5, "", "not valid YAML: illegal map value"},
    // yaml-cpp 0.7's LoadAll loops forever on a leading ',' (jbeder/yaml-cpp#1040); we must not.
    {"LeadingComma", "# comment\n,\nname: a\n", 2, 1, "", "not a recipe: the document reads as null (malformed YAML?)"},
    {"NullDocument", "~\n", 1, 1, "", "the document reads as null"},
    {"TopLevelScalar", "just some text\n", 1, 1, "", "the top level must be a map with keys name, model"},
    {"TopLevelList", "- a\n- b\n", 1, 1, "", "got a list"},
    {"TwoDocuments", "name: a\n---\nname: b\n", 3, 1, "", "a recipe is one document"},
    {"DuplicateKey", "parallel:\n  tp: 2\n  pp: 2\n  tp: 4\n", 4, 3, "parallel.tp",
     "duplicate key; first set on line 2, again on line 4"},
    {"AttentionAndMla", "model:\n  attention: {heads: 8}\n  mla: {heads: 8}\n", 3, 3, "model.mla",
     "mutually exclusive with model.attention (line 2)"},
    // Semantic checks, each with the nearest valid values.
    {"HeadsNotDivisibleByKvHeads", "model:\n  attention: {heads: 32, kv_heads: 6}\n", 2, 36, "model.attention.kv_heads",
     "must divide model.attention.heads (32) for grouped-query attention; try 4 or 8"},
    // world 24 = 3 x 8 so only the head rule breaks for tp 3; gcd(32, 8) = 8 has divisors 2, 4 around 3.
    {"TpNotDividingHeads", "parallel: {tp: 3}\ncluster: {nodes: 3}\n", 1, 16, "parallel.tp",
     "must divide model.attention.heads (32) and kv_heads (8); try 2 or 4"},
    {"TpNotDividingMambaGroups", "model: {pattern: M, repeat: 2}\nparallel: {tp: 16}\n", 2, 16, "parallel.tp",
     "and model.mamba.groups (8); try 8"},
    {"MlaHeadsTp", "model:\n  mla: {heads: 12}\nparallel: {tp: 8}\n", 3, 16, "parallel.tp",
     "must divide model.mla.heads (12); try 6 or 12"},
    // 2 x 4096 = 8192 = 2^13: divisors around 96 are 64 and 128.
    {"MambaHeadDim", "model:\n  mamba: {head_dim: 96}\n", 2, 21, "model.mamba.head_dim",
     "must divide the Mamba inner width expand x hidden = 2 x 4096 = 8192; try 64 or 128"},
    {"MambaGroups", "model:\n  mamba: {groups: 3}\n", 2, 19, "model.mamba.groups",
     "must divide the Mamba head count expand x hidden / head_dim = 128; try 2 or 4"},
    // tp 4, cp 3 on 48 GPUs: heads/tp = 32 is not divisible by 3; groups/tp = 2 allows cp 2 or 4.
    {"MambaCp", "parallel: {tp: 4, cp: 3}\ncluster: {nodes: 6}\n", 1, 23, "parallel.cp",
     "Mamba all-to-all context parallelism needs heads/tp (32) divisible by cp and groups/tp (2) divisible by cp "
     "or dividing it (docs/formulas.md §1.4); try 2 or 4, or set parallel.cp_recurrent: handoff"},
    // Default R layers: 32 gate blocks; 2 blocks over cp 4 do not split (Mamba 128 heads / 8 groups do).
    {"RecurrentCpAllToAll", "model:\n  recurrent: {width: 4096, heads: 2}\nparallel: {cp: 4}\n", 3, 16, "parallel.cp",
     "recurrent all-to-all context parallelism needs model.recurrent.heads/tp (2) divisible by cp; try 2, or set "
     "parallel.cp_recurrent: handoff"},
    // seq_len 8 over 2 x cp = 4 chunks: 2 positions each, fewer than the conv tail d_conv - 1 = 3;
    // cp <= 8 / (2 x 3) = 1. The R layers' conv (d_conv 4) gets the same error.
    {"HandoffConvTail", "training: {seq_len: 8}\nparallel: {cp: 2, cp_recurrent: handoff}\n", 2, 16, "parallel.cp",
     "the context-parallel state hand-off needs every sequence chunk (seq_len / 4 = 2 positions) to hold the conv "
     "tail of model.mamba.d_conv - 1 = 3 positions; use cp <= 1"},
    // Attention 32 query / 8 KV heads: gcd 8 does not split over cp 16 (Mamba: 128 heads, groups 8 divide 16).
    {"A2aHeads", "parallel: {cp: 16, cp_comm: a2a}\n", 1, 16, "parallel.cp",
     "cp_comm a2a splits the attention heads over cp: heads/tp (32) and kv_heads/tp (8) must both be divisible by "
     "cp; try 8, or use cp_comm p2p"},
    {"RecurrentHeads", "model:\n  recurrent: {width: 4096, heads: 24}\n", 2, 35, "model.recurrent.heads",
     "must divide model.recurrent.width (4096) into equal gate blocks; try 16 or 32"},
    // 1002 = 2 x 3 x 167.
    {"DenseFfnTp", "model: {pattern: AD, mlp: {ffn_hidden: 1002}}\nparallel: {tp: 8}\n", 2, 16, "parallel.tp",
     "must divide model.mlp.ffn_hidden (1002) of the dense D layers; try 6 or 167"},
    {"EpNotDividingExperts", "parallel: {ep: 6}\n", 1, 16, "parallel.ep",
     "must divide model.moe.experts (64); try 4 or 8"},
    // No MoE layers, but the expert mesh must still fold: 64 ranks / (ep 1 x expert_tp 3).
    {"ExpertMeshWithoutMoe", "model: {pattern: AD}\nparallel: {expert_tp: 3}\n", 2, 23, "parallel.expert_tp",
     "ep x expert_tp = 1 x 3 must divide tp x cp x dp = 64 (the ranks of one pipeline stage, Megatron's MoE "
     "folding); try 2 or 4"},
    {"ExpertTpNotDividingFfn", "parallel: {expert_tp: 3}\n", 1, 23, "parallel.expert_tp",
     "must divide model.moe.ffn_hidden (2048); try 2 or 4"},
    {"TopKAboveExperts", "model:\n  moe: {experts: 4, top_k: 8}\n", 2, 28, "model.moe.top_k",
     "must not exceed model.moe.experts (4); valid range is [1, 4]"},
    {"MoeNeedsSp", "parallel: {tp: 2, sp: false}\n", 1, 23, "parallel.sp",
     "must be true: Megatron requires sequence parallelism for MoE layers when tp > 1"},
    // 64 GPUs / (tp 8) = 8 ranks left for pp: divisors 2, 4 around 3.
    {"WorldNotDivisible", "parallel: {tp: 8, pp: 3}\n", 1, 23, "parallel.pp",
     "tp x cp x pp = 8 x 1 x 3 must divide the world size 64 (cluster.nodes 8 x gpus_per_node 8); try 2 or 4"},
    {"GlobalBatchNotMultiple", "training: {global_batch: 100}\n", 1, 26, "training.global_batch",
     "must be a multiple of micro_batch x dp = 1 x 64; try 64 or 128"},
    {"SeqLenCp", "training: {seq_len: 8190}\nparallel: {cp: 2}\n", 1, 21, "training.seq_len",
     "must be a multiple of 2 x parallel.cp = 4 (causal load balancing splits the sequence into 2 x cp chunks); try "
     "8188 or 8192"},
    {"SeqLenCpUnbalanced", "training: {seq_len: 8191}\nparallel: {cp: 2, cp_load_balance: false}\n", 1, 21,
     "training.seq_len",
     "must be a multiple of parallel.cp = 2 (context parallelism without load balancing splits the sequence into cp "
     "chunks); try 8190 or 8192"},
    // 8194 % 4 = 2; the nearest multiples of cp x tp = 4 are 8192 and 8196.
    {"SeqLenSp", "training: {seq_len: 8194}\nparallel: {tp: 4}\n", 1, 21, "training.seq_len",
     "seq_len / cp = 8194 must be a multiple of parallel.tp (4) with sequence parallelism; try 8192 or 8196"},
    // pp 4 leaves dp 16: global batch 16 gives m = 1 < pp.
    {"InterleavedFewMicroBatches", "training: {global_batch: 16}\nparallel: {pp: 4, vpp: 2}\n", 1, 26,
     "training.global_batch",
     "gives m = 1 micro-batches per pipeline (global_batch / (micro_batch x dp)); the interleaved schedule needs at "
     "least pp = 4 (Megatron); try global_batch 64"},
    {"VppWithoutPp", "parallel: {vpp: 2}\n", 1, 17, "parallel.vpp", "virtual pipeline stages need parallel.pp > 1"},
    // vpp is not in the file: the mark falls back to its parent, the parallel map.
    {"InterleavedWithoutVpp", "parallel: {pp: 2, schedule: interleaved}\n", 1, 11, "parallel.vpp",
     "the interleaved schedule needs vpp > 1"},
    {"DualPipeOddPp", "parallel: {pp: 3, schedule: dualpipe}\ncluster: {nodes: 6}\n", 1, 16, "parallel.pp",
     "dualpipe needs an even pp; try 2 or 4"},
    // pp 4 -> dp 16, global batch 96 -> m = 6 < 2 x pp = 8.
    {"DualPipeFewMicroBatches", "training: {global_batch: 96}\nparallel: {pp: 4, schedule: dualpipe}\n", 1, 26,
     "training.global_batch", "dualpipe needs an even m >= 2 x pp = 8; try global_batch 128"},
    // DualPipeV: pp 3 on 48 GPUs -> dp 16; global batch 64 -> m = 4 < 2 x 3; 6 x 16 = 96.
    {"DualPipeVFewMicroBatches",
     "training: {global_batch: 64}\nparallel: {pp: 3, schedule: dualpipev}\n"
     "cluster: {nodes: 6}\n",
     1, 26, "training.global_batch", "dualpipev needs m >= 2 x pp = 6; try global_batch 96"},
    {"DualPipeWithVpp", "parallel: {pp: 2, vpp: 2, schedule: dualpipe}\n", 1, 24, "parallel.vpp",
     "dualpipe places two model chunks per rank itself; set vpp 1"},
    {"PpExceedsLayers", "model: {pattern: AEM, repeat: 1}\nparallel: {pp: 4}\n", 2, 16, "parallel.pp",
     "Megatron-LM splits the 3 layers evenly over pipeline stages; 3 is not a multiple of pp = 4"},
    {"StageBoundaryCount", "parallel: {pp: 4, stage_boundaries: [12, 24]}\n", 1, 37, "parallel.stage_boundaries",
     "has 2 entries; the 4 model chunks (pp = 4, vpp = 1, schedule 1f1b) need exactly 3"},
    {"StageBoundaryOrder", "parallel: {pp: 4, stage_boundaries: [12, 30, 20]}\n", 1, 46, "parallel.stage_boundaries[2]",
     "must not decrease and stay within [0, 48] layers; valid here: [30, 48]"},
    {"StageBoundaryPastTheEnd", "parallel: {pp: 2, stage_boundaries: [49]}\n", 1, 38, "parallel.stage_boundaries[0]",
     "valid here: [0, 48]"},
};

class MalformedRecipe : public ::testing::TestWithParam<Case> {};

TEST_P(MalformedRecipe, FailsWithLocatedDiagnostic) {
  const Case& c = GetParam();
  const LoadResult result = LoadRecipeFromString(c.yaml, kFile);
  EXPECT_FALSE(result.ok());
  ASSERT_TRUE(HasErrors(result.diagnostics));
  std::string all;
  for (const Diagnostic& d : result.diagnostics) all += Format(d) + "\n";
  const Diagnostic* match = nullptr;
  for (const Diagnostic& d : result.diagnostics) {
    if (d.severity == Severity::kError && d.key_path == c.key_path && d.message.find(c.message) != std::string::npos) {
      match = &d;
      break;
    }
  }
  ASSERT_NE(match, nullptr) << "no error at '" << c.key_path << "' containing '" << c.message << "'; got:\n" << all;
  EXPECT_EQ(match->file, kFile);
  EXPECT_EQ(match->mark.line, c.line) << all;
  EXPECT_EQ(match->mark.column, c.column) << all;
}

INSTANTIATE_TEST_SUITE_P(All, MalformedRecipe, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// Whole messages, caret line included (docs/recipe.md "Diagnostics", ninja style).
LoadResult Load(const std::string& yaml) { return LoadRecipeFromString(yaml, "recipes/x.yaml"); }

std::string FirstError(const LoadResult& r) {
  for (const Diagnostic& d : r.diagnostics) {
    if (d.severity == Severity::kError) return Format(d);
  }
  return "";
}

TEST(DiagnosticFormat, DeviceFigureFromAnOverrideNamesTheOverride) {
  const LoadResult r = LoadRecipeFromString("cluster: {device: {based_on: h100}}\n", "recipes/x.yaml",
                                            {{"cluster.device.rates.gemm", "0"}});
  EXPECT_EQ(
      FirstError(r),
      "--set cluster.device.rates.gemm=0: cluster.device.rates.gemm = 0: must be positive; valid range is (0, 1]");
}

TEST(DiagnosticFormat, DividesWithCaret) {
  const auto r = Load("name: x\nmodel:\n  attention: {heads: 32, kv_heads: 6}\n");
  EXPECT_EQ(FirstError(r),
            "recipes/x.yaml:3:36: model.attention.kv_heads = 6: must divide model.attention.heads (32) for "
            "grouped-query attention; try 4 or 8\n"
            "      attention: {heads: 32, kv_heads: 6}\n"
            "                                       ^");
}

TEST(DiagnosticFormat, UnknownKeyWithSuggestion) {
  const auto r = Load("model:\n  mamba:\n    d_stat: 128\n");
  EXPECT_EQ(FirstError(r),
            "recipes/x.yaml:3:5: model.mamba.d_stat: unknown key; did you mean 'd_state'?\n"
            "        d_stat: 128\n"
            "        ^");
}

TEST(DiagnosticFormat, TpMustDivideHeads) {
  // The docs/recipe.md "Diagnostics" example: tp 6 on 48 GPUs (6 | 48), seq_len 8196 = 6 x 1366.
  const auto r = Load("cluster: {nodes: 6}\ntraining: {seq_len: 8196}\nparallel:\n  tp: 6\n");
  EXPECT_EQ(FirstError(r),
            "recipes/x.yaml:4:7: parallel.tp = 6: must divide model.attention.heads (32) and kv_heads (8); try 4 "
            "or 8\n"
            "      tp: 6\n"
            "          ^");
}

TEST(DiagnosticFormat, BadLetterCaretUnderTheLetter) {
  const auto r = Load("model:\n  pattern: \"AEMQ\"\n");
  EXPECT_EQ(FirstError(r),
            "recipes/x.yaml:2:16: model.pattern = AEMQ: bad layer letter 'Q' at position 4; valid letters: A "
            "(attention), M (Mamba-2), E (MoE), R (recurrent), D (dense MLP)\n"
            "      pattern: \"AEMQ\"\n"
            "                   ^");
}

TEST(DiagnosticFormat, DuplicateKeyNamesBothLines) {
  const auto r = Load("parallel:\n  tp: 2\n  tp: 4\n");
  EXPECT_EQ(FirstError(r),
            "recipes/x.yaml:3:3: parallel.tp: duplicate key; first set on line 2, again on line 3: keep one\n"
            "      tp: 4\n"
            "      ^");
}

TEST(DiagnosticFormat, EmptyFileHasNoLine) {
  EXPECT_EQ(FirstError(Load("")),
            "recipes/x.yaml: the recipe is empty; expected a map with keys name, model, training, parallel, "
            "cluster, serving");
}

TEST(Diagnostics, CollectsAllErrorsInFileOrder) {
  const auto r = Load("parallel: {tp: x}\nmodel:\n  hidden: -1\n  foo: 2\ntraining: {recompute: all}\n");
  std::vector<std::string> keys;
  for (const Diagnostic& d : r.diagnostics) keys.push_back(d.key_path);
  EXPECT_EQ(keys, (std::vector<std::string>{"parallel.tp", "model.hidden", "model.foo", "training.recompute"}));
}

TEST(Diagnostics, NoSemanticNoiseFromAnUnreadableKey) {
  // heads is unreadable, so "kv_heads must divide heads (32, the default)" would mislead.
  const auto r = Load("model:\n  attention: {heads: many, kv_heads: 6}\n");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].key_path, "model.attention.heads");
}

TEST(Diagnostics, TabIsPrintedAsOneColumn) {
  const auto r = Load("model:\n\thidden: 3\n");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].mark.line, 2);
  EXPECT_EQ(r.diagnostics[0].source_line, " hidden: 3");
}

TEST(Diagnostics, OversizedFileIsRefused) {
  const std::string big = "name: x\n# " + std::string(4 << 20, 'x') + "\n";
  const auto r = Load(big);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_NE(r.diagnostics[0].message.find("limited to 4194304 bytes (4 MiB)"), std::string::npos);
}

TEST(Diagnostics, HugeFlowListIsRefusedBeforeParsing) {
  // 500,000 list items in well under 4 MiB: refused without building the tree.
  std::string yaml = "parallel: {stage_boundaries: [1";
  for (int i = 0; i < 500'000; ++i) yaml += ",1";
  yaml += "]}\n";
  const auto r = Load(yaml);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_NE(r.diagnostics[0].message.find("recipes are limited to 400000"), std::string::npos);
}

TEST(Diagnostics, LongestExplicitLayerListLoads) {
  // 100,000 layers in block style ("- A" lines) stay under the separator bound.
  std::string yaml = "model:\n  layers:\n";
  for (int i = 0; i < 100'000; ++i) yaml += "  - M\n";
  const auto r = Load(yaml);
  ASSERT_TRUE(r.ok()) << FirstError(r);
  EXPECT_EQ(r.recipe->model.layers.size(), 100'000u);
}

TEST(Diagnostics, DeepNestingIsASyntaxErrorNotACrash) {
  const auto r = Load("name: " + std::string(100000, '[') + "\n");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(HasErrors(r.diagnostics));
}

TEST(Diagnostics, AliasBombIsBounded) {
  // Each level references the previous one ten times: 10^8 leaves if expanded.
  std::string yaml = "a0: &a0 [A, A, A, A, A, A, A, A, A, A]\n";
  for (int i = 1; i <= 8; ++i) {
    yaml += fmt::format("a{}: &a{} [", i, i);
    for (int j = 0; j < 10; ++j) yaml += fmt::format("{}*a{}", j ? ", " : "", i - 1);
    yaml += "]\n";
  }
  yaml += "model: {layers: *a8}\n";
  const auto r = Load(yaml);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(HasErrors(r.diagnostics));
}

TEST(Diagnostics, HugeDegreesOverflowCleanly) {
  // tp x cp x pp = (2^24 - 1)^3 leaves int64: a located error, no wrap, no hang.
  const auto r = Load("parallel: {tp: 16777215, cp: 16777215, pp: 16777215}\n");
  EXPECT_FALSE(r.ok());
  bool found = false;
  for (const Diagnostic& d : r.diagnostics) {
    if (d.key_path == "parallel.tp" && d.message.find("must divide the world size 64") != std::string::npos) {
      found = true;
      EXPECT_NE(d.message.find("try 64"), std::string::npos) << d.message;
    }
  }
  EXPECT_TRUE(found) << FirstError(r);
}

TEST(Diagnostics, HugeButValidRecipeValidates) {
  // About 10 T parameters on a million GPUs (125,000 nodes x 8). Hand count:
  // 80 MoE layers x 128 experts x 3 x 32768 x 10240 = 1.03e13 expert weights.
  // world 1,000,000 / (tp 8 x pp 20) = dp 6250; 1,000,000 sequences / 6250 = 160
  // micro-batches; tp x dp = 50,000 = 16 x 3125, so ep 16 folds.
  const auto r = Load(
      "model:\n"
      "  pattern: AEAEAEAEAEAEAEAEAEAE\n"
      "  repeat: 8\n"
      "  hidden: 32768\n"
      "  attention: {heads: 256, kv_heads: 32, head_dim: 128}\n"
      "  moe: {experts: 128, top_k: 8, ffn_hidden: 10240}\n"
      "training: {seq_len: 32768, global_batch: 1000000, micro_batch: 1}\n"
      "parallel: {tp: 8, pp: 20, ep: 16}\n"
      "cluster: {nodes: 125000, gpus_per_node: 8}\n");
  std::string all;
  for (const Diagnostic& d : r.diagnostics) all += Format(d) + "\n";
  ASSERT_TRUE(r.ok()) << all;
  EXPECT_EQ(r.recipe->world(), 1'000'000);
  EXPECT_EQ(r.recipe->dp(), 6250);
  EXPECT_EQ(r.recipe->micro_batches(), 160);
  EXPECT_EQ(r.recipe->expert_dp(), 3125);
}

}  // namespace
}  // namespace preflight::recipe_errors_test

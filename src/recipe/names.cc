// Names of recipe enums (as written in YAML) and the GPU presets.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "preflight/recipe/recipe.h"

namespace preflight {

const char* Name(DType d) {
  switch (d) {
    case DType::kFp32: return "fp32";
    case DType::kBf16: return "bf16";
    case DType::kFp16: return "fp16";
    case DType::kFp8: return "fp8";
  }
  return "?";
}

const char* Name(Fp4Format f) {
  switch (f) {
    case Fp4Format::kNone: return "none";
    case Fp4Format::kNvfp4: return "nvfp4";
    case Fp4Format::kMxfp4: return "mxfp4";
  }
  return "?";
}

const char* Name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
    case Recompute::kSelectiveOp: return "selective_op";
  }
  return "?";
}

const char* Name(RecomputeModule m) {
  switch (m) {
    case RecomputeModule::kCoreAttn: return "core_attn";
    case RecomputeModule::kMoeAct: return "moe_act";
    case RecomputeModule::kLayernorm: return "layernorm";
    case RecomputeModule::kMlaUpProj: return "mla_up_proj";
    case RecomputeModule::kMlp: return "mlp";
    case RecomputeModule::kMoe: return "moe";
    case RecomputeModule::kSharedExperts: return "shared_experts";
  }
  return "?";
}

const char* Name(RecomputeMethod m) { return m == RecomputeMethod::kBlock ? "block" : "uniform"; }

const char* Name(CrossEntropy c) { return c == CrossEntropy::kFp32Upcast ? "fp32_upcast" : "vocab_parallel"; }

namespace {
template <class E, size_t N>
std::string SetText(EnumSet<E> set, const E (&all)[N]) {
  std::string out;
  for (E e : all) {
    if (set.has(e)) out += (out.empty() ? "" : ", ") + std::string(Name(e));
  }
  return "[" + out + "]";
}
}  // namespace

std::string RecomputeModulesText(ModuleSet set) { return SetText(set, kAllRecomputeModules); }
std::string OffloadModulesText(OffloadSet set) { return SetText(set, kAllOffloadModules); }

const char* Name(OffloadModule m) {
  switch (m) {
    case OffloadModule::kAttnNorm: return "attn_norm";
    case OffloadModule::kQkvLinear: return "qkv_linear";
    case OffloadModule::kCoreAttn: return "core_attn";
    case OffloadModule::kAttnProj: return "attn_proj";
    case OffloadModule::kMlpNorm: return "mlp_norm";
    case OffloadModule::kExpertFc1: return "expert_fc1";
    case OffloadModule::kMoeAct: return "moe_act";
  }
  return "?";
}

const char* Name(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kMuon: return "muon";
  }
  return "?";
}

const char* Name(EmbeddingSplit e) {
  switch (e) {
    case EmbeddingSplit::kVocabParallel: return "vocab_parallel";
    case EmbeddingSplit::kReplicated: return "replicated";
  }
  return "?";
}

const char* Name(Partition p) {
  switch (p) {
    case Partition::kMegatron: return "megatron";
    case Partition::kTorchtitan: return "torchtitan";
    case Partition::kBalanced: return "balanced";
  }
  return "?";
}

const char* Name(Schedule s) {
  switch (s) {
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
    case Schedule::kDualPipe: return "dualpipe";
    case Schedule::kDualPipeV: return "dualpipev";
  }
  return "?";
}

const char* Name(CpRecurrent c) {
  switch (c) {
    case CpRecurrent::kAllToAll: return "all_to_all";
    case CpRecurrent::kHandoff: return "handoff";
  }
  return "?";
}

namespace {

// One row per device; every figure with its source. Units: MiB as
// `nvidia-smi` reports memory.total (not the marketing GB: docs/formulas.md
// §2.4), dense TFLOP/s (datasheets print "with sparsity": dense is half),
// GB/s per GPU per direction for links, GB/s for HBM, GiB of host memory per
// node.
//
// Capacities: A100 80GB 81920 MiB and H100 80GB HBM3 81559 MiB (nvidia-smi,
// listed in modal-labs/modal-client#2797), H200 143771 MiB (nvidia-smi on
// DGX H200), B200 183359 MiB (nvidia-smi on DGX B200, NVIDIA/TensorRT-LLM#10278).
// H100 NVL and GB200 are the datasheets' 94 GB and 186 GB in MiB (89645,
// 177383: no nvidia-smi figure at hand, so the lower reading; a site that
// knows better sets cluster.capacity_mib).
// Peaks (dense, per GPU): A100 SXM 312 bf16, no fp8; H100 SXM / H200 SXM 989
// bf16, 1979 fp8; H100 NVL 835 / 1671; B200 (HGX B200, 1000 W) 2250 bf16,
// 4500 fp8, 9000 fp4; GB200 (NVL72) 2500 / 5000 / 10000 — the datasheets'
// sparse figures halved, as torchao's roofline_utils and torchtitan's
// infer_peak_bf16_tflops list them.
// HBM: A100 80GB 2039, H100 SXM 3350, H100 NVL 3900, H200 4800 GB/s
// (datasheets); B200 and GB200 7672 GB/s (7680-bit bus at 3996 MHz, DDR: the
// driver's corrected bus width, pytorch/ao#4002; the datasheet says 8 TB/s).
// NVLink per direction: NVLink3 12 x 25 = 300 (A100), NVLink4 18 x 25 = 450
// (H100/H200 SXM), NVLink bridge 600 GB/s bidirectional = 300 in pairs (H100
// NVL), NVLink5 18 x 50 = 900 (B200, GB200; one domain of 72 on NVL72).
// Network per GPU per direction: HDR 200 Gb/s = 25 GB/s (DGX A100), NDR
// 400 Gb/s = 50 GB/s (DGX H100/H200/B200, ConnectX-7 on GB200 NVL72).
// Host: PCIe Gen4 x16 31.5 GB/s (A100), Gen5 x16 63 GB/s (32 GT/s x 16,
// 128b/130b); GB200's NVLink-C2C 900 GB/s bidirectional per Grace, shared by
// its two GPUs: 225 per GPU per direction. Host memory: DGX A100/H100/H200/B200
// 2 TB (1863 GiB); a GB200 compute tray (4 GPUs, 2 Grace x 480 GB LPDDR5X)
// 960 GB (894 GiB); H100 NVL servers vary: DGX-like 2 TB assumed.
//
// Kernel rates (KernelRates): Hopper's from bench/device on an H100 SXM
// (bench/data/gemm_h100_bf16.tsv, bench/data/kernel_rates_h100.json; fit in
// docs/plan.md; an H200 SXM measured the same fractions, *_h200*): GEMMs at max(FLOPs (1 + 256 / K) / (0.74 peak),
// bytes / (0.45 HBM)) over 138 shapes (median error 3.8 %, p90 11 %); fp8 _scaled_mm 1310-1380 of 1979 TFLOP/s at K =
// 4096-14336 (0.71 before the K term); a 1 GiB copy 2991 of 3350 GB/s (0.89); causal GQA attention forward+backward at
// s = 2048/4096/8192: cuDNN 0.31/0.45/0.53 and FlashAttention-2 0.18/0.25/0.29 of peak, i.e. 0.71 and 0.37 at long
// sequences with half rate at s = 2400. Ampere's GEMM rate is fitted on the Megatron-LM PTD-P paper's Table 1
// (docs/plan.md); its attention figures are FlashAttention-2's paper (Dao 2023: 50-73 % of A100 peak forward+backward).
// Blackwell: no device at hand; Hopper's fractions are taken as they are
// (docs/plan.md says so), the peaks are Blackwell's.
constexpr KernelRates kHopper{0.74, 0.71, 0.45, 0.89, 0.71, 0.37, 2400.0, 256.0};
constexpr KernelRates kAmpere{0.69, 0.0, 0.45, 0.89, 0.71, 0.62, 2400.0, 256.0};
constexpr KernelRates kBlackwell = kHopper;

const GpuSpec kPresets[] = {
    {"h200", 143771, 989.0, 450.0, 50.0, 63.0, 1863.0, 1979.0, 0.0, 4800.0, 0, kHopper},
    {"h100", 81559, 989.0, 450.0, 50.0, 63.0, 1863.0, 1979.0, 0.0, 3350.0, 0, kHopper},
    {"h100-nvl", 89645, 835.0, 300.0, 50.0, 63.0, 1863.0, 1671.0, 0.0, 3900.0, 2, kHopper},
    {"a100", 81920, 312.0, 300.0, 25.0, 31.5, 1863.0, 0.0, 0.0, 2039.0, 0, kAmpere},
    {"b200", 183359, 2250.0, 900.0, 50.0, 63.0, 1863.0, 4500.0, 9000.0, 7672.0, 0, kBlackwell},
    {"gb200", 177383, 2500.0, 900.0, 50.0, 225.0, 894.0, 5000.0, 10000.0, 7672.0, 72, kBlackwell},
};

}  // namespace

const char* Name(FfnActivation a) {
  switch (a) {
    case FfnActivation::kSwiglu: return "swiglu";
    case FfnActivation::kGelu: return "gelu";
    case FfnActivation::kRelu2: return "relu2";
  }
  return "swiglu";
}
const char* Name(NormKind n) { return n == NormKind::kRmsNorm ? "rmsnorm" : "layernorm"; }
const char* Name(RouterScore r) { return r == RouterScore::kSoftmax ? "softmax" : "sigmoid"; }
const char* Name(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::kAllToAll: return "alltoall";
    case MoeDispatcher::kAllGather: return "allgather";
    case MoeDispatcher::kFlex: return "flex";
  }
  return "alltoall";
}
const char* Name(AxisOrder o) { return o == AxisOrder::kTpCpDpPp ? "tp-cp-dp-pp" : "tp-cp-pp-dp"; }
const char* Name(CpComm c) {
  switch (c) {
    case CpComm::kP2p: return "p2p";
    case CpComm::kAllGather: return "all_gather";
    case CpComm::kA2a: return "a2a";
  }
  return "p2p";
}

const char* Name(OptimizerSharding s) { return s == OptimizerSharding::kFlat ? "flat" : "layer_wise"; }

std::optional<GpuSpec> GpuPreset(const std::string& name) {
  for (const GpuSpec& spec : kPresets) {
    if (spec.name == name) return spec;
  }
  return std::nullopt;
}

std::vector<std::string> GpuPresetNames() {
  std::vector<std::string> names;
  for (const GpuSpec& spec : kPresets) names.push_back(spec.name);
  return names;
}

std::string DeviceLabel(const ClusterConfig& cluster) {
  std::string label = cluster.gpu;
  if (cluster.device) {
    label = fmt::format("custom '{}'", cluster.device->spec.name);
    if (!cluster.device->based_on.empty()) label += " based on " + cluster.device->based_on;
  }
  std::vector<std::string> overrides;
  if (cluster.capacity_mib > 0) overrides.push_back(fmt::format("capacity_mib {}", cluster.capacity_mib));
  if (cluster.host_memory_gib > 0) overrides.push_back(fmt::format("host_memory_gib {}", cluster.host_memory_gib));
  if (!overrides.empty()) label += fmt::format(" ({} from the recipe)", fmt::join(overrides, ", "));
  return label;
}

}  // namespace preflight

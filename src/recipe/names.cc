// Names of recipe enums (as written in YAML) and the GPU presets.
#include <optional>
#include <string>
#include <vector>

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

const char* Name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
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

// Capacities are what `nvidia-smi` reports as memory.total, not the marketing
// figure (docs/formulas.md §2.4): H200 141 GB HBM3e shows 143771 MiB, H100
// 80GB HBM3 SXM shows 81559 MiB.
// bf16 dense peak: NVIDIA H100/H200 SXM datasheets give 1,979 TFLOPS "with
// sparsity"; the dense figure is half, 989 TFLOPS (same Hopper SXM tensor cores).
// Links (docs/formulas.md §7.1): NVLink4 18 links x 50 GB/s = 900 GB/s bidirectional =
// 450 GB/s per direction per GPU; InfiniBand NDR 400 Gb/s = 50 GB/s per
// direction per GPU (one NIC per GPU, rail-optimised).
// Host side (DGX H100 / H200 datasheets): each GPU on PCIe Gen5 x16, 32 GT/s
// x 16 lanes, 128b/130b = 63 GB/s per direction; 2 TB (1863 GiB) of system
// memory a node.
const GpuSpec kPresets[] = {
    {"h200", 143771, 989.0, 450.0, 50.0, 63.0, 1863.0},
    {"h100", 81559, 989.0, 450.0, 50.0, 63.0, 1863.0},
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
const char* Name(AxisOrder o) { return o == AxisOrder::kTpCpDpPp ? "tp-cp-dp-pp" : "tp-cp-pp-dp"; }
const char* Name(CpComm c) {
  switch (c) {
    case CpComm::kP2p: return "p2p";
    case CpComm::kAllGather: return "all_gather";
    case CpComm::kA2a: return "a2a";
  }
  return "p2p";
}

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

}  // namespace preflight

// cluster.device: a custom device instead of a preset. Parsing (every key
// given, based_on with overrides, the cluster's own overrides on top),
// DeviceLabel, diff's flattening, and pricing: a device spelled out with a
// preset's figures prices exactly like the preset. The error cases are in
// recipe_errors_test; the CLI's in cli_device_test.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "preflight/inventory/inventory.h"
#include "preflight/planner/plan.h"
#include "preflight/recipe/fields.h"
#include "preflight/recipe/recipe.h"
#include "preflight/report/diff.h"
#include "support/test_support.h"

namespace preflight::recipe_device_test {
namespace {

using testing::ReadFile;
using testing::SourcePath;

std::string Errors(const LoadResult& r) {
  std::string out;
  for (const Diagnostic& d : r.diagnostics) out += Format(d) + "\n";
  return out;
}

Recipe MustLoad(const std::string& yaml, const std::vector<Override>& overrides = {}) {
  LoadResult r = LoadRecipeFromString(yaml, "device.yaml", overrides);
  EXPECT_TRUE(r.ok()) << Errors(r);
  return r.ok() ? *r.recipe : Recipe{};
}

constexpr const char* kFullDevice = R"(cluster:
  device:
    name: mygpu
    capacity_mib: 98304
    bf16_dense_tflops: 1200
    fp8_dense_tflops: 2400
    fp4_dense_tflops: 4800
    hbm_gbps: 5000
    nvlink_gbps_per_dir: 400
    ib_gbps_per_dir: 40
    nvlink_domain: 16
    host_link_gbps_per_dir: 60
    host_memory_gib: 1000
    rates: {gemm: 0.7, gemm_fp8: 0.65, gemm_memory: 0.55, hbm: 0.85,
            attention_fused: 0.6, attention_flash2: 0.35, attention_half_seq: 2000}
)";

TEST(RecipeDevice, EveryKeyGivenIsPriced) {
  const Recipe r = MustLoad(kFullDevice);
  ASSERT_TRUE(r.cluster.device.has_value());
  EXPECT_EQ(r.cluster.gpu, "");
  EXPECT_EQ(r.cluster.device->based_on, "");
  const GpuSpec& g = r.cluster.spec;
  EXPECT_EQ(g.name, "mygpu");
  EXPECT_EQ(g.capacity_mib, 98304);
  EXPECT_EQ(g.bf16_dense_tflops, 1200.0);
  EXPECT_EQ(g.fp8_dense_tflops, 2400.0);
  EXPECT_EQ(g.fp4_dense_tflops, 4800.0);
  EXPECT_EQ(g.hbm_gbps, 5000.0);
  EXPECT_EQ(g.nvlink_gbps_per_dir, 400.0);
  EXPECT_EQ(g.ib_gbps_per_dir, 40.0);
  EXPECT_EQ(g.nvlink_domain, 16);
  EXPECT_EQ(g.host_link_gbps_per_dir, 60.0);
  EXPECT_EQ(g.host_memory_gib, 1000.0);
  EXPECT_EQ(g.rates.gemm, 0.7);
  EXPECT_EQ(g.rates.gemm_fp8, 0.65);
  EXPECT_EQ(g.rates.gemm_memory, 0.55);
  EXPECT_EQ(g.rates.hbm, 0.85);
  EXPECT_EQ(g.rates.attention_fused, 0.6);
  EXPECT_EQ(g.rates.attention_flash2, 0.35);
  EXPECT_EQ(g.rates.attention_half_seq, 2000.0);
  EXPECT_EQ(DeviceLabel(r.cluster), "custom 'mygpu'");
}

TEST(RecipeDevice, OnlyTheFiguresPricingNeedsAreRequired) {
  // No fp8/fp4 peaks, NVLink domain, host link or memory: 0 (none, one node).
  const Recipe r = MustLoad(R"(cluster:
  device:
    name: plain
    capacity_mib: 40960
    bf16_dense_tflops: 300
    hbm_gbps: 1500
    nvlink_gbps_per_dir: 300
    ib_gbps_per_dir: 25
    rates: {gemm: 0.7, gemm_memory: 0.6, hbm: 0.8, attention_fused: 0.6, attention_flash2: 0.5,
            attention_half_seq: 2400}
)");
  EXPECT_EQ(r.cluster.spec.fp8_dense_tflops, 0.0);
  EXPECT_EQ(r.cluster.spec.rates.gemm_fp8, 0.0);
  EXPECT_EQ(r.cluster.spec.nvlink_domain, 0);
  EXPECT_EQ(r.cluster.spec.host_memory_gib, 0.0);
}

TEST(RecipeDevice, BasedOnFillsEveryKeyNotGiven) {
  const Recipe r = MustLoad(
      "cluster:\n  device: {based_on: h100, name: h100-96g, capacity_mib: 98304, hbm_gbps: 3900,"
      " rates: {gemm: 0.75}}\n");
  GpuSpec want = *GpuPreset("h100");
  want.name = "h100-96g";
  want.capacity_mib = 98304;
  want.hbm_gbps = 3900;
  want.rates.gemm = 0.75;
  const GpuSpec& g = r.cluster.spec;
  EXPECT_EQ(g.name, want.name);
  EXPECT_EQ(g.capacity_mib, want.capacity_mib);
  EXPECT_EQ(g.bf16_dense_tflops, want.bf16_dense_tflops);
  EXPECT_EQ(g.fp8_dense_tflops, want.fp8_dense_tflops);
  EXPECT_EQ(g.hbm_gbps, want.hbm_gbps);
  EXPECT_EQ(g.nvlink_gbps_per_dir, want.nvlink_gbps_per_dir);
  EXPECT_EQ(g.ib_gbps_per_dir, want.ib_gbps_per_dir);
  EXPECT_EQ(g.host_link_gbps_per_dir, want.host_link_gbps_per_dir);
  EXPECT_EQ(g.host_memory_gib, want.host_memory_gib);
  EXPECT_EQ(g.rates.gemm, 0.75);
  EXPECT_EQ(g.rates.gemm_fp8, want.rates.gemm_fp8);
  EXPECT_EQ(g.rates.attention_flash2, want.rates.attention_flash2);
  EXPECT_EQ(r.cluster.device->based_on, "h100");
  EXPECT_EQ(DeviceLabel(r.cluster), "custom 'h100-96g' based on h100");
  // Without a name the device keeps the preset's.
  EXPECT_EQ(DeviceLabel(MustLoad("cluster: {device: {based_on: b200}}\n").cluster), "custom 'b200' based on b200");
}

TEST(RecipeDevice, KeyOrderDoesNotMatter) {
  // based_on is read first whatever its place in the map.
  const Recipe r = MustLoad("cluster:\n  device: {hbm_gbps: 3900, rates: {gemm: 0.75}, based_on: h100}\n");
  EXPECT_EQ(r.cluster.spec.hbm_gbps, 3900.0);
  EXPECT_EQ(r.cluster.spec.rates.gemm, 0.75);
  EXPECT_EQ(r.cluster.spec.bf16_dense_tflops, 989.0);
}

TEST(RecipeDevice, ClusterOverridesApplyOnTopOfTheDevice) {
  const Recipe r =
      MustLoad("cluster:\n  capacity_mib: 90000\n  host_memory_gib: 512\n  device: {based_on: h100, name: x}\n");
  EXPECT_EQ(r.cluster.spec.capacity_mib, 90000);
  EXPECT_EQ(r.cluster.spec.host_memory_gib, 512.0);
  EXPECT_EQ(r.cluster.device->spec.capacity_mib, 81559);  // the device's own figure is kept
  EXPECT_EQ(DeviceLabel(r.cluster),
            "custom 'x' based on h100 (capacity_mib 90000, host_memory_gib 512 from the recipe)");
}

TEST(RecipeDevice, EveryDeviceKeyReadsBackThroughSet) {
  // The field table's generic test skips cluster.device (no defaults of its
  // own); here each key is set to its based_on figure and read back.
  const std::string yaml = "cluster: {device: {based_on: h100}}\n";
  const Recipe base = MustLoad(yaml);
  int keys = 0;
  for (const RecipeField& f : RecipeFields()) {
    if (f.text == nullptr || f.path.rfind("cluster.device.", 0) != 0) continue;
    ++keys;
    const std::string value = f.text(base);
    ASSERT_FALSE(value.empty()) << f.path;
    const Recipe set = MustLoad(yaml, {{std::string(f.path), value}});
    EXPECT_EQ(f.text(set), value) << f.path;
  }
  // based_on, name, 10 figures, 7 rates at least. A figure GpuSpec gains
  // without a key here fails APresetsFiguresSpelledOutPriceLikeThePreset.
  EXPECT_GE(keys, 19);
}

TEST(DeviceLabel, NamesWhatWasPriced) {
  EXPECT_EQ(DeviceLabel(MustLoad("name: x\n").cluster), "h200");
  EXPECT_EQ(DeviceLabel(MustLoad("cluster: {gpu: a100}\n").cluster), "a100");
  EXPECT_EQ(DeviceLabel(MustLoad("cluster: {capacity_mib: 81920}\n").cluster),
            "h200 (capacity_mib 81920 from the recipe)");
  EXPECT_EQ(DeviceLabel(MustLoad("cluster: {gpu: h100, host_memory_gib: 1024}\n").cluster),
            "h100 (host_memory_gib 1024 from the recipe)");
  EXPECT_EQ(DeviceLabel(MustLoad(kFullDevice).cluster), "custom 'mygpu'");
  EXPECT_EQ(DeviceLabel(MustLoad("cluster: {device: {based_on: h100, name: mygpu}}\n").cluster),
            "custom 'mygpu' based on h100");
}

// ---- diff ------------------------------------------------------------------

TEST(RecipeDevice, DiffListsTheDeviceAsOneMapThatReadsBack) {
  const Recipe a = MustLoad(kFullDevice);
  const auto flat = FlattenRecipe(a);
  std::vector<Override> back;
  bool device = false;
  for (const auto& [key, value] : flat) {
    EXPECT_NE(key, "cluster.gpu");  // excluded by cluster.device
    EXPECT_NE(key.rfind("cluster.device.", 0), 0u) << key;
    if (key == "cluster.device") {
      device = true;
      EXPECT_EQ(value.rfind("{name: mygpu, capacity_mib: 98304, ", 0), 0u) << value;
      EXPECT_NE(value.find("rates: {gemm: 0.7, gemm_fp8: 0.65, "), std::string::npos) << value;
    }
    if (key != "name") back.push_back({key, value});
  }
  EXPECT_TRUE(device);
  const Recipe again = MustLoad(kFullDevice, back);
  EXPECT_TRUE(DifferingKeys(a, again).empty());

  // One figure changed: one change, the device map; based_on is listed when given.
  const Recipe b = MustLoad(kFullDevice, {{"cluster.device.hbm_gbps", "6000"}});
  const auto changes = DifferingKeys(a, b);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "cluster.device");
  EXPECT_NE(changes[0].after.find("hbm_gbps: 6000"), std::string::npos);
  const Recipe c = MustLoad("cluster: {device: {based_on: h100, name: \"h100, 96 GB\"}}\n");
  for (const auto& [key, value] : FlattenRecipe(c)) {
    if (key != "cluster.device") continue;
    EXPECT_EQ(value.rfind("{based_on: h100, name: \"h100, 96 GB\", capacity_mib: 81559, ", 0), 0u) << value;
    EXPECT_EQ(MustLoad("name: x\n", {{key, value}}).cluster.spec.name, "h100, 96 GB");
  }
}

TEST(RecipeDevice, DiffBetweenAPresetAndADevice) {
  const Recipe preset = MustLoad("cluster: {gpu: h100}\n");
  const Recipe device = MustLoad("cluster: {device: {based_on: h100}}\n");
  const auto changes = DifferingKeys(preset, device);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].key, "cluster.gpu");
  EXPECT_EQ(changes[0].after, "(absent)");
  EXPECT_EQ(changes[1].key, "cluster.device");
  EXPECT_EQ(changes[1].before, "(absent)");
}

// ---- pricing ---------------------------------------------------------------

struct Priced {
  double step_s = 0;
  std::vector<int64_t> memory;
  int64_t capacity = 0;
};

Priced Price(const Recipe& r) {
  const Inventory inv = BuildInventory(r);
  const PlanResult planned = MakePlan(inv, LayoutOf(r));
  EXPECT_TRUE(planned.plan.has_value());
  Priced out;
  if (!planned.plan) return out;
  out.step_s = planned.plan->time.step_s;
  for (const RankMemory& m : planned.plan->memory->stages) {
    for (const Bytes& b : m.bytes) out.memory.push_back(b.count());
    out.capacity = m.capacity.count();
  }
  return out;
}

/// recipes/llama3-8b-h200.yaml with `device` in place of its `gpu: h200`.
std::string LlamaWith(const std::string& device) {
  std::string text = ReadFile(SourcePath("recipes/llama3-8b-h200.yaml"));
  const std::string gpu = "gpu: h200, ";
  const size_t at = text.find(gpu);
  EXPECT_NE(at, std::string::npos);
  return text.replace(at, gpu.size(), device.empty() ? "" : "device: " + device + ", ");
}

/// Every figure of `preset` as a cluster.device flow map without based_on,
/// spelled by diff's flattening (so a figure added to the table is in it).
std::string SpelledOut(const std::string& preset) {
  const Recipe r = MustLoad("cluster: {device: {based_on: " + preset + "}}\n");
  for (const auto& [key, value] : FlattenRecipe(r)) {
    if (key != "cluster.device") continue;
    const std::string based_on = "based_on: " + preset + ", ";
    EXPECT_EQ(value.find(based_on), 1u) << value;
    return "{" + value.substr(1 + based_on.size());
  }
  ADD_FAILURE() << "no cluster.device";
  return "";
}

TEST(RecipeDevice, APresetsFiguresSpelledOutPriceLikeThePreset) {
  const Priced preset = Price(MustLoad(LlamaWith("")));
  const Priced based = Price(MustLoad(LlamaWith("{based_on: h200}")));
  const std::string h200 = SpelledOut("h200");
  EXPECT_EQ(h200.find("based_on"), std::string::npos) << h200;
  const Priced spelled = Price(MustLoad(LlamaWith(h200)));
  for (const Priced* p : {&based, &spelled}) {
    EXPECT_EQ(p->step_s, preset.step_s);
    EXPECT_EQ(p->memory, preset.memory);
    EXPECT_EQ(p->capacity, preset.capacity);
  }
  // A faster device is priced as one: twice the bf16 peak shortens the step.
  const Priced faster = Price(MustLoad(LlamaWith("{based_on: h200, bf16_dense_tflops: 1978}")));
  EXPECT_LT(faster.step_s, preset.step_s);
  EXPECT_EQ(faster.memory, preset.memory);
  const Priced smaller = Price(MustLoad(LlamaWith("{based_on: h200, capacity_mib: 81920}")));
  EXPECT_EQ(smaller.capacity, int64_t{81920} << 20);
}

}  // namespace
}  // namespace preflight::recipe_device_test

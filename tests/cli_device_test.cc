// A recipe with cluster.device through the built binary: every command
// accepts it, fit (table and JSON) and the emitters name the device priced,
// a capacity override is named too, and a bad device figure is exit 2 with
// file, line and key path.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "preflight/recipe/recipe.h"
#include "support/test_support.h"

namespace preflight::cli_device_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::RunPreflight;
using testing::SourcePath;

constexpr const char* kLlama = "recipes/llama3-8b-h200.yaml";

/// recipes/llama3-8b-h200.yaml with `cluster_head` in place of "gpu: h200, ",
/// written to a file of its own (removed with the fixture).
class DeviceRecipe {
 public:
  explicit DeviceRecipe(const std::string& cluster_head) {
    static int counter = 0;
    path_ = (fs::temp_directory_path() /
             ("preflight-device-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".yaml"))
                .string();
    std::string text = ReadFile(SourcePath(kLlama));
    const std::string gpu = "gpu: h200, ";
    const size_t at = text.find(gpu);
    EXPECT_NE(at, std::string::npos);
    text.replace(at, gpu.size(), cluster_head);
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~DeviceRecipe() { fs::remove(path_); }
  DeviceRecipe(const DeviceRecipe&) = delete;
  DeviceRecipe& operator=(const DeviceRecipe&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

constexpr const char* kBasedOn = "device: {based_on: h100, name: mygpu, capacity_mib: 98304, hbm_gbps: 3900}, ";

TEST(CliDevice, FitNamesTheCustomDevice) {
  const DeviceRecipe recipe(kBasedOn);
  const auto r = RunPreflight({"fit", recipe.path()});
  EXPECT_NE(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.out, HasSubstr("device    custom 'mygpu' based on h100 98304 MiB (96.00 GiB), 32 GPUs = 4 nodes × 8"));
}

TEST(CliDevice, FitJsonHasThePricedFigures) {
  const DeviceRecipe recipe(kBasedOn);
  const auto r = RunPreflight({"fit", recipe.path(), "--format", "json"});
  ASSERT_NE(r.exit_code, 2) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& d = j["device"];
  EXPECT_EQ(d["gpu"], "mygpu");
  EXPECT_EQ(d["label"], "custom 'mygpu' based on h100");
  EXPECT_EQ(d["based_on"], "h100");
  EXPECT_EQ(d["capacity_mib"], 98304);
  EXPECT_EQ(d["capacity_bytes"], int64_t{98304} << 20);
  EXPECT_EQ(d["hbm_gbps"], 3900.0);
  const GpuSpec h100 = *GpuPreset("h100");  // the figures not given
  EXPECT_EQ(d["bf16_dense_tflops"], h100.bf16_dense_tflops);
  EXPECT_EQ(d["rates"]["gemm"], h100.rates.gemm);
  EXPECT_EQ(d["rates"]["attention_half_seq"], h100.rates.attention_half_seq);
  EXPECT_EQ(d["nodes"], 4);
  EXPECT_EQ(d["gpus_per_node"], 8);
}

TEST(CliDevice, FitNamesACapacityOverride) {
  const auto r = RunPreflight({"fit", kLlama, "--set", "cluster.capacity_mib=81920"});
  EXPECT_NE(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.out, HasSubstr("device    h200 (capacity_mib 81920 from the recipe) 81920 MiB (80.00 GiB)"));
  const auto plain = RunPreflight({"fit", kLlama, "--format", "json"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto j = nlohmann::json::parse(plain.out);
  EXPECT_EQ(j["device"]["gpu"], "h200");
  EXPECT_EQ(j["device"]["label"], "h200");
  EXPECT_FALSE(j["device"].contains("based_on"));
}

TEST(CliDevice, EmittersNameTheDevice) {
  const DeviceRecipe recipe(kBasedOn);
  for (const char* target : {"megatron", "torchtitan"}) {
    // --force: the header is written whether or not the framework runs the plan as priced.
    const auto r = RunPreflight({"plan", recipe.path(), "--emit", target, "--force"});
    EXPECT_EQ(r.exit_code, 0) << target << r.err;
    EXPECT_THAT(r.out, HasSubstr("32 GPUs (4 nodes x 8 custom 'mygpu' based on h100), from `preflight plan`"))
        << target;
  }
}

TEST(CliDevice, EveryCommandAcceptsACustomDevice) {
  const DeviceRecipe full(
      "device: {name: mygpu, capacity_mib: 98304, bf16_dense_tflops: 1200, hbm_gbps: 5000, nvlink_gbps_per_dir: 450, "
      "ib_gbps_per_dir: 50, rates: {gemm: 0.7, gemm_memory: 0.6, hbm: 0.85, attention_fused: 0.65, "
      "attention_flash2: 0.35, attention_half_seq: 2400}}, ");
  const DeviceRecipe based(kBasedOn);
  for (const DeviceRecipe* recipe : {&full, &based}) {
    const std::string& path = recipe->path();
    const auto validate = RunPreflight({"validate", path});
    EXPECT_EQ(validate.exit_code, 0) << validate.err;
    const auto check = RunPreflight({"check", path});
    EXPECT_NE(check.exit_code, 2) << check.out << check.err;
    const auto plan = RunPreflight({"plan", path});
    EXPECT_EQ(plan.exit_code, 0) << plan.err;
    const auto sweep = RunPreflight({"sweep", path, "--gpus", "8", "--tp", "1,2", "--pp", "1", "--cp", "1"});
    EXPECT_EQ(sweep.exit_code, 0) << sweep.err;
    // A device against the preset: the two exclusive keys are the changes.
    const auto diff = RunPreflight({"diff", kLlama, path});
    EXPECT_EQ(diff.exit_code, 0) << diff.err;
    EXPECT_THAT(diff.out, HasSubstr("cluster.gpu"));
    EXPECT_THAT(diff.out, HasSubstr("cluster.device"));
    // A device against itself with one figure changed: one change.
    const auto one = RunPreflight({"diff", path, "--set", "cluster.device.hbm_gbps=8000", "--format", "json"});
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const auto j = nlohmann::json::parse(one.out);
    ASSERT_EQ(j["changed_keys"].size(), 1u) << one.out;
    EXPECT_EQ(j["changed_keys"][0]["key"], "cluster.device");
  }
}

TEST(CliDevice, BadDeviceFigureIsExit2WithFileLineAndKey) {
  const DeviceRecipe recipe("device: {based_on: h100, hbm_gbps: 0}, ");
  const auto r = RunPreflight({"fit", recipe.path()});
  EXPECT_EQ(r.exit_code, 2);
  // The cluster line is line 36 of the recipe; hbm_gbps's value is at column 48.
  EXPECT_THAT(r.err, HasSubstr(recipe.path() + ":36:48: cluster.device.hbm_gbps = 0: must be positive; valid range "
                                               "is (0, 1000000]"));
  const auto both = RunPreflight({"validate", kLlama, "--set", "cluster.device.based_on=h100"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.err, HasSubstr("cluster.device: mutually exclusive with cluster.gpu (line 36)"));
}

}  // namespace
}  // namespace preflight::cli_device_test

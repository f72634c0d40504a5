// Reports: results are structs, renderers are separate (docs/architecture.md). The
// renderers are deterministic (fixed precision, no timestamps or absolute
// paths) so golden files pin them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "preflight/planner/advice.h"
#include "preflight/estimator/estimate.h"
#include "preflight/inventory/inventory.h"
#include "preflight/inventory/layout.h"

namespace preflight {

/// Everything `preflight fit` shows.
struct FitReport {
  std::string file;             // the recipe path as the user gave it
  const Inventory* inventory = nullptr;
  Layout layout;
  StagePlan stages;
  MemoryEstimate estimate;
  std::vector<Explanation> explanations;  // worst stage, when --explain
  /// Changes that would make it fit, or the dominant category when it fits
  /// (AdviseFit); rendered after the verdict and as JSON key `advice`.
  std::optional<FitAdvice> advice;
  /// A balanced stage cut that beats the framework's partition (Plan::balanced_cut).
  std::optional<BalancedCut> balanced_cut;
};

/// The priced device as JSON: "gpu" (its name), "label" (DeviceLabel), every
/// figure of cluster.spec under the names cluster.device gives them
/// (capacity_mib, bf16_dense_tflops, ..., rates.{gemm, ...}), and "based_on"
/// for a custom device built on a preset. FitJson's "device" object.
nlohmann::json DeviceJson(const ClusterConfig& cluster);

/// The readable table (default output of `fit`).
std::string RenderFitTable(const FitReport& report);
/// The same content as JSON with the stable keys documented in README.md.
nlohmann::json FitJson(const FitReport& report);

/// `--explain` lines as JSON: [{category, item, formula, inputs, bytes}].
nlohmann::json ExplanationsJson(const std::vector<Explanation>& explanations);

/// The colour a category is drawn in (SVG and HTML charts): parameters in
/// blues, gradients and optimizer in greens, activations in orange,
/// transients in purples, fixed costs in greys.
const char* CategoryColor(Category c);

/// An SVG chart of the memory geometry: one stacked bar per pipeline stage,
/// one segment per category (labelled on the bar and in a key beside it),
/// and the device capacity and headroom floor as horizontal lines.
std::string RenderMemorySvg(const FitReport& report);

/// JSON of a layout ({"tp": 4, "sp": true, ...}), shared by every command's JSON.
nlohmann::json LayoutJson(const Layout& layout);
/// "tp 4 (sp) · cp 1 · pp 4 · dp 4 · ep 8 · etp 1 · edp 2" one-line summary.
std::string LayoutSummary(const Layout& layout);
/// " (HSDP: r replicas of d/r)" with HSDP, else empty.
std::string ReplicaText(const Layout& layout);

}  // namespace preflight

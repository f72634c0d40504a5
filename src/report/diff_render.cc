// Renderers of `preflight diff`: table, JSON, Markdown. Only what moved is
// listed (unchanged categories and axes are left out of the tables, kept in JSON).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "preflight/report/diff.h"
#include "preflight/report/format.h"

namespace preflight {
namespace {

/// Signed size with a unit, small moves in MiB/KiB so they do not read "+0.00 GiB".
std::string SignedSize(Bytes b) {
  const char sign = b.count() < 0 ? '-' : '+';
  const Bytes magnitude(b.count() < 0 ? -b.count() : b.count());
  return sign + FormatBytesHuman(magnitude);
}

Category CategoryAt(int i) { return static_cast<Category>(i); }
Axis AxisAt(int i) { return static_cast<Axis>(i); }

/// "ep_sharded_params +18.40 GiB, routing_scratch +0.30 GiB; comm ep +1.20 GiB",
/// largest memory moves first (at most `max_categories`); "no change" when nothing moved.
std::string Effects(const std::array<Bytes, kNumCategories>& memory, const std::array<Bytes, kNumAxes>& comm,
                    size_t max_categories = kNumCategories) {
  std::vector<int> order;
  for (int i = 0; i < kNumCategories; ++i) {
    if (memory[static_cast<size_t>(i)].count() != 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return std::llabs(memory[static_cast<size_t>(x)].count()) > std::llabs(memory[static_cast<size_t>(y)].count());
  });
  if (order.size() > max_categories) order.resize(max_categories);
  std::string out;
  for (int i : order) {
    out +=
        fmt::format("{}{} {}", out.empty() ? "" : ", ", Key(CategoryAt(i)), SignedSize(memory[static_cast<size_t>(i)]));
  }
  std::string comm_text;
  for (int x = 0; x < kNumAxes; ++x) {
    if (comm[static_cast<size_t>(x)].count() == 0) continue;
    comm_text +=
        fmt::format("{}{} {}", comm_text.empty() ? "" : ", ", Key(AxisAt(x)), SignedSize(comm[static_cast<size_t>(x)]));
  }
  if (!comm_text.empty()) out += fmt::format("{}comm sent {}", out.empty() ? "" : "; ", comm_text);
  return out.empty() ? "no change" : out;
}

std::string ChangeText(const KeyChange& c) { return fmt::format("{} {} -> {}", c.key, c.before, c.after); }

std::string AttributionText(const Attribution& a) {
  if (!a.applied) return a.note;
  return Effects(a.memory_delta, a.comm_delta);
}

bool AnyNonZero(const std::array<Bytes, kNumCategories>& m, const std::array<Bytes, kNumAxes>& c) {
  return std::any_of(m.begin(), m.end(), [](Bytes b) { return b.count() != 0; }) ||
         std::any_of(c.begin(), c.end(), [](Bytes b) { return b.count() != 0; });
}

std::array<Bytes, kNumCategories> StageDelta(const DiffReport& r, size_t s) {
  std::array<Bytes, kNumCategories> d{};
  for (int i = 0; i < kNumCategories; ++i) {
    d[static_cast<size_t>(i)] = r.b.memory.stages[s].of(CategoryAt(i)) - r.a.memory.stages[s].of(CategoryAt(i));
  }
  return d;
}

}  // namespace

std::string RenderDiffTable(const DiffReport& r) {
  std::string out =
      fmt::format("preflight diff\n  A  {} ({})\n  B  {} ({})\n\n", r.a.label, r.a.name, r.b.label, r.b.name);
  out += "changed keys\n";
  if (r.changes.empty()) out += "  none\n";
  for (const KeyChange& c : r.changes) out += fmt::format("  {:<36} {} -> {}\n", c.key, c.before, c.after);

  out += fmt::format("\nmemory of the worst rank (A stage {}, B stage {}), GiB\n", r.a.memory.worst_stage,
                     r.b.memory.worst_stage);
  out += fmt::format("  {:<24}{:>10}{:>10}{:>10}\n", "category", "A", "B", "delta");
  for (int i = 0; i < kNumCategories; ++i) {
    const Category c = CategoryAt(i);
    if (r.memory_delta(c).count() == 0) continue;
    out += fmt::format("  {:<24}{:>10}{:>10}{:>10}\n", Key(c), FormatGiBNumber(r.a.worst().of(c)),
                       FormatGiBNumber(r.b.worst().of(c)), FormatSignedGiBNumber(r.memory_delta(c)));
  }
  out += fmt::format("  {:<24}{:>10}{:>10}{:>10}\n", "peak", FormatGiBNumber(r.a.worst().total()),
                     FormatGiBNumber(r.b.worst().total()), FormatSignedGiBNumber(r.total_delta()));
  out += fmt::format("  {:<24}{:>10}{:>10}{:>10}\n", "headroom", FormatGiBNumber(r.a.worst().headroom()),
                     FormatGiBNumber(r.b.worst().headroom()),
                     FormatSignedGiBNumber(r.b.worst().headroom() - r.a.worst().headroom()));

  out += "\nmemory per stage, GiB\n";
  out += fmt::format("  {:<8}{:>10}{:>10}{:>10}  {}\n", "stage", "A total", "B total", "delta", "moved categories");
  const size_t stages = std::max(r.a.memory.stages.size(), r.b.memory.stages.size());
  for (size_t s = 0; s < stages; ++s) {
    const bool in_a = s < r.a.memory.stages.size();
    const bool in_b = s < r.b.memory.stages.size();
    const std::string ta = in_a ? FormatGiBNumber(r.a.memory.stages[s].total()) : "-";
    const std::string tb = in_b ? FormatGiBNumber(r.b.memory.stages[s].total()) : "-";
    std::string delta = "-", moved = in_a ? "only in A" : "only in B";
    if (in_a && in_b) {
      delta = FormatSignedGiBNumber(r.b.memory.stages[s].total() - r.a.memory.stages[s].total());
      moved = Effects(StageDelta(r, s), {}, 3);
    }
    out += fmt::format("  {:<8}{:>10}{:>10}{:>10}  {}\n", s, ta, tb, delta, moved);
  }

  out += "\ncommunication per step, busiest pipeline rank, GiB sent\n";
  out += fmt::format("  {:<24}{:>10}{:>10}{:>10}\n", "axis", "A", "B", "delta");
  bool any_axis = false;
  for (int x = 0; x < kNumAxes; ++x) {
    const Axis axis = AxisAt(x);
    if (r.comm_delta(axis).count() == 0) continue;
    any_axis = true;
    out +=
        fmt::format("  {:<24}{:>10}{:>10}{:>10}\n", Key(axis), FormatGiBNumber(r.a.comm_send[static_cast<size_t>(x)]),
                    FormatGiBNumber(r.b.comm_send[static_cast<size_t>(x)]), FormatSignedGiBNumber(r.comm_delta(axis)));
  }
  if (!any_axis) out += "  no axis moved\n";

  out += "\nwhy (each changed key applied alone to A; worst rank)\n";
  if (r.changes.empty()) out += "  nothing differs\n";
  for (const Attribution& a : r.attributions)
    out += fmt::format("  {}: {}\n", ChangeText(a.change), AttributionText(a));
  if (AnyNonZero(r.interaction_memory, r.interaction_comm)) {
    out += fmt::format("  the changes together (interaction): {}\n", Effects(r.interaction_memory, r.interaction_comm));
  }
  return out;
}

namespace {

nlohmann::json MemoryJson(const std::array<Bytes, kNumCategories>& m, bool nonzero_only) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumCategories; ++i) {
    if (!nonzero_only || m[static_cast<size_t>(i)].count() != 0)
      j[Key(CategoryAt(i))] = m[static_cast<size_t>(i)].count();
  }
  return j;
}

nlohmann::json CommJson(const std::array<Bytes, kNumAxes>& c, bool nonzero_only) {
  nlohmann::json j = nlohmann::json::object();
  for (int x = 0; x < kNumAxes; ++x) {
    if (!nonzero_only || c[static_cast<size_t>(x)].count() != 0) j[Key(AxisAt(x))] = c[static_cast<size_t>(x)].count();
  }
  return j;
}

nlohmann::json SideJson(const DiffSide& s) {
  nlohmann::json stages = nlohmann::json::array();
  for (const RankMemory& m : s.memory.stages) {
    stages.push_back({{"memory_bytes", MemoryJson(m.bytes, false)}, {"total_bytes", m.total().count()}});
  }
  return {{"label", s.label},
          {"name", s.name},
          {"worst_stage", s.memory.worst_stage},
          {"worst_memory_bytes", MemoryJson(s.worst().bytes, false)},
          {"worst_total_bytes", s.worst().total().count()},
          {"headroom_bytes", s.worst().headroom().count()},
          {"stages", stages},
          {"comm_send_bytes", CommJson(s.comm_send, false)}};
}

}  // namespace

nlohmann::json DiffJson(const DiffReport& r) {
  nlohmann::json changes = nlohmann::json::array();
  for (const KeyChange& c : r.changes) changes.push_back({{"key", c.key}, {"before", c.before}, {"after", c.after}});
  nlohmann::json attribution = nlohmann::json::array();
  for (const Attribution& a : r.attributions) {
    nlohmann::json j = {
        {"key", a.change.key}, {"before", a.change.before}, {"after", a.change.after}, {"applied", a.applied}};
    if (a.applied) {
      j["memory_delta_bytes"] = MemoryJson(a.memory_delta, true);
      j["comm_delta_bytes"] = CommJson(a.comm_delta, true);
    } else {
      j["note"] = a.note;
    }
    attribution.push_back(j);
  }
  std::array<Bytes, kNumCategories> mem{};
  for (int i = 0; i < kNumCategories; ++i) mem[static_cast<size_t>(i)] = r.memory_delta(CategoryAt(i));
  std::array<Bytes, kNumAxes> comm{};
  for (int x = 0; x < kNumAxes; ++x) comm[static_cast<size_t>(x)] = r.comm_delta(AxisAt(x));
  nlohmann::json stage_deltas = nlohmann::json::array();
  const size_t both = std::min(r.a.memory.stages.size(), r.b.memory.stages.size());
  for (size_t s = 0; s < both; ++s) {
    stage_deltas.push_back(
        {{"pipeline_rank", s},
         {"total_delta_bytes", (r.b.memory.stages[s].total() - r.a.memory.stages[s].total()).count()},
         {"memory_delta_bytes", MemoryJson(StageDelta(r, s), true)}});
  }
  return {{"preflight_version", PreflightVersion()},
          {"schema_version", kJsonSchemaVersion},
          {"a", SideJson(r.a)},
          {"b", SideJson(r.b)},
          {"changed_keys", changes},
          {"memory_delta_bytes", MemoryJson(mem, false)},
          {"total_delta_bytes", r.total_delta().count()},
          {"stage_deltas", stage_deltas},
          {"comm_delta_bytes", CommJson(comm, false)},
          {"attribution", attribution},
          {"interaction",
           {{"memory_delta_bytes", MemoryJson(r.interaction_memory, true)},
            {"comm_delta_bytes", CommJson(r.interaction_comm, true)}}}};
}

std::string RenderDiffMarkdown(const DiffReport& r) {
  std::string out =
      fmt::format("## preflight diff\n\n- A: `{}` ({})\n- B: `{}` ({})\n\n", r.a.label, r.a.name, r.b.label, r.b.name);
  out += "| changed key | A | B | effect alone (worst rank) |\n| --- | --- | --- | --- |\n";
  for (const Attribution& a : r.attributions) {
    out += fmt::format("| `{}` | {} | {} | {} |\n", a.change.key, a.change.before, a.change.after, AttributionText(a));
  }
  if (AnyNonZero(r.interaction_memory, r.interaction_comm)) {
    out += fmt::format("| together (interaction) | | | {} |\n", Effects(r.interaction_memory, r.interaction_comm));
  }
  out += "\n| worst rank, GiB | A | B | delta |\n| --- | ---: | ---: | ---: |\n";
  for (int i = 0; i < kNumCategories; ++i) {
    const Category c = CategoryAt(i);
    if (r.memory_delta(c).count() == 0) continue;
    out += fmt::format("| {} | {} | {} | {} |\n", Key(c), FormatGiBNumber(r.a.worst().of(c)),
                       FormatGiBNumber(r.b.worst().of(c)), FormatSignedGiBNumber(r.memory_delta(c)));
  }
  out += fmt::format("| **total** | {} | {} | {} |\n", FormatGiBNumber(r.a.worst().total()),
                     FormatGiBNumber(r.b.worst().total()), FormatSignedGiBNumber(r.total_delta()));
  out += "\n| comm sent per step, GiB | A | B | delta |\n| --- | ---: | ---: | ---: |\n";
  for (int x = 0; x < kNumAxes; ++x) {
    const Axis axis = AxisAt(x);
    if (r.comm_delta(axis).count() == 0) continue;
    out +=
        fmt::format("| {} | {} | {} | {} |\n", Key(axis), FormatGiBNumber(r.a.comm_send[static_cast<size_t>(x)]),
                    FormatGiBNumber(r.b.comm_send[static_cast<size_t>(x)]), FormatSignedGiBNumber(r.comm_delta(axis)));
  }
  return out;
}

}  // namespace preflight

#include <string>

#include <fmt/format.h>

#include "preflight/report/report.h"

namespace preflight {

nlohmann::json LayoutJson(const Layout& l) {
  return nlohmann::json{
      {"tp", l.tp},
      {"sp", l.sequence_parallel()},
      {"cp", l.cp},
      {"pp", l.pp},
      {"vpp", l.vpp},
      {"dp", l.dp},
      {"ep", l.ep},
      {"expert_tp", l.expert_tp},
      {"expert_dp", l.expert_dp()},
      {"zero", l.zero},
      {"dp_replicate", l.dp_replicate},
      {"micro_batch", l.micro_batch},
      {"micro_batches", l.micro_batches},
      {"recompute", Name(l.recompute)},
      {"schedule", Name(l.schedule)},
      {"world", l.world()},
  };
}

std::string ReplicaText(const Layout& l) {
  return l.dp_replicate > 1 ? fmt::format(" (HSDP: {} replicas of {})", l.dp_replicate, l.dp / l.dp_replicate) : "";
}

std::string LayoutSummary(const Layout& l) {
  std::string out = fmt::format("tp {}{} · cp {} · pp {}", l.tp, l.sequence_parallel() ? " (sp)" : "", l.cp, l.pp);
  if (l.vpp > 1) out += fmt::format(" (vpp {})", l.vpp);
  out += fmt::format(" · dp {}{} · ep {} · expert_tp {} · expert_dp {}", l.dp, ReplicaText(l), l.ep, l.expert_tp,
                     l.expert_dp());
  return out;
}

}  // namespace preflight

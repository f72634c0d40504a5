// Text helpers of --explain (the slow path).
#include <cstdio>

#include "internal.h"

namespace preflight::estimator_detail {


std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

std::string Inputs(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string out;
  for (const auto& [k, v] : kv) {
    if (!out.empty()) out += ' ';
    out += k;
    out += '=';
    out += std::to_string(v);
  }
  return out;
}

std::string Decimal(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

const char* FamilyName(int f) {
  static const char* const kNames[] = {"A", "M", "E", "R", "D"};
  return kNames[f];
}

const char* RecomputeText(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

const char* ScheduleText(Schedule s) {
  switch (s) {
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
    case Schedule::kDualPipe: return "dualpipe";
    case Schedule::kDualPipeV: return "dualpipev";
  }
  return "?";
}

void Note(Sink* sink, Category c, std::string item, std::string formula, std::string inputs, Bytes bytes) {
  sink->push_back(Explanation{c, std::move(item), std::move(formula), std::move(inputs), bytes});
}

}  // namespace preflight::estimator_detail

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

std::string FamilyName(int f) { return std::string(1, Letter(kAllBlockKinds[f])); }

void Note(Sink* sink, Category c, std::string item, std::string formula, std::string inputs, Bytes bytes) {
  sink->push_back(Explanation{c, std::move(item), std::move(formula), std::move(inputs), bytes});
}

}  // namespace preflight::estimator_detail

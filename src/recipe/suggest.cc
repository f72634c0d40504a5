#include "suggest.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace preflight::recipe_internal {

int EditDistance(std::string_view a, std::string_view b) {
  std::vector<int> previous(b.size() + 1);
  std::vector<int> current(b.size() + 1);
  std::iota(previous.begin(), previous.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::optional<std::string> ClosestName(std::string_view word, const std::vector<std::string>& candidates) {
  const int limit = word.size() < 4 ? 1 : 2;
  std::optional<std::string> best;
  int best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    const int d = EditDistance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::vector<int64_t> NearestValid(int64_t bad, int64_t lo, int64_t hi, const std::function<bool(int64_t)>& valid) {
  constexpr int64_t kBudget = int64_t{1} << 20;
  std::vector<int64_t> out;
  // Below: from min(bad - 1, hi) down to lo.
  int64_t start = std::min(bad - 1, hi);
  for (int64_t x = start, steps = 0; x >= lo && steps < kBudget; --x, ++steps) {
    if (valid(x)) {
      out.push_back(x);
      break;
    }
  }
  // Above: from max(bad + 1, lo) up to hi.
  start = bad < lo ? lo : bad + 1;
  for (int64_t x = start, steps = 0; x <= hi && steps < kBudget && x > 0; ++x, ++steps) {
    if (valid(x)) {
      out.push_back(x);
      break;
    }
  }
  return out;
}

std::string TryText(const std::vector<int64_t>& values) {
  if (values.empty()) return "";
  if (values.size() == 1) return fmt::format("try {}", values[0]);
  return fmt::format("try {} or {}", values[0], values[1]);
}

std::string TryDivisorsOf(int64_t n, int64_t bad) {
  const std::string text = TryText(NearestValid(bad, 1, n, [n](int64_t x) { return n % x == 0; }));
  return text.empty() ? text : "; " + text;
}

std::string TryMultiplesOf(int64_t m, int64_t bad) {
  std::vector<int64_t> values;
  const int64_t below = bad / m * m;
  if (below > 0 && below != bad) values.push_back(below);
  if (const auto above = Mul(bad / m + 1, m)) values.push_back(*above);
  const std::string text = TryText(values);
  return text.empty() ? text : "; " + text;
}

std::optional<int64_t> Mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace preflight::recipe_internal

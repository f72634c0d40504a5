// "What would be valid" helpers for recipe diagnostics: nearest valid
// integers, nearest key names, lists of choices.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace preflight::recipe_internal {

/// Levenshtein distance (insertions, deletions, substitutions each cost 1).
int EditDistance(std::string_view a, std::string_view b);

/// The candidate closest to `word` when it is plausibly a misspelling
/// (distance <= 1 for words under 4 letters, <= 2 otherwise); ties go to the
/// earlier candidate.
std::optional<std::string> ClosestName(std::string_view word, const std::vector<std::string>& candidates);

/// "a, b, c".
std::string JoinNames(const std::vector<std::string>& names);

/// The nearest values to `bad` in [lo, hi] for which `valid` holds: the
/// largest below and the smallest above, each searched over at most 2^20
/// candidates (so huge values cannot stall). Empty when none was found.
std::vector<int64_t> NearestValid(int64_t bad, int64_t lo, int64_t hi, const std::function<bool(int64_t)>& valid);

/// "try 4 or 8" / "try 4" / "" from NearestValid's result.
std::string TryText(const std::vector<int64_t>& values);

/// "; try 4 or 8" for divisors of `n` nearest to `bad`; "" when none.
std::string TryDivisorsOf(int64_t n, int64_t bad);

/// "; try 512 or 520" for positive multiples of `m` nearest to `bad`.
std::string TryMultiplesOf(int64_t m, int64_t bad);

/// a * b, or nullopt when the product leaves int64.
std::optional<int64_t> Mul(int64_t a, int64_t b);

}  // namespace preflight::recipe_internal

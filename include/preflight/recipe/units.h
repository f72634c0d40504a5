// Quantities as types: byte counts are checked 64-bit integers, so an
// overflow is an error, never a wrap-around (docs/recipe.md, "Diagnostics").
#pragma once

#include <compare>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace preflight {

/// Thrown when byte or count arithmetic leaves the int64 range. The CLI maps
/// it to exit code 2 with the message; no number is ever printed from a wrap.
class ArithmeticOverflow : public std::overflow_error {
 public:
  explicit ArithmeticOverflow(const std::string& what) : std::overflow_error(what) {}
};

inline int64_t CheckedAdd(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) throw ArithmeticOverflow("int64 overflow in addition");
  return out;
}
inline int64_t CheckedSub(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_sub_overflow(a, b, &out)) throw ArithmeticOverflow("int64 overflow in subtraction");
  return out;
}
inline int64_t CheckedMul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw ArithmeticOverflow("int64 overflow in multiplication");
  return out;
}
/// Ceiling division of non-negative a by positive b.
inline int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
/// Rounds a up to a multiple of m (m > 0).
inline int64_t RoundUp(int64_t a, int64_t m) { return CheckedMul(CeilDiv(a, m), m); }

/// A byte count. Signed, because headroom can be negative.
class Bytes {
 public:
  constexpr Bytes() = default;
  constexpr explicit Bytes(int64_t n) : n_(n) {}
  constexpr int64_t count() const { return n_; }
  double gib() const { return static_cast<double>(n_) / static_cast<double>(int64_t{1} << 30); }

  friend Bytes operator+(Bytes a, Bytes b) { return Bytes(CheckedAdd(a.n_, b.n_)); }
  friend Bytes operator-(Bytes a, Bytes b) { return Bytes(CheckedSub(a.n_, b.n_)); }
  friend Bytes operator*(Bytes a, int64_t k) { return Bytes(CheckedMul(a.n_, k)); }
  friend Bytes operator*(int64_t k, Bytes a) { return Bytes(CheckedMul(a.n_, k)); }
  /// Floor division; callers divide only where validation proved divisibility
  /// or where the floor is the documented intent.
  friend Bytes operator/(Bytes a, int64_t k) { return Bytes(a.n_ / k); }
  Bytes& operator+=(Bytes b) { return *this = *this + b; }
  Bytes& operator-=(Bytes b) { return *this = *this - b; }
  friend constexpr auto operator<=>(Bytes, Bytes) = default;

 private:
  int64_t n_ = 0;
};

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

/// Converts a GiB figure from a recipe to bytes (rounded to the nearest byte).
inline Bytes GiB(double x) { return Bytes(static_cast<int64_t>(x * static_cast<double>(kGiB) + (x >= 0 ? 0.5 : -0.5))); }
inline Bytes MiB(int64_t x) { return Bytes(CheckedMul(x, kMiB)); }

/// Elements times bytes per element, checked.
inline Bytes BytesOf(int64_t elements, int64_t bytes_per_element) {
  return Bytes(CheckedMul(elements, bytes_per_element));
}

/// Seconds and rates stay doubles but carry their unit in the type name.
struct Seconds {
  double value = 0.0;
};
struct BytesPerSecond {
  double value = 0.0;
};
struct FlopsPerSecond {
  double value = 0.0;
};

}  // namespace preflight

#include "preflight/recipe/units.h"

#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace preflight::units_test {
namespace {

TEST(Bytes, ArithmeticIsExact) {
  EXPECT_EQ((Bytes(3) + Bytes(4)).count(), 7);
  EXPECT_EQ((Bytes(3) - Bytes(4)).count(), -1);
  EXPECT_EQ((Bytes(6) * 7).count(), 42);
  EXPECT_EQ((Bytes(43) / 7).count(), 6);
}

TEST(Bytes, GiBConversion) {
  EXPECT_EQ(GiB(1.0).count(), 1073741824);
  EXPECT_EQ(GiB(3.0).count(), 3 * 1073741824LL);
  EXPECT_EQ(MiB(143771).count(), 143771LL * 1048576LL);  // H200 capacity as nvidia-smi shows it
}

TEST(Bytes, OverflowIsAnErrorNotAWrap) {
  const Bytes big(std::numeric_limits<int64_t>::max() / 2 + 1);
  EXPECT_THROW(big + big, ArithmeticOverflow);
  EXPECT_THROW(big * 2, ArithmeticOverflow);
  EXPECT_THROW(Bytes(std::numeric_limits<int64_t>::min()) - Bytes(1), ArithmeticOverflow);
  // 10 T parameters x 18 bytes fits in int64 (1.8e14); x 1e6 ranks does not.
  EXPECT_EQ(BytesOf(10'000'000'000'000LL, 18).count(), 180'000'000'000'000LL);
  EXPECT_THROW(BytesOf(180'000'000'000'000LL, 1'000'000'000LL), ArithmeticOverflow);
}

TEST(Bytes, RoundUpAndCeilDiv) {
  EXPECT_EQ(CeilDiv(4096 * 2, 128), 64);
  EXPECT_EQ(CeilDiv(8193, 128), 65);
  EXPECT_EQ(RoundUp(128256, 128 * 8), 129024);  // Llama-3 vocab padded for TP 8 (Megatron rule)
}

}  // namespace
}  // namespace preflight::units_test

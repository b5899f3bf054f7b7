// The host's float16 kernels against their scalar definitions: with F16C
// they convert eight elements at a time (host_ops.cpp), and must give the
// scalar cast's bits for every float16, tails included.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/core/scaling.hpp"

using namespace nncomm;
using namespace unit;

namespace {

// Every float16 bit pattern, and five more so that the count is not a
// multiple of the vector width.
constexpr size_t kCount = 65536 + 5;

std::vector<_Float16> every_half(uint32_t stride) {
  std::vector<_Float16> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i * stride);
    std::memcpy(&v[i], &bits, 2);
  }
  return v;
}

uint16_t bits_of(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// Same bits, or both NaN (a NaN's payload is not what is tested).
bool same(_Float16 a, _Float16 b) {
  return bits_of(a) == bits_of(b) || (a != a && b != b);
}

// The first index where `got` differs from `want`, or -1.
template <typename T> long first_difference(const std::vector<T> &got,
                                            const std::vector<T> &want) {
  for (size_t i = 0; i < got.size(); ++i) {
    bool equal;
    if constexpr (std::is_same<T, _Float16>::value)
      equal = same(got[i], want[i]);
    else
      equal = std::memcmp(&got[i], &want[i], sizeof(T)) == 0 ||
              (std::isnan(got[i]) && std::isnan(want[i]));
    if (!equal)
      return static_cast<long>(i);
  }
  return -1;
}

} // namespace

TEST(add_narrow_float16_matches_the_scalar_sum_for_every_value) {
  // Odd strides pair every pattern with a different partner each.
  const std::vector<_Float16> a = every_half(1), b0 = every_half(40503);
  std::vector<_Float16> want(kCount), got = b0;
  for (size_t i = 0; i < kCount; ++i)
    want[i] = static_cast<_Float16>(static_cast<float>(a[i]) +
                                    static_cast<float>(b0[i]));
  add_narrow(a.data(), got.data(), DType::kFloat16, kCount);
  CHECK_EQ(first_difference(got, want), -1L);
}

TEST(convert_scaled_float16_matches_the_scalar_cast_for_every_value) {
  const std::vector<_Float16> h = every_half(1);
  const float scale = 0.75f;
  for (const int divisor : {1, 3, 4}) {
    // What convert_scaled means by scale and divisor.
    const Scaling s = make_scaling(scale, divisor);
    auto scaled = [&](float x) {
      x *= s.multiply;
      return s.divide == 1.0f ? x : x / s.divide;
    };
    // float16 -> float32.
    std::vector<float> wide(kCount), wide_want(kCount);
    for (size_t i = 0; i < kCount; ++i)
      wide_want[i] = scaled(static_cast<float>(h[i]));
    convert_scaled(wide.data(), DType::kFloat32, h.data(), DType::kFloat16,
                   kCount, scale, divisor);
    CHECK_EQ(first_difference(wide, wide_want), -1L);
    // float32 -> float16: values around float16's whole range, its
    // rounding boundaries and overflow included.
    std::vector<float> f(kCount);
    std::vector<_Float16> narrow(kCount), narrow_want(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      f[i] = static_cast<float>(h[i]) * 1.0009765625f;
      narrow_want[i] = static_cast<_Float16>(scaled(f[i]));
    }
    convert_scaled(narrow.data(), DType::kFloat16, f.data(), DType::kFloat32,
                   kCount, scale, divisor);
    CHECK_EQ(first_difference(narrow, narrow_want), -1L);
  }
}

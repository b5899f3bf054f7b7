// bfloat16 on the host: the upper half of a float32. Rounding is to nearest
// even and every NaN becomes 0x7FFF, as CUDA's __float2bfloat16_rn does, so
// the host twin of the packing kernels agrees with them bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace nncomm {

struct BFloat16 {
  uint16_t bits;

  BFloat16() = default;
  explicit BFloat16(float f) : bits(round(f)) {}
  // Rounded once: to float rounding to odd, which keeps the information
  // the second rounding needs, then to nearest even.
  explicit BFloat16(double d) : bits(round(to_float_odd(d))) {}
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  explicit operator double() const { return static_cast<float>(*this); }

private:
  static float to_float_odd(double d) {
    float f = static_cast<float>(d);
    if (static_cast<double>(f) == d || std::isinf(f) || std::isnan(f))
      return f;
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if (std::fabs(static_cast<double>(f)) > std::fabs(d))
      --u; // truncate: one step toward zero
    u |= 1u;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  static uint16_t round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
      return 0x7FFF;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};

static_assert(sizeof(BFloat16) == 2, "bfloat16 is two bytes");

} // namespace nncomm

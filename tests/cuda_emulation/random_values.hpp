// Random finite values of the packing dtypes (and float64), the values
// the NaN/infinity check must and must not flag, and byte comparison, for
// the programs that run the CUDA packing code on the CPU.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "nncomm/host/bfloat16.hpp"
#include "nncomm/core/dtype.hpp"

namespace nncomm {

// Fills `bytes` with finite values of `dt` spread over many binades.
inline void fill_random(char *bytes, size_t size, DType dt,
                        std::mt19937_64 &rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-12, 8);
  const size_t n = size / dtype_size(dt);
  for (size_t i = 0; i < n; ++i) {
    const float v = std::ldexp(normal(rng), exponent(rng));
    char *p = bytes + i * dtype_size(dt);
    if (dt == DType::kFloat32) {
      std::memcpy(p, &v, 4);
    } else if (dt == DType::kFloat64) {
      const double d = std::ldexp(double(normal(rng)), exponent(rng) * 40);
      std::memcpy(p, &d, 8);
    } else if (dt == DType::kFloat16) {
      const _Float16 h = static_cast<_Float16>(v);
      std::memcpy(p, &h, 2);
    } else {
      const BFloat16 b(v);
      std::memcpy(p, &b, 2);
    }
  }
}

// Bit patterns at the edge of the exponent field, in element `i` of `dt`
// at `p`: NaNs (quiet, signalling, negative) and infinities when `bad`,
// else the largest finite values, denormals and -0.0.
inline void put_special(char *p, size_t i, DType dt, bool bad,
                        std::mt19937_64 &rng) {
  static const uint64_t kBad[][5] = {
      {0x7fc00000, 0x7f800001, 0xffc12345, 0x7f800000, 0xff800000},
      {0x7ff8000000000000, 0x7ff0000000000001, 0xfff8000000000123,
       0x7ff0000000000000, 0xfff0000000000000},
      {0x7e00, 0x7c01, 0xfe17, 0x7c00, 0xfc00},
      {0x7fc0, 0x7f81, 0xffc5, 0x7f80, 0xff80}};
  static const uint64_t kGood[][5] = {
      {0x7f7fffff, 0xff7fffff, 0x00000001, 0x807fffff, 0x80000000},
      {0x7fefffffffffffff, 0xffefffffffffffff, 0x1, 0x800fffffffffffff,
       0x8000000000000000},
      {0x7bff, 0xfbff, 0x0001, 0x83ff, 0x8000},
      {0x7f7f, 0xff7f, 0x0001, 0x807f, 0x8000}};
  const int kind = dt == DType::kFloat32   ? 0
                   : dt == DType::kFloat64 ? 1
                   : dt == DType::kFloat16 ? 2
                                           : 3;
  const uint64_t bits = (bad ? kBad : kGood)[kind][rng() % 5];
  std::memcpy(p + i * dtype_size(dt), &bits, dtype_size(dt)); // little-endian
}

// Whether `size` bytes at `twin` (the host twin's) and `got` are equal;
// prints the first difference when not.
inline bool same_bytes(const char *twin, const char *got, size_t size,
                       const std::string &what) {
  if (std::memcmp(twin, got, size) == 0)
    return true;
  size_t i = 0;
  while (twin[i] == got[i])
    ++i;
  std::printf("%s differ at byte %zu (twin %02x, got %02x)\n", what.c_str(), i,
              twin[i] & 0xff, got[i] & 0xff);
  return false;
}

} // namespace nncomm

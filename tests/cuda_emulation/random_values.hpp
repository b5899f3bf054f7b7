// Random finite values of the packing dtypes, and byte comparison, for the
// programs that run the CUDA packing code on the CPU.
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
    } else if (dt == DType::kFloat16) {
      const _Float16 h = static_cast<_Float16>(v);
      std::memcpy(p, &h, 2);
    } else {
      const BFloat16 b(v);
      std::memcpy(p, &b, 2);
    }
  }
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

// Element-wise host kernels used around the transport.
#pragma once

#include <cstddef>

#include "nncomm/dtype.hpp"

namespace nncomm {

// dst[i] = src[i] / divisor for i < count; a plain copy when divisor is 1.
// dst may equal src. Integer types are copied only (callers reject integer
// division before any rank communicates).
void copy_divided(void *dst, const void *src, size_t count, DType dt,
                  int divisor);

// Writes one element of `dt` holding 1 or 0.
void write_flag(void *dst, DType dt, bool value);
// True when the element of `dt` at `src` is not zero.
bool read_flag(const void *src, DType dt);

}  // namespace nncomm

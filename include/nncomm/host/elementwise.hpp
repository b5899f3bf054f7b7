// Element-wise host kernels used around the transport.
#pragma once

#include <cstddef>

#include "nncomm/core/dtype.hpp"

namespace nncomm {

// dst[i] = src[i] * scale / divisor for i < count, converting between the
// floating dtypes (arithmetic in float, or in double where either side is
// float64). A plain copy when the dtypes match and scale and divisor are 1;
// integer dtypes are only ever copied that way (callers refuse integer
// scaling before any rank communicates). dst may equal src.
void convert_scaled(void *dst, DType dst_dt, const void *src, DType src_dt,
                    size_t count, float scale, int divisor);

// b[i] = a[i] + b[i] for i < count in a 16-bit float dtype (float16 or
// bfloat16): widened to float, added, and rounded back once, which is what
// numpy's float16 addition does. MPI has no sum for these dtypes.
void add_narrow(const void *a, void *b, DType dt, size_t count);

// Whether the `count` elements of `dt` at `p` hold no NaN and no infinity
// (NNCOMM_CHECK_FINITE); integers always do. Tested on the bits (exponent
// all ones), so -0.0 and subnormals pass whatever the floating-point
// environment, and without an early exit, so that the loop stays a vector
// loop.
bool all_finite(const void *p, DType dt, size_t count);
// all_finite(src, dt, count), copying the elements to `dst` in the same
// pass (dst and src do not overlap).
bool copy_finite(void *dst, const void *src, DType dt, size_t count);

// Writes one element of `dt` holding 1 or 0.
void write_flag(void *dst, DType dt, bool value);
// True when the element of `dt` at `src` is not zero.
bool read_flag(const void *src, DType dt);

} // namespace nncomm

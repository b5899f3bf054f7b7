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

// Writes one element of `dt` holding 1 or 0.
void write_flag(void *dst, DType dt, bool value);
// True when the element of `dt` at `src` is not zero.
bool read_flag(const void *src, DType dt);

} // namespace nncomm

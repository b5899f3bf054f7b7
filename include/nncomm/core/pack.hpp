// Packing a bucket: pieces of tensors ("segments") laid end to end in one
// buffer of the wire dtype, scaled on the way in; unpacking is the reverse.
//
// The layout is computed once, here, into a PackTable that both
// implementations execute: the host twin below (the CPU engine's) and the
// CUDA kernels (cuda_pack.hpp), which read the same rows from device memory.
// A segment may start and end anywhere in its tensor, so one tensor can be
// split across buckets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

// `count` elements of a tensor of `dtype` whose element 0 is at `tensor`,
// starting at its element `offset`. A null `tensor` reads as zeros when
// packing and is left out when unpacking.
struct PackSegment {
  const void *tensor;
  DType dtype;
  size_t offset;
  size_t count;
};

// One row per non-empty segment, fixed-width so that it can be copied to a
// device as it is.
struct PackEntry {
  uint64_t address;       // the segment's first element; 0 for zeros
  uint64_t bucket_offset; // in elements of the wire dtype
  uint64_t count;
  uint64_t first_tile; // tiles of earlier rows: the CUDA packer's, 0 here
  int32_t dtype;       // DType of the tensor
  int32_t reserved;    // keeps the row 8-byte aligned; always 0
};

struct PackTable {
  std::vector<PackEntry> entries;
  size_t count = 0; // elements in the bucket
};

// Lays out `n` segments end to end in a bucket of `wire`, in their order.
// Refuses dtypes other than float32, float64, float16, bfloat16, int32 and
// int64, and tensor addresses not aligned to their element size. `table` is
// refilled; its memory is reused.
Status build_pack_table(const PackSegment *segments, size_t n, DType wire,
                        PackTable *table);

// Refuses a bucket of `count` elements at a null address or at one not
// aligned to the wire dtype's size.
Status check_bucket_address(const void *bucket, size_t count, DType wire);

// Host twin of the CUDA kernels: bucket[k] = wire(tensor[i] * scale).
// Arithmetic in float (double where float64 is on either side); integer
// dtypes are copied, and only with scale 1. With `nonfinite`, also appends
// the index (in table.entries) of each row whose tensor holds a NaN or an
// infinity, checked in the same pass over memory.
Status pack_host(const PackTable &table, void *bucket, DType wire, float scale,
                 std::vector<size_t> *nonfinite = nullptr);
// tensor[i] = dtype(bucket[k] * scale / divisor); rows with address 0 are
// left out.
Status unpack_host(const PackTable &table, const void *bucket, DType wire,
                   float scale, int divisor);

} // namespace nncomm

// Packing on a CUDA device: one kernel launch per bucket, whatever the
// number of segments, executing the PackTable that pack.hpp lays out (the
// same rows the host twin executes), with scaling and dtype conversion
// fused in. float32, float16 and bfloat16 on either side.
//
// Streams and events are passed as the caller's framework holds them
// (cudaStream_t, cudaEvent_t), as opaque handles, so this header needs no
// CUDA headers and the package builds without nvcc; such a build has no
// kernels and CudaPacker::Create says so.
#pragma once

#include <cstddef>
#include <memory>

#include "nncomm/core/pack.hpp"
#include "nncomm/core/status.hpp"

// Bytes of a row's wider side (its dtype or the wire's) that one block of
// the packing kernel moves: a tile (pack_tile.cuh). bench/pack_sweep.sh
// builds with other values; on an H200, 32 KiB beat 64 and 128 KiB in
// every case (docs/performance.md).
#ifndef NNCOMM_PACK_TILE_BYTES
#define NNCOMM_PACK_TILE_BYTES 32768
#endif

namespace nncomm {

constexpr size_t kPackTileBytes = NNCOMM_PACK_TILE_BYTES;

using CudaStream = void *; // cudaStream_t; nullptr is the legacy default
using CudaEvent = void *;  // cudaEvent_t; nullptr waits for nothing

// Whether this build has the CUDA kernels.
bool cuda_packing_built();
// Whether the kernels move `dt` (float32, float16 and bfloat16 do).
bool cuda_packs(DType dt);

// Enqueues on `stream` a check of the `count` elements of `dt` at `p`
// (device memory): *flag (device memory, zero before) becomes 1 where one
// is a NaN or an infinity. Integers are never flagged. The packer's check
// (pack()'s flags) for what is not packed: buckets reduced in place, and
// float64 rows, which the packer does not move.
Status cuda_check_finite(const void *p, size_t count, DType dt, unsigned *flag,
                         CudaStream stream);

class CudaPacker {
public:
  // A packer for the device current at creation. It keeps the tables of
  // the last `max_tables` distinct buckets in device memory (uploaded from
  // pinned host memory, both reused), so a training loop's buckets are
  // uploaded once. One packer's launches run in the order they were issued,
  // even on different streams (use a packer per stream to pack on several
  // at once); it may be called from several threads. Not for CUDA graph
  // capture.
  static Status Create(std::unique_ptr<CudaPacker> *out,
                       size_t max_tables = kDefaultMaxTables);
  static constexpr size_t kDefaultMaxTables = 256;
  ~CudaPacker();
  CudaPacker(const CudaPacker &) = delete;
  CudaPacker &operator=(const CudaPacker &) = delete;

  // Enqueues bucket[k] = wire(tensor[i] * scale) on `stream`, after
  // `after`. Asynchronous: the bucket is ready when the stream reaches it.
  // With `flags` (device memory, one per row of `table`, zero before), the
  // tensors are also checked as they are read (NNCOMM_CHECK_FINITE):
  // flags[i] becomes 1 where row i's elements hold a NaN or an infinity.
  Status pack(const PackTable &table, void *bucket, DType wire, float scale,
              CudaStream stream, CudaEvent after, unsigned *flags = nullptr);
  // Enqueues tensor[i] = dtype(bucket[k] * scale / divisor) likewise.
  Status unpack(const PackTable &table, const void *bucket, DType wire,
                float scale, int divisor, CudaStream stream, CudaEvent after);

private:
  struct Device;
  explicit CudaPacker(std::unique_ptr<Device> device);
  Status launch(const PackTable &table, const void *bucket, DType wire,
                float scale, int divisor, bool packing, CudaStream stream,
                CudaEvent after, unsigned *flags);

  std::unique_ptr<Device> device_;
};

} // namespace nncomm

// One tile of a bucket's packing: what one block of the packing kernel
// does (cuda_pack.cu), written for host and device alike so that the same
// code can also run on a CPU, a tile and a thread at a time, where no GPU
// is (tests/cuda_emulation/).
//
// Block b handles tile b of the table: the row whose tiles contain b is
// found by binary search over the rows' first_tile, so blocks never share a
// row's elements and the table is the only per-bucket state on the device.
// Inside a row, elements move in vectors of 16 bytes of the wider dtype
// wherever source and destination reach vector alignment at the same
// element; rows whose two sides are misaligned differently move element by
// element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "nncomm/pack.hpp"
#include "nncomm/scaling.hpp"

#define NNCOMM_HD __host__ __device__

namespace nncomm {

// One thread of a block: its index and the block's size.
struct Lane {
  unsigned thread;
  unsigned threads;
};

NNCOMM_HD inline float to_float(float x) { return x; }
NNCOMM_HD inline float to_float(__half x) { return __half2float(x); }
NNCOMM_HD inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> NNCOMM_HD T from_float(float x);
template <> NNCOMM_HD inline float from_float<float>(float x) { return x; }
template <> NNCOMM_HD inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> NNCOMM_HD inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x * scale / divisor, as the host twin computes it (scaling.hpp).
template <typename Dst, typename Src>
NNCOMM_HD Dst convert(Src x, Scaling s, bool identity) {
  if constexpr (std::is_same<Dst, Src>::value) {
    if (identity)
      return x; // bit for bit, NaN payloads included, as the host copies
  }
  // Plain operators: IEEE multiply and divide rounded to nearest on the
  // device (nvcc's defaults) and on the host, never fused.
  float v = to_float(x) * s.multiply;
  if (s.divide != 1.0f)
    v = v / s.divide;
  return from_float<Dst>(v);
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vector { T v[N]; };

// Moves elements [begin, end) of one row: dst[i] = convert(src[i]), or
// zeros when src is null.
template <typename Dst, typename Src>
NNCOMM_HD void move_row(Dst *dst, const Src *src, size_t begin, size_t end,
                        Scaling s, bool identity, Lane lane) {
  constexpr int kWide = sizeof(Dst) > sizeof(Src) ? sizeof(Dst) : sizeof(Src);
  constexpr int N = 16 / kWide; // elements per vector
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  // First element at which dst is vector-aligned; src must be there too.
  const size_t head = (N - (d / sizeof(Dst)) % N) % N;
  const bool vectors =
      src == nullptr ||
      (reinterpret_cast<uintptr_t>(src + head) % (sizeof(Src) * N)) == 0;
  size_t first = begin, last = begin; // the vector span [first, last)
  if (vectors && end > head) {
    first = begin < head ? head : head + (begin - head + N - 1) / N * N;
    last = head + (end - head) / N * N;
    if (last < first)
      first = last = begin;
  }
  auto one = [&](size_t i) {
    dst[i] = src == nullptr ? from_float<Dst>(0.0f)
                            : convert<Dst>(src[i], s, identity);
  };
  // The scalar edges: at most N - 1 elements each side of the span.
  for (size_t i = begin + lane.thread; i < first; i += lane.threads)
    one(i);
  for (size_t i = last + lane.thread; i < end; i += lane.threads)
    one(i);
  const size_t n = (last - first) / N;
  Vector<Dst, N> *dv = reinterpret_cast<Vector<Dst, N> *>(dst + first);
  const Vector<Src, N> *sv =
      src == nullptr ? nullptr
                     : reinterpret_cast<const Vector<Src, N> *>(src + first);
  // A thread loads a batch of its vectors before it stores any: the
  // compiler cannot move a load above an earlier store (the two might
  // alias, as far as it knows), so one vector at a time would keep only one
  // load per thread in flight.
  constexpr int kBatch = 4;
  for (size_t k0 = lane.thread; k0 < n; k0 += kBatch * lane.threads) {
    Vector<Src, N> in[kBatch] = {};
    for (int u = 0; u < kBatch; ++u) {
      const size_t k = k0 + u * lane.threads;
      if (sv != nullptr && k < n)
        in[u] = sv[k];
    }
    for (int u = 0; u < kBatch; ++u) {
      const size_t k = k0 + u * lane.threads;
      if (k >= n)
        break;
      Vector<Dst, N> out;
      for (int j = 0; j < N; ++j) {
        out.v[j] = sv == nullptr ? from_float<Dst>(0.0f)
                                 : convert<Dst>(in[u].v[j], s, identity);
      }
      dv[k] = out;
    }
  }
}

template <typename Dst, typename Src>
NNCOMM_HD void move_tile(const PackEntry &e, char *bucket, bool packing,
                         size_t begin, size_t end, Scaling s, bool identity,
                         Lane lane) {
  if (packing) {
    move_row(reinterpret_cast<Dst *>(bucket) + e.bucket_offset,
             reinterpret_cast<const Src *>(e.address), begin, end, s, identity,
             lane);
  } else {
    move_row(reinterpret_cast<Dst *>(e.address),
             reinterpret_cast<const Src *>(bucket) + e.bucket_offset, begin,
             end, s, identity, lane);
  }
}

template <typename Dst>
NNCOMM_HD void dispatch_source(DType src, const PackEntry &e, char *bucket,
                               bool packing, size_t begin, size_t end,
                               Scaling s, bool identity, Lane lane) {
  switch (src) {
  case DType::kFloat32:
    move_tile<Dst, float>(e, bucket, packing, begin, end, s, identity, lane);
    break;
  case DType::kFloat16:
    move_tile<Dst, __half>(e, bucket, packing, begin, end, s, identity, lane);
    break;
  case DType::kBFloat16:
    move_tile<Dst, __nv_bfloat16>(e, bucket, packing, begin, end, s, identity,
                                  lane);
    break;
  default: break;
  }
}

// Moves tile `tile` of the bucket whose rows are `table`: what block `tile`
// of the kernel does, `lane` being one of its threads. `copy`: scale and
// divisor are both 1, so rows of the wire dtype are copied bit for bit, as
// the host copies them (decided from the caller's values, not from the
// folded scaling, which maps e.g. scale 2 / divisor 2 to 1).
NNCOMM_HD inline void move_bucket_tile(const PackEntry *table, size_t rows,
                                       char *bucket, DType wire, bool packing,
                                       Scaling s, bool copy, uint64_t tile,
                                       Lane lane) {
  size_t lo = 0, hi = rows; // the last row with first_tile <= tile
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].first_tile <= tile)
      lo = mid;
    else
      hi = mid;
  }
  const PackEntry e = table[lo];
  if (!packing && e.address == 0)
    return; // rows without a tensor are left out when unpacking
  const size_t begin = (tile - e.first_tile) * kPackTileElements;
  const size_t end =
      begin + kPackTileElements < e.count ? begin + kPackTileElements : e.count;
  const DType row = static_cast<DType>(e.dtype);
  const DType src = packing ? row : wire;
  const DType dst = packing ? wire : row;
  const bool identity = copy && src == dst;
  switch (dst) {
  case DType::kFloat32:
    dispatch_source<float>(src, e, bucket, packing, begin, end, s, identity,
                           lane);
    break;
  case DType::kFloat16:
    dispatch_source<__half>(src, e, bucket, packing, begin, end, s, identity,
                            lane);
    break;
  case DType::kBFloat16:
    dispatch_source<__nv_bfloat16>(src, e, bucket, packing, begin, end, s,
                                   identity, lane);
    break;
  default: break;
  }
}

} // namespace nncomm

// One tile of a bucket's packing: what one block of the packing kernel
// does (cuda_pack.cu), written for host and device alike so that the same
// code can also run on a CPU, a tile and a thread at a time, where no GPU
// is (tests/cuda_emulation/).
//
// Block b handles tile b of the table: the row whose tiles contain b is
// found by binary search over the rows' first_tile, so blocks never share a
// row's elements and the table is the only per-bucket state on the device.
// A tile is kPackTileBytes of the row's wider side: large enough that the
// search and the block's start are a small part of its time, small enough
// that a bucket is several waves of blocks. Inside a row, elements move in
// 16-byte vectors wherever source and destination reach alignment at the
// same element; rows whose two sides are misaligned differently move
// element by element. Rows of the wire dtype at scale 1 are copied as
// words, converting rows a pair of elements per conversion.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/core/pack.hpp"
#include "nncomm/core/scaling.hpp"

// 16-byte words a thread loads before storing any (bench/pack_sweep.sh
// builds with other values).
#ifndef NNCOMM_PACK_BATCH
#define NNCOMM_PACK_BATCH 4
#endif

#define NNCOMM_HD __host__ __device__

namespace nncomm {

constexpr int kPackBatch = NNCOMM_PACK_BATCH;

// One thread of a block: its index and the block's size.
struct Lane {
  unsigned thread;
  unsigned threads;
};

// The sizes of the dtypes the kernel moves (dtype.hpp's dtype_size is host
// code).
NNCOMM_HD inline uint64_t moved_size(DType dt) {
  return dt == DType::kFloat32 ? 4 : 2;
}

// Elements of a row in one tile: kPackTileBytes of the row's wider side
// (its own dtype or the wire's), so that every full tile is the same DRAM
// traffic and the same loads per thread, whatever the dtypes.
NNCOMM_HD inline uint64_t tile_elements(DType row, DType wire) {
  const uint64_t a = moved_size(row), b = moved_size(wire);
  return kPackTileBytes / (a > b ? a : b);
}

NNCOMM_HD inline uint64_t row_tiles(const PackEntry &e, DType wire) {
  const uint64_t n = tile_elements(static_cast<DType>(e.dtype), wire);
  return (e.count + n - 1) / n;
}

// Numbers the tiles of `rows` (their first_tile) for a bucket of `wire`;
// returns how many there are, the kernel's blocks.
inline uint64_t assign_tiles(PackEntry *rows, size_t n, DType wire) {
  uint64_t tiles = 0;
  for (size_t i = 0; i < n; ++i) {
    rows[i].first_tile = tiles;
    tiles += row_tiles(rows[i], wire);
  }
  return tiles;
}

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

// Two neighbouring elements to float and back. The 16-bit types convert a
// pair per instruction (cvt.rn.f16x2.f32, cvt.rn.bf16x2.f32), rounding each
// element as the one-element conversions do.
NNCOMM_HD inline float2 load2(const float *p) { return make_float2(p[0], p[1]); }
NNCOMM_HD inline float2 load2(const __half *p) {
  return __half22float2(__halves2half2(p[0], p[1]));
}
NNCOMM_HD inline float2 load2(const __nv_bfloat16 *p) {
  return __bfloat1622float2(__halves2bfloat162(p[0], p[1]));
}
NNCOMM_HD inline void store2(float *p, float2 v) {
  p[0] = v.x;
  p[1] = v.y;
}
NNCOMM_HD inline void store2(__half *p, float2 v) {
  const __half2 h = __floats2half2_rn(v.x, v.y);
  p[0] = __low2half(h);
  p[1] = __high2half(h);
}
NNCOMM_HD inline void store2(__nv_bfloat16 *p, float2 v) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
  p[0] = __low2bfloat16(h);
  p[1] = __high2bfloat16(h);
}

// x * scale / divisor, as the host twin computes it (scaling.hpp): plain
// operators, IEEE multiply and divide rounded to nearest on the device
// (nvcc's defaults) and on the host, never fused.
NNCOMM_HD inline float scaled(float v, Scaling s) {
  v = v * s.multiply;
  if (s.divide != 1.0f)
    v = v / s.divide;
  return v;
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vector {
  T v[N];
};

// [*first, *last): the part of a row's elements [begin, end) that moves in
// vectors of N elements, each side's vectors aligned to their size. It
// starts at the first element where the destination's are, if the
// source's are there too (a null source always is); rows misaligned
// differently on the two sides have none and move element by element.
template <int N>
NNCOMM_HD void vector_span(uintptr_t dst, uint64_t dst_size, uintptr_t src,
                           uint64_t src_size, size_t begin, size_t end,
                           size_t *first, size_t *last) {
  *first = *last = begin;
  const uint64_t dst_align = N * dst_size, src_align = N * src_size;
  const size_t head = (dst_align - dst % dst_align) % dst_align / dst_size;
  if (end <= head || (src != 0 && (src + head * src_size) % src_align != 0))
    return;
  const size_t f = begin < head ? head : head + (begin - head + N - 1) / N * N;
  const size_t l = head + (end - head) / N * N;
  if (l > f) {
    *first = f;
    *last = l;
  }
}

// One element at a time, each side of the vector span: at most N - 1
// elements each.
template <typename Move>
NNCOMM_HD void move_edges(size_t begin, size_t first, size_t last, size_t end,
                          Lane lane, Move move) {
  for (size_t i = begin + lane.thread; i < first; i += lane.threads)
    move(i);
  for (size_t i = last + lane.thread; i < end; i += lane.threads)
    move(i);
}

// Vectors [0, n): a thread loads kPackBatch 16-byte words of its vectors
// before it stores any. The compiler cannot move a load above an earlier
// store (the two might alias, as far as it knows), so one vector at a time
// would keep only one load per thread in flight, far too few bytes to
// cover DRAM latency.
template <typename In, typename Load, typename Store>
NNCOMM_HD void move_vectors(size_t n, Lane lane, Load load, Store store) {
  constexpr int kBatch = kPackBatch * 16 / sizeof(In) > 0
                             ? kPackBatch * 16 / sizeof(In)
                             : 1;
  for (size_t k0 = lane.thread; k0 < n; k0 += kBatch * lane.threads) {
    In in[kBatch] = {};
    for (int u = 0; u < kBatch; ++u) {
      const size_t k = k0 + u * lane.threads;
      if (k < n)
        in[u] = load(k);
    }
    for (int u = 0; u < kBatch; ++u) {
      const size_t k = k0 + u * lane.threads;
      if (k < n)
        store(k, in[u]);
    }
  }
}

// Elements [begin, end) of a row copied bit for bit, NaN payloads
// included, as the host copies them: whatever the dtype, 16-byte words
// with no conversion.
template <typename T>
NNCOMM_HD void copy_row(T *dst, const T *src, size_t begin, size_t end,
                        Lane lane) {
  constexpr int N = 16 / sizeof(T);
  size_t first, last;
  vector_span<N>(reinterpret_cast<uintptr_t>(dst), sizeof(T),
                 reinterpret_cast<uintptr_t>(src), sizeof(T), begin, end,
                 &first, &last);
  move_edges(begin, first, last, end, lane, [&](size_t i) { dst[i] = src[i]; });
  const uint4 *s = reinterpret_cast<const uint4 *>(src + first);
  uint4 *d = reinterpret_cast<uint4 *>(dst + first);
  move_vectors<uint4>(
      (last - first) / N, lane, [&](size_t k) { return s[k]; },
      [&](size_t k, const uint4 &v) { d[k] = v; });
}

// Elements [begin, end) of a row set to zero (a segment without a tensor).
template <typename T>
NNCOMM_HD void zero_row(T *dst, size_t begin, size_t end, Lane lane) {
  constexpr int N = 16 / sizeof(T);
  size_t first, last;
  vector_span<N>(reinterpret_cast<uintptr_t>(dst), sizeof(T), 0, 0, begin,
                 end, &first, &last);
  move_edges(begin, first, last, end, lane, [&](size_t i) { dst[i] = T(0); });
  uint4 *d = reinterpret_cast<uint4 *>(dst + first);
  for (size_t k = lane.thread; k < (last - first) / N; k += lane.threads)
    d[k] = uint4{0, 0, 0, 0};
}

// dst[i] = Dst(src[i] * scale / divisor) for elements [begin, end) of a
// row, a pair of elements per conversion. A vector is 16 bytes of the
// wider side and 8 of the narrower: a warp's load or store then covers
// whole 32-byte sectors on both sides (16 bytes of the narrower side would
// make the wider one two accesses each writing half of every sector it
// touches, which cost unpack to float32 a third of its speed).
template <typename Dst, typename Src>
NNCOMM_HD void convert_row(Dst *dst, const Src *src, size_t begin,
                           size_t end, Scaling s, Lane lane) {
  constexpr int N = 16 / (sizeof(Dst) > sizeof(Src) ? sizeof(Dst)
                                                     : sizeof(Src));
  size_t first, last;
  vector_span<N>(reinterpret_cast<uintptr_t>(dst), sizeof(Dst),
                 reinterpret_cast<uintptr_t>(src), sizeof(Src), begin, end,
                 &first, &last);
  move_edges(begin, first, last, end, lane, [&](size_t i) {
    dst[i] = from_float<Dst>(scaled(to_float(src[i]), s));
  });
  using In = Vector<Src, N>;
  using Out = Vector<Dst, N>;
  const In *sv = reinterpret_cast<const In *>(src + first);
  Out *dv = reinterpret_cast<Out *>(dst + first);
  move_vectors<In>(
      (last - first) / N, lane, [&](size_t k) { return sv[k]; },
      [&](size_t k, const In &in) {
        Out out;
        for (int j = 0; j < N; j += 2) {
          const float2 v = load2(in.v + j);
          store2(out.v + j, make_float2(scaled(v.x, s), scaled(v.y, s)));
        }
        dv[k] = out;
      });
}

// Moves elements [begin, end) of one row: dst[i] = convert(src[i]), or
// zeros when src is null. `copy`: scale and divisor are both 1, so rows
// of the wire dtype are copied bit for bit.
template <typename Dst, typename Src>
NNCOMM_HD void move_row(Dst *dst, const Src *src, size_t begin, size_t end,
                        Scaling s, bool copy, Lane lane) {
  // Zeros and copies move words (the word-copy kernel's code): +0 is all
  // zero bits in every dtype moved.
  using Word = std::conditional_t<sizeof(Dst) == 4, uint32_t, uint16_t>;
  if (src == nullptr) {
    zero_row(reinterpret_cast<Word *>(dst), begin, end, lane);
    return;
  }
  if constexpr (std::is_same<Dst, Src>::value) {
    if (copy) {
      copy_row(reinterpret_cast<Word *>(dst),
               reinterpret_cast<const Word *>(src), begin, end, lane);
      return;
    }
  }
  convert_row(dst, src, begin, end, s, lane);
}

template <typename Dst, typename Src>
NNCOMM_HD void move_tile(const PackEntry &e, char *bucket, bool packing,
                         size_t begin, size_t end, Scaling s, bool copy,
                         Lane lane) {
  if (packing) {
    move_row(reinterpret_cast<Dst *>(bucket) + e.bucket_offset,
             reinterpret_cast<const Src *>(e.address), begin, end, s, copy,
             lane);
  } else {
    move_row(reinterpret_cast<Dst *>(e.address),
             reinterpret_cast<const Src *>(bucket) + e.bucket_offset, begin,
             end, s, copy, lane);
  }
}

template <typename Dst>
NNCOMM_HD void dispatch_source(DType src, const PackEntry &e, char *bucket,
                               bool packing, size_t begin, size_t end,
                               Scaling s, bool copy, Lane lane) {
  switch (src) {
  case DType::kFloat32:
    move_tile<Dst, float>(e, bucket, packing, begin, end, s, copy, lane);
    break;
  case DType::kFloat16:
    move_tile<Dst, __half>(e, bucket, packing, begin, end, s, copy, lane);
    break;
  case DType::kBFloat16:
    move_tile<Dst, __nv_bfloat16>(e, bucket, packing, begin, end, s, copy,
                                  lane);
    break;
  default: break;
  }
}

// The row that tile `tile` of a bucket of `wire` belongs to, and the
// tile's elements [*begin, *end) in it.
NNCOMM_HD inline PackEntry find_tile(const PackEntry *table, size_t rows,
                                     DType wire, uint64_t tile, size_t *begin,
                                     size_t *end) {
  size_t lo = 0, hi = rows; // the last row with first_tile <= tile
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].first_tile <= tile)
      lo = mid;
    else
      hi = mid;
  }
  const PackEntry e = table[lo];
  const uint64_t per_tile = tile_elements(static_cast<DType>(e.dtype), wire);
  *begin = (tile - e.first_tile) * per_tile;
  *end = *begin + per_tile < e.count ? *begin + per_tile : e.count;
  return e;
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
  size_t begin, end;
  const PackEntry e = find_tile(table, rows, wire, tile, &begin, &end);
  if (!packing && e.address == 0)
    return; // rows without a tensor are left out when unpacking
  const DType row = static_cast<DType>(e.dtype);
  const DType src = packing ? row : wire;
  const DType dst = packing ? wire : row;
  switch (dst) {
  case DType::kFloat32:
    dispatch_source<float>(src, e, bucket, packing, begin, end, s, copy, lane);
    break;
  case DType::kFloat16:
    dispatch_source<__half>(src, e, bucket, packing, begin, end, s, copy,
                            lane);
    break;
  case DType::kBFloat16:
    dispatch_source<__nv_bfloat16>(src, e, bucket, packing, begin, end, s,
                                   copy, lane);
    break;
  default: break;
  }
}

// Whether every row of a launch travels as itself (the wire dtype, scale 1,
// divisor 1), so that copy_bucket_tile can move it.
inline bool moves_words(const PackEntry *table, size_t rows, DType wire,
                        bool copy) {
  for (size_t i = 0; copy && i < rows; ++i)
    copy = static_cast<DType>(table[i].dtype) == wire;
  return copy;
}

// Elements [begin, end) of a row between its bucket slot and its tensor
// (null: zeros), as words.
template <typename W>
NNCOMM_HD void copy_words(W *slot, W *tensor, bool packing, size_t begin,
                          size_t end, Lane lane) {
  if (!packing)
    copy_row(tensor, slot, begin, end, lane);
  else if (tensor == nullptr)
    zero_row(slot, begin, end, lane);
  else
    copy_row(slot, tensor, begin, end, lane);
}

// move_bucket_tile where moves_words holds: words of the wire dtype's size
// copied, or zeroed, with no conversion in the kernel. Its few registers
// let half as many blocks again share a multiprocessor, each keeping its
// loads in flight.
NNCOMM_HD inline void copy_bucket_tile(const PackEntry *table, size_t rows,
                                       char *bucket, DType wire, bool packing,
                                       uint64_t tile, Lane lane) {
  size_t begin, end;
  const PackEntry e = find_tile(table, rows, wire, tile, &begin, &end);
  if (!packing && e.address == 0)
    return;
  if (moved_size(wire) == 4) {
    copy_words(reinterpret_cast<uint32_t *>(bucket) + e.bucket_offset,
               reinterpret_cast<uint32_t *>(e.address), packing, begin, end,
               lane);
  } else {
    copy_words(reinterpret_cast<uint16_t *>(bucket) + e.bucket_offset,
               reinterpret_cast<uint16_t *>(e.address), packing, begin, end,
               lane);
  }
}

} // namespace nncomm

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
//
// With the NaN/infinity check on (NNCOMM_CHECK_FINITE), a lane also tests
// the exponent bits of each source element it moves, and the kernel
// combines the lanes' findings into one flag per row; the unchecked
// kernels are instantiated without any of it (Unwatched).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
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

// A dtype's exponent field in every element of a 64-bit word: all ones
// there is a NaN or an infinity, in each IEEE dtype, as the host's
// all_finite tests it (denormals and -0.0 are finite). Floating dtypes
// only.
NNCOMM_HD inline uint64_t exponent_field(DType dt) {
  switch (dt) {
  case DType::kFloat32: return 0x7f8000007f800000ull;
  case DType::kFloat16: return 0x7c007c007c007c00ull;
  case DType::kBFloat16: return 0x7f807f807f807f80ull;
  default: return 0x7ff0000000000000ull; // float64
  }
}

template <typename T> NNCOMM_HD DType dtype_of();
template <> NNCOMM_HD inline DType dtype_of<float>() { return DType::kFloat32; }
template <> NNCOMM_HD inline DType dtype_of<__half>() {
  return DType::kFloat16;
}
template <> NNCOMM_HD inline DType dtype_of<__nv_bfloat16>() {
  return DType::kBFloat16;
}

// What a lane notes of the source values it moves, unchecked: nothing.
struct Unwatched {
  NNCOMM_HD explicit Unwatched(uint64_t) {}
  template <typename V> NNCOMM_HD void see(const V &) {}
};

// What a lane notes of the source values it moves, checked: whether one of
// them, elements of kSize bytes with exponent field `field`, is a NaN or
// an infinity. Values are tested where they are stored, after the lane's
// batch of loads has been issued, so the test never holds a load back;
// in words of 32 bits (64 for float64), a few integer instructions a word.
template <int kSize> struct Watch {
  using Word = std::conditional_t<kSize == 8, uint64_t, uint32_t>;
  NNCOMM_HD explicit Watch(uint64_t exponent) : field(Word(exponent)) {}
  template <typename V> NNCOMM_HD void see(const V &v) {
    constexpr int kWords = (sizeof(V) + sizeof(Word) - 1) / sizeof(Word);
    Word w[kWords] = {};
    memcpy(w, &v, sizeof(V));
    for (int i = 0; i < kWords; ++i) {
      // Zero in an element exactly where its exponent is all ones; a value
      // narrower than the word leaves the rest zero bits, which are finite.
      const Word y = (w[i] & field) ^ field;
      if constexpr (kSize == 2) {
        // Whether either half is zero: neither has bit 15 set (the sign
        // bit is outside the field), so it is set after subtracting 1
        // from each half exactly when one of them was zero.
        found |= ((y - 0x00010001u) & ~y & 0x80008000u) != 0;
      } else {
        found |= y == 0;
      }
    }
  }
  Word field;
  bool found = false;
};

// The watch of source elements of type T (checked: Watch; else Unwatched).
template <bool kCheck, typename T>
using WatchOf = std::conditional_t<kCheck, Watch<sizeof(T)>, Unwatched>;

// What one lane of a checked launch found in its part of a tile: the
// tile's row, and whether a NaN or an infinity was among the source
// elements it moved.
struct Finding {
  size_t row = 0;
  bool nonfinite = false;
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
template <typename T, typename W>
NNCOMM_HD void copy_row(T *dst, const T *src, size_t begin, size_t end,
                        Lane lane, W &watch) {
  constexpr int N = 16 / sizeof(T);
  size_t first, last;
  vector_span<N>(reinterpret_cast<uintptr_t>(dst), sizeof(T),
                 reinterpret_cast<uintptr_t>(src), sizeof(T), begin, end,
                 &first, &last);
  move_edges(begin, first, last, end, lane, [&](size_t i) {
    watch.see(src[i]);
    dst[i] = src[i];
  });
  const uint4 *s = reinterpret_cast<const uint4 *>(src + first);
  uint4 *d = reinterpret_cast<uint4 *>(dst + first);
  move_vectors<uint4>(
      (last - first) / N, lane, [&](size_t k) { return s[k]; },
      [&](size_t k, const uint4 &v) {
        watch.see(v);
        d[k] = v;
      });
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
template <typename Dst, typename Src, typename W>
NNCOMM_HD void convert_row(Dst *dst, const Src *src, size_t begin,
                           size_t end, Scaling s, Lane lane, W &watch) {
  constexpr int N = 16 / (sizeof(Dst) > sizeof(Src) ? sizeof(Dst)
                                                     : sizeof(Src));
  size_t first, last;
  vector_span<N>(reinterpret_cast<uintptr_t>(dst), sizeof(Dst),
                 reinterpret_cast<uintptr_t>(src), sizeof(Src), begin, end,
                 &first, &last);
  move_edges(begin, first, last, end, lane, [&](size_t i) {
    watch.see(src[i]);
    dst[i] = from_float<Dst>(scaled(to_float(src[i]), s));
  });
  using In = Vector<Src, N>;
  using Out = Vector<Dst, N>;
  const In *sv = reinterpret_cast<const In *>(src + first);
  Out *dv = reinterpret_cast<Out *>(dst + first);
  move_vectors<In>(
      (last - first) / N, lane, [&](size_t k) { return sv[k]; },
      [&](size_t k, const In &in) {
        watch.see(in);
        Out out;
        for (int j = 0; j < N; j += 2) {
          const float2 v = load2(in.v + j);
          store2(out.v + j, make_float2(scaled(v.x, s), scaled(v.y, s)));
        }
        dv[k] = out;
      });
}

// Moves elements [begin, end) of one row: dst[i] = convert(src[i]), or
// zeros when src is null; `watch` sees each src[i]. `copy`: scale and
// divisor are both 1, so rows of the wire dtype are copied bit for bit.
template <typename Dst, typename Src, typename W>
NNCOMM_HD void move_row(Dst *dst, const Src *src, size_t begin, size_t end,
                        Scaling s, bool copy, Lane lane, W &watch) {
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
               reinterpret_cast<const Word *>(src), begin, end, lane, watch);
      return;
    }
  }
  convert_row(dst, src, begin, end, s, lane, watch);
}

// kCheck: packing only, the tensor's elements are checked as they move.
template <bool kCheck, typename Dst, typename Src>
NNCOMM_HD void move_tile(const PackEntry &e, char *bucket, bool packing,
                         size_t begin, size_t end, Scaling s, bool copy,
                         Lane lane, Finding *finding) {
  if (packing) {
    WatchOf<kCheck, Src> watch(exponent_field(dtype_of<Src>()));
    move_row(reinterpret_cast<Dst *>(bucket) + e.bucket_offset,
             reinterpret_cast<const Src *>(e.address), begin, end, s, copy,
             lane, watch);
    if constexpr (kCheck)
      finding->nonfinite |= watch.found;
  } else {
    Unwatched none(0);
    move_row(reinterpret_cast<Dst *>(e.address),
             reinterpret_cast<const Src *>(bucket) + e.bucket_offset, begin,
             end, s, copy, lane, none);
  }
}

template <bool kCheck, typename Dst>
NNCOMM_HD void dispatch_source(DType src, const PackEntry &e, char *bucket,
                               bool packing, size_t begin, size_t end,
                               Scaling s, bool copy, Lane lane,
                               Finding *finding) {
  switch (src) {
  case DType::kFloat32:
    move_tile<kCheck, Dst, float>(e, bucket, packing, begin, end, s, copy,
                                  lane, finding);
    break;
  case DType::kFloat16:
    move_tile<kCheck, Dst, __half>(e, bucket, packing, begin, end, s, copy,
                                   lane, finding);
    break;
  case DType::kBFloat16:
    move_tile<kCheck, Dst, __nv_bfloat16>(e, bucket, packing, begin, end, s,
                                          copy, lane, finding);
    break;
  default: break;
  }
}

// The row that tile `tile` of a bucket of `wire` belongs to, and the
// tile's elements [*begin, *end) in it.
NNCOMM_HD inline PackEntry find_tile(const PackEntry *table, size_t rows,
                                     DType wire, uint64_t tile, size_t *row,
                                     size_t *begin, size_t *end) {
  size_t lo = 0, hi = rows; // the last row with first_tile <= tile
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].first_tile <= tile)
      lo = mid;
    else
      hi = mid;
  }
  *row = lo;
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
// folded scaling, which maps e.g. scale 2 / divisor 2 to 1). kCheck
// (packing): `*finding` says what the lane found.
template <bool kCheck = false>
NNCOMM_HD void move_bucket_tile(const PackEntry *table, size_t rows,
                                char *bucket, DType wire, bool packing,
                                Scaling s, bool copy, uint64_t tile, Lane lane,
                                Finding *finding = nullptr) {
  size_t index, begin, end;
  const PackEntry e = find_tile(table, rows, wire, tile, &index, &begin, &end);
  if constexpr (kCheck)
    finding->row = index;
  if (!packing && e.address == 0)
    return; // rows without a tensor are left out when unpacking
  const DType row = static_cast<DType>(e.dtype);
  const DType src = packing ? row : wire;
  const DType dst = packing ? wire : row;
  switch (dst) {
  case DType::kFloat32:
    dispatch_source<kCheck, float>(src, e, bucket, packing, begin, end, s,
                                   copy, lane, finding);
    break;
  case DType::kFloat16:
    dispatch_source<kCheck, __half>(src, e, bucket, packing, begin, end, s,
                                    copy, lane, finding);
    break;
  case DType::kBFloat16:
    dispatch_source<kCheck, __nv_bfloat16>(src, e, bucket, packing, begin,
                                           end, s, copy, lane, finding);
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
// (null: zeros), as words of a dtype whose exponent field is `exponent`;
// the tensor's words are checked when packing with kCheck.
template <bool kCheck, typename W>
NNCOMM_HD bool copy_words(W *slot, W *tensor, bool packing, size_t begin,
                          size_t end, uint64_t exponent, Lane lane) {
  WatchOf<kCheck, W> watch(exponent);
  Unwatched none(0);
  if (!packing)
    copy_row(tensor, slot, begin, end, lane, none);
  else if (tensor == nullptr)
    zero_row(slot, begin, end, lane);
  else
    copy_row(slot, tensor, begin, end, lane, watch);
  if constexpr (kCheck)
    return watch.found;
  return false;
}

// move_bucket_tile where moves_words holds: words of the wire dtype's size
// copied, or zeroed, with no conversion in the kernel. Its few registers
// let half as many blocks again share a multiprocessor, each keeping its
// loads in flight.
template <bool kCheck = false>
NNCOMM_HD void copy_bucket_tile(const PackEntry *table, size_t rows,
                                char *bucket, DType wire, bool packing,
                                uint64_t tile, Lane lane,
                                Finding *finding = nullptr) {
  size_t row, begin, end;
  const PackEntry e = find_tile(table, rows, wire, tile, &row, &begin, &end);
  if (!packing && e.address == 0)
    return;
  const uint64_t exponent = kCheck ? exponent_field(wire) : 0;
  bool found;
  if (moved_size(wire) == 4) {
    found = copy_words<kCheck>(
        reinterpret_cast<uint32_t *>(bucket) + e.bucket_offset,
        reinterpret_cast<uint32_t *>(e.address), packing, begin, end,
        exponent, lane);
  } else {
    found = copy_words<kCheck>(
        reinterpret_cast<uint16_t *>(bucket) + e.bucket_offset,
        reinterpret_cast<uint16_t *>(e.address), packing, begin, end,
        exponent, lane);
  }
  if constexpr (kCheck) {
    finding->row = row;
    finding->nonfinite |= found;
  }
}

// Elements of a tile of an array that is only checked, not moved (a
// bucket reduced in place, a float64 row): the check kernel's tiles are
// kPackTileBytes of `dt`.
NNCOMM_HD inline uint64_t check_tile_elements(DType dt) {
  return kPackTileBytes / (dt == DType::kFloat64 ? 8 : moved_size(dt));
}

// Whether lane `lane` of block `tile` of the check kernel finds a NaN or
// an infinity among the `count` elements of floating dtype `dt` at `p`:
// the loads of copy_row, without its stores.
template <typename T>
NNCOMM_HD bool check_words(const T *p, size_t begin, size_t end,
                           uint64_t exponent, Lane lane) {
  constexpr int N = 16 / sizeof(T);
  Watch<sizeof(T)> watch(exponent);
  size_t first, last;
  vector_span<N>(reinterpret_cast<uintptr_t>(p), sizeof(T),
                 reinterpret_cast<uintptr_t>(p), sizeof(T), begin, end,
                 &first, &last);
  move_edges(begin, first, last, end, lane, [&](size_t i) { watch.see(p[i]); });
  const uint4 *v = reinterpret_cast<const uint4 *>(p + first);
  move_vectors<uint4>(
      (last - first) / N, lane, [&](size_t k) { return v[k]; },
      [&](size_t, const uint4 &w) { watch.see(w); });
  return watch.found;
}

NNCOMM_HD inline bool check_tile(const void *p, size_t count, DType dt,
                                 uint64_t tile, Lane lane) {
  const uint64_t per_tile = check_tile_elements(dt);
  const size_t begin = tile * per_tile;
  const size_t end = begin + per_tile < count ? begin + per_tile : count;
  const uint64_t exponent = exponent_field(dt);
  switch (dt) {
  case DType::kFloat64:
    return check_words(static_cast<const uint64_t *>(p), begin, end, exponent,
                       lane);
  case DType::kFloat32:
    return check_words(static_cast<const uint32_t *>(p), begin, end, exponent,
                       lane);
  default:
    return check_words(static_cast<const uint16_t *>(p), begin, end, exponent,
                       lane);
  }
}

} // namespace nncomm

// One tile of the IPC transport's sum (cuda_ipc_transport.cu): out = the
// sum over ranks, in rank order, of each rank's elements, each term scaled
// and the sum divided (scaling.hpp), written for
// host and device alike so that the CPU-side runtime of
// tests/cuda_emulation/ runs the same code. Every rank reads the same
// terms in the same order, so every rank gets the same bits.
#pragma once

#include "cuda/pack_tile.cuh"

namespace nncomm {

// Elements of one block's tile, each thread taking every blockDim-th.
constexpr uint64_t kSumTileElements = 4096;
constexpr int kSumMaxSources = 8;

// Where each rank's terms begin (device addresses, some mapped from other
// processes); passed by value, as a kernel argument.
struct SumSources {
  const void *at[kSumMaxSources];
  int count;
};

// a * b rounded on its own: nvcc would otherwise fuse it with the sum it
// feeds (an FMA), which the host twin does not.
NNCOMM_HD inline float product(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

NNCOMM_HD inline double product(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Floating dtypes: float64 summed in double, float32 in float, the 16-bit
// dtypes in float rounded to their own after each step. As the host's
// reductions do (mpi_transport.cpp): each rank's term is multiplied by
// `scale` and rounded, the terms summed, and the sum divided as `after`
// says (make_scaling(1, divisor)) and rounded again.
template <typename T>
NNCOMM_HD inline void sum_floating(const SumSources &src, T *out,
                                   size_t begin, size_t end, float scale,
                                   Scaling after, Lane lane) {
  constexpr bool kWide = std::is_same_v<T, double>;
  using Acc = std::conditional_t<kWide, double, float>;
  const auto rounded = [](Acc v) -> Acc {
    if constexpr (kWide || std::is_same_v<T, float>)
      return v;
    else
      return to_float(from_float<T>(v));
  };
  for (size_t i = begin + lane.thread; i < end; i += lane.threads) {
    Acc acc = 0;
    for (int r = 0; r < src.count; ++r) {
      const T x = static_cast<const T *>(src.at[r])[i];
      Acc term;
      if constexpr (kWide)
        term = x;
      else
        term = to_float(x);
      if (scale != 1.0f)
        term = rounded(product(term, Acc(scale)));
      acc = r == 0 ? term : rounded(acc + term);
    }
    if (after.multiply != 1.0f)
      acc = product(acc, Acc(after.multiply));
    if (after.divide != 1.0f)
      acc = acc / Acc(after.divide);
    if constexpr (kWide)
      out[i] = acc;
    else
      out[i] = from_float<T>(acc);
  }
}

// Integer dtypes are only summed (Transport: scale 1, divisor 1), wrapping
// on overflow as MPI's sums do (unsigned arithmetic: no undefined
// behaviour in the host's copy).
template <typename T>
NNCOMM_HD inline void sum_integers(const SumSources &src, T *out,
                                   size_t begin, size_t end, Lane lane) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = begin + lane.thread; i < end; i += lane.threads) {
    U acc = 0;
    for (int r = 0; r < src.count; ++r)
      acc += static_cast<U>(static_cast<const T *>(src.at[r])[i]);
    out[i] = static_cast<T>(acc);
  }
}

// Tile `tile` of `count` elements of `dt`.
NNCOMM_HD inline void sum_tile(const SumSources &src, void *out, size_t count,
                               DType dt, float scale, Scaling after,
                               uint64_t tile, Lane lane) {
  const size_t begin = tile * kSumTileElements;
  const size_t end =
      begin + kSumTileElements < count ? begin + kSumTileElements : count;
  switch (dt) {
  case DType::kFloat32:
    sum_floating<float>(src, static_cast<float *>(out), begin, end, scale,
                        after, lane);
    break;
  case DType::kFloat64:
    sum_floating<double>(src, static_cast<double *>(out), begin, end,
                         scale, after, lane);
    break;
  case DType::kFloat16:
    sum_floating<__half>(src, static_cast<__half *>(out), begin, end,
                         scale, after, lane);
    break;
  case DType::kBFloat16:
    sum_floating<__nv_bfloat16>(src, static_cast<__nv_bfloat16 *>(out),
                                begin, end, scale, after, lane);
    break;
  case DType::kInt32:
    sum_integers(src, static_cast<int32_t *>(out), begin, end, lane);
    break;
  case DType::kInt64:
    sum_integers(src, static_cast<int64_t *>(out), begin, end, lane);
    break;
  }
}

} // namespace nncomm

#include "nncomm/host/elementwise.hpp"

#include "nncomm/host/bfloat16.hpp"
#include "nncomm/core/scaling.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace nncomm {

namespace {

template <typename To, typename From, typename Wide>
void convert(To *dst, const From *src, size_t count, Wide scale, Wide divisor) {
  if (divisor == Wide(1)) {
    for (size_t i = 0; i < count; ++i) {
      dst[i] = static_cast<To>(static_cast<Wide>(src[i]) * scale);
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      dst[i] = static_cast<To>(static_cast<Wide>(src[i]) * scale / divisor);
    }
  }
}

#if defined(__F16C__)
// GCC (12) does not vectorise _Float16 conversions ("unsupported
// data-type"), so each element was a scalar vcvtph2ps; F16C converts eight
// at a time, rounding to nearest even as the scalar cast does, so both
// paths give the same bits. The scalar loops finish the tails.
__m256 load8(const _Float16 *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
__m256 load8(const float *p) { return _mm256_loadu_ps(p); }
void store8(_Float16 *p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i *>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
void store8(float *p, __m256 v) { _mm256_storeu_ps(p, v); }

// Converts the first count - count % 8 elements; returns how many.
template <typename To, typename From>
size_t convert8(To *dst, const From *src, size_t count, float scale,
                float divisor) {
  const size_t whole = count - count % 8;
  const __m256 m = _mm256_set1_ps(scale);
  const __m256 d = _mm256_set1_ps(divisor);
  for (size_t i = 0; i < whole; i += 8) {
    __m256 v = _mm256_mul_ps(load8(src + i), m);
    store8(dst + i, divisor == 1.0f ? v : _mm256_div_ps(v, d));
  }
  return whole;
}

size_t add8(const _Float16 *a, _Float16 *b, size_t count) {
  const size_t whole = count - count % 8;
  for (size_t i = 0; i < whole; i += 8)
    store8(b + i, _mm256_add_ps(load8(a + i), load8(b + i)));
  return whole;
}
#endif

template <typename To, typename From>
void convert_from(To *dst, const From *src, size_t count, Scaling s) {
  constexpr bool wide = sizeof(To) == 8 || sizeof(From) == 8;
  using Wide = typename std::conditional<wide, double, float>::type;
#if defined(__F16C__)
  constexpr bool half = std::is_same<To, _Float16>::value ||
                        std::is_same<From, _Float16>::value;
  constexpr bool simd = half && (std::is_same<To, float>::value ||
                                 std::is_same<From, float>::value);
  if constexpr (simd) {
    const size_t done = convert8(dst, src, count, s.multiply,
                                 static_cast<float>(s.divide));
    dst += done;
    src += done;
    count -= done;
  }
#endif
  convert<To, From, Wide>(dst, src, count, static_cast<Wide>(s.multiply),
                          static_cast<Wide>(s.divide));
}

// Calls f(static_cast<T *>(nullptr)) with T the C++ type of `dt`.
template <typename F> void with_type(DType dt, F &&f) {
  switch (dt) {
  case DType::kFloat32: f(static_cast<float *>(nullptr)); break;
  case DType::kFloat64: f(static_cast<double *>(nullptr)); break;
  case DType::kFloat16: f(static_cast<_Float16 *>(nullptr)); break;
  case DType::kBFloat16: f(static_cast<BFloat16 *>(nullptr)); break;
  case DType::kInt32: f(static_cast<int32_t *>(nullptr)); break;
  case DType::kInt64: f(static_cast<int64_t *>(nullptr)); break;
  }
}

template <typename P> using Pointee = typename std::remove_pointer<P>::type;

template <typename T> void write_as(void *dst, bool value) {
  T v = static_cast<T>(value ? 1.0f : 0.0f);
  std::memcpy(dst, &v, sizeof(T));
}

template <typename T> bool read_as(const void *src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return static_cast<float>(v) != 0.0f;
}

// OR of "exponent all ones" over the elements, copying them to `dst` on
// the way with kCopy: branch-free, so that GCC makes it a vector loop (an
// and, a compare and an or per vector), and cloned for AVX2, whose 32-byte
// integer vectors the build's flags (F16C's AVX) leave out. The copy
// checks at memcpy's speed; a check after a memcpy costs a second pass.
template <typename Bits, bool kCopy>
__attribute__((target_clones("avx2", "default"))) bool
finite_bits(Bits *__restrict dst, const Bits *__restrict src, size_t count,
            Bits exponent) {
  Bits bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const Bits x = src[i];
    if constexpr (kCopy)
      dst[i] = x;
    bad |= static_cast<Bits>((x & exponent) == exponent);
  }
  return bad == 0;
}

// finite_bits on `dt`'s bits (its exponent: infinity's); integers are
// copied and always finite.
template <bool kCopy>
bool finite_as(void *dst, const void *src, DType dt, size_t count) {
  const auto check = [&](auto exponent) {
    using Bits = decltype(exponent);
    return finite_bits<Bits, kCopy>(static_cast<Bits *>(dst),
                                    static_cast<const Bits *>(src), count,
                                    exponent);
  };
  switch (dt) {
  case DType::kFloat32: return check(uint32_t{0x7f800000u});
  case DType::kFloat64: return check(uint64_t{0x7ff0000000000000ull});
  case DType::kFloat16: return check(uint16_t{0x7c00});
  case DType::kBFloat16: return check(uint16_t{0x7f80});
  case DType::kInt32:
  case DType::kInt64: break;
  }
  if (kCopy)
    std::memcpy(dst, src, count * dtype_size(dt));
  return true;
}

} // namespace

void convert_scaled(void *dst, DType dst_dt, const void *src, DType src_dt,
                    size_t count, float scale, int divisor) {
  const bool identity = scale == 1.0f && divisor == 1;
  if (dst_dt == src_dt && (identity || !dtype_is_floating(dst_dt))) {
    if (dst != src)
      std::memcpy(dst, src, count * dtype_size(dst_dt));
    return;
  }
  const Scaling scaling = make_scaling(scale, divisor);
  with_type(dst_dt, [&](auto *to) {
    with_type(src_dt, [&](auto *from) {
      using To = Pointee<decltype(to)>;
      using From = Pointee<decltype(from)>;
      // Integers are only ever copied, above.
      if constexpr (!std::is_integral<To>::value &&
                    !std::is_integral<From>::value) {
        convert_from(static_cast<To *>(dst), static_cast<const From *>(src),
                     count, scaling);
      }
    });
  });
}

void add_narrow(const void *a, void *b, DType dt, size_t count) {
  with_type(dt, [&](auto *type) {
    using T = Pointee<decltype(type)>;
    if constexpr (sizeof(T) == 2) {
      const T *x = static_cast<const T *>(a);
      T *y = static_cast<T *>(b);
      size_t i = 0;
#if defined(__F16C__)
      if constexpr (std::is_same<T, _Float16>::value)
        i = add8(x, y, count);
#endif
      for (; i < count; ++i)
        y[i] = static_cast<T>(static_cast<float>(x[i]) +
                              static_cast<float>(y[i]));
    }
  });
}

bool all_finite(const void *p, DType dt, size_t count) {
  return finite_as<false>(nullptr, p, dt, count);
}

bool copy_finite(void *dst, const void *src, DType dt, size_t count) {
  return finite_as<true>(dst, src, dt, count);
}

void write_flag(void *dst, DType dt, bool value) {
  with_type(dt,
            [&](auto *type) { write_as<Pointee<decltype(type)>>(dst, value); });
}

bool read_flag(const void *src, DType dt) {
  bool value = false;
  with_type(dt,
            [&](auto *type) { value = read_as<Pointee<decltype(type)>>(src); });
  return value;
}

} // namespace nncomm

#include "nncomm/host_ops.hpp"

#include "nncomm/bfloat16.hpp"
#include "nncomm/scaling.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

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

template <typename To, typename From>
void convert_from(To *dst, const From *src, size_t count, Scaling s) {
  constexpr bool wide = sizeof(To) == 8 || sizeof(From) == 8;
  using Wide = typename std::conditional<wide, double, float>::type;
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

#include "nncomm/host_ops.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace nncomm {

namespace {

template <typename To, typename From, typename Wide>
void convert(To *dst, const From *src, size_t count, Wide scale, Wide divisor) {
  // Dividing, rather than multiplying by 1 / divisor, gives the same
  // rounding as numpy's x / n. For a power of two 1 / divisor is exact, so
  // multiplying rounds identically and is several times faster.
  int exponent = 0;
  if (std::frexp(divisor, &exponent) == Wide(0.5)) {
    scale *= Wide(1) / divisor;
    divisor = Wide(1);
  }
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
void convert_from(To *dst, const From *src, size_t count, float scale,
                  int divisor) {
  constexpr bool wide = sizeof(To) == 8 || sizeof(From) == 8;
  using Wide = typename std::conditional<wide, double, float>::type;
  convert<To, From, Wide>(dst, src, count, static_cast<Wide>(scale),
                          static_cast<Wide>(divisor));
}

template <typename To>
void convert_to(To *dst, const void *src, DType src_dt, size_t count,
                float scale, int divisor) {
  switch (src_dt) {
  case DType::kFloat32:
    convert_from(dst, static_cast<const float *>(src), count, scale, divisor);
    break;
  case DType::kFloat64:
    convert_from(dst, static_cast<const double *>(src), count, scale, divisor);
    break;
  case DType::kFloat16:
    convert_from(dst, static_cast<const _Float16 *>(src), count, scale,
                 divisor);
    break;
  default: break;
  }
}

template <typename T> void write_as(void *dst, bool value) {
  T v = static_cast<T>(value ? 1 : 0);
  std::memcpy(dst, &v, sizeof(T));
}

template <typename T> bool read_as(const void *src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return v != static_cast<T>(0);
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
  switch (dst_dt) {
  case DType::kFloat32:
    convert_to(static_cast<float *>(dst), src, src_dt, count, scale, divisor);
    break;
  case DType::kFloat64:
    convert_to(static_cast<double *>(dst), src, src_dt, count, scale, divisor);
    break;
  case DType::kFloat16:
    convert_to(static_cast<_Float16 *>(dst), src, src_dt, count, scale,
               divisor);
    break;
  default: break;
  }
}

void write_flag(void *dst, DType dt, bool value) {
  switch (dt) {
  case DType::kFloat32: write_as<float>(dst, value); break;
  case DType::kFloat64: write_as<double>(dst, value); break;
  case DType::kFloat16: write_as<_Float16>(dst, value); break;
  case DType::kInt32: write_as<int32_t>(dst, value); break;
  case DType::kInt64: write_as<int64_t>(dst, value); break;
  }
}

bool read_flag(const void *src, DType dt) {
  switch (dt) {
  case DType::kFloat32: return read_as<float>(src);
  case DType::kFloat64: return read_as<double>(src);
  case DType::kFloat16: return read_as<_Float16>(src);
  case DType::kInt32: return read_as<int32_t>(src);
  case DType::kInt64: return read_as<int64_t>(src);
  }
  return false;
}

} // namespace nncomm

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

template <typename To>
void convert_to(To *dst, const void *src, DType src_dt, size_t count,
                Scaling scaling) {
  switch (src_dt) {
  case DType::kFloat32:
    convert_from(dst, static_cast<const float *>(src), count, scaling);
    break;
  case DType::kFloat64:
    convert_from(dst, static_cast<const double *>(src), count, scaling);
    break;
  case DType::kFloat16:
    convert_from(dst, static_cast<const _Float16 *>(src), count, scaling);
    break;
  case DType::kBFloat16:
    convert_from(dst, static_cast<const BFloat16 *>(src), count, scaling);
    break;
  default: break;
  }
}

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
  switch (dst_dt) {
  case DType::kFloat32:
    convert_to(static_cast<float *>(dst), src, src_dt, count, scaling);
    break;
  case DType::kFloat64:
    convert_to(static_cast<double *>(dst), src, src_dt, count, scaling);
    break;
  case DType::kFloat16:
    convert_to(static_cast<_Float16 *>(dst), src, src_dt, count, scaling);
    break;
  case DType::kBFloat16:
    convert_to(static_cast<BFloat16 *>(dst), src, src_dt, count, scaling);
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
  case DType::kBFloat16: write_as<BFloat16>(dst, value); break;
  }
}

bool read_flag(const void *src, DType dt) {
  switch (dt) {
  case DType::kFloat32: return read_as<float>(src);
  case DType::kFloat64: return read_as<double>(src);
  case DType::kFloat16: return read_as<_Float16>(src);
  case DType::kInt32: return read_as<int32_t>(src);
  case DType::kInt64: return read_as<int64_t>(src);
  case DType::kBFloat16: return read_as<BFloat16>(src);
  }
  return false;
}

} // namespace nncomm

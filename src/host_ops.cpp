#include "nncomm/host_ops.hpp"

#include <cstdint>
#include <cstring>

namespace nncomm {

namespace {
template <typename T, typename Wide>
void divide(T *dst, const T *src, size_t count, int divisor) {
  const Wide d = static_cast<Wide>(divisor);
  for (size_t i = 0; i < count; ++i) {
    dst[i] = static_cast<T>(static_cast<Wide>(src[i]) / d);
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
}  // namespace

void copy_divided(void *dst, const void *src, size_t count, DType dt,
                  int divisor) {
  if (divisor == 1 || !dtype_is_floating(dt)) {
    if (dst != src) std::memcpy(dst, src, count * dtype_size(dt));
    return;
  }
  switch (dt) {
  case DType::kFloat32:
    divide<float, float>(static_cast<float *>(dst),
                         static_cast<const float *>(src), count, divisor);
    break;
  case DType::kFloat64:
    divide<double, double>(static_cast<double *>(dst),
                           static_cast<const double *>(src), count, divisor);
    break;
  case DType::kFloat16:
    divide<_Float16, float>(static_cast<_Float16 *>(dst),
                            static_cast<const _Float16 *>(src), count,
                            divisor);
    break;
  default:
    break;
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

}  // namespace nncomm

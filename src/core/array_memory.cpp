#include <cstring>

#include "nncomm/core/array_memory.hpp"
#include "nncomm/host/elementwise.hpp"

namespace nncomm {

Status HostArrays::check_finite(const void *p, size_t count, DType dt,
                                bool *finite) {
  *finite = all_finite(p, dt, count);
  return Status::Ok();
}

Status HostArrays::zero(void *p, size_t bytes) {
  std::memset(p, 0, bytes);
  return Status::Ok();
}

Status HostArrays::copy(void *dst, const void *src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}

} // namespace nncomm

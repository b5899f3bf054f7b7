#include <cstring>

#include "nncomm/core/array_memory.hpp"

namespace nncomm {

Status HostArrays::zero(void *p, size_t bytes) {
  std::memset(p, 0, bytes);
  return Status::Ok();
}

Status HostArrays::copy(void *dst, const void *src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}

} // namespace nncomm

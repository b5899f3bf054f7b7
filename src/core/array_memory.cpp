#include <cstring>

#include "nncomm/core/array_memory.hpp"
#include "nncomm/host/elementwise.hpp"

namespace nncomm {

namespace {

Status not_on_this_memory() {
  return Status::InvalidArgument(
      "nncomm checks gradients for NaN and infinity (check_finite) in host "
      "memory only, so far");
}

} // namespace

Status ArrayMemory::pack_checked(const PackTable &, void *, DType, float,
                                 std::vector<size_t> *) {
  return not_on_this_memory();
}

Status ArrayMemory::check_finite(const void *, size_t, DType, bool *) {
  return not_on_this_memory();
}

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

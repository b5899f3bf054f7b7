#include <cstring>

#include "nncomm/core/array_memory.hpp"
#include "nncomm/host/elementwise.hpp"

namespace nncomm {

Status HostArrays::pack_checked(const PackTable &table, void *message,
                                DType wire, float scale) {
  rows_.clear();
  NNCOMM_RETURN_IF_ERROR(pack_host(table, message, wire, scale, &rows_));
  const size_t first = found_.size();
  found_.resize(first + table.entries.size(), false);
  for (size_t row : rows_)
    found_[first + row] = true;
  return Status::Ok();
}

Status HostArrays::check_finite(const void *p, size_t count, DType dt) {
  found_.push_back(!all_finite(p, dt, count));
  return Status::Ok();
}

Status HostArrays::findings(std::vector<bool> *nonfinite) {
  nonfinite->swap(found_);
  found_.clear();
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

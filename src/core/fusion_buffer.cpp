#include "nncomm/core/fusion_buffer.hpp"

#include "nncomm/observability/config.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace nncomm {

FusionBuffer::~FusionBuffer() { std::free(data_); }

Status FusionBuffer::reserve(size_t bytes, char **data) {
  if (bytes > capacity_) {
    const size_t refused = config::test_fail_allocation_bytes();
    if (refused > 0 && bytes >= refused) {
      return Status::OutOfMemory(
          "nncomm could not allocate " + std::to_string(bytes) +
          " bytes (refused by NNCOMM_TEST_FAIL_ALLOCATION)");
    }
    // Growing by at least half again keeps a slowly rising message size
    // from reallocating on every call.
    size_t grown = std::max(bytes, capacity_ + capacity_ / 2);
    void *fresh = nullptr;
    if (posix_memalign(&fresh, 64, grown) != 0) {
      return Status::OutOfMemory(
          "nncomm could not allocate a fusion buffer of " +
          std::to_string(grown) + " bytes");
    }
    std::free(data_);
    data_ = static_cast<char *>(fresh);
    capacity_ = grown;
  }
  *data = data_;
  return Status::Ok();
}

} // namespace nncomm

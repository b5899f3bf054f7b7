// FusionBuffer: the staging memory that packs many small arrays into one
// message. Allocated on first use, grown only when a larger message arrives
// and reused by every later call, so steady-state collectives allocate
// nothing.
#pragma once

#include <cstddef>

#include "nncomm/core/status.hpp"

namespace nncomm {

class FusionBuffer {
public:
  FusionBuffer() = default;
  ~FusionBuffer();
  FusionBuffer(const FusionBuffer &) = delete;
  FusionBuffer &operator=(const FusionBuffer &) = delete;

  // Points `*data` at least `bytes` of 64-byte-aligned memory. Earlier
  // contents are not kept when the buffer grows.
  Status reserve(size_t bytes, char **data);

private:
  char *data_ = nullptr;
  size_t capacity_ = 0;
};

} // namespace nncomm

// Calling the CUDA runtime from nncomm's core: its errors as a Status
// carrying the runtime's own words, and the device a scope works on.
// Internal to src/ (it needs the CUDA headers).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "nncomm/core/status.hpp"

namespace nncomm {

inline Status cuda_status(cudaError_t err, const char *call) {
  if (err == cudaSuccess)
    return Status::Ok();
  return Status::RuntimeError(std::string(call) +
                              " failed: " + cudaGetErrorString(err));
}

#define NNCOMM_CUDA_CALL(fn, ...)                                              \
  NNCOMM_RETURN_IF_ERROR(::nncomm::cuda_status(fn(__VA_ARGS__), #fn))

// Makes `device` current for a scope and restores the caller's device.
class DeviceScope {
public:
  Status enter(int device) {
    NNCOMM_CUDA_CALL(cudaGetDevice, &previous_);
    if (previous_ != device)
      NNCOMM_CUDA_CALL(cudaSetDevice, device);
    entered_ = previous_ != device;
    return Status::Ok();
  }
  ~DeviceScope() {
    if (entered_)
      cudaSetDevice(previous_);
  }

private:
  int previous_ = 0;
  bool entered_ = false;
};

} // namespace nncomm

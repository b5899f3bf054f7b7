#include "nncomm/cuda_devices.hpp"

#include <string>

#include <cuda_runtime.h>

namespace nncomm {

Status cuda_device_count(int *count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    return Status::RuntimeError(std::string("cudaGetDeviceCount failed: ") +
                                cudaGetErrorString(err));
  }
  return Status::Ok();
}

} // namespace nncomm

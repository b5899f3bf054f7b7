#include "nncomm/cuda/cuda_devices.hpp"

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

Status cuda_device_of(const void *ptr, int *device) {
  cudaPointerAttributes attributes;
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    return Status::RuntimeError(std::string("the device of a GPU array: ") +
                                cudaGetErrorString(err));
  }
  if (attributes.type != cudaMemoryTypeDevice &&
      attributes.type != cudaMemoryTypeManaged) {
    return Status::InvalidArgument(
        "an array handed over as GPU memory (__cuda_array_interface__) is "
        "not device memory");
  }
  *device = attributes.device;
  return Status::Ok();
}

Status cuda_use_device_of(const void *ptr) {
  int device = 0;
  NNCOMM_RETURN_IF_ERROR(cuda_device_of(ptr, &device));
  const cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    return Status::RuntimeError(std::string("the device of a GPU array: ") +
                                cudaGetErrorString(err));
  }
  return Status::Ok();
}

} // namespace nncomm

// The CUDA entry points in a build without nvcc: each says why there is no
// CUDA, so a caller gets a clear error instead of a missing symbol.
#include "nncomm/cuda/cuda_devices.hpp"
#include "nncomm/cuda/cuda_pack.hpp"

namespace nncomm {

Status built_without_cuda() {
  return Status::RuntimeError(
      "nncomm was built without CUDA (nvcc was not found at build time, or "
      "NNCOMM_CUDA=0); rebuild with nvcc on PATH or NNCOMM_CUDA=1");
}

namespace {
Status unavailable() { return built_without_cuda(); }
} // namespace

struct CudaPacker::Device {};

bool cuda_packing_built() { return false; }

Status cuda_device_count(int *) { return unavailable(); }

Status cuda_device_of(const void *, int *) { return unavailable(); }

Status cuda_use_device_of(const void *) { return unavailable(); }

Status CudaPacker::Create(std::unique_ptr<CudaPacker> *, size_t) {
  return unavailable();
}

CudaPacker::CudaPacker(std::unique_ptr<Device> device)
    : device_(std::move(device)) {}
CudaPacker::~CudaPacker() = default;

Status CudaPacker::pack(const PackTable &, void *, DType, float, CudaStream,
                        CudaEvent, unsigned *) {
  return unavailable();
}

Status cuda_check_finite(const void *, size_t, DType, unsigned *, CudaStream) {
  return unavailable();
}

Status CudaPacker::unpack(const PackTable &, const void *, DType, float, int,
                          CudaStream, CudaEvent) {
  return unavailable();
}

} // namespace nncomm

#include "nncomm/cuda/cuda_runner.hpp"

#include <algorithm>

#include "cuda/cuda_calls.hpp"
#include "nncomm/cuda/device_arrays.hpp"

namespace nncomm {

Status CudaRunner::Create(DeviceTransport &transport, CudaStream compute,
                          std::unique_ptr<CudaRunner> *out) {
  std::unique_ptr<DeviceArrays> memory;
  NNCOMM_RETURN_IF_ERROR(DeviceArrays::Create(transport, &memory));
  out->reset(new CudaRunner(transport, compute, std::move(memory)));
  return Status::Ok();
}

CudaRunner::~CudaRunner() {
  DeviceScope scope;
  if (!scope.enter(transport_.device()).ok())
    return;
  // An event still waited on is released once the wait is over.
  for (CudaEvent e : ready_)
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

Status CudaRunner::prepare(const std::vector<Bucket> &plan) {
  NNCOMM_RETURN_IF_ERROR(BucketRunner::prepare(plan));
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  // One event per bucket index, for every plan of the engine: made for the
  // indices no earlier plan had.
  ready_.resize(std::max(ready_.size(), plan.size()), nullptr);
  for (CudaEvent &e : ready_) {
    if (e == nullptr) {
      NNCOMM_CUDA_CALL(cudaEventCreateWithFlags,
                       reinterpret_cast<cudaEvent_t *>(&e),
                       cudaEventDisableTiming);
    }
  }
  return Status::Ok();
}

Status CudaRunner::ready(size_t index) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_CUDA_CALL(cudaEventRecord, static_cast<cudaEvent_t>(ready_[index]),
                   static_cast<cudaStream_t>(compute_));
  return Status::Ok();
}

Status CudaRunner::follow(size_t index) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_CUDA_CALL(cudaStreamWaitEvent,
                   static_cast<cudaStream_t>(transport_.stream()),
                   static_cast<cudaEvent_t>(ready_[index]), 0);
  return Status::Ok();
}

Status CudaRunner::close() { return transport_.lead(compute_); }

// DeviceArrays packs and unpacks on the transport's stream.
void *CudaRunner::stream() const { return transport_.stream(); }

int CudaRunner::device() const { return transport_.device(); }

} // namespace nncomm

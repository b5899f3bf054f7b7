#include "nncomm/transports/device_transport.hpp"

#include "cuda/cuda_calls.hpp"

namespace nncomm {

namespace {
// Makes `waiter` wait for the work enqueued on `first` so far.
Status order(CudaEvent *event, int device, CudaStream first,
             CudaStream waiter) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(device));
  cudaEvent_t *e = reinterpret_cast<cudaEvent_t *>(event);
  if (*e == nullptr)
    NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, e, cudaEventDisableTiming);
  NNCOMM_CUDA_CALL(cudaEventRecord, *e, static_cast<cudaStream_t>(first));
  NNCOMM_CUDA_CALL(cudaStreamWaitEvent, static_cast<cudaStream_t>(waiter), *e,
                   0);
  return Status::Ok();
}
} // namespace

DeviceTransport::~DeviceTransport() {
  if (order_ != nullptr)
    cudaEventDestroy(static_cast<cudaEvent_t>(order_));
}

Status DeviceTransport::follow(CudaStream s) {
  return order(&order_, device(), s, stream());
}

Status DeviceTransport::lead(CudaStream s) {
  return order(&order_, device(), stream(), s);
}

} // namespace nncomm

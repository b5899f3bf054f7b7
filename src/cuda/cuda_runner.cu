#include "nncomm/cuda/cuda_runner.hpp"

#include <algorithm>

#include "cuda/cuda_calls.hpp"
#include "nncomm/cuda/device_arrays.hpp"
#include "nncomm/observability/timeline.hpp"

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
  current_ = index;
  tracing_ = Timeline::on();
  if (tracing_ && trace_ == nullptr)
    NNCOMM_RETURN_IF_ERROR(DeviceTrace::Create(transport_.device(), &trace_));
  NNCOMM_RETURN_IF_ERROR(trace(DeviceTrace::kReached));
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_CUDA_CALL(cudaStreamWaitEvent,
                   static_cast<cudaStream_t>(transport_.stream()),
                   static_cast<cudaEvent_t>(ready_[index]), 0);
  return trace(DeviceTrace::kReady);
}

Status CudaRunner::packed(size_t index, const Bucket &bucket, bool staged) {
  if (tracing_)
    trace_->describe(index, bucket.count, bucket.dtype, staged);
  return trace(DeviceTrace::kPacked);
}

Status CudaRunner::finish() {
  NNCOMM_RETURN_IF_ERROR(trace(DeviceTrace::kReduced));
  NNCOMM_RETURN_IF_ERROR(BucketRunner::finish());
  return trace(DeviceTrace::kWritten);
}

Status CudaRunner::trace(DeviceTrace::Point point) {
  if (!tracing_)
    return Status::Ok();
  return trace_->mark(current_, point, transport_.stream());
}

Status CudaRunner::close() {
  if (trace_ != nullptr)
    trace_->close();
  return transport_.lead(compute_);
}

// DeviceArrays packs and unpacks on the transport's stream.
void *CudaRunner::stream() const { return transport_.stream(); }

int CudaRunner::device() const { return transport_.device(); }

} // namespace nncomm

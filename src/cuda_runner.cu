#include "nncomm/cuda_runner.hpp"

#include <algorithm>

#include "cuda_calls.hpp"

namespace nncomm {

Status CudaRunner::Create(DeviceTransport &transport, CudaStream compute,
                          std::unique_ptr<CudaRunner> *out) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport.device()));
  std::unique_ptr<CudaPacker> packer;
  NNCOMM_RETURN_IF_ERROR(CudaPacker::Create(&packer));
  out->reset(new CudaRunner(transport, compute, std::move(packer)));
  return Status::Ok();
}

CudaRunner::~CudaRunner() {
  DeviceScope scope;
  if (!scope.enter(transport_.device()).ok())
    return;
  // The transport's stream may still unpack from the staging buffer.
  cudaStreamSynchronize(static_cast<cudaStream_t>(transport_.stream()));
  cudaFree(staging_);
  for (CudaEvent e : ready_)
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

Status CudaRunner::prepare(const std::vector<Bucket> &plan) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  size_t bytes = 0;
  for (const Bucket &b : plan)
    bytes = std::max(bytes, b.count * dtype_size(b.dtype));
  NNCOMM_CUDA_CALL(cudaMalloc, &staging_, std::max<size_t>(bytes, 1));
  ready_.resize(plan.size(), nullptr);
  for (CudaEvent &e : ready_) {
    NNCOMM_CUDA_CALL(cudaEventCreateWithFlags,
                     reinterpret_cast<cudaEvent_t *>(&e),
                     cudaEventDisableTiming);
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

Status CudaRunner::start(size_t index, const Bucket &bucket,
                         const TensorTable &tensors, float scale, int divisor,
                         bool zeros, WorkPtr *work) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  unpack_ = false;
  const auto stream = static_cast<cudaStream_t>(transport_.stream());
  NNCOMM_CUDA_CALL(cudaStreamWaitEvent, stream,
                   static_cast<cudaEvent_t>(ready_[index]), 0);
  if (void *piece = in_place(bucket, tensors, zeros)) {
    return transport_.start_allreduce(piece, bucket.count, bucket.dtype, scale,
                                      divisor, work);
  }
  staged_segments(bucket, tensors, zeros, &segments_);
  NNCOMM_RETURN_IF_ERROR(build_pack_table(segments_.data(), segments_.size(),
                                          bucket.dtype, &table_));
  NNCOMM_RETURN_IF_ERROR(
      packer_->pack(table_, staging_, bucket.dtype, scale, stream, nullptr));
  wire_ = bucket.dtype;
  divisor_ = divisor;
  unpack_ = !zeros;
  return transport_.start_allreduce(staging_, table_.count, bucket.dtype, 1.0f,
                                    1, work);
}

Status CudaRunner::finish() {
  if (!unpack_)
    return Status::Ok();
  unpack_ = false;
  return packer_->unpack(table_, staging_, wire_, 1.0f, divisor_,
                         transport_.stream(), nullptr);
}

Status CudaRunner::close() { return transport_.lead(compute_); }

} // namespace nncomm

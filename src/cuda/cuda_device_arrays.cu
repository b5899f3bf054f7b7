#include "nncomm/cuda/device_arrays.hpp"

#include <cstring>

#include "cuda/cuda_calls.hpp"

namespace nncomm {

namespace {
cudaStream_t stream_of(const DeviceTransport &t) {
  return static_cast<cudaStream_t>(t.stream());
}
} // namespace

Status DeviceArrays::Create(DeviceTransport &transport,
                            std::unique_ptr<DeviceArrays> *out) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport.device()));
  std::unique_ptr<CudaPacker> packer;
  NNCOMM_RETURN_IF_ERROR(CudaPacker::Create(&packer));
  out->reset(new DeviceArrays(transport, std::move(packer)));
  return Status::Ok();
}

DeviceArrays::~DeviceArrays() {
  DeviceScope scope;
  if (!scope.enter(transport_.device()).ok())
    return;
  // Work still pending on the stream may use both buffers.
  cudaStreamSynchronize(stream_of(transport_));
  cudaFree(messages_);
  cudaFreeHost(pinned_);
}

Status DeviceArrays::reserve(size_t bytes, char **buffer) {
  if (bytes > capacity_) {
    DeviceScope scope;
    NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
    NNCOMM_CUDA_CALL(cudaStreamSynchronize, stream_of(transport_));
    NNCOMM_CUDA_CALL(cudaFree, messages_);
    messages_ = nullptr;
    capacity_ = 0;
    NNCOMM_CUDA_CALL(cudaMalloc, reinterpret_cast<void **>(&messages_), bytes);
    capacity_ = bytes;
  }
  *buffer = messages_;
  return Status::Ok();
}

// Messages of the dtypes the packer's kernel does not move (integers,
// float64) are moved by one copy per array, unconverted and unscaled.
Status DeviceArrays::copy_rows(const PackTable &table, char *message,
                               DType wire, bool packing, bool scaled) {
  const size_t size = dtype_size(wire);
  for (const PackEntry &e : table.entries) {
    if (static_cast<DType>(e.dtype) != wire || scaled) {
      return Status::InvalidArgument(
          "on a CUDA device nncomm converts and scales float32, float16 and "
          "bfloat16 only");
    }
    char *tensor = reinterpret_cast<char *>(e.address);
    char *in_message = message + e.bucket_offset * size;
    if (tensor == nullptr) {
      if (packing)
        NNCOMM_RETURN_IF_ERROR(zero(in_message, e.count * size));
      continue;
    }
    NNCOMM_RETURN_IF_ERROR(packing ? copy(in_message, tensor, e.count * size)
                                   : copy(tensor, in_message, e.count * size));
  }
  return Status::Ok();
}

Status DeviceArrays::pack(const PackTable &table, void *message, DType wire,
                          float scale) {
  if (!cuda_packs(wire))
    return copy_rows(table, static_cast<char *>(message), wire, true,
                     scale != 1.0f);
  return packer_->pack(table, message, wire, scale, transport_.stream(),
                       nullptr);
}

Status DeviceArrays::unpack(const PackTable &table, const void *message,
                            DType wire, int divisor) {
  if (!cuda_packs(wire))
    return copy_rows(table, static_cast<char *>(const_cast<void *>(message)),
                     wire, false, divisor != 1);
  return packer_->unpack(table, message, wire, 1.0f, divisor,
                         transport_.stream(), nullptr);
}

Status DeviceArrays::zero(void *p, size_t bytes) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_CUDA_CALL(cudaMemsetAsync, p, 0, bytes, stream_of(transport_));
  return Status::Ok();
}

Status DeviceArrays::copy(void *dst, const void *src, size_t bytes) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_CUDA_CALL(cudaMemcpyAsync, dst, src, bytes, cudaMemcpyDeviceToDevice,
                   stream_of(transport_));
  return Status::Ok();
}

Status DeviceArrays::pinned(size_t bytes) {
  if (bytes <= pinned_capacity_)
    return Status::Ok();
  NNCOMM_CUDA_CALL(cudaStreamSynchronize, stream_of(transport_));
  NNCOMM_CUDA_CALL(cudaFreeHost, pinned_);
  pinned_ = nullptr;
  pinned_capacity_ = 0;
  NNCOMM_CUDA_CALL(cudaMallocHost, reinterpret_cast<void **>(&pinned_), bytes);
  pinned_capacity_ = bytes;
  return Status::Ok();
}

Status DeviceArrays::put(void *dst, const void *host, size_t bytes) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_RETURN_IF_ERROR(pinned(bytes));
  // The copy before may still read the pinned buffer.
  NNCOMM_CUDA_CALL(cudaStreamSynchronize, stream_of(transport_));
  std::memcpy(pinned_, host, bytes);
  NNCOMM_CUDA_CALL(cudaMemcpyAsync, dst, pinned_, bytes,
                   cudaMemcpyHostToDevice, stream_of(transport_));
  return Status::Ok();
}

Status DeviceArrays::get(void *host, const void *src, size_t bytes) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_RETURN_IF_ERROR(pinned(bytes));
  NNCOMM_CUDA_CALL(cudaMemcpyAsync, pinned_, src, bytes,
                   cudaMemcpyDeviceToHost, stream_of(transport_));
  NNCOMM_CUDA_CALL(cudaStreamSynchronize, stream_of(transport_));
  std::memcpy(host, pinned_, bytes);
  return Status::Ok();
}

} // namespace nncomm

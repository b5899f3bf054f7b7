#include "nncomm/cuda/device_arrays.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

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
  cudaFree(flags_);
  cudaFreeHost(found_);
  if (copied_ != nullptr)
    cudaEventDestroy(static_cast<cudaEvent_t>(copied_));
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

Status DeviceArrays::flag_room(size_t more) {
  if (copied_ == nullptr) {
    NNCOMM_CUDA_CALL(cudaEventCreateWithFlags,
                     reinterpret_cast<cudaEvent_t *>(&copied_),
                     cudaEventDisableTiming);
  }
  if (made_ + more <= flag_capacity_)
    return Status::Ok();
  // The findings made so far may still be on their way to the host; once
  // there, the device's flags are no longer needed and both arrays can be
  // replaced (the first iterations only: they grow to a plan's size).
  NNCOMM_CUDA_CALL(cudaStreamSynchronize, stream_of(transport_));
  std::vector<unsigned> kept(found_, found_ + made_);
  NNCOMM_CUDA_CALL(cudaFree, flags_);
  NNCOMM_CUDA_CALL(cudaFreeHost, found_);
  flags_ = found_ = nullptr;
  flag_capacity_ = 0;
  const size_t grown = std::max<size_t>(2 * (made_ + more), 64);
  const size_t bytes = grown * sizeof(unsigned);
  NNCOMM_CUDA_CALL(cudaMalloc, reinterpret_cast<void **>(&flags_), bytes);
  NNCOMM_CUDA_CALL(cudaMallocHost, reinterpret_cast<void **>(&found_), bytes);
  NNCOMM_CUDA_CALL(cudaMemsetAsync, flags_, 0, bytes, stream_of(transport_));
  std::copy(kept.begin(), kept.end(), found_);
  flag_capacity_ = grown;
  return Status::Ok();
}

Status DeviceArrays::flags_set(size_t n) {
  // Copied as soon as set, so that findings() waits for no later work
  // (the last bucket's unpacking, say).
  NNCOMM_CUDA_CALL(cudaMemcpyAsync, found_ + made_, flags_ + made_,
                   n * sizeof(unsigned), cudaMemcpyDeviceToHost,
                   stream_of(transport_));
  NNCOMM_CUDA_CALL(cudaEventRecord, static_cast<cudaEvent_t>(copied_),
                   stream_of(transport_));
  made_ += n;
  return Status::Ok();
}

Status DeviceArrays::pack_checked(const PackTable &table, void *message,
                                  DType wire, float scale) {
  const size_t rows = table.entries.size();
  if (rows == 0)
    return pack(table, message, wire, scale);
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_RETURN_IF_ERROR(flag_room(rows));
  unsigned *flags = flags_ + made_;
  if (cuda_packs(wire)) {
    NNCOMM_RETURN_IF_ERROR(packer_->pack(table, message, wire, scale,
                                         transport_.stream(), nullptr, flags));
  } else {
    // The packer's kernel does not move these rows (copy_rows does): they
    // are checked by themselves, before they are copied.
    for (size_t i = 0; i < rows; ++i) {
      const PackEntry &e = table.entries[i];
      if (e.address == 0)
        continue;
      NNCOMM_RETURN_IF_ERROR(cuda_check_finite(
          reinterpret_cast<const void *>(e.address), e.count,
          static_cast<DType>(e.dtype), flags + i, transport_.stream()));
    }
    NNCOMM_RETURN_IF_ERROR(pack(table, message, wire, scale));
  }
  return flags_set(rows);
}

Status DeviceArrays::check_finite(const void *p, size_t count, DType dt) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_RETURN_IF_ERROR(flag_room(1));
  NNCOMM_RETURN_IF_ERROR(
      cuda_check_finite(p, count, dt, flags_ + made_, transport_.stream()));
  return flags_set(1);
}

Status DeviceArrays::findings(std::vector<bool> *nonfinite) {
  nonfinite->clear();
  if (made_ == 0)
    return Status::Ok();
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(transport_.device()));
  NNCOMM_CUDA_CALL(cudaEventSynchronize, static_cast<cudaEvent_t>(copied_));
  for (size_t i = 0; i < made_; ++i)
    nonfinite->push_back(found_[i] != 0);
  // Zero again for the next checks, which the stream runs after this.
  NNCOMM_CUDA_CALL(cudaMemsetAsync, flags_, 0, made_ * sizeof(unsigned),
                   stream_of(transport_));
  made_ = 0;
  return Status::Ok();
}

} // namespace nncomm

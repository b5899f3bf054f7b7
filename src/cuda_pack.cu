// The CUDA half of packing: one kernel launch moves a whole bucket.
//
// Block b handles tile b of the table: the row whose tiles contain b is
// found by binary search over the rows' first_tile, so blocks never share a
// row's elements and the table is the only per-bucket state on the device.
// Inside a row, elements move in vectors of 16 bytes of the wider dtype
// wherever source and destination reach vector alignment at the same
// element; rows whose two sides are misaligned differently move element by
// element.
#include "nncomm/cuda_pack.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace nncomm {

namespace {

constexpr int kThreads = 256;
static_assert(kPackTileElements % (kThreads * 8) == 0,
              "a tile is whole vectors for every thread");

__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ T from_float(float x);
template <> __device__ float from_float<float>(float x) { return x; }
template <> __device__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x * scale / divisor, as the host twin computes it (scaling.hpp).
template <typename Dst, typename Src>
__device__ Dst convert(Src x, Scaling s, bool identity) {
  if constexpr (std::is_same<Dst, Src>::value) {
    if (identity)
      return x; // bit for bit, NaN payloads included, as the host copies
  }
  float v = __fmul_rn(to_float(x), s.multiply);
  if (s.divide != 1.0f)
    v = __fdiv_rn(v, s.divide);
  return from_float<Dst>(v);
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vector { T v[N]; };

// Moves elements [begin, end) of one row: dst[i] = convert(src[i]), or
// zeros when src is null.
template <typename Dst, typename Src>
__device__ void move_row(Dst *dst, const Src *src, size_t begin, size_t end,
                         Scaling s, bool identity) {
  constexpr int kWide = sizeof(Dst) > sizeof(Src) ? sizeof(Dst) : sizeof(Src);
  constexpr int N = 16 / kWide; // elements per vector
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  // First element at which dst is vector-aligned; src must be there too.
  const size_t head = (N - (d / sizeof(Dst)) % N) % N;
  const bool vectors =
      src == nullptr ||
      (reinterpret_cast<uintptr_t>(src + head) % (sizeof(Src) * N)) == 0;
  size_t first = begin, last = begin; // the vector span [first, last)
  if (vectors && end > head) {
    first = begin < head ? head : head + (begin - head + N - 1) / N * N;
    last = head + (end - head) / N * N;
    if (last < first)
      first = last = begin;
  }
  auto one = [&](size_t i) {
    dst[i] = src == nullptr ? from_float<Dst>(0.0f)
                            : convert<Dst>(src[i], s, identity);
  };
  // The scalar edges: at most N - 1 elements each side of the span.
  for (size_t i = begin + threadIdx.x; i < first; i += blockDim.x)
    one(i);
  for (size_t i = last + threadIdx.x; i < end; i += blockDim.x)
    one(i);
  const size_t n = (last - first) / N;
  Vector<Dst, N> *dv = reinterpret_cast<Vector<Dst, N> *>(dst + first);
  const Vector<Src, N> *sv =
      src == nullptr ? nullptr
                     : reinterpret_cast<const Vector<Src, N> *>(src + first);
  for (size_t k = threadIdx.x; k < n; k += blockDim.x) {
    Vector<Dst, N> out;
    if (sv == nullptr) {
#pragma unroll
      for (int j = 0; j < N; ++j)
        out.v[j] = from_float<Dst>(0.0f);
    } else {
      const Vector<Src, N> in = sv[k];
#pragma unroll
      for (int j = 0; j < N; ++j)
        out.v[j] = convert<Dst>(in.v[j], s, identity);
    }
    dv[k] = out;
  }
}

template <typename Dst, typename Src>
__device__ void move_tile(const PackEntry &e, char *bucket, bool packing,
                          size_t begin, size_t end, Scaling s, bool identity) {
  if (packing) {
    move_row(reinterpret_cast<Dst *>(bucket) + e.bucket_offset,
             reinterpret_cast<const Src *>(e.address), begin, end, s, identity);
  } else {
    move_row(reinterpret_cast<Dst *>(e.address),
             reinterpret_cast<const Src *>(bucket) + e.bucket_offset, begin,
             end, s, identity);
  }
}

template <typename Dst>
__device__ void dispatch_source(DType src, const PackEntry &e, char *bucket,
                                bool packing, size_t begin, size_t end,
                                Scaling s, bool identity) {
  switch (src) {
  case DType::kFloat32:
    move_tile<Dst, float>(e, bucket, packing, begin, end, s, identity);
    break;
  case DType::kFloat16:
    move_tile<Dst, __half>(e, bucket, packing, begin, end, s, identity);
    break;
  case DType::kBFloat16:
    move_tile<Dst, __nv_bfloat16>(e, bucket, packing, begin, end, s, identity);
    break;
  default: break;
  }
}

__global__ void __launch_bounds__(kThreads)
    pack_kernel(const PackEntry *table, size_t rows, char *bucket, DType wire,
                bool packing, Scaling s) {
  const uint64_t tile = blockIdx.x;
  size_t lo = 0, hi = rows; // the last row with first_tile <= tile
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].first_tile <= tile)
      lo = mid;
    else
      hi = mid;
  }
  const PackEntry e = table[lo];
  if (!packing && e.address == 0)
    return; // rows without a tensor are left out when unpacking
  const size_t begin = (tile - e.first_tile) * kPackTileElements;
  const size_t end =
      begin + kPackTileElements < e.count ? begin + kPackTileElements : e.count;
  const DType row = static_cast<DType>(e.dtype);
  const DType src = packing ? row : wire;
  const DType dst = packing ? wire : row;
  const bool identity = src == dst && s.multiply == 1.0f && s.divide == 1.0f;
  switch (dst) {
  case DType::kFloat32:
    dispatch_source<float>(src, e, bucket, packing, begin, end, s, identity);
    break;
  case DType::kFloat16:
    dispatch_source<__half>(src, e, bucket, packing, begin, end, s, identity);
    break;
  case DType::kBFloat16:
    dispatch_source<__nv_bfloat16>(src, e, bucket, packing, begin, end, s,
                                   identity);
    break;
  default: break;
  }
}

bool on_device(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

Status cuda_status(cudaError_t err, const char *call) {
  if (err == cudaSuccess)
    return Status::Ok();
  return Status::RuntimeError(std::string(call) +
                              " failed: " + cudaGetErrorString(err));
}

#define NNCOMM_CUDA_CALL(fn, ...)                                              \
  NNCOMM_RETURN_IF_ERROR(cuda_status(fn(__VA_ARGS__), #fn))

// Makes `device` current for a scope and restores the caller's device.
class DeviceScope {
public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device)
      cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

private:
  int previous_ = 0;
};

} // namespace

bool cuda_packing_built() { return true; }

// What a packer keeps on its device between buckets.
struct CudaPacker::Device {
  int ordinal = 0;
  PackEntry *table = nullptr;   // device copy of the last table uploaded
  PackEntry *staging = nullptr; // pinned host memory the upload reads
  size_t capacity = 0;          // rows both can hold
  std::vector<PackEntry> uploaded;
  cudaEvent_t upload_done = nullptr; // the staging buffer may be rewritten
  cudaEvent_t kernel_done = nullptr; // the device table may be rewritten
  bool launched = false;

  ~Device() {
    DeviceScope scope(ordinal);
    if (launched)
      cudaEventSynchronize(kernel_done);
    cudaFree(table);
    cudaFreeHost(staging);
    if (upload_done != nullptr)
      cudaEventDestroy(upload_done);
    if (kernel_done != nullptr)
      cudaEventDestroy(kernel_done);
  }

  // Makes the device table equal to `rows`, uploading on `stream` only
  // when it changed since the last upload.
  Status upload(const std::vector<PackEntry> &rows, cudaStream_t stream) {
    const size_t bytes = rows.size() * sizeof(PackEntry);
    if (rows.size() == uploaded.size() &&
        std::memcmp(rows.data(), uploaded.data(), bytes) == 0) {
      // Uploaded earlier, maybe on another stream.
      NNCOMM_CUDA_CALL(cudaStreamWaitEvent, stream, upload_done, 0);
      return Status::Ok();
    }
    // The last upload may still read the staging buffer. (The last kernel,
    // which reads the device table, is already ordered before `stream`.)
    if (launched)
      NNCOMM_CUDA_CALL(cudaEventSynchronize, upload_done);
    if (rows.size() > capacity) {
      if (launched)
        NNCOMM_CUDA_CALL(cudaEventSynchronize, kernel_done);
      NNCOMM_CUDA_CALL(cudaFree, table);
      NNCOMM_CUDA_CALL(cudaFreeHost, staging);
      table = nullptr;
      staging = nullptr;
      capacity = 0;
      const size_t grown = rows.size() + rows.size() / 2;
      NNCOMM_CUDA_CALL(cudaMalloc, reinterpret_cast<void **>(&table),
                       grown * sizeof(PackEntry));
      NNCOMM_CUDA_CALL(cudaMallocHost, reinterpret_cast<void **>(&staging),
                       grown * sizeof(PackEntry));
      capacity = grown;
    }
    std::memcpy(staging, rows.data(), bytes);
    NNCOMM_CUDA_CALL(cudaMemcpyAsync, table, staging, bytes,
                     cudaMemcpyHostToDevice, stream);
    NNCOMM_CUDA_CALL(cudaEventRecord, upload_done, stream);
    uploaded = rows;
    return Status::Ok();
  }
};

Status CudaPacker::Create(std::unique_ptr<CudaPacker> *out) {
  std::unique_ptr<Device> device(new Device);
  NNCOMM_CUDA_CALL(cudaGetDevice, &device->ordinal);
  NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &device->upload_done,
                   cudaEventDisableTiming);
  NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &device->kernel_done,
                   cudaEventDisableTiming);
  out->reset(new CudaPacker(std::move(device)));
  return Status::Ok();
}

CudaPacker::CudaPacker(std::unique_ptr<Device> device)
    : device_(std::move(device)) {}

CudaPacker::~CudaPacker() = default;

Status CudaPacker::pack(const PackTable &table, void *bucket, DType wire,
                        float scale, CudaStream stream, CudaEvent after) {
  return launch(table, bucket, wire, make_scaling(scale, 1), true, stream,
                after);
}

Status CudaPacker::unpack(const PackTable &table, const void *bucket,
                          DType wire, float scale, int divisor,
                          CudaStream stream, CudaEvent after) {
  if (divisor < 1)
    return Status::InvalidArgument("divisor must be at least 1");
  return launch(table, bucket, wire, make_scaling(scale, divisor), false,
                stream, after);
}

Status CudaPacker::launch(const PackTable &table, const void *bucket,
                          DType wire, Scaling scaling, bool packing,
                          CudaStream stream, CudaEvent after) {
  if (!on_device(wire)) {
    return Status::InvalidArgument(
        "the CUDA packer moves float32, float16 and bfloat16 only; the wire "
        "dtype is not one of them");
  }
  for (size_t i = 0; i < table.entries.size(); ++i) {
    if (!on_device(static_cast<DType>(table.entries[i].dtype))) {
      return Status::InvalidArgument(
          "the CUDA packer moves float32, float16 and bfloat16 only; segment " +
          std::to_string(i) + " is of another dtype");
    }
  }
  NNCOMM_RETURN_IF_ERROR(check_bucket_address(bucket, wire));
  if (table.entries.empty())
    return Status::Ok();

  DeviceScope scope(device_->ordinal);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (after != nullptr)
    NNCOMM_CUDA_CALL(cudaStreamWaitEvent, s, static_cast<cudaEvent_t>(after),
                     0);
  // One packer's launches run in the order they were issued, whatever their
  // streams, so the table the last one reads is never rewritten under it.
  if (device_->launched)
    NNCOMM_CUDA_CALL(cudaStreamWaitEvent, s, device_->kernel_done, 0);
  NNCOMM_RETURN_IF_ERROR(device_->upload(table.entries, s));
  pack_kernel<<<static_cast<unsigned>(table.tiles), kThreads, 0, s>>>(
      device_->table, table.entries.size(),
      const_cast<char *>(static_cast<const char *>(bucket)), wire, packing,
      scaling);
  NNCOMM_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "pack_kernel"));
  NNCOMM_CUDA_CALL(cudaEventRecord, device_->kernel_done, s);
  device_->launched = true;
  return Status::Ok();
}

} // namespace nncomm

// The CUDA half of packing: one kernel launch moves a whole bucket (block
// b moves tile b, pack_tile.cuh), and the packer that uploads the tables
// and orders the launches on the caller's streams.
#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/core/scaling.hpp"
#include "cuda/cuda_calls.hpp"
#include "cuda/pack_tile.cuh"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace nncomm {

namespace {

constexpr int kThreads = 256;
static_assert(kPackTileBytes % (16 * kThreads) == 0,
              "a full tile is whole vectors for every thread");

// Blocks a multiprocessor should hold of the word-copy kernel: as many as
// fit (its loads in flight are what keeps DRAM busy), which 32 registers a
// thread allow without spilling.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kWordBlocks = 1024 / kThreads; // Turing's threads per SM
#else
constexpr int kWordBlocks = 2048 / kThreads;
#endif

// Block b moves tile b. kWords: every row travels as itself
// (moves_words), so the conversions are left out of the kernel. kCheck
// (packing, NNCOMM_CHECK_FINITE): flags[row] is set where the row's tensor
// holds a NaN or an infinity; the unchecked kernels have none of the
// check's code, and `flags` is null there.
template <bool kWords, bool kCheck>
__global__ void __launch_bounds__(kThreads, kWords ? kWordBlocks : 4)
    pack_kernel(const PackEntry *__restrict__ table, size_t rows, char *bucket,
                DType wire, bool packing, Scaling s, bool copy,
                unsigned *flags) {
  const Lane lane{threadIdx.x, blockDim.x};
  Finding finding;
  if constexpr (kWords)
    copy_bucket_tile<kCheck>(table, rows, bucket, wire, packing, blockIdx.x,
                             lane, &finding);
  else
    move_bucket_tile<kCheck>(table, rows, bucket, wire, packing, s, copy,
                             blockIdx.x, lane, &finding);
  // One vote per block (every thread of a block takes the same path to
  // here); the blocks of a row that found one all store the same 1, so
  // they need no atomic.
  if constexpr (kCheck) {
    if (__syncthreads_or(finding.nonfinite) && threadIdx.x == 0)
      flags[finding.row] = 1;
  }
}

// Block b checks tile b of `count` elements of `dt` at `p`; *flag is set
// where one is a NaN or an infinity.
__global__ void __launch_bounds__(kThreads)
    finite_kernel(const void *p, size_t count, DType dt, unsigned *flag) {
  const bool found =
      check_tile(p, count, dt, blockIdx.x, Lane{threadIdx.x, blockDim.x});
  if (__syncthreads_or(found) && threadIdx.x == 0)
    *flag = 1;
}

// One table in device memory, and the pinned host buffer it is uploaded
// from.
struct TableSlot {
  PackEntry *table = nullptr;
  PackEntry *staging = nullptr;
  size_t capacity = 0;            // rows both can hold
  std::vector<PackEntry> rows;    // what `table` holds; empty when unknown
  cudaEvent_t uploaded = nullptr; // the last upload from `staging`
  uint64_t last_use = 0;

  bool holds(const std::vector<PackEntry> &wanted) const {
    return !rows.empty() && rows.size() == wanted.size() &&
           std::memcmp(rows.data(), wanted.data(),
                       rows.size() * sizeof(PackEntry)) == 0;
  }

  // Makes `table` hold `wanted`, uploading on `stream`. The caller has
  // ordered `stream` after every kernel that may read `table`; `kernels`
  // completes when those kernels have.
  Status upload(const std::vector<PackEntry> &wanted, cudaStream_t stream,
                cudaEvent_t kernels) {
    rows.clear(); // unknown until the upload is enqueued
    if (uploaded == nullptr) {
      NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &uploaded,
                       cudaEventDisableTiming);
    }
    // The last upload may still read the staging buffer.
    NNCOMM_CUDA_CALL(cudaEventSynchronize, uploaded);
    if (wanted.size() > capacity) {
      // cudaFree "may" synchronise, CUDA says, so the host waits for the
      // kernels that read `table` itself.
      if (table != nullptr)
        NNCOMM_CUDA_CALL(cudaEventSynchronize, kernels);
      NNCOMM_CUDA_CALL(cudaFree, table);
      NNCOMM_CUDA_CALL(cudaFreeHost, staging);
      table = nullptr;
      staging = nullptr;
      capacity = 0;
      const size_t grown = wanted.size() + wanted.size() / 2;
      NNCOMM_CUDA_CALL(cudaMalloc, reinterpret_cast<void **>(&table),
                       grown * sizeof(PackEntry));
      NNCOMM_CUDA_CALL(cudaMallocHost, reinterpret_cast<void **>(&staging),
                       grown * sizeof(PackEntry));
      capacity = grown;
    }
    const size_t bytes = wanted.size() * sizeof(PackEntry);
    std::memcpy(staging, wanted.data(), bytes);
    NNCOMM_CUDA_CALL(cudaMemcpyAsync, table, staging, bytes,
                     cudaMemcpyHostToDevice, stream);
    NNCOMM_CUDA_CALL(cudaEventRecord, uploaded, stream);
    rows = wanted;
    return Status::Ok();
  }
};

} // namespace

bool cuda_packing_built() { return true; }

bool cuda_packs(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

// What a packer keeps on its device between buckets: the tables of the
// last `max_tables` distinct buckets, since a training step packs the same
// buckets every iteration and each should find its table already there.
struct CudaPacker::Device {
  int ordinal = 0;
  size_t max_tables = 0;
  std::mutex mutex; // one launch at a time: the slots are shared state
  std::vector<TableSlot> slots;
  std::vector<PackEntry> tiled; // the launch's rows, tiles numbered
  uint64_t uses = 0;
  // After the last work enqueued (an upload or a kernel); every launch
  // waits for it, so all run in the order they were issued.
  cudaEvent_t last_work = nullptr;

  ~Device() {
    DeviceScope scope;
    if (!scope.enter(ordinal).ok())
      return;
    // Events never recorded count as complete; one never created (its
    // creation failed) is no handle to wait on.
    if (last_work != nullptr)
      cudaEventSynchronize(last_work);
    for (TableSlot &slot : slots) {
      if (slot.uploaded != nullptr) {
        cudaEventSynchronize(slot.uploaded);
        cudaEventDestroy(slot.uploaded);
      }
      cudaFree(slot.table);
      cudaFreeHost(slot.staging);
    }
    if (last_work != nullptr)
      cudaEventDestroy(last_work);
  }

  // The device copy of `rows`, on `stream`: a slot that holds them already,
  // else one that holds nothing (a failed upload leaves one), else a new
  // slot while there are fewer than `max_tables`, else the least recently
  // used one, uploaded again.
  Status table_for(const std::vector<PackEntry> &rows, cudaStream_t stream,
                   const PackEntry **table) {
    TableSlot *chosen = nullptr, *empty = nullptr, *oldest = nullptr;
    for (TableSlot &slot : slots) {
      if (slot.holds(rows)) {
        chosen = &slot;
        break;
      }
      if (slot.rows.empty())
        empty = &slot;
      if (oldest == nullptr || slot.last_use < oldest->last_use)
        oldest = &slot;
    }
    // A table found here was uploaded before `last_work`'s latest record,
    // which `stream` already waits for.
    if (chosen == nullptr) {
      if (empty != nullptr) {
        chosen = empty;
      } else if (slots.size() < max_tables) {
        slots.emplace_back();
        chosen = &slots.back();
      } else {
        chosen = oldest;
      }
      NNCOMM_RETURN_IF_ERROR(chosen->upload(rows, stream, last_work));
      // Later launches find the table there even if this one fails.
      NNCOMM_CUDA_CALL(cudaEventRecord, last_work, stream);
    }
    chosen->last_use = ++uses;
    *table = chosen->table;
    return Status::Ok();
  }
};

Status CudaPacker::Create(std::unique_ptr<CudaPacker> *out, size_t max_tables) {
  if (max_tables < 1)
    return Status::InvalidArgument("max_tables must be at least 1");
  std::unique_ptr<Device> device(new Device);
  device->max_tables = max_tables;
  NNCOMM_CUDA_CALL(cudaGetDevice, &device->ordinal);
  NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &device->last_work,
                   cudaEventDisableTiming);
  out->reset(new CudaPacker(std::move(device)));
  return Status::Ok();
}

CudaPacker::CudaPacker(std::unique_ptr<Device> device)
    : device_(std::move(device)) {}

CudaPacker::~CudaPacker() = default;

Status CudaPacker::pack(const PackTable &table, void *bucket, DType wire,
                        float scale, CudaStream stream, CudaEvent after,
                        unsigned *flags) {
  return launch(table, bucket, wire, scale, 1, true, stream, after, flags);
}

Status CudaPacker::unpack(const PackTable &table, const void *bucket,
                          DType wire, float scale, int divisor,
                          CudaStream stream, CudaEvent after) {
  if (divisor < 1)
    return Status::InvalidArgument("divisor must be at least 1");
  return launch(table, bucket, wire, scale, divisor, false, stream, after,
                nullptr);
}

Status CudaPacker::launch(const PackTable &table, const void *bucket,
                          DType wire, float scale, int divisor, bool packing,
                          CudaStream stream, CudaEvent after,
                          unsigned *flags) {
  if (!cuda_packs(wire)) {
    return Status::InvalidArgument(
        "the CUDA packer moves float32, float16 and bfloat16 only; the wire "
        "dtype is not one of them");
  }
  for (size_t i = 0; i < table.entries.size(); ++i) {
    if (!cuda_packs(static_cast<DType>(table.entries[i].dtype))) {
      return Status::InvalidArgument(
          "the CUDA packer moves float32, float16 and bfloat16 only; segment " +
          std::to_string(i) + " is of another dtype");
    }
  }
  NNCOMM_RETURN_IF_ERROR(check_bucket_address(bucket, table.count, wire));
  if (table.entries.empty())
    return Status::Ok();

  std::lock_guard<std::mutex> lock(device_->mutex);
  std::vector<PackEntry> &rows = device_->tiled;
  rows.assign(table.entries.begin(), table.entries.end());
  const uint64_t tiles = assign_tiles(rows.data(), rows.size(), wire);
  if (tiles > static_cast<uint64_t>(INT_MAX)) {
    return Status::InvalidArgument("bucket too large for one launch (" +
                                   std::to_string(table.count) + " elements)");
  }
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(device_->ordinal));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  NNCOMM_CUDA_CALL(cudaStreamIsCapturing, s, &capture);
  if (capture != cudaStreamCaptureStatusNone) {
    return Status::InvalidArgument(
        "the CUDA packer cannot be captured into a CUDA graph (its tables "
        "are uploaded from host memory it reuses)");
  }
  if (after != nullptr)
    NNCOMM_CUDA_CALL(cudaStreamWaitEvent, s, static_cast<cudaEvent_t>(after),
                     0);
  // One packer's work runs in the order it was issued, whatever the
  // streams, so a table is never rewritten under a kernel still reading it.
  NNCOMM_CUDA_CALL(cudaStreamWaitEvent, s, device_->last_work, 0);
  const PackEntry *on_device = nullptr;
  NNCOMM_RETURN_IF_ERROR(device_->table_for(rows, s, &on_device));

  size_t count = rows.size();
  char *out = const_cast<char *>(static_cast<const char *>(bucket));
  Scaling scaling = make_scaling(scale, divisor);
  bool copy = scale == 1.0f && divisor == 1;
  void *args[] = {&on_device, &count,   &out,  &wire,
                  &packing,   &scaling, &copy, &flags};
  const void *kernels[2][2] = {
      {reinterpret_cast<const void *>(&pack_kernel<false, false>),
       reinterpret_cast<const void *>(&pack_kernel<false, true>)},
      {reinterpret_cast<const void *>(&pack_kernel<true, false>),
       reinterpret_cast<const void *>(&pack_kernel<true, true>)}};
  const void *kernel =
      kernels[moves_words(rows.data(), rows.size(), wire, copy)]
             [flags != nullptr];
  NNCOMM_CUDA_CALL(cudaLaunchKernel, kernel,
                   dim3(static_cast<unsigned>(tiles)), dim3(kThreads),
                   args, size_t(0), s);
  NNCOMM_CUDA_CALL(cudaEventRecord, device_->last_work, s);
  return Status::Ok();
}

Status cuda_check_finite(const void *p, size_t count, DType dt,
                         unsigned *flag, CudaStream stream) {
  if (!dtype_is_floating(dt) || count == 0)
    return Status::Ok(); // integers hold no NaN, as on the host
  const uint64_t tiles =
      (count + check_tile_elements(dt) - 1) / check_tile_elements(dt);
  if (tiles > static_cast<uint64_t>(INT_MAX)) {
    return Status::InvalidArgument("array too large for one check (" +
                                   std::to_string(count) + " elements)");
  }
  void *args[] = {&p, &count, &dt, &flag};
  NNCOMM_CUDA_CALL(cudaLaunchKernel,
                   reinterpret_cast<const void *>(&finite_kernel),
                   dim3(static_cast<unsigned>(tiles)), dim3(kThreads), args,
                   size_t(0), static_cast<cudaStream_t>(stream));
  return Status::Ok();
}

} // namespace nncomm

#include "nncomm/transports/staged_transport.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_calls.hpp"

namespace nncomm {

struct StagedTransport::Device {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t staged = nullptr; // the input is in host memory
  char *pinned = nullptr;
  size_t capacity = 0;

  // On the device current to the calling thread.
  static Status Create(std::unique_ptr<Device> *out);
  ~Device() {
    // Pending copies may still use the pinned buffer.
    if (stream != nullptr)
      cudaStreamSynchronize(stream);
    cudaFreeHost(pinned);
    if (staged != nullptr)
      cudaEventDestroy(staged);
    if (stream != nullptr)
      cudaStreamDestroy(stream);
  }

  // At least `bytes` of pinned memory, grown (never shrunk) once the copies
  // still using the old buffer are done.
  Status reserve(size_t bytes) {
    if (bytes <= capacity)
      return Status::Ok();
    const size_t grown = std::max(bytes, capacity + capacity / 2);
    NNCOMM_CUDA_CALL(cudaStreamSynchronize, stream);
    NNCOMM_CUDA_CALL(cudaFreeHost, pinned);
    pinned = nullptr;
    capacity = 0;
    NNCOMM_CUDA_CALL(cudaMallocHost, reinterpret_cast<void **>(&pinned),
                     grown);
    capacity = grown;
    return Status::Ok();
  }
};

namespace {

// A copy between device memory and the pinned buffer.
struct Copy {
  void *dst;
  const void *src;
  size_t bytes;
};

} // namespace

// One operation: the input copies to host, the host operation once they are
// done, then the result copies back.
class StagedTransport::Staged : public Work {
public:
  using HostStart = std::function<Status(WorkPtr *)>;

  Staged(Device &device, std::vector<Copy> in, HostStart host,
         std::vector<Copy> out)
      : device_(device), in_(std::move(in)), host_start_(std::move(host)),
        out_(std::move(out)) {}

  Status begin() {
    DeviceScope scope;
    NNCOMM_RETURN_IF_ERROR(scope.enter(device_.device));
    for (const Copy &c : in_) {
      NNCOMM_CUDA_CALL(cudaMemcpyAsync, c.dst, c.src, c.bytes,
                       cudaMemcpyDeviceToHost, device_.stream);
    }
    NNCOMM_CUDA_CALL(cudaEventRecord, device_.staged, device_.stream);
    return Status::Ok();
  }

  Status test(bool *done) override {
    *done = false;
    if (!host_) {
      const cudaError_t err = cudaEventQuery(device_.staged);
      if (err == cudaErrorNotReady)
        return Status::Ok();
      NNCOMM_RETURN_IF_ERROR(cuda_status(err, "cudaEventQuery"));
      NNCOMM_RETURN_IF_ERROR(host_start_(&host_));
    }
    bool host_done = false;
    NNCOMM_RETURN_IF_ERROR(host_->test(&host_done));
    if (!host_done)
      return Status::Ok();
    DeviceScope scope;
    NNCOMM_RETURN_IF_ERROR(scope.enter(device_.device));
    for (const Copy &c : out_) {
      NNCOMM_CUDA_CALL(cudaMemcpyAsync, c.dst, c.src, c.bytes,
                       cudaMemcpyHostToDevice, device_.stream);
    }
    *done = true;
    return Status::Ok();
  }

  Stall inspect() override { return host_ ? host_->inspect() : Stall(); }

  std::string describe() const override {
    return host_ ? host_->describe() : "copying to host memory";
  }

private:
  Device &device_;
  const std::vector<Copy> in_;
  const HostStart host_start_;
  const std::vector<Copy> out_;
  WorkPtr host_;
};

StagedTransport::StagedTransport(std::unique_ptr<Transport> host,
                                 std::unique_ptr<Device> device)
    : host_(std::move(host)), device_(std::move(device)) {}

StagedTransport::~StagedTransport() = default;

Status StagedTransport::Device::Create(std::unique_ptr<Device> *out) {
  std::unique_ptr<Device> device(new Device);
  NNCOMM_CUDA_CALL(cudaGetDevice, &device->device);
  NNCOMM_CUDA_CALL(cudaStreamCreateWithFlags, &device->stream,
                   cudaStreamNonBlocking);
  NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &device->staged,
                   cudaEventDisableTiming);
  *out = std::move(device);
  return Status::Ok();
}

Status StagedTransport::Create(std::unique_ptr<Transport> host,
                               std::unique_ptr<StagedTransport> *out) {
  std::unique_ptr<Device> device;
  // A rank left without a transport would leave the others waiting for it
  // in their first operation: all fail or none.
  NNCOMM_RETURN_IF_ERROR(
      fail_together(*host, Device::Create(&device),
                    "setting up GPU communication through host memory"));
  out->reset(new StagedTransport(std::move(host), std::move(device)));
  return Status::Ok();
}

int StagedTransport::device() const { return device_->device; }

CudaStream StagedTransport::stream() const { return device_->stream; }

namespace {

// The copies of `blocks` (of elements of `size` bytes) from `staged` back
// to `device`, each block to its own place: the bytes between blocks are
// not the operation's to write.
std::vector<Copy> blocks_back(const Blocks &blocks, size_t size,
                              const char *staged, void *device) {
  std::vector<Copy> copies;
  for (size_t r = 0; r < blocks.counts.size(); ++r) {
    const size_t at = blocks.offsets[r] * size;
    if (blocks.counts[r] > 0) {
      copies.push_back({static_cast<char *>(device) + at, staged + at,
                        blocks.counts[r] * size});
    }
  }
  return copies;
}

// Starts `staged` and hands it out.
template <typename W> Status started(std::unique_ptr<W> staged, WorkPtr *work) {
  NNCOMM_RETURN_IF_ERROR(staged->begin());
  *work = std::move(staged);
  return Status::Ok();
}

} // namespace

Status StagedTransport::start_allreduce(void *buf, size_t count, DType dt,
                                        float scale, int divisor,
                                        WorkPtr *work) {
  const size_t bytes = count * dtype_size(dt);
  NNCOMM_RETURN_IF_ERROR(device_->reserve(bytes));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  return started(
      std::unique_ptr<Staged>(new Staged(
          *device_, {{pinned, buf, bytes}},
          [=](WorkPtr *w) {
            return host->start_allreduce(pinned, count, dt, scale, divisor, w);
          },
          {{buf, pinned, bytes}})),
      work);
}

Status StagedTransport::start_reduce(void *buf, size_t count, DType dt,
                                     int root, int divisor, WorkPtr *work) {
  const size_t bytes = count * dtype_size(dt);
  NNCOMM_RETURN_IF_ERROR(device_->reserve(bytes));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  std::vector<Copy> out;
  if (rank() == root)
    out.push_back({buf, pinned, bytes});
  return started(std::unique_ptr<Staged>(new Staged(
                     *device_, {{pinned, buf, bytes}},
                     [=](WorkPtr *w) {
                       return host->start_reduce(pinned, count, dt, root,
                                                 divisor, w);
                     },
                     std::move(out))),
                 work);
}

Status StagedTransport::start_bcast(void *buf, size_t count, DType dt,
                                    int root, WorkPtr *work) {
  const size_t bytes = count * dtype_size(dt);
  NNCOMM_RETURN_IF_ERROR(device_->reserve(bytes));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  std::vector<Copy> in, out;
  if (rank() == root)
    in.push_back({pinned, buf, bytes});
  else
    out.push_back({buf, pinned, bytes});
  return started(std::unique_ptr<Staged>(new Staged(
                     *device_, std::move(in),
                     [=](WorkPtr *w) {
                       return host->start_bcast(pinned, count, dt, root, w);
                     },
                     std::move(out))),
                 work);
}

Status StagedTransport::start_allgather(const void *send, void *recv,
                                        size_t count, DType dt,
                                        WorkPtr *work) {
  const size_t block = count * dtype_size(dt);
  const size_t all = block * size();
  NNCOMM_RETURN_IF_ERROR(device_->reserve(block + all));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  return started(
      std::unique_ptr<Staged>(new Staged(
          *device_, {{pinned, send, block}},
          [=](WorkPtr *w) {
            return host->start_allgather(pinned, pinned + block, count, dt, w);
          },
          {{recv, pinned + block, all}})),
      work);
}

Status StagedTransport::start_reduce_scatter(const void *send, void *recv,
                                             size_t count, DType dt,
                                             int divisor, WorkPtr *work) {
  const size_t block = count * dtype_size(dt);
  const size_t all = block * size();
  NNCOMM_RETURN_IF_ERROR(device_->reserve(all + block));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  return started(std::unique_ptr<Staged>(new Staged(
                     *device_, {{pinned, send, all}},
                     [=](WorkPtr *w) {
                       return host->start_reduce_scatter(
                           pinned, pinned + all, count, dt, divisor, w);
                     },
                     {{recv, pinned + all, block}})),
                 work);
}

// The blocks keep their offsets in pinned memory, so the host operation
// takes them as they are.
Status StagedTransport::start_alltoallv(const void *send,
                                        const Blocks &send_blocks, void *recv,
                                        const Blocks &recv_blocks, DType dt,
                                        WorkPtr *work) {
  const size_t size = dtype_size(dt);
  const size_t in = send_blocks.extent() * size;
  NNCOMM_RETURN_IF_ERROR(
      device_->reserve(in + recv_blocks.extent() * size));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  return started(
      std::unique_ptr<Staged>(new Staged(
          *device_, {{pinned, send, in}},
          [=](WorkPtr *w) {
            return host->start_alltoallv(pinned, send_blocks, pinned + in,
                                         recv_blocks, dt, w);
          },
          blocks_back(recv_blocks, size, pinned + in, recv))),
      work);
}

Status StagedTransport::start_allgatherv(const void *send, size_t count,
                                         void *recv, const Blocks &blocks,
                                         DType dt, WorkPtr *work) {
  const size_t size = dtype_size(dt);
  const size_t in = count * size;
  NNCOMM_RETURN_IF_ERROR(device_->reserve(in + blocks.extent() * size));
  char *pinned = device_->pinned;
  Transport *host = host_.get();
  return started(
      std::unique_ptr<Staged>(new Staged(
          *device_, {{pinned, send, in}},
          [=](WorkPtr *w) {
            return host->start_allgatherv(pinned, count, pinned + in, blocks,
                                          dt, w);
          },
          blocks_back(blocks, size, pinned + in, recv))),
      work);
}

Status StagedTransport::start_barrier(WorkPtr *work) {
  Transport *host = host_.get();
  return started(std::unique_ptr<Staged>(new Staged(
                     *device_, {},
                     [=](WorkPtr *w) { return host->start_barrier(w); }, {})),
                 work);
}

} // namespace nncomm

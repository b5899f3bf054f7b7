// StagedTransport: collectives on CUDA device memory carried by a host
// transport (MPI): each operation copies its input into pinned host memory
// on the transport's own stream, runs the host operation (chunked, huge
// pages: mpi_transport.hpp), and copies the result back on the stream.
// It serves machines without NCCL, and several ranks on one GPU, which
// NCCL refuses.
//
// Ordered as a DeviceTransport: a Work completes once the result's copy to
// the device is enqueued; the host waits for the device only where the
// host operation needs the data.
#pragma once

#include <memory>

#include "nncomm/transports/device_transport.hpp"

namespace nncomm {

class StagedTransport : public DeviceTransport {
public:
  // A transport on the device current to the calling thread, over `host`.
  // Collective over `host`'s ranks; fails on every rank when it fails on
  // one (fail_together).
  static Status Create(std::unique_ptr<Transport> host,
                       std::unique_ptr<StagedTransport> *out);
  ~StagedTransport() override;
  StagedTransport(const StagedTransport &) = delete;
  StagedTransport &operator=(const StagedTransport &) = delete;

  Transport &host() override { return *host_; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int device() const override;
  CudaStream stream() const override;

  Status start_allreduce(void *buf, size_t count, DType dt, float scale,
                         int divisor, WorkPtr *work) override;
  Status start_reduce(void *buf, size_t count, DType dt, int root,
                      int divisor, WorkPtr *work) override;
  Status start_bcast(void *buf, size_t count, DType dt, int root,
                     WorkPtr *work) override;
  Status start_allgather(const void *send, void *recv, size_t count,
                         DType dt, WorkPtr *work) override;
  Status start_reduce_scatter(const void *send, void *recv, size_t count,
                              DType dt, int divisor, WorkPtr *work) override;
  Status start_alltoallv(const void *send, const Blocks &send_blocks,
                         void *recv, const Blocks &recv_blocks, DType dt,
                         WorkPtr *work) override;
  Status start_allgatherv(const void *send, size_t count, void *recv,
                          const Blocks &blocks, DType dt,
                          WorkPtr *work) override;
  Status start_barrier(WorkPtr *work) override;
  Status agree(uint64_t value, bool *same) override {
    return host_->agree(value, same);
  }
  Status unite(uint64_t *words, size_t count) override {
    return host_->unite(words, count);
  }
  Status check_call(uint64_t signature, bool always) override {
    return host_->check_call(signature, always);
  }

private:
  struct Device;
  class Staged;
  StagedTransport(std::unique_ptr<Transport> host,
                  std::unique_ptr<Device> device);

  const std::unique_ptr<Transport> host_;
  const std::unique_ptr<Device> device_;
};

} // namespace nncomm

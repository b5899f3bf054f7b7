// NcclTransport: collectives on CUDA device memory over one NCCL
// communicator, on a stream of its own, for ranks that each have a GPU of
// their own (NCCL refuses two ranks on one device). The host transport
// (MPI) carries the communicator's unique id, the agreements and call
// checks, and the host's own small messages. A Work completes once its
// operation has passed on the device: it is polled, with NCCL's
// asynchronous errors, so that its wait is bounded like every other (a
// communicator left with an operation that never completes is aborted,
// not destroyed). NCCL tells nothing of the other ranks while a wait
// lasts; the end notices (ended_ranks.hpp) tell which have ended without
// making the call.
#pragma once

#include <memory>

#include "nncomm/transports/device_transport.hpp"
#include "nncomm/transports/mpi_transport.hpp"
#include "nncomm/transports/nccl_api.hpp"

namespace nncomm {

class NcclTransport : public DeviceTransport {
public:
  // A communicator over `host`'s ranks on the device current to the
  // calling thread. Collective over `host`'s ranks; fails on every rank
  // when it fails on one (fail_together), at once rather than at
  // NNCOMM_TIMEOUT, except where NCCL itself hangs.
  static Status Create(const NcclApi &api,
                       std::unique_ptr<MpiTransport> host,
                       std::unique_ptr<NcclTransport> *out);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport &) = delete;
  NcclTransport &operator=(const NcclTransport &) = delete;

  Transport &host() override { return *host_; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int device() const override { return device_; }
  CudaStream stream() const override { return stream_; }

  Status start_allreduce(void *buf, size_t count, DType dt, float scale,
                         int divisor, WorkPtr *work) override;
  bool scales_precisely(DType dt, float scale, int divisor) const override;
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
  Status start_barrier(WorkPtr *work) override {
    return host_->start_barrier(work);
  }
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
  class Launched;
  NcclTransport(const NcclApi &api, std::unique_ptr<MpiTransport> host);
  // This rank's steps before the communicator: the device, the stream and
  // event, and on rank 0 the communicator's unique id, into `*id`.
  Status prepare(nccl::UniqueId *id);
  // Starts `call`, which `enqueue(op)` puts on the stream, `op` being the
  // reduction of `scale` and `divisor` (reduction()); an operation that
  // reduces nothing passes 1 and 1 and ignores it. On success, `*work`
  // completes when the operation has passed on the device.
  template <typename Enqueue>
  Status start(const char *call, DType dt, float scale, int divisor,
               Enqueue enqueue, WorkPtr *work);
  Status nccl_status(nccl::Result result, const char *call) const;
  // Enqueues as one NCCL group, for each rank r, the send of block r of
  // `send` to r and the receive of block r of `recv` from r (empty blocks
  // left out).
  nccl::Result exchange(const void *send, const Blocks &to, void *recv,
                        const Blocks &from, DType dt) const;
  Status reduction(DType dt, float scale, int divisor, nccl::RedOp *op,
                   bool *created);

  const NcclApi &api_;
  const std::unique_ptr<MpiTransport> host_;
  // For the end notices: the same on every rank.
  const uint64_t id_;
  uint64_t begun_ = 0; // operations started
  int device_ = 0;
  CudaStream stream_ = nullptr;
  CudaEvent done_ = nullptr; // recorded after each operation
  nccl::Comm comm_ = nullptr;
};

} // namespace nncomm

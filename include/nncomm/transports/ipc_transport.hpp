// IpcTransport: collectives on CUDA device memory among ranks of one host
// that read each other's device memory directly (CUDA IPC), for ranks
// sharing a GPU, which NCCL refuses and host staging serves at the speed of
// host memory. Each rank exports two slots of device memory; an operation
// goes through them in chunks: a rank copies its chunk into its slot, the
// ranks meet in a barrier on the host once each has seen its copy
// complete, and each then reads the others' slots (a sum kernel, or
// copies) into its own result. A slot is written again two chunks later,
// after a barrier that every rank enters only once its reads of that slot
// have completed: completion is established on the host, never by events
// shared between processes. A rank's exported slots are kept until the
// process ends (see Slots in the .cu file), and recycled: a transport over
// the same processes takes the slots of one that is gone, where every
// rank's is gone (agreed when it is made), so that making a transport
// again and again (a callback per step) costs no more device memory.
//
// Sums run in rank order, rounded as the host's (sum_tile.cuh), so every
// rank gets the same bits. all_reduce, reduce, bcast, all_gather and
// reduce_scatter of at least config::ipc_min_bytes() go through the slots;
// smaller ones, every one inside comm.join() (whose ranks that left follow
// the others' MPI calls) and the others, through the host-staged transport
// it is made over, on the same stream.
#pragma once

#include <functional>
#include <memory>

#include "nncomm/transports/staged_transport.hpp"

namespace nncomm {

class IpcTransport : public DeviceTransport {
public:
  // The most ranks one transport serves.
  static constexpr int kMaxRanks = 8;

  // A transport over `*staged`'s ranks (at most kMaxRanks, on this host),
  // which it takes over; on failure `*staged` is left as it was (for the
  // caller to fall back on). Collective; fails on every rank when it fails
  // on one.
  static Status Create(std::unique_ptr<StagedTransport> *staged,
                       std::unique_ptr<IpcTransport> *out);
  ~IpcTransport() override;
  IpcTransport(const IpcTransport &) = delete;
  IpcTransport &operator=(const IpcTransport &) = delete;

  Transport &host() override { return staged_->host(); }
  int rank() const override { return staged_->rank(); }
  int size() const override { return staged_->size(); }
  int device() const override { return staged_->device(); }
  CudaStream stream() const override { return staged_->stream(); }

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
                         WorkPtr *work) override {
    return staged_->start_alltoallv(send, send_blocks, recv, recv_blocks, dt,
                                    work);
  }
  Status start_allgatherv(const void *send, size_t count, void *recv,
                          const Blocks &blocks, DType dt,
                          WorkPtr *work) override {
    return staged_->start_allgatherv(send, count, recv, blocks, dt, work);
  }
  Status start_barrier(WorkPtr *work) override {
    return staged_->start_barrier(work);
  }
  Status agree(uint64_t value, bool *same) override {
    return staged_->agree(value, same);
  }
  Status unite(uint64_t *words, size_t count) override {
    return staged_->unite(words, count);
  }
  Status check_call(uint64_t signature, bool always) override {
    return staged_->check_call(signature, always);
  }

private:
  struct Slots;
  class Chunked;
  // One chunk's part of an operation: its copies into this rank's slot
  // (fill), or its reads of every rank's (use).
  using Step = std::function<Status(size_t chunk, uint64_t slot)>;
  // Whether an operation whose largest buffer holds `bytes` goes through
  // host memory (config::ipc_min_bytes(), and every one inside
  // comm.join()).
  bool staged(size_t bytes) const;
  // Starts the sum of every rank's `buf` into this rank's `buf` where it
  // `receives` (all_reduce: every rank; reduce: the root).
  Status start_sum(const char *name, void *buf, size_t count, DType dt,
                   float scale, int divisor, bool receives, WorkPtr *work);
  // Starts an operation of `chunks` chunks; `name`: a literal.
  Status start(const char *name, size_t chunks, Step fill, Step use,
               WorkPtr *work);
  class Pool;
  IpcTransport(std::unique_ptr<StagedTransport> staged, Slots *slots);

  const std::unique_ptr<StagedTransport> staged_;
  Slots *const slots_; // the pool's, in use by this transport alone
};

} // namespace nncomm

// Transport: the collectives nncomm runs on one group of ranks, whatever
// carries them: MPI on host memory (mpi_transport.hpp) today, NCCL and
// host-staged MPI on GPU memory beside it. The engine, the bucket runners
// and the list collectives see only this interface, so each is testable on
// an in-process fake (tests/unit/fake_transport.hpp).
//
// An operation is started and hands back a Work; waiting for it is the
// caller's business (wait.hpp), so a background thread polls at its own
// pace while a caller's thread lets Ctrl-C through. Every rank of the group
// starts the same operations in the same order, one at a time: a Work is
// waited for before the next operation starts. One thread at a time per
// transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

struct Polling;

// What a long wait has learned about the other ranks, by world rank.
struct Stall {
  bool known = false;         // the transport can tell (else: nothing)
  std::vector<int> missing;   // not arrived at this operation yet
  std::vector<int> differing; // at it with another call: it cannot complete
  std::vector<int> ended;     // ended before this operation: neither can it
};

class Work {
public:
  virtual ~Work() = default;
  // Advances the operation; sets `*done` once its results are in place.
  virtual Status test(bool *done) = 0;
  // Called about every 200 ms once the wait has lasted a second: tells the
  // other ranks that this one is here, and says what is known of them.
  virtual Stall inspect() { return {}; }
  // The operation, for messages: "operation 12 on the group of world
  // ranks [0, 1]".
  virtual std::string describe() const = 0;
};
using WorkPtr = std::unique_ptr<Work>;

// Where each rank's block lies in a buffer: rank r's `counts[r]` elements
// from element `offsets[r]` on.
struct Blocks {
  std::vector<size_t> counts;
  std::vector<size_t> offsets;

  // Blocks of `counts` back to back, in rank order.
  static Blocks packed(std::vector<size_t> counts);
  // Elements from the buffer's start to the end of its last block.
  size_t extent() const;
};

class Transport {
public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A transport over the same ranks on host memory, for small messages of
  // the host's own (e.g. a flag round): this one, unless it works on device
  // memory. Operations on it and on this one are one sequence.
  virtual Transport &host() { return *this; }

  // Starts buf = (sum over ranks of buf * scale) / divisor, in place; the
  // arithmetic as scaling.hpp says. Integer dtypes only with 1 and 1.
  virtual Status start_allreduce(void *buf, size_t count, DType dt,
                                 float scale, int divisor, WorkPtr *work) = 0;
  // Whether start_allreduce scales `dt` by `scale` / `divisor` losing no
  // more than the dtype's own rounding; where not (NCCL's one scalar in a
  // 16-bit dtype), callers scale while packing instead.
  virtual bool scales_precisely(DType dt, float scale, int divisor) const {
    return true;
  }
  // Sums `buf` into `root`'s `buf`, divided there by `divisor`; the
  // other ranks' stay unchanged.
  virtual Status start_reduce(void *buf, size_t count, DType dt, int root,
                              int divisor, WorkPtr *work) = 0;
  virtual Status start_bcast(void *buf, size_t count, DType dt, int root,
                             WorkPtr *work) = 0;
  // `recv` holds size() blocks of `count`, block r from rank r.
  virtual Status start_allgather(const void *send, void *recv, size_t count,
                                 DType dt, WorkPtr *work) = 0;
  // `send` holds size() blocks of `count`; rank r gets the sum of block r,
  // divided by `divisor`.
  virtual Status start_reduce_scatter(const void *send, void *recv,
                                      size_t count, DType dt, int divisor,
                                      WorkPtr *work) = 0;
  // Block s of `send` goes to rank s, into its recv block for this rank;
  // there, that block's count is this block's count here.
  virtual Status start_alltoallv(const void *send, const Blocks &send_blocks,
                                 void *recv, const Blocks &recv_blocks,
                                 DType dt, WorkPtr *work) = 0;
  // The `count` elements of `send` land in every rank's recv block for
  // this rank: `blocks.counts[r]` is rank r's count, the same everywhere.
  virtual Status start_allgatherv(const void *send, size_t count, void *recv,
                                  const Blocks &blocks, DType dt,
                                  WorkPtr *work) = 0;
  virtual Status start_barrier(WorkPtr *work) = 0;

  // Sets `*same` to whether every rank passed the same `value`.
  virtual Status agree(uint64_t value, bool *same) = 0;
  // Sets each of the `count` `words` to the bitwise OR of every rank's.
  virtual Status unite(uint64_t *words, size_t count) = 0;
  // Checks that the ranks make the same call, `signature` being what every
  // rank must agree on: compared across the ranks the first time this
  // signature comes on this transport (every time with `always`), together
  // with every call since the last comparison. Fails on every rank that
  // compared when they differ; a rank whose call was not compared learns of
  // it from the stall reports of its next wait (Work::inspect).
  virtual Status check_call(uint64_t signature, bool always) = 0;

  // Start-and-wait forms, waited for as `polling` says (wait.hpp).
  Status allreduce(void *buf, size_t count, DType dt, float scale = 1.0f,
                   int divisor = 1, const Polling *polling = nullptr);
  Status reduce(void *buf, size_t count, DType dt, int root, int divisor = 1);
  Status bcast(void *buf, size_t count, DType dt, int root);
  Status allgather(const void *send, void *recv, size_t count, DType dt);
  Status reduce_scatter(const void *send, void *recv, size_t count, DType dt,
                        int divisor = 1);
  Status alltoallv(const void *send, const Blocks &send_blocks, void *recv,
                   const Blocks &recv_blocks, DType dt);
  Status allgatherv(const void *send, size_t count, void *recv,
                    const Blocks &blocks, DType dt);
  Status barrier();
};

// For a step that can fail on one rank alone just before a collective,
// which the other ranks would wait in until NNCOMM_TIMEOUT: every rank
// passes how its step went (`mine`), and every rank fails where any did.
// A rank that failed keeps its own error; the others get one naming the
// ranks that failed `step` ("creating the NCCL communicator") and the first
// one's error. One small all-gather on `t`'s host transport; collective.
Status fail_together(Transport &t, const Status &mine,
                     const std::string &step);

} // namespace nncomm

// MpiTransport: the collectives nncomm needs, on one MPI communicator.
//
// The transport owns a duplicate of the communicator it is built from, so
// nncomm's messages never match a user's own MPI traffic, and sets
// MPI_ERRORS_RETURN on it so failures come back as a Status instead of
// aborting the job. Buffers are raw host memory. Every call returns when its
// operation is complete and is made without the GIL by the binding, but
// waits on a nonblocking MPI operation, so that the wait is bounded
// (config::timeout_seconds()), reports stalls (stall_inspector.hpp) and
// lets Ctrl-C through (wait.hpp). One thread at a time per transport.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <mpi.h>

#include "nncomm/dtype.hpp"
#include "nncomm/stall_inspector.hpp"
#include "nncomm/status.hpp"

namespace nncomm {

// How a background thread waits for a nonblocking reduction: it tests the
// request every `interval_us` microseconds and sleeps in between, so that
// its core goes to computation (MPICH's blocking calls would spin on it),
// until `*hurry` is set: then the computation is itself waiting for the
// reduction, and the thread tests again as soon as the scheduler lets it
// (yielding, so that ranks sharing cores still get theirs). Once `*cancel`
// is set the wait gives up (the thread is being stopped). Such a thread
// never runs Python's signal handlers. Without a Polling, the caller's
// thread tests, yielding in between, and runs them.
struct Polling {
  int interval_us = 0;
  const std::atomic<bool> *hurry = nullptr;
  const std::atomic<bool> *cancel = nullptr;
};

// Names the operation under way on this thread in stall reports and
// timeout messages, for its scope: a printf format with up to two integers
// (e.g. "all_reduce of %zu arrays"), formatted only when a message needs it.
class OperationLabel {
public:
  explicit OperationLabel(const char *format, size_t a = 0, size_t b = 0);
  ~OperationLabel();
  static std::string current();

private:
  const char *format_;
  size_t a_, b_;
  const OperationLabel *previous_;
};

class MpiTransport {
public:
  // A transport over a duplicate of `comm`. Collective over `comm`.
  static Status Create(MPI_Comm comm, std::unique_ptr<MpiTransport> *out);
  // A transport over the ranks `ranks` of `parent`, numbered in that order.
  // Collective over those ranks only; `parent`'s other ranks need not call.
  // A caller outside `ranks` must not call it.
  static Status CreateGroup(const MpiTransport &parent,
                            const std::vector<int> &ranks,
                            std::unique_ptr<MpiTransport> *out);
  // A transport over a new duplicate of this one's communicator, for a
  // thread that must not interleave its collectives with others' on this
  // one. Collective over this transport's ranks.
  Status Duplicate(std::unique_ptr<MpiTransport> *out) const {
    return Create(comm_, out);
  }
  ~MpiTransport();
  MpiTransport(const MpiTransport &) = delete;
  MpiTransport &operator=(const MpiTransport &) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes that share this one's memory (same host).
  int local_rank() const { return local_rank_; }

  // Work on one piece of a large buffer (its address and element count).
  using PieceFn = std::function<void(void *piece, size_t count)>;

  // Sums `buf` over all ranks, in place; with `polling`, nonblocking and
  // waited for as it says, else blocking. Large buffers travel in pieces;
  // `before` and `after`, when given, run on each piece just before and
  // after it is summed, while it is still in cache, which saves the memory
  // pass a separate scaling or division over `buf` would cost.
  Status allreduce(void *buf, size_t count, DType dt,
                   const Polling *polling = nullptr,
                   const PieceFn &before = nullptr,
                   const PieceFn &after = nullptr) const;
  // Sums `buf` into `root`'s `buf`; other ranks' `buf` stay unchanged.
  Status reduce(void *buf, size_t count, DType dt, int root) const;
  Status bcast(void *buf, size_t count, DType dt, int root) const;
  // `recv` holds size() blocks of `count`, block r from rank r.
  Status allgather(const void *send, void *recv, size_t count, DType dt) const;
  // `send` holds size() blocks of `count`; rank r gets the sum of block r.
  Status reduce_scatter(const void *send, void *recv, size_t count,
                        DType dt) const;
  Status barrier() const;
  // Sets `*same` to whether every rank passed the same `value`.
  Status agree(uint64_t value, bool *same) const;
  // Checks that the ranks make the same call, `signature` being what every
  // rank must agree on: compared across the ranks the first time this
  // signature comes on this transport (every time with `always`), together
  // with every call since the last comparison, on a communicator of its own
  // (so a rank that did not compare cannot match it with a collective).
  // Fails on every rank that compared when they differ; a rank whose call
  // was not compared, because it had made it before, learns of it from the
  // stall reports (wait()) and fails too.
  Status check_call(uint64_t signature, bool always) const;
  // Ends the whole job: MPI_Abort on this communicator.
  void abort(int errorcode) const;

private:
  explicit MpiTransport(MPI_Comm comm) : comm_(comm) {}
  // `created`: the request completing the communicator, or null.
  Status Init(MPI_Request *created);
  // Waits for `*request`, the next step of the operation `begin()` opened.
  Status wait(MPI_Request *request, const Polling *polling) const;
  // Sets `*same` to whether every rank passed the same `value`, compared
  // on `comm` (this transport's, or the one kept for check_call()).
  Status same_everywhere(MPI_Comm comm, uint64_t value, bool *same) const;
  // Opens the next operation, whose `fingerprint` (kind, count, dtype,
  // root) the stall reports carry: fails at once after an earlier failed
  // wait. `phase` 1: the check of a call (check_call()).
  Status begin(uint64_t fingerprint, uint64_t phase = 0) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
  int local_rank_ = 0;
  MPI_Comm check_comm_ = MPI_COMM_NULL; // check_call()'s rounds only
  // The operation under way: counted, the same on every rank while their
  // calls match.
  mutable StallInspector::Position at_;
  mutable std::unique_ptr<StallInspector> inspector_;
  // Signatures of calls compared across the ranks, and the fold of every
  // call's signature since the last comparison.
  mutable std::unordered_set<uint64_t> checked_;
  mutable uint64_t unchecked_ = 0;
};

} // namespace nncomm

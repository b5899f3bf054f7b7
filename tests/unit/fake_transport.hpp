// FakeTransport: nncomm's Transport for N ranks in one process, one thread
// per rank, so that what is built on the interface (engine, bucket
// runners, list collectives, waits) is tested without MPI. A FakeWorld
// holds what its ranks share.
//
// Each rank's k-th operation meets the other ranks' k-th, and completes
// once every rank has started it, with MpiTransport's results: sums in
// rank order 0, 1, ..., in the dtype, 16-bit floats widened to float for
// each addition and rounded back; an all-reduce's scale applied to each
// rank's share before the sum and its divisor after, by convert_scaled.
// Ranks starting different calls at the same position (kind, count, dtype,
// root) fail there at once, each with InvalidArgument naming both calls,
// where MpiTransport learns of them from its stall reports: a test never
// hangs on them, and their data is never mixed.
//
// The tests control when ranks arrive (a rank's delay; a rank no thread
// drives never arrives, and the others' waits report it missing) and which
// operations fail (Status::Transport), and read each rank's log of the
// calls it started.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "nncomm/transports/transport.hpp"

namespace unit {

enum class OpKind {
  kAllreduce,
  kReduce,
  kBcast,
  kAllgather,
  kReduceScatter,
  kAlltoallv,
  kAllgatherv,
  kBarrier,
  kAgree,
  kCheck, // check_call()'s comparison
  kUnite,
};

// What ranks must agree on for their operations to meet, as MpiTransport's
// stall reports fingerprint it. Two ranks comparing calls (kCheck) meet
// whatever their signatures: the comparison itself tells them apart.
// The count of an alltoallv is 0 (its counts differ between ranks), that
// of an allgatherv the sum of its blocks'.
struct Call {
  OpKind kind;
  size_t count = 0;
  nncomm::DType dtype = nncomm::DType::kInt64;
  int root = 0;

  bool operator==(const Call &other) const {
    return kind == other.kind && count == other.count &&
           dtype == other.dtype && root == other.root;
  }
  bool operator!=(const Call &other) const { return !(*this == other); }
};
// "allreduce of 4 float32", "bcast of 3 int64 from 1", "barrier".
std::ostream &operator<<(std::ostream &out, const Call &call);

struct LoggedOp {
  Call call;
  const void *buffer; // the one the rank passed (the send buffer, if two)
};

class FakeTransport;

class FakeWorld {
public:
  // `world_ranks[r]`: how messages name rank r (default: r).
  explicit FakeWorld(int size, std::vector<int> world_ranks = {});
  FakeWorld(const FakeWorld &) = delete;
  FakeWorld &operator=(const FakeWorld &) = delete;

  int size() const { return size_; }
  // Rank `rank`'s transport: one per rank; the world outlives it.
  std::unique_ptr<FakeTransport> transport(int rank);

  // Rank `rank` arrives `delay` late at every operation it starts.
  void set_delay(int rank, std::chrono::microseconds delay);
  // The `index`-th operation rank `rank` starts (0: its first) fails
  // there with Status::Transport; the other ranks' complete.
  void fail_operation(int rank, size_t index);
  // The operations rank `rank` started, in order.
  std::vector<LoggedOp> log(int rank) const;
  std::vector<Call> calls(int rank) const;

private:
  friend class FakeTransport;
  friend class FakeWork;
  using Clock = std::chrono::steady_clock;

  struct Arrival {
    Call call;
    Clock::time_point seen_at;   // by the other ranks
    std::vector<char> share;     // what the rank sends, copied when started
    // Of an alltoallv or allgatherv: the elements the rank sends to each
    // rank (its share holds them back to back) and expects from each.
    std::vector<size_t> sends, expects;
  };
  struct Operation {
    std::vector<std::optional<Arrival>> arrivals; // by rank
    bool computed = false;
    std::vector<std::vector<char>> results; // by rank; empty: nothing comes
    std::string error; // ranks whose counts do not match, where MPI fails
  };

  // Rank `rank` starts its next operation; returns the operation's index.
  size_t arrive(int rank, const Call &call, const void *buffer,
                Arrival arrival);
  // Fills `op.results` from the shares, once every rank has arrived.
  void compute(Operation &op) const;
  // An alltoallv's or allgatherv's results: rank r gets each rank's block
  // for r (of an allgatherv: its whole share; `own_blocks`: the share's
  // r-th block), or `op.error` names ranks whose counts do not match.
  void exchange_blocks(Operation &op, size_t elem, bool own_blocks) const;
  std::string describe(size_t index) const;

  const int size_;
  std::vector<int> world_ranks_;
  mutable std::mutex mutex_; // everything below
  std::map<size_t, Operation> operations_;
  std::vector<std::vector<LoggedOp>> logs_; // by rank
  std::vector<Clock::duration> delays_;     // by rank
  std::set<std::pair<int, size_t>> failing_;
};

class FakeTransport : public nncomm::Transport {
public:
  FakeTransport(FakeWorld &world, int rank) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }

  nncomm::Status start_allreduce(void *buf, size_t count, nncomm::DType dt,
                                 float scale, int divisor,
                                 nncomm::WorkPtr *work) override;
  nncomm::Status start_reduce(void *buf, size_t count, nncomm::DType dt,
                              int root, int divisor,
                              nncomm::WorkPtr *work) override;
  nncomm::Status start_bcast(void *buf, size_t count, nncomm::DType dt,
                             int root, nncomm::WorkPtr *work) override;
  nncomm::Status start_allgather(const void *send, void *recv, size_t count,
                                 nncomm::DType dt,
                                 nncomm::WorkPtr *work) override;
  nncomm::Status start_reduce_scatter(const void *send, void *recv,
                                      size_t count, nncomm::DType dt,
                                      int divisor,
                                      nncomm::WorkPtr *work) override;
  nncomm::Status start_alltoallv(const void *send,
                                 const nncomm::Blocks &send_blocks,
                                 void *recv,
                                 const nncomm::Blocks &recv_blocks,
                                 nncomm::DType dt,
                                 nncomm::WorkPtr *work) override;
  nncomm::Status start_allgatherv(const void *send, size_t count, void *recv,
                                  const nncomm::Blocks &blocks,
                                  nncomm::DType dt,
                                  nncomm::WorkPtr *work) override;
  nncomm::Status start_barrier(nncomm::WorkPtr *work) override;
  nncomm::Status agree(uint64_t value, bool *same) override;
  nncomm::Status unite(uint64_t *words, size_t count) override;
  nncomm::Status check_call(uint64_t signature, bool always) override;
  // As NCCL's pre-multiplied sum in a 16-bit dtype: scaling said to be
  // imprecise (the arithmetic stays exact) once scale_imprecisely() is
  // called.
  bool scales_precisely(nncomm::DType, float scale,
                        int divisor) const override {
    return precise_ || (scale == 1.0f && divisor == 1);
  }
  void scale_imprecisely() { precise_ = false; }

private:
  // Starts `call` with `arrival` as this rank's side; the result lands in
  // `out`, divided by `divisor`; with `blocks`, the result being the
  // blocks received from each rank in rank order, as `blocks` lays them
  // out.
  nncomm::Status start(const Call &call, const void *buffer,
                       FakeWorld::Arrival arrival, void *out, int divisor,
                       std::optional<nncomm::Blocks> blocks,
                       nncomm::WorkPtr *work);
  // The same with `share` as this rank's contribution.
  nncomm::Status start(const Call &call, const void *buffer,
                       std::vector<char> share, void *out, int divisor,
                       nncomm::WorkPtr *work);
  // agree() and check_call(): whether every rank passed `value`.
  nncomm::Status compare(OpKind kind, uint64_t value, bool *same);

  FakeWorld &world_;
  const int rank_;
  // As MpiTransport's: signatures compared, and the fold since the last
  // comparison.
  std::unordered_set<uint64_t> checked_;
  uint64_t unchecked_ = 0;
  bool precise_ = true;
};

// Runs `body(rank)` for each of `size` ranks, each on a thread of its own,
// and returns once all have.
void run_ranks(int size, const std::function<void(int rank)> &body);

} // namespace unit

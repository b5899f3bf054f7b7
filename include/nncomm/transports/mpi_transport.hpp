// MpiTransport: the Transport over one MPI communicator, on host memory.
//
// The transport owns a duplicate of the communicator it is built from, so
// nncomm's messages never match a user's own MPI traffic, and sets
// MPI_ERRORS_RETURN on it so failures come back as a Status instead of
// aborting the job. Every operation is a nonblocking MPI call, so that its
// wait (wait.hpp) is bounded, and every operation is announced to the
// stall inspector (stall_inspector.hpp) by a position the same on every
// rank making the same call. Reductions of large buffers travel in pieces
// (config::chunk_bytes()), each scaled and divided next to its reduction,
// while it is still in cache. Across hosts, all-reduces may run in two
// levels (hierarchical_allreduce.hpp), as the pieces of one operation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include <mpi.h>

#include "nncomm/observability/flight_recorder.hpp"
#include "nncomm/observability/stall_inspector.hpp"
#include "nncomm/transports/hierarchical_allreduce.hpp"
#include "nncomm/transports/join.hpp"
#include "nncomm/transports/transport.hpp"

namespace nncomm {

class MpiTransport : public Transport {
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
  // one. Collective over this transport's ranks: an operation of this one.
  // `role`: what it is for, in its operations' messages (a literal), or
  // null.
  Status Duplicate(std::unique_ptr<MpiTransport> *out,
                   const char *role = nullptr);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport &) = delete;
  MpiTransport &operator=(const MpiTransport &) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Rank among the processes that share this one's memory (same host).
  int local_rank() const { return local_rank_; }

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
  Status agree(uint64_t value, bool *same) override;
  Status unite(uint64_t *words, size_t count) override;
  // Compares on a communicator of its own, so that a rank that did not
  // compare cannot match the comparison with a collective.
  Status check_call(uint64_t signature, bool always) override;
  // Ends the whole job: MPI_Abort on this communicator.
  void abort(int errorcode) const;

  // For Join (join.hpp) and the end notices (ended_ranks.hpp). The same on
  // every rank: `id` names the transport (by how it was made), `seq`
  // counts its operations.
  uint64_t id() const { return id_; }
  uint64_t seq() const { return at_.seq; }
  uint64_t created_seq() const { return created_seq_; }
  // The world rank of each rank of the transport: none while it is being
  // made (its stall inspector comes last).
  const std::vector<int> &world_ranks() const;
  // Starts `op`, which the ranks still training described, as a rank that
  // has left: zeros in, results dropped in `*scratch`.
  Status start_shadow(const ShadowOp &op, std::vector<char> *scratch,
                      WorkPtr *work);
  // Starts Join::Count's round: every rank adds `mine` into `*total`.
  Status start_count(int64_t mine, int64_t *total, WorkPtr *work);
  // Forgets which calls were compared (after a join, whose leavers did
  // not make the others' calls).
  void forget_calls();

  // Every transport of the process registers while it lives. The one of
  // id `id`, or null.
  static MpiTransport *find(uint64_t id);
  // Calls `f` on each transport alive (a lock is held meanwhile).
  static void for_each(const std::function<void(MpiTransport &)> &f);

private:
  friend class Join; // Open() duplicates the communicator for its messages

  MpiTransport(MPI_Comm comm, uint64_t id) : comm_(comm), id_(id) {}
  static Status Create(MPI_Comm comm, uint64_t id,
                       std::unique_ptr<MpiTransport> *out);
  // `created`: the request completing the communicator, or null;
  // `makers`: then the world ranks making it.
  Status Init(MPI_Request *created, std::vector<int> makers);
  // Opens the next operation, `op`, whose fingerprint (kind, count, dtype,
  // root) the stall reports carry and the flight recorder records (with
  // the rest): fails at once after an earlier failed wait. Phase 1: the
  // check of a call (check_call()).
  Status begin(const ShadowOp &op);
  // Starts the operation begin() opened, as `pieces` nonblocking `call`s,
  // each started once the one before has completed: `start(i, &request)`
  // starts piece i's, returning MPI's error code, and `finish(i)` runs
  // once it has completed.
  template <typename Start, typename Finish>
  Status start_pieces(const char *call, size_t pieces, Start start,
                      Finish finish, WorkPtr *work);
  // Sets `*same` to whether every rank passed the same `value`, compared
  // on `comm` (this transport's, or the one kept for check_call()).
  Status same_everywhere(MPI_Comm comm, uint64_t value, bool *same);
  // Starts same_everywhere's round: `both` = {value, ~value}, maximized.
  Status start_same(MPI_Comm comm, uint64_t *both, WorkPtr *work);
  // Starts an in-place all-reduce of a few `words` on `comm`, whose
  // caller began the operation: the rounds of agreement and counting.
  Status start_word_round(MPI_Comm comm, void *words, int count,
                          MPI_Datatype type, MPI_Op op, WorkPtr *work);

  MPI_Comm comm_;
  const uint64_t id_;
  uint64_t created_seq_ = 0;
  uint64_t duplicates_ = 0; // made by Duplicate(): the next one's id
  int rank_ = 0;
  int size_ = 0;
  int local_rank_ = 0;
  MPI_Comm check_comm_ = MPI_COMM_NULL; // check_call()'s rounds only
  // All-reduces in two levels, where the ranks' hosts call for them
  // (NNCOMM_HIERARCHICAL); null: flat.
  std::unique_ptr<HierarchicalAllreduce> two_level_;
  // The operation under way: counted, the same on every rank while their
  // calls match.
  StallInspector::Position at_;
  std::unique_ptr<StallInspector> inspector_;
  FlightRecorder flight_;
  // Signatures of calls compared across the ranks, and the fold of every
  // call's signature since the last comparison.
  std::unordered_set<uint64_t> checked_;
  uint64_t unchecked_ = 0;
  // Calls per comparison of calls compared before, on average.
  static constexpr uint64_t kSampledCalls = 128;
};

} // namespace nncomm

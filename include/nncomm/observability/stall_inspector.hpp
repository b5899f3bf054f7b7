// StallInspector: which ranks of a communicator have not arrived at an
// operation that takes long, as Horovod's stall inspector reports, and which
// are at it with another call.
//
// A rank whose wait at operation `seq` has lasted kArrivalReportSeconds tells
// every other rank of the communicator so, once, in a point-to-point message
// on the communicator itself (point-to-point traffic never matches a
// collective's), with the operation's fingerprint and phase (the operation
// itself, or the check that precedes a call), and those of the operations
// it began before, up to kHistory in all. Waiting ranks collect these
// reports: a rank that sent none for `seq` has not arrived there; one at
// `seq`, or that went through `seq` or an operation this rank went through,
// with another fingerprint or phase makes different calls. So a rank that
// skipped a call, whose next calls then pair with the others' one apart
// (and complete, where the sizes allow, until a pair cannot), is found on
// both sides: by the rank left waiting, and by the one gone ahead. A wait
// that completes quickly sends nothing, so healthy training pays nothing.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include <mpi.h>

namespace nncomm {

class StallInspector {
public:
  static constexpr double kArrivalReportSeconds = 1.0;
  static constexpr int kHistory = 16;

  // `world_ranks[r]`: the world rank of rank r of `comm`; `transport`:
  // the id of the transport over `comm` (the same on every rank), which
  // the reports carry, so that one left unread on a communicator since
  // freed, whose context MPI gave a new one, is not taken for this one's.
  StallInspector(MPI_Comm comm, int rank, std::vector<int> world_ranks,
                 uint64_t transport)
      : comm_(comm), rank_(rank), world_ranks_(std::move(world_ranks)),
        transport_(transport) {}
  ~StallInspector();
  StallInspector(const StallInspector &) = delete;
  StallInspector &operator=(const StallInspector &) = delete;

  // What a rank is doing at an operation.
  struct Position {
    uint64_t seq = 0;
    uint64_t fingerprint = 0;
    uint64_t phase = 0; // 0: the operation; 1: the check of a call
  };

  // This rank began the operation at `at` (kept for the reports).
  void began(const Position &at) { history_[at.seq % kHistory] = at; }
  // This rank waits at `at`: tells the other ranks, once.
  void arrived(const Position &at);
  // The world ranks of the communicator that have not told this one they
  // are at operation `at.seq` (this rank excluded).
  std::vector<int> missing(const Position &at);
  // The world ranks at operation `at.seq`, or at one before it that both
  // ranks began, doing something else there than this rank (ranks both
  // checking calls are left to the check itself).
  std::vector<int> differing(const Position &at);
  const std::vector<int> &world_ranks() const { return world_ranks_; }
  // What the communicator is for, where its creator says ("in its queue of
  // async_op=True calls"), for messages; or null.
  void set_role(const char *role) { role_ = role; }
  const char *role() const { return role_; }

private:
  struct Report {
    bool arrived = false;
    Position at;
  };
  void collect(uint64_t seq);
  // This rank's position at operation `seq`, if it is still known.
  const Position *mine(uint64_t seq, const Position &at) const;

  MPI_Comm comm_;
  int rank_;
  std::vector<int> world_ranks_;
  const uint64_t transport_;
  const char *role_ = nullptr;
  uint64_t reported_ = UINT64_MAX; // the last seq this rank announced
  uint64_t reported_phase_ = 0;
  std::map<uint64_t, std::vector<Report>> arrived_; // seq -> per rank
  Position history_[kHistory]; // by seq % kHistory
  struct Send {
    MPI_Request request;
    uint64_t message[1 + 3 * kHistory]; // the buffer: transport, Positions
  };
  std::vector<Send *> sends_;
};

} // namespace nncomm

// StallInspector: which ranks of a communicator have not arrived at an
// operation that takes long, as Horovod's stall inspector reports.
//
// A rank whose wait at operation `seq` has lasted kArrivalReportSeconds tells
// every other rank of the communicator so, once, in a point-to-point message
// on the communicator itself (point-to-point traffic never matches a
// collective's). Waiting ranks collect these reports; a rank that sent none
// for `seq` has not arrived there. A wait that completes quickly sends
// nothing, so healthy training pays nothing.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include <mpi.h>

namespace nncomm {

class StallInspector {
public:
  static constexpr double kArrivalReportSeconds = 1.0;

  // `world_ranks[r]`: the world rank of rank r of `comm`.
  StallInspector(MPI_Comm comm, int rank, std::vector<int> world_ranks)
      : comm_(comm), rank_(rank), world_ranks_(std::move(world_ranks)) {}
  ~StallInspector();
  StallInspector(const StallInspector &) = delete;
  StallInspector &operator=(const StallInspector &) = delete;

  // This rank waits at operation `seq`: tells the other ranks, once.
  void arrived(uint64_t seq);
  // The world ranks of the communicator that have not told this one they
  // are at operation `seq` (this rank excluded).
  std::vector<int> missing(uint64_t seq);
  const std::vector<int> &world_ranks() const { return world_ranks_; }

private:
  void collect(uint64_t seq);

  MPI_Comm comm_;
  int rank_;
  std::vector<int> world_ranks_;
  uint64_t reported_ = UINT64_MAX; // the last seq this rank announced
  std::map<uint64_t, std::vector<bool>> arrived_; // seq -> rank has arrived
  struct Send {
    MPI_Request request;
    uint64_t seq; // the message's buffer
  };
  std::vector<Send *> sends_;
};

} // namespace nncomm

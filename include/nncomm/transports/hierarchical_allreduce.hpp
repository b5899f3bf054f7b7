// HierarchicalAllreduce: MpiTransport's all-reduce in two levels for ranks
// that span hosts, as Horovod's hierarchical all-reduce and the 2D-torus
// all-reduce of Sony's ImageNet-in-224-seconds run: each piece of the
// buffer is reduce-scattered among the ranks of a host (shared memory),
// each rank's shard all-reduced among the ranks of the same local index on
// every host (the "cross" communicator: one shard per rank crosses the
// network, 1/(ranks per host) of what the flat all-reduce sends), then
// all-gathered within the host.
//
// It is no operation of its own: MpiTransport::start_allreduce runs its
// three steps per piece as the pieces of one operation, so that the
// operation's stall reports, flight record and Join description are the
// transport's (a rank missing from a step is named by world rank at the
// operation, and a rank that left a join makes the same steps from the
// same description). One operation at a time, as the transport's.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <mpi.h>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

// An all-reduce in place: `count` elements of `dt` at `base` (MPI's `type`,
// summed with `op`), in pieces of `step` elements; each rank's share is
// multiplied by `scale`, the sum divided by `divisor`.
struct Reduction {
  char *base;
  size_t count;
  size_t step;
  DType dt;
  MPI_Datatype type;
  MPI_Op op;
  float scale;
  int divisor;
};

class HierarchicalAllreduce {
public:
  // The two levels for the ranks of `comm` (this one `rank` of them),
  // `node` being those sharing this one's memory, when the ranks' hosts
  // call for them under NNCOMM_HIERARCHICAL; else `*out` stays null and
  // all-reduces run flat. Takes `node` (freed either way). Collective over
  // `comm`, whose ranks are all there (it blocks).
  static Status Create(MPI_Comm comm, int rank, MPI_Comm node,
                       std::unique_ptr<HierarchicalAllreduce> *out);
  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce &) = delete;
  HierarchicalAllreduce &operator=(const HierarchicalAllreduce &) = delete;

  // The steps of `r`: three per piece.
  static size_t steps(const Reduction &r);
  // Starts step `i` of `r`, returning MPI's error code; step 0 of a piece
  // scales this rank's share of it first.
  int start(const Reduction &r, size_t i, MPI_Request *request);
  // Runs once step `i` has completed: divides the shard after its sum.
  void finish(const Reduction &r, size_t i);

private:
  HierarchicalAllreduce(MPI_Comm node, MPI_Comm cross, int local_rank,
                        int local_size)
      : node_(node), cross_(cross), local_rank_(local_rank),
        local_size_(local_size) {}

  MPI_Comm node_;  // the ranks of this host
  MPI_Comm cross_; // the ranks of this local rank on every host
  const int local_rank_;
  const int local_size_;
  // The piece under way: each local rank's shard of it, and this rank's
  // shard's sum (kept from one operation to the next).
  std::vector<int> counts_;
  std::vector<int> offsets_;
  std::vector<char> shard_;
};

} // namespace nncomm

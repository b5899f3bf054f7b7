// Group: this rank's side of one named group of ranks: its transport, the
// host memory its list collectives pack in, and the queue that orders
// its collectives (collective_queue.hpp). The binding makes every
// collective on a group through here, each in its turn, so collectives
// from several threads never interleave on the transport. Its list
// collectives are recorded on the timeline under their names
// (timeline.hpp), with the group's name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "nncomm/collective_queue.hpp"
#include "nncomm/collectives.hpp"
#include "nncomm/array_memory.hpp"
#include "nncomm/bucket_plan.hpp"
#include "nncomm/engine.hpp"
#include "nncomm/mpi_transport.hpp"

namespace nncomm {

class Group {
public:
  // A group of every rank of `comm`, named "world". Collective over
  // `comm`.
  static Status Create(MPI_Comm comm, std::unique_ptr<Group> *out);
  // A group named `name` of this group's ranks `ranks`, numbered in that
  // order. Every rank of this group calls it; `*out` stays empty where
  // this rank is not in `ranks`.
  Status create_subgroup(const std::vector<int> &ranks,
                         const std::string &name,
                         std::unique_ptr<Group> *out);
  // A transport of its own over this group's ranks, for an engine thread
  // whose collectives must not interleave with the group's. Collective.
  Status duplicate_transport(std::unique_ptr<MpiTransport> *out);
  // An engine thread (engine.hpp) reducing `plan`'s buckets of
  // `num_tensors` tensors in host memory, on a transport of its own.
  // Collective.
  Status create_engine(size_t num_tensors, std::vector<Bucket> plan,
                       int poll_us, std::unique_ptr<Engine> *out);

  const std::string &name() const { return name_; }
  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  int local_rank() const { return transport_->local_rank(); }
  // Ends the whole job.
  void abort(int errorcode) const { transport_->abort(errorcode); }

  Status barrier();
  // Sets `*same` to whether every rank passed the same `value`.
  Status agree(uint64_t value, bool *same);
  Status allgather(const void *send, void *recv, size_t count, DType dt);
  // The list collectives of collectives.hpp, on this group.
  Status all_reduce(std::vector<ArrayRef> &arrays, bool division, float scale,
                    bool fuse, Materializer materialize);
  Status reduce(const std::vector<ArrayRef> &arrays, int root, bool division,
                bool fuse);
  Status bcast(const std::vector<ArrayRef> &arrays, int root, bool fuse);
  Status all_gather(const ArrayRef &send, const std::vector<ArrayRef> &recv);
  Status all_gatherv(const ArrayRef &send, const std::vector<size_t> &counts,
                     const std::vector<ArrayRef> &recv);
  Status alltoall(const ArrayRef &send, const std::vector<size_t> &send_counts,
                  const ArrayRef &recv,
                  const std::vector<size_t> &recv_counts);
  Status reduce_scatter(const std::vector<ArrayRef> &send,
                        const ArrayRef &recv, bool division);

private:
  Group(std::unique_ptr<MpiTransport> transport, std::string name)
      : transport_(std::move(transport)), name_(std::move(name)) {}

  const std::unique_ptr<MpiTransport> transport_;
  const std::string name_;
  HostArrays memory_;
  CollectiveQueue queue_;
};

} // namespace nncomm

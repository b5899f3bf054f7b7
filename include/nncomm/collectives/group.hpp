// Group: this rank's side of one named group of ranks: its transport, the
// host memory its list collectives pack in, the queue that orders its
// collectives (collective_queue.hpp), and, from its first collective
// placed on a device, its DevicePath (device_path.hpp). The binding makes
// every collective on a group through here, each in its turn, so
// collectives from several threads never interleave on a transport; each
// takes a Placement, so the binding never branches on where memory is. Its
// list collectives are recorded on the timeline under their names
// (timeline.hpp), with the group's name.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <mpi.h>

#include "nncomm/collectives/collective_queue.hpp"
#include "nncomm/collectives/list_collectives.hpp"
#include "nncomm/core/array_memory.hpp"
#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/collectives/device_path.hpp"
#include "nncomm/core/engine.hpp"
#include "nncomm/transports/mpi_transport.hpp"

namespace nncomm {

// Where a collective's arrays lie: host memory, or a CUDA device's, the
// call ordered with the framework's `stream` there (device_path.hpp).
struct Placement {
  bool on_device = false;
  CudaStream stream = nullptr;
};

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
  // An engine thread (engine.hpp) reducing buckets of `num_tensors`
  // tensors placed `where` (on a device: computed on its stream;
  // `gradients`, the tensors as they are now, are where the group's device
  // path opens, if it has none yet), on a transport of its own, by the
  // plans added to it. Collective.
  Status create_engine(const Placement &where,
                       const std::vector<ArrayRef> &gradients,
                       size_t num_tensors, int poll_us,
                       std::unique_ptr<Engine> *out);

  // A group of the same ranks and name over a transport of its own, whose
  // collectives never interleave with this one's (a queue of nonblocking
  // collectives, async_queue.hpp), on the timeline's `track`, its waits'
  // messages naming its `role` (a literal). Collective.
  Status duplicate(Track track, const char *role,
                   std::unique_ptr<Group> *out);

  // Whether `arrays` are on the device the group communicates device
  // memory on (before its first device collective: on one device), asked
  // of this rank alone: ordered with another device's streams, the group
  // would read arrays elsewhere while they are written. Every device
  // collective below checks its arrays; the engine's caller checks its
  // gradients.
  Status check_placed(const std::vector<ArrayRef> &arrays);
  // How the group communicates device memory: "nccl", "ipc" or "mpi"
  // ("mpi" before its first device collective too).
  const char *device_transport();
  // Its DevicePath's bucket_floor_bytes(); 0 before it has one.
  size_t bucket_floor_bytes();
  // What the device path, opened since the last call, advises the user
  // (device_path.hpp); empty otherwise. has_advice() says whether there
  // is some, without a lock: every call of the binding asks.
  std::string take_advice();
  bool has_advice() const { return has_advice_.load(); }

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  int local_rank() const { return transport_->local_rank(); }
  // Ends the whole job.
  void abort(int errorcode) const { transport_->abort(errorcode); }

  Status barrier();
  // Opens a join scope over this group's ranks (join.hpp). Collective.
  Status open_join(bool throw_early);
  // Join::Count on this group: `*training`, the ranks still training.
  Status count_training(int *training);
  // Sets `*same` to whether every rank passed the same `value`.
  // `what` names the agreement in stall reports and errors (a literal,
  // without %).
  Status agree(uint64_t value, bool *same, const char *what);
  // Transport::unite, `what` naming it as agree's.
  Status unite(uint64_t *words, size_t count, const char *what);
  Status allgather(const void *send, void *recv, size_t count, DType dt);
  // The list collectives of list_collectives.hpp, on this group, on arrays
  // placed `where`.
  Status all_reduce(const Placement &where, std::vector<ArrayRef> &arrays,
                    bool division, float scale, bool fuse,
                    Materializer materialize);
  Status reduce(const Placement &where, const std::vector<ArrayRef> &arrays,
                int root, bool division, bool fuse);
  Status bcast(const Placement &where, const std::vector<ArrayRef> &arrays,
               int root, bool fuse);
  Status all_gather(const Placement &where, const ArrayRef &send,
                    const std::vector<ArrayRef> &recv);
  Status all_gatherv(const Placement &where, const ArrayRef &send,
                     const std::vector<size_t> &counts,
                     const std::vector<ArrayRef> &recv);
  Status alltoall(const Placement &where, const ArrayRef &send,
                  const std::vector<size_t> &send_counts,
                  const ArrayRef &recv,
                  const std::vector<size_t> &recv_counts);
  Status reduce_scatter(const Placement &where,
                        const std::vector<ArrayRef> &send,
                        const ArrayRef &recv, bool division);

private:
  Group(std::unique_ptr<MpiTransport> transport, std::string name,
        Track track = Track::kCollectives)
      : transport_(std::move(transport)), name_(std::move(name)),
        track_(track) {}

  // A transport of its own over this group's ranks, for an engine thread
  // or the device path, whose collectives must not interleave with the
  // group's. Collective.
  Status duplicate_transport(std::unique_ptr<MpiTransport> *out,
                             const char *role = nullptr);
  // Runs `collective` (a Collective's body: named `op` on the timeline,
  // sending `sent`) on `arrays` where they are placed, in its turn.
  template <typename Sent, typename Body>
  Status run(const Placement &where, const char *op, const Sent &sent,
             const std::vector<ArrayRef> &arrays, const Body &collective);
  // The device path, opened (a collective call) on the device of the first
  // of `arrays` that has memory the first time.
  Status device_path(const std::vector<ArrayRef> &arrays, DevicePath **out);

  const std::unique_ptr<MpiTransport> transport_;
  const std::string name_;
  const Track track_; // where its collectives go on the timeline
  HostArrays memory_;
  CollectiveQueue queue_;

  std::mutex device_mutex_; // guards the three below
  std::unique_ptr<DevicePath> device_;
  std::string advice_; // device_'s, until taken
  std::atomic<bool> has_advice_{false};
};

} // namespace nncomm

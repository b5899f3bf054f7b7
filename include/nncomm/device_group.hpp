// DeviceGroup: a group's collectives on CUDA device memory, on the device
// transport chosen for the group (config::gpu_transport()): NCCL where it
// loads on every rank and every rank has a device of its own (NCCL refuses
// two ranks on one), MPI through pinned host memory otherwise; every rank
// makes the same choice. The list collectives run on DeviceArrays, in the
// group's turn, ordered with the caller's compute stream: they read what
// was enqueued there before the call, and work enqueued there after it
// sees their results; the host waits for the device only where a
// collective's host part needs it. Its state is private to the CUDA build
// (src/cuda_device_group.cu), so that a build without CUDA links the
// binding anyway, every call saying why it cannot work
// (src/cuda_unavailable.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nncomm/bucket_plan.hpp"
#include "nncomm/collectives.hpp"
#include "nncomm/cuda_pack.hpp"
#include "nncomm/engine.hpp"
#include "nncomm/group.hpp"

namespace nncomm {

// Refuses `arrays` unless each is device memory of CUDA device `device`
// (-1: of the first that has memory's device), naming the array's address
// and both devices; arrays of no elements are passed over (CuPy gives them
// address 0).
Status check_on_device(const std::vector<ArrayRef> &arrays, int device);

class DeviceGroup {
public:
  // Over `group`'s ranks, on the device holding `on` (device memory).
  // Collective over `group`'s ranks; fails on every rank when it fails on
  // one.
  static Status Create(Group &group, const void *on,
                       std::unique_ptr<DeviceGroup> *out);
  ~DeviceGroup();
  DeviceGroup(const DeviceGroup &) = delete;
  DeviceGroup &operator=(const DeviceGroup &) = delete;

  // "nccl" or "mpi".
  const char *transport_name() const;

  // What the user should change where the group's ranks share a GPU while
  // their hosts have more; empty otherwise.
  const std::string &advice() const;

  // check_on_device of the group's device (the one its first GPU
  // collective was on): ordered with another device's streams, the group
  // would read arrays elsewhere while they are written. Every collective
  // below checks its arrays; the engine's caller checks its gradients.
  Status check_device(const std::vector<ArrayRef> &arrays) const {
    return check_on_device(arrays, device());
  }
  int device() const;

  // An engine thread (engine.hpp) reducing `plan`'s buckets of
  // `num_tensors` gradients in the group's device memory, which the
  // framework computes on `compute`, over a device transport of its own of
  // the group's kind (cuda_runner.hpp). Collective.
  Status create_engine(CudaStream compute, size_t num_tensors,
                       std::vector<Bucket> plan, int poll_us,
                       std::unique_ptr<Engine> *out);

  Status all_reduce(CudaStream compute, std::vector<ArrayRef> &arrays,
                    bool division, float scale, bool fuse,
                    Materializer materialize);
  Status reduce(CudaStream compute, const std::vector<ArrayRef> &arrays,
                int root, bool division, bool fuse);
  Status bcast(CudaStream compute, const std::vector<ArrayRef> &arrays,
               int root, bool fuse);
  Status all_gather(CudaStream compute, const ArrayRef &send,
                    const std::vector<ArrayRef> &recv);
  Status all_gatherv(CudaStream compute, const ArrayRef &send,
                     const std::vector<size_t> &counts,
                     const std::vector<ArrayRef> &recv);
  Status alltoall(CudaStream compute, const ArrayRef &send,
                  const std::vector<size_t> &send_counts,
                  const ArrayRef &recv,
                  const std::vector<size_t> &recv_counts);
  Status reduce_scatter(CudaStream compute, const std::vector<ArrayRef> &send,
                        const ArrayRef &recv, bool division);

private:
  struct State;
  explicit DeviceGroup(std::unique_ptr<State> state);
  // Runs `collective` on `arrays` (checked by check_device) in the
  // group's turn, after `compute`'s work so far and before its later work;
  // on the timeline, as collective `name` sending `sent` (collectives.hpp:
  // CollectiveSpan).
  template <typename Sent, typename Collective>
  Status ordered(CudaStream compute, const char *name, const Sent &sent,
                 const std::vector<ArrayRef> &arrays, Collective collective);

  const std::unique_ptr<State> state_;
};

} // namespace nncomm

// DevicePath: how a group reaches CUDA device memory: the device transport
// chosen for the group (config::gpu_transport()): NCCL where it loads on
// every rank and every rank has a device of its own (NCCL refuses two ranks
// on one), CUDA IPC where every rank is on one device, MPI through pinned
// host memory otherwise; every rank makes the same choice. A Group (group.hpp) opens its path at its first collective
// placed on a device, and runs every later one there through run(). Its
// state is private to the CUDA build (src/cuda/cuda_device_path.cu); a
// build without CUDA refuses to open one
// (src/cuda/cuda_device_path_unavailable.cpp), the one place that says so.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/collectives/list_collectives.hpp"
#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/core/engine.hpp"
#include "nncomm/transports/mpi_transport.hpp"

namespace nncomm {

// Refuses `arrays` unless each is device memory of CUDA device `device`
// (-1: of the first that has memory's device), naming the array's address
// and both devices; arrays of no elements are passed over (CuPy gives them
// address 0).
Status check_on_device(const std::vector<ArrayRef> &arrays, int device);

// A collective's work on a transport and the memory its messages are
// packed in.
using Collective = std::function<Status(Transport &, ArrayMemory &)>;

class DevicePath {
public:
  // Over `host`'s ranks (a transport of the group's own), on the device
  // holding `on` (device memory). Collective; fails on every rank when it
  // fails on one.
  static Status Open(std::unique_ptr<MpiTransport> host, const void *on,
                     std::unique_ptr<DevicePath> *out);
  virtual ~DevicePath() = default;

  // "nccl", "ipc" or "mpi".
  virtual const char *transport_name() const = 0;
  // The smallest bucket worth an operation of its own on the path's
  // transport: the engine merges its plans' smaller ones (merge_buckets);
  // 0 where any size is.
  virtual size_t bucket_floor_bytes() const = 0;
  // What the user should change where the group's ranks share a GPU while
  // their hosts have more; empty otherwise.
  virtual const std::string &advice() const = 0;
  // The device the path was opened on.
  virtual int device() const = 0;

  // Runs `collective` on `arrays` (checked to be on device()) in the
  // path's turn, after `compute`'s work so far and before its later work:
  // it reads what was enqueued there before the call, and work enqueued
  // there after it sees its results; the host waits for the device only
  // where the collective's host part needs it.
  virtual Status run(CudaStream compute, const std::vector<ArrayRef> &arrays,
                     const Collective &collective) = 0;

  // An engine thread (engine.hpp) reducing buckets of `num_tensors`
  // gradients in device memory, which the framework computes on
  // `compute`, over a device transport of its own of the path's kind over
  // `host` (cuda_runner.hpp). Collective.
  virtual Status create_engine(std::unique_ptr<MpiTransport> host,
                               CudaStream compute, size_t num_tensors,
                               int poll_us, std::unique_ptr<Engine> *out) = 0;
};

} // namespace nncomm

#include "nncomm/device_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include "cuda_calls.hpp"
#include "nncomm/collective_queue.hpp"
#include "nncomm/config.hpp"
#include "nncomm/cuda_devices.hpp"
#include "nncomm/cuda_runner.hpp"
#include "nncomm/cuda_staged_transport.hpp"
#include "nncomm/device_arrays.hpp"
#include "nncomm/fingerprint.hpp"
#include "nncomm/nccl_transport.hpp"
#include "nncomm/wait.hpp"

namespace nncomm {

namespace {

// What each rank tells the others when a device group is made.
enum Field { kDevice, kNccl, kHasDevice, kHost, kFields };

uint64_t host_identity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return Fingerprint().add(host).value();
}

// The device current to the calling thread, and an identity the same on
// two ranks only if they use the same device of the same host (`host`, its
// host_identity()).
Status device_identity(uint64_t host, int *device, uint64_t *identity) {
  NNCOMM_CUDA_CALL(cudaGetDevice, device);
  char bus[64] = {0};
  NNCOMM_CUDA_CALL(cudaDeviceGetPCIBusId, bus, sizeof bus - 1, *device);
  *identity = Fingerprint().add(host).add(bus).value();
  return Status::Ok();
}

// What to change where the group's ranks on this host use fewer of its
// `visible` GPUs than they could (the usual cause: every rank's context
// left on device 0), for the lowest of them to say once; empty otherwise.
// `all` holds every rank's fields.
std::string sharing_advice(const std::vector<int64_t> &all, int rank,
                           int visible) {
  std::vector<int> here;
  std::set<int64_t> used;
  for (size_t r = 0; r < all.size() / kFields; ++r) {
    if (all[r * kFields + kHost] == all[rank * kFields + kHost]) {
      here.push_back(static_cast<int>(r));
      used.insert(all[r * kFields + kDevice]);
    }
  }
  if (here[0] != rank || used.size() >= std::min<size_t>(visible, here.size()))
    return "";
  return "group ranks " + rank_list(here) + " on this host use " +
         std::to_string(used.size()) + " of its " + std::to_string(visible) +
         " GPUs, so ranks sharing one communicate through host memory (no "
         "NCCL); give each rank its own, as nnabla's examples do with "
         "ctx.device_id = str(comm.local_rank)";
}

// `one` followed by `more`.
std::vector<ArrayRef> joined(const ArrayRef &one,
                             const std::vector<ArrayRef> &more) {
  std::vector<ArrayRef> all{one};
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

} // namespace

Status check_on_device(const std::vector<ArrayRef> &arrays, int device) {
  for (const ArrayRef &a : arrays) {
    if (a.count == 0)
      continue;
    int here = 0;
    NNCOMM_RETURN_IF_ERROR(cuda_device_of(a.ptr, &here));
    if (device < 0)
      device = here;
    if (here != device) {
      char address[32];
      std::snprintf(address, sizeof address, "%p", a.ptr);
      return Status::InvalidArgument(
          std::string("a GPU array of this call (at ") + address +
          ") is on CUDA device " + std::to_string(here) +
          ", but the call communicates on device " + std::to_string(device) +
          " (the group's, where its first GPU collective was, or the "
          "call's first array's); a group's GPU arrays must all be on one "
          "device");
    }
  }
  return Status::Ok();
}

struct DeviceGroup::State {
  Group &group;
  const NcclApi *nccl; // the group's transport is NCCL's; null: staged MPI
  int device;
  std::string advice;
  CollectiveQueue queue;
  std::unique_ptr<DeviceTransport> transport;
  std::unique_ptr<DeviceArrays> memory; // on transport

  // A device transport of the group's kind over `host`, on the group's
  // device. Collective; fails on every rank when it fails on one.
  Status transport_over(std::unique_ptr<MpiTransport> host,
                        std::unique_ptr<DeviceTransport> *out) const {
    DeviceScope scope;
    const Status entered = scope.enter(device);
    // The other ranks compare their set-up's outcome with this rank's
    // before waiting for it (fail_together): this one's failure too.
    if (!entered.ok())
      return fail_together(*host, entered, "setting up GPU communication");
    if (nccl != nullptr) {
      std::unique_ptr<NcclTransport> t;
      NNCOMM_RETURN_IF_ERROR(NcclTransport::Create(*nccl, std::move(host), &t));
      *out = std::move(t);
      return Status::Ok();
    }
    std::unique_ptr<StagedTransport> t;
    NNCOMM_RETURN_IF_ERROR(StagedTransport::Create(std::move(host), &t));
    *out = std::move(t);
    return Status::Ok();
  }
};

DeviceGroup::DeviceGroup(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

DeviceGroup::~DeviceGroup() = default;

const char *DeviceGroup::transport_name() const {
  return state_->nccl != nullptr ? "nccl" : "mpi";
}

const std::string &DeviceGroup::advice() const { return state_->advice; }

int DeviceGroup::device() const { return state_->device; }

Status DeviceGroup::Create(Group &group, const void *on,
                           std::unique_ptr<DeviceGroup> *out) {
  std::unique_ptr<MpiTransport> host;
  NNCOMM_RETURN_IF_ERROR(group.duplicate_transport(&host));
  const config::GpuTransport choice = config::gpu_transport();
  const NcclApi *api = nullptr;
  Status loaded = Status::RuntimeError("NNCOMM_GPU_TRANSPORT=mpi");
  if (choice != config::GpuTransport::kMpi)
    loaded = load_nccl(config::nccl_library(), &api);
  const uint64_t machine = host_identity();
  uint64_t identity = 0;
  int device = 0, visible = 0;
  Status here = cuda_use_device_of(on);
  if (here.ok())
    here = device_identity(machine, &device, &identity);
  if (here.ok())
    here = cuda_status(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
  // Every rank decides from what every rank found, so all decide alike,
  // and all fail where one cannot go on.
  int64_t mine[kFields];
  mine[kDevice] = static_cast<int64_t>(identity);
  mine[kNccl] = loaded.ok() ? 1 : 0;
  mine[kHasDevice] = here.ok() ? 1 : 0;
  mine[kHost] = static_cast<int64_t>(machine);
  const int size = host->size();
  std::vector<int64_t> all(kFields * size);
  NNCOMM_RETURN_IF_ERROR(
      host->allgather(mine, all.data(), kFields, DType::kInt64));
  NNCOMM_RETURN_IF_ERROR(here);
  std::set<int64_t> devices;
  std::vector<int> without_nccl, without_device;
  for (int r = 0; r < size; ++r) {
    devices.insert(all[kFields * r + kDevice]);
    if (all[kFields * r + kNccl] == 0)
      without_nccl.push_back(r);
    if (all[kFields * r + kHasDevice] == 0)
      without_device.push_back(r);
  }
  if (!without_device.empty()) {
    return Status::RuntimeError("group ranks " + rank_list(without_device) +
                                " have no CUDA device to communicate on");
  }
  const bool shared = static_cast<int>(devices.size()) < size;
  if (choice == config::GpuTransport::kNccl &&
      (shared || !without_nccl.empty())) {
    if (!loaded.ok())
      return loaded;
    return Status::InvalidArgument(
        shared ? "NNCOMM_GPU_TRANSPORT=nccl, but ranks of this group share a "
                 "GPU, which NCCL refuses (use NNCOMM_GPU_TRANSPORT=mpi)"
               : "NNCOMM_GPU_TRANSPORT=nccl, but NCCL could not be loaded "
                 "on group ranks " + rank_list(without_nccl));
  }
  std::unique_ptr<State> state(
      new State{group, !shared && without_nccl.empty() ? api : nullptr,
                device, sharing_advice(all, host->rank(), visible)});
  NNCOMM_RETURN_IF_ERROR(
      state->transport_over(std::move(host), &state->transport));
  DeviceTransport &transport = *state->transport;
  NNCOMM_RETURN_IF_ERROR(
      fail_together(transport, DeviceArrays::Create(transport, &state->memory),
                    "setting up the group's GPU packer"));
  out->reset(new DeviceGroup(std::move(state)));
  return Status::Ok();
}

Status DeviceGroup::create_engine(CudaStream compute, size_t num_tensors,
                                  std::vector<Bucket> plan, int poll_us,
                                  std::unique_ptr<Engine> *out) {
  std::unique_ptr<MpiTransport> host;
  NNCOMM_RETURN_IF_ERROR(state_->group.duplicate_transport(&host));
  std::unique_ptr<DeviceTransport> own;
  NNCOMM_RETURN_IF_ERROR(state_->transport_over(std::move(host), &own));
  std::unique_ptr<CudaRunner> runner;
  // The caller's next step is collective (pyx/engines.pxi: whether every
  // rank prepared): a rank failing here alone would leave the others there.
  NNCOMM_RETURN_IF_ERROR(fail_together(
      *own, CudaRunner::Create(*own, compute, &runner),
      "setting up the engine's GPU packer"));
  out->reset(new Engine(std::move(own), std::move(runner), num_tensors,
                        std::move(plan), poll_us));
  return Status::Ok();
}

template <typename Sent, typename Collective>
Status DeviceGroup::ordered(CudaStream compute, const char *name,
                            const Sent &sent,
                            const std::vector<ArrayRef> &arrays,
                            Collective collective) {
  const Status placed = check_device(arrays);
  if (!placed.ok()) {
    // The other ranks may be making this call: comparing one that no rank
    // makes tells them, at once or at their wait's next look, that this
    // rank will not, so that they raise instead of waiting for it. Where
    // every rank refuses alike, the comparison passes and all go on. This
    // rank's error is its refusal, whatever the comparison found.
    CollectiveQueue::Turn turn(state_->queue);
    (void)state_->transport->check_call(
        Fingerprint().add("a GPU call refused on this rank").value(), true);
    return placed;
  }
  CollectiveQueue::Turn turn(state_->queue);
  NNCOMM_RETURN_IF_ERROR(turn.status());
  CollectiveSpan traced(name, state_->group.name(), sent);
  DeviceTransport &transport = *state_->transport;
  NNCOMM_RETURN_IF_ERROR(transport.follow(compute));
  NNCOMM_RETURN_IF_ERROR(collective(transport, *state_->memory));
  return transport.lead(compute);
}

Status DeviceGroup::all_reduce(CudaStream compute,
                               std::vector<ArrayRef> &arrays, bool division,
                               float scale, bool fuse,
                               Materializer materialize) {
  return ordered(compute, "all_reduce", arrays, arrays,
                 [&](Transport &t, ArrayMemory &m) {
    return all_reduce_list(t, m, arrays, division, scale, fuse, materialize);
  });
}

Status DeviceGroup::reduce(CudaStream compute,
                           const std::vector<ArrayRef> &arrays, int root,
                           bool division, bool fuse) {
  return ordered(compute, "reduce", arrays, arrays,
                 [&](Transport &t, ArrayMemory &m) {
    return reduce_list(t, m, arrays, root, division, fuse);
  });
}

Status DeviceGroup::bcast(CudaStream compute,
                          const std::vector<ArrayRef> &arrays, int root,
                          bool fuse) {
  return ordered(compute, "bcast", arrays, arrays,
                 [&](Transport &t, ArrayMemory &m) {
    return bcast_list(t, m, arrays, root, fuse);
  });
}

Status DeviceGroup::all_gather(CudaStream compute, const ArrayRef &send,
                               const std::vector<ArrayRef> &recv) {
  return ordered(compute, "all_gather", send, joined(send, recv),
                 [&](Transport &t, ArrayMemory &m) {
    return nncomm::all_gather(t, m, send, recv);
  });
}

Status DeviceGroup::all_gatherv(CudaStream compute, const ArrayRef &send,
                                const std::vector<size_t> &counts,
                                const std::vector<ArrayRef> &recv) {
  return ordered(compute, "all_gather", send, joined(send, recv),
                 [&](Transport &t, ArrayMemory &m) {
    return nncomm::all_gatherv(t, m, send, counts, recv);
  });
}

Status DeviceGroup::alltoall(CudaStream compute, const ArrayRef &send,
                             const std::vector<size_t> &send_counts,
                             const ArrayRef &recv,
                             const std::vector<size_t> &recv_counts) {
  return ordered(compute, "alltoall", send, {send, recv},
                 [&](Transport &t, ArrayMemory &) {
    return nncomm::alltoall(t, send, send_counts, recv, recv_counts);
  });
}

Status DeviceGroup::reduce_scatter(CudaStream compute,
                                   const std::vector<ArrayRef> &send,
                                   const ArrayRef &recv, bool division) {
  return ordered(compute, "reduce_scatter", send, joined(recv, send),
                 [&](Transport &t, ArrayMemory &m) {
    return nncomm::reduce_scatter(t, m, send, recv, division);
  });
}

} // namespace nncomm

#include "nncomm/device_group.hpp"

#include <unistd.h>

#include <cstdint>
#include <set>
#include <string>

#include "cuda_calls.hpp"
#include "nncomm/config.hpp"
#include "nncomm/cuda_staged_transport.hpp"
#include "nncomm/fingerprint.hpp"
#include "nncomm/nccl_transport.hpp"
#include "nncomm/wait.hpp"

namespace nncomm {

namespace {

// The same on two ranks only if they use the same device of the same host.
Status device_identity(uint64_t *identity) {
  int device = 0;
  NNCOMM_CUDA_CALL(cudaGetDevice, &device);
  char bus[64] = {0};
  NNCOMM_CUDA_CALL(cudaDeviceGetPCIBusId, bus, sizeof bus - 1, device);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  *identity = Fingerprint().add(host).add(bus).value();
  return Status::Ok();
}

} // namespace

DeviceGroup::~DeviceGroup() = default;

Status DeviceGroup::Create(Group &group, std::unique_ptr<DeviceGroup> *out) {
  std::unique_ptr<MpiTransport> host;
  NNCOMM_RETURN_IF_ERROR(group.duplicate_transport(&host));
  const config::GpuTransport choice = config::gpu_transport();
  const NcclApi *api = nullptr;
  Status loaded = Status::RuntimeError("NNCOMM_GPU_TRANSPORT=mpi");
  if (choice != config::GpuTransport::kMpi)
    loaded = load_nccl(config::nccl_library(), &api);
  int64_t mine[2] = {0, loaded.ok() ? 1 : 0};
  NNCOMM_RETURN_IF_ERROR(
      device_identity(reinterpret_cast<uint64_t *>(&mine[0])));
  // Every rank decides from what every rank found, so all decide alike.
  const int size = host->size();
  std::vector<int64_t> all(2 * size);
  NNCOMM_RETURN_IF_ERROR(host->allgather(mine, all.data(), 2, DType::kInt64));
  std::set<int64_t> devices;
  std::vector<int> without_nccl;
  for (int r = 0; r < size; ++r) {
    devices.insert(all[2 * r]);
    if (all[2 * r + 1] == 0)
      without_nccl.push_back(r);
  }
  const bool shared = static_cast<int>(devices.size()) < size;
  if (choice == config::GpuTransport::kNccl && (shared || !without_nccl.empty())) {
    if (!loaded.ok())
      return loaded;
    return Status::InvalidArgument(
        shared ? "NNCOMM_GPU_TRANSPORT=nccl, but ranks of this group share a "
                 "GPU, which NCCL refuses (use NNCOMM_GPU_TRANSPORT=mpi)"
               : "NNCOMM_GPU_TRANSPORT=nccl, but NCCL could not be loaded "
                 "on group ranks " + rank_list(without_nccl));
  }
  std::unique_ptr<DeviceGroup> g(new DeviceGroup);
  g->nccl_ = !shared && without_nccl.empty();
  if (g->nccl_) {
    std::unique_ptr<NcclTransport> nccl;
    NNCOMM_RETURN_IF_ERROR(NcclTransport::Create(*api, std::move(host), &nccl));
    g->transport_ = std::move(nccl);
  } else {
    std::unique_ptr<StagedTransport> staged;
    NNCOMM_RETURN_IF_ERROR(StagedTransport::Create(std::move(host), &staged));
    g->transport_ = std::move(staged);
  }
  NNCOMM_RETURN_IF_ERROR(DeviceArrays::Create(*g->transport_, &g->memory_));
  *out = std::move(g);
  return Status::Ok();
}

template <typename Collective>
Status DeviceGroup::ordered(CudaStream compute, Collective collective) {
  CollectiveQueue::Turn turn(queue_);
  NNCOMM_RETURN_IF_ERROR(turn.status());
  NNCOMM_RETURN_IF_ERROR(transport_->follow(compute));
  NNCOMM_RETURN_IF_ERROR(collective(*transport_, *memory_));
  return transport_->lead(compute);
}

Status DeviceGroup::all_reduce(CudaStream compute,
                               std::vector<ArrayRef> &arrays, bool division,
                               float scale, bool fuse,
                               Materializer materialize) {
  return ordered(compute, [&](Transport &t, ArrayMemory &m) {
    return all_reduce_list(t, m, arrays, division, scale, fuse, materialize);
  });
}

Status DeviceGroup::reduce(CudaStream compute,
                           const std::vector<ArrayRef> &arrays, int root,
                           bool division, bool fuse) {
  return ordered(compute, [&](Transport &t, ArrayMemory &m) {
    return reduce_list(t, m, arrays, root, division, fuse);
  });
}

Status DeviceGroup::bcast(CudaStream compute,
                          const std::vector<ArrayRef> &arrays, int root,
                          bool fuse) {
  return ordered(compute, [&](Transport &t, ArrayMemory &m) {
    return bcast_list(t, m, arrays, root, fuse);
  });
}

Status DeviceGroup::all_gather(CudaStream compute, const ArrayRef &send,
                               const std::vector<ArrayRef> &recv) {
  return ordered(compute, [&](Transport &t, ArrayMemory &m) {
    return nncomm::all_gather(t, m, send, recv);
  });
}

Status DeviceGroup::reduce_scatter(CudaStream compute,
                                   const std::vector<ArrayRef> &send,
                                   const ArrayRef &recv, bool division) {
  return ordered(compute, [&](Transport &t, ArrayMemory &m) {
    return nncomm::reduce_scatter(t, m, send, recv, division);
  });
}

} // namespace nncomm

#include "nncomm/collectives/device_path.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include "cuda/cuda_calls.hpp"
#include "nncomm/collectives/collective_queue.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/cuda/cuda_devices.hpp"
#include "nncomm/cuda/cuda_runner.hpp"
#include "nncomm/transports/ipc_transport.hpp"
#include "nncomm/transports/staged_transport.hpp"
#include "nncomm/cuda/device_arrays.hpp"
#include "nncomm/core/fingerprint.hpp"
#include "nncomm/transports/nccl_transport.hpp"
#include "nncomm/core/wait.hpp"

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
// host_identity()): the host and the PCI bus id, as NCCL's own check for
// ranks sharing a GPU has them, so that auto never picks NCCL where NCCL
// would refuse. MIG instances of one GPU share its bus id: they count as
// one GPU, whose IPC set-up fails there (CUDA IPC does not cross MIG
// instances) and falls back to host memory.
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
         " GPUs, so ranks sharing one cannot use NCCL (they communicate "
         "through CUDA IPC or host memory); give each rank its own, as "
         "nnabla's examples do with ctx.device_id = str(comm.local_rank)";
}

} // namespace

namespace {

// The transports a path can be made of.
enum class Kind { kNccl, kIpc, kStaged };

class CudaDevicePath final : public DevicePath {
public:
  // `chosen`: the kind is auto's choice, not the user's (an IPC set-up
  // that fails then falls back to staging).
  CudaDevicePath(Kind kind, bool chosen, const NcclApi *nccl, int device,
                 std::string advice)
      : kind_(kind), chosen_(chosen), nccl_(nccl), device_(device),
        advice_(std::move(advice)) {}

  // The rest of Open(): the path's transport over `host` and its packer.
  Status start(std::unique_ptr<MpiTransport> host) {
    NNCOMM_RETURN_IF_ERROR(transport_over(std::move(host), &transport_));
    return fail_together(*transport_,
                         DeviceArrays::Create(*transport_, &memory_),
                         "setting up the group's GPU packer");
  }

  const char *transport_name() const override {
    switch (kind_) {
    case Kind::kNccl: return "nccl";
    case Kind::kIpc: return "ipc";
    case Kind::kStaged: break;
    }
    return "mpi";
  }
  size_t bucket_floor_bytes() const override {
    return kind_ == Kind::kIpc ? config::ipc_bucket_bytes() : 0;
  }
  const std::string &advice() const override { return advice_; }
  int device() const override { return device_; }

  Status run(CudaStream compute, const std::vector<ArrayRef> &arrays,
             const Collective &collective) override {
    const Status placed = check_on_device(arrays, device_);
    if (!placed.ok()) {
      // The other ranks may be making this call: comparing one that no
      // rank makes tells them, at once or at their wait's next look, that
      // this rank will not, so that they raise instead of waiting for it.
      // Where every rank refuses alike, the comparison passes and all go
      // on. This rank's error is its refusal, whatever the comparison
      // found.
      CollectiveQueue::Turn turn(queue_);
      (void)transport_->check_call(
          Fingerprint().add("a GPU call refused on this rank").value(), true);
      return placed;
    }
    CollectiveQueue::Turn turn(queue_);
    NNCOMM_RETURN_IF_ERROR(turn.status());
    NNCOMM_RETURN_IF_ERROR(transport_->follow(compute));
    NNCOMM_RETURN_IF_ERROR(collective(*transport_, *memory_));
    return transport_->lead(compute);
  }

  Status create_engine(std::unique_ptr<MpiTransport> host, CudaStream compute,
                       size_t num_tensors, int poll_us,
                       std::unique_ptr<Engine> *out) override {
    std::unique_ptr<DeviceTransport> own;
    NNCOMM_RETURN_IF_ERROR(transport_over(std::move(host), &own));
    std::unique_ptr<CudaRunner> runner;
    // The caller's next step is collective (pyx/engines.pxi: whether every
    // rank prepared): a rank failing here alone would leave the others
    // there.
    NNCOMM_RETURN_IF_ERROR(fail_together(
        *own, CudaRunner::Create(*own, compute, &runner),
        "setting up the engine's GPU packer"));
    out->reset(
        new Engine(std::move(own), std::move(runner), num_tensors, poll_us));
    return Status::Ok();
  }

private:
  // A device transport of the path's kind over `host`, on its device.
  // Collective; fails on every rank when it fails on one.
  Status transport_over(std::unique_ptr<MpiTransport> host,
                        std::unique_ptr<DeviceTransport> *out) {
    DeviceScope scope;
    const Status entered = scope.enter(device_);
    // The other ranks compare their set-up's outcome with this rank's
    // before waiting for it (fail_together): this one's failure too.
    if (!entered.ok())
      return fail_together(*host, entered, "setting up GPU communication");
    if (kind_ == Kind::kNccl) {
      std::unique_ptr<NcclTransport> t;
      NNCOMM_RETURN_IF_ERROR(
          NcclTransport::Create(*nccl_, std::move(host), &t));
      *out = std::move(t);
      return Status::Ok();
    }
    std::unique_ptr<StagedTransport> staged;
    NNCOMM_RETURN_IF_ERROR(
        StagedTransport::Create(std::move(host), &staged));
    if (kind_ == Kind::kStaged) {
      *out = std::move(staged);
      return Status::Ok();
    }
    std::unique_ptr<IpcTransport> t;
    const Status made = IpcTransport::Create(&staged, &t);
    if (made.ok()) {
      *out = std::move(t);
      return Status::Ok();
    }
    // Every rank failed alike (fail_together), so every rank falls back
    // alike, and the path's later transports are staged too.
    if (!chosen_ || staged == nullptr)
      return made;
    kind_ = Kind::kStaged;
    if (staged->rank() == 0) {
      advice_ += std::string(advice_.empty() ? "" : "; ") +
                 "CUDA IPC could not be set up between the group's ranks (" +
                 made.message() + "), so they communicate through host "
                 "memory";
    }
    *out = std::move(staged);
    return Status::Ok();
  }

  Kind kind_;
  const bool chosen_;
  const NcclApi *const nccl_; // kNccl's
  const int device_;
  std::string advice_;
  CollectiveQueue queue_;
  std::unique_ptr<DeviceTransport> transport_;
  std::unique_ptr<DeviceArrays> memory_; // on transport_
};

} // namespace

Status DevicePath::Open(std::unique_ptr<MpiTransport> host, const void *on,
                        std::unique_ptr<DevicePath> *out) {
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
  std::set<int64_t> devices, hosts;
  std::vector<int> without_nccl, without_device;
  for (int r = 0; r < size; ++r) {
    devices.insert(all[kFields * r + kDevice]);
    hosts.insert(all[kFields * r + kHost]);
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
  const bool one_host = hosts.size() == 1 && size <= IpcTransport::kMaxRanks;
  if (choice == config::GpuTransport::kIpc && !one_host) {
    return Status::InvalidArgument(
        "NNCOMM_GPU_TRANSPORT=ipc, but the group's " + std::to_string(size) +
        " ranks are not all on one host, or more than " +
        std::to_string(IpcTransport::kMaxRanks) +
        " (CUDA IPC reaches the memory of one host's GPUs)");
  }
  Kind kind = Kind::kStaged;
  bool chosen = false;
  if (choice == config::GpuTransport::kIpc) {
    kind = Kind::kIpc;
  } else if (choice == config::GpuTransport::kNccl ||
             (choice == config::GpuTransport::kAuto && !shared &&
              without_nccl.empty())) {
    kind = Kind::kNccl;
  } else if (choice == config::GpuTransport::kAuto && one_host &&
             devices.size() == 1 && size > 1) {
    kind = Kind::kIpc;
    chosen = true;
  }
  const std::string advice = sharing_advice(all, host->rank(), visible);
  std::unique_ptr<CudaDevicePath> path(new CudaDevicePath(
      kind, chosen, kind == Kind::kNccl ? api : nullptr, device, advice));
  NNCOMM_RETURN_IF_ERROR(path->start(std::move(host)));
  *out = std::move(path);
  return Status::Ok();
}

} // namespace nncomm

// DeviceGroup in a communicator built without CUDA: every call says why it
// cannot work, so that the binding links and a caller gets a clear error.
#include "nncomm/cuda_devices.hpp"
#include "nncomm/device_group.hpp"

namespace nncomm {

namespace {
Status unavailable() { return built_without_cuda(); }
} // namespace

struct DeviceGroup::State {};

DeviceGroup::DeviceGroup(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
DeviceGroup::~DeviceGroup() = default;

Status DeviceGroup::Create(Group &, const void *,
                           std::unique_ptr<DeviceGroup> *) {
  return unavailable();
}

const char *DeviceGroup::transport_name() const { return "none"; }

const std::string &DeviceGroup::advice() const {
  static const std::string none;
  return none;
}

Status check_on_device(const std::vector<ArrayRef> &, int) {
  return unavailable();
}

int DeviceGroup::device() const { return -1; }

Status DeviceGroup::create_engine(CudaStream, size_t, std::vector<Bucket>, int,
                                  std::unique_ptr<Engine> *) {
  return unavailable();
}

Status DeviceGroup::all_reduce(CudaStream, std::vector<ArrayRef> &, bool,
                               float, bool, Materializer) {
  return unavailable();
}

Status DeviceGroup::reduce(CudaStream, const std::vector<ArrayRef> &, int,
                           bool, bool) {
  return unavailable();
}

Status DeviceGroup::bcast(CudaStream, const std::vector<ArrayRef> &, int,
                          bool) {
  return unavailable();
}

Status DeviceGroup::all_gather(CudaStream, const ArrayRef &,
                               const std::vector<ArrayRef> &) {
  return unavailable();
}

Status DeviceGroup::all_gatherv(CudaStream, const ArrayRef &,
                                const std::vector<size_t> &,
                                const std::vector<ArrayRef> &) {
  return unavailable();
}

Status DeviceGroup::alltoall(CudaStream, const ArrayRef &,
                             const std::vector<size_t> &, const ArrayRef &,
                             const std::vector<size_t> &) {
  return unavailable();
}

Status DeviceGroup::reduce_scatter(CudaStream, const std::vector<ArrayRef> &,
                                   const ArrayRef &, bool) {
  return unavailable();
}

} // namespace nncomm

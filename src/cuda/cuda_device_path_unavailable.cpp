// A communicator built without CUDA opens no device path: the one place
// where a collective placed on a device is refused, so that the binding
// links and a caller gets a clear error.
#include "nncomm/cuda/cuda_devices.hpp"
#include "nncomm/collectives/device_path.hpp"

namespace nncomm {

Status DevicePath::Open(std::unique_ptr<MpiTransport>, const void *,
                        std::unique_ptr<DevicePath> *) {
  return built_without_cuda();
}

} // namespace nncomm

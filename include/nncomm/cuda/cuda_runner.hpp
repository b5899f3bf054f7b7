// CudaRunner: buckets of CUDA device memory, reduced on a DeviceTransport
// without the host waiting for the device. When a bucket's last gradient
// is final (ready()), an event is recorded on the stream the framework
// computes on (nnabla-ext-cuda's: the legacy default stream); the
// transport's stream waits for it, and the bucket is packed there by the
// CUDA packer (DeviceArrays: scale and wire dtype fused, one launch),
// reduced and unpacked, all in that stream's order. close() makes the
// framework's stream wait for the last of it, so an optimizer step
// enqueued afterwards sees reduced gradients.
#pragma once

#include <memory>
#include <vector>

#include "nncomm/core/bucket_runner.hpp"
#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/transports/device_transport.hpp"

namespace nncomm {

class CudaRunner : public BucketRunner {
public:
  // A runner on `transport` (which must outlive it), for gradients the
  // framework computes on `compute`.
  static Status Create(DeviceTransport &transport, CudaStream compute,
                       std::unique_ptr<CudaRunner> *out);
  ~CudaRunner() override;

  Status prepare(const std::vector<Bucket> &plan) override;
  Status ready(size_t index) override;
  Status close() override;
  void *stream() const override;
  int device() const override;

protected:
  Status follow(size_t index) override;

private:
  CudaRunner(DeviceTransport &transport, CudaStream compute,
             std::unique_ptr<ArrayMemory> memory)
      : BucketRunner(transport, std::move(memory)), transport_(transport),
        compute_(compute) {}

  DeviceTransport &transport_;
  const CudaStream compute_;
  std::vector<CudaEvent> ready_; // per bucket: its gradients are final
};

} // namespace nncomm

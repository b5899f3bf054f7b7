// CudaRunner: buckets of CUDA device memory, reduced on a DeviceTransport
// without the host waiting for the device. When a bucket's last gradient
// is final (ready()), an event is recorded on the stream the framework
// computes on (nnabla-ext-cuda's: the legacy default stream); the
// transport's stream waits for it, and the bucket is packed there by the
// CUDA packer (DeviceArrays: scale and wire dtype fused, one launch),
// reduced and unpacked, all in that stream's order. close() makes the
// framework's stream wait for the last of it, so an optimizer step
// enqueued afterwards sees reduced gradients. While a timeline records,
// each bucket's device time goes to it too (device_trace.hpp).
#pragma once

#include <memory>
#include <vector>

#include "nncomm/core/bucket_runner.hpp"
#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/cuda/device_trace.hpp"
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
  Status finish() override;
  Status close() override;
  void *stream() const override;
  int device() const override;

protected:
  Status follow(size_t index) override;
  Status packed(size_t index, const Bucket &bucket, bool staged) override;

private:
  CudaRunner(DeviceTransport &transport, CudaStream compute,
             std::unique_ptr<ArrayMemory> memory)
      : BucketRunner(transport, std::move(memory)), transport_(transport),
        compute_(compute) {}

  // Records `point` of the bucket started last where a timeline records.
  Status trace(DeviceTrace::Point point);

  DeviceTransport &transport_;
  const CudaStream compute_;
  std::vector<CudaEvent> ready_; // per bucket: its gradients are final
  std::unique_ptr<DeviceTrace> trace_; // made at the first timeline
  size_t current_ = 0;                 // the bucket started last
  bool tracing_ = false;               // its points are being recorded
};

} // namespace nncomm

// CudaRunner: buckets of CUDA device memory, reduced on a DeviceTransport
// without the host waiting for the device. When a bucket's last gradient
// is final (ready()), an event is recorded on the stream the framework
// computes on (nnabla-ext-cuda's: the legacy default stream); the
// transport's stream waits for it, the CUDA packer packs the bucket there
// (scale and wire dtype fused) into one device staging buffer, the
// transport reduces it, and the packer unpacks it (divided), all in that
// stream's order. A direct bucket is reduced where it lies. close() makes
// the framework's stream wait for the last of it, so an optimizer step
// enqueued afterwards sees reduced gradients.
#pragma once

#include <memory>
#include <vector>

#include "nncomm/bucket_runner.hpp"
#include "nncomm/cuda_pack.hpp"
#include "nncomm/device_transport.hpp"

namespace nncomm {

class CudaRunner : public BucketRunner {
public:
  // A runner on `transport` (which must outlive it), for gradients the
  // framework computes on `compute`.
  static Status Create(DeviceTransport &transport, CudaStream compute,
                       std::unique_ptr<CudaRunner> *out);
  ~CudaRunner() override;
  CudaRunner(const CudaRunner &) = delete;
  CudaRunner &operator=(const CudaRunner &) = delete;

  Status prepare(const std::vector<Bucket> &plan) override;
  Status ready(size_t index) override;
  Status start(size_t index, const Bucket &bucket, const TensorTable &tensors,
               float scale, int divisor, bool zeros, WorkPtr *work) override;
  Status finish() override;
  Status close() override;

private:
  CudaRunner(DeviceTransport &transport, CudaStream compute,
             std::unique_ptr<CudaPacker> packer)
      : transport_(transport), compute_(compute), packer_(std::move(packer)) {}

  DeviceTransport &transport_;
  const CudaStream compute_;
  const std::unique_ptr<CudaPacker> packer_;
  void *staging_ = nullptr; // device memory for the largest bucket
  std::vector<CudaEvent> ready_; // per bucket: its gradients are final
  std::vector<PackSegment> segments_;
  // The staged bucket started last: unpacked by finish().
  PackTable table_;
  DType wire_ = DType::kFloat32;
  int divisor_ = 1;
  bool unpack_ = false;
};

} // namespace nncomm

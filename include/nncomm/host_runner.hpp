// HostRunner: buckets of host memory. A direct bucket (one piece of one
// tensor in the wire dtype, bucket_plan.hpp) is scaled, reduced and divided
// where it lies; any other goes through one staging buffer, reused for
// every bucket: packed (pack_host), reduced, unpacked. A tensor whose dtype
// is not the planned one goes through the staging buffer too, converted
// into and out of the bucket's dtype, so the call stays the one every rank
// planned.
#pragma once

#include <vector>

#include "nncomm/bucket_runner.hpp"
#include "nncomm/fusion_buffer.hpp"
#include "nncomm/pack.hpp"

namespace nncomm {

class HostRunner : public BucketRunner {
public:
  // Reduces on `transport`, which must outlive the runner.
  explicit HostRunner(Transport &transport) : transport_(transport) {}

  Status prepare(const std::vector<Bucket> &plan) override;
  Status start(size_t index, const Bucket &bucket, const TensorTable &tensors,
               float scale, int divisor, bool zeros, WorkPtr *work) override;
  Status finish() override;

private:
  Transport &transport_;
  FusionBuffer staging_;
  std::vector<PackSegment> segments_;
  // The staged bucket started last: unpacked by finish().
  PackTable table_;
  char *buffer_ = nullptr;
  DType wire_ = DType::kFloat32;
  int divisor_ = 1;
  bool unpack_ = false;
};

} // namespace nncomm

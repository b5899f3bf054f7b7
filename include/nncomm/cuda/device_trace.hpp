// DeviceTrace: what the device does for each bucket of a CUDA engine, in
// the timeline (timeline.hpp, its "device" track). The engine's own spans
// are host times, and on a GPU the host runs ahead of the device: a
// bucket's reduce span there is mostly the transport waiting for the
// device to reach the bucket. Here each step of a bucket is a CUDA event
// recorded on the transport's stream: when the stream reached the bucket,
// when the framework's gradients were ready (its wait for the compute
// stream over), packed, reduced, written back. An iteration's events are
// read once the next one starts (or the trace ends), by then long
// complete, and placed on the host clock through an anchor event recorded
// on an idle stream of its own as the iteration's first bucket is reached.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"
#include "nncomm/cuda/cuda_pack.hpp"

namespace nncomm {

class DeviceTrace {
public:
  enum Point { kReached, kReady, kPacked, kReduced, kWritten, kPoints };

  // A trace on `device`.
  static Status Create(int device, std::unique_ptr<DeviceTrace> *out);
  ~DeviceTrace(); // writes what is left
  DeviceTrace(const DeviceTrace &) = delete;
  DeviceTrace &operator=(const DeviceTrace &) = delete;

  // Records `point` of bucket `index` on `stream`. The first of an
  // iteration writes the last iteration's to the timeline first.
  Status mark(size_t index, Point point, CudaStream stream);
  // What bucket `index` is: `count` elements of `dtype`, packed or (not
  // `staged`) reduced where it lies.
  void describe(size_t index, size_t count, DType dtype, bool staged);
  // The iteration's points are all recorded.
  void close() { closed_ = true; }

private:
  struct Bucket {
    CudaEvent events[kPoints] = {};
    bool marked[kPoints] = {};
    size_t count = 0;
    DType dtype = DType::kFloat32;
    bool staged = false;
  };
  explicit DeviceTrace(int device) : device_(device) {}
  // Writes the recorded iteration's spans to the timeline and forgets them.
  Status flush();

  const int device_;
  CudaStream anchor_stream_ = nullptr;
  CudaEvent anchor_ = nullptr;
  std::chrono::steady_clock::time_point anchor_host_;
  bool closed_ = false;
  std::vector<Bucket> buckets_; // by index
  // The buckets marked since the anchor, in order (a bucket's first point
  // is kReached).
  std::vector<size_t> order_;
};

} // namespace nncomm

#include "nncomm/cuda/device_trace.hpp"

#include <algorithm>
#include <iterator>

#include "cuda/cuda_calls.hpp"
#include "nncomm/observability/timeline.hpp"

namespace nncomm {

namespace {

cudaEvent_t event(CudaEvent e) { return static_cast<cudaEvent_t>(e); }

} // namespace

Status DeviceTrace::Create(int device, std::unique_ptr<DeviceTrace> *out) {
  std::unique_ptr<DeviceTrace> trace(new DeviceTrace(device));
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(device));
  cudaStream_t s = nullptr;
  NNCOMM_CUDA_CALL(cudaStreamCreateWithFlags, &s, cudaStreamNonBlocking);
  trace->anchor_stream_ = s;
  cudaEvent_t e = nullptr;
  NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &e, cudaEventDefault);
  trace->anchor_ = e;
  *out = std::move(trace);
  return Status::Ok();
}

DeviceTrace::~DeviceTrace() {
  DeviceScope scope;
  if (!scope.enter(device_).ok())
    return;
  (void)flush();
  for (Bucket &b : buckets_) {
    for (CudaEvent e : b.events) {
      if (e != nullptr)
        cudaEventDestroy(event(e));
    }
  }
  if (anchor_ != nullptr)
    cudaEventDestroy(event(anchor_));
  if (anchor_stream_ != nullptr)
    cudaStreamDestroy(static_cast<cudaStream_t>(anchor_stream_));
}

Status DeviceTrace::mark(size_t index, Point point, CudaStream stream) {
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(device_));
  if (closed_)
    NNCOMM_RETURN_IF_ERROR(flush());
  if (order_.empty()) {
    // The iteration's first point. On an idle stream the event is reached
    // as soon as it is recorded.
    anchor_host_ = std::chrono::steady_clock::now();
    NNCOMM_CUDA_CALL(cudaEventRecord, event(anchor_),
                     static_cast<cudaStream_t>(anchor_stream_));
  }
  if (index >= buckets_.size())
    buckets_.resize(index + 1);
  Bucket &b = buckets_[index];
  if (b.events[point] == nullptr) {
    cudaEvent_t e = nullptr;
    NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &e, cudaEventDefault);
    b.events[point] = e;
  }
  if (point == kReached) {
    std::fill(std::begin(b.marked), std::end(b.marked), false);
    order_.push_back(index);
  }
  NNCOMM_CUDA_CALL(cudaEventRecord, event(b.events[point]),
                   static_cast<cudaStream_t>(stream));
  b.marked[point] = true;
  return Status::Ok();
}

void DeviceTrace::describe(size_t index, size_t count, DType dtype,
                           bool staged) {
  if (index >= buckets_.size())
    return;
  Bucket &b = buckets_[index];
  b.count = count;
  b.dtype = dtype;
  b.staged = staged;
}

Status DeviceTrace::flush() {
  closed_ = false;
  // Each span: its name, its first and last point, whether a bucket
  // reduced where it lies has it.
  struct Span {
    const char *name;
    Point from, to;
    bool direct;
  };
  static const Span kSpans[] = {{"wait_gradients", kReached, kReady, true},
                                {"pack", kReady, kPacked, false},
                                {"reduce", kPacked, kReduced, true},
                                {"unpack", kReduced, kWritten, false}};
  Status status;
  for (size_t index : order_) {
    Bucket &b = buckets_[index];
    double at[kPoints] = {};
    for (int p = 0; p < kPoints && status.ok(); ++p) {
      if (!b.marked[p])
        continue;
      float ms = 0;
      status = cuda_status(cudaEventSynchronize(event(b.events[p])),
                           "cudaEventSynchronize");
      if (status.ok()) {
        status = cuda_status(
            cudaEventElapsedTime(&ms, event(anchor_), event(b.events[p])),
            "cudaEventElapsedTime");
      }
      at[p] = ms;
    }
    for (const Span &s : kSpans) {
      if (!status.ok() || !b.marked[s.from] || !b.marked[s.to] ||
          (!b.staged && !s.direct))
        continue;
      const auto time = [&](Point p) {
        return anchor_host_ +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double, std::milli>(at[p]));
      };
      TimelineArgs args;
      args.bucket = static_cast<int64_t>(index);
      args.bytes = static_cast<int64_t>(b.count * dtype_size(b.dtype));
      args.dtype = dtype_name(b.dtype);
      Timeline::complete(Track::kDevice, s.name, time(s.from), time(s.to),
                         std::move(args));
    }
  }
  order_.clear();
  return status;
}

} // namespace nncomm

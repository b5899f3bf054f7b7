// BucketRunner: how one bucket of an engine's plan is reduced where its
// tensors live, in the ArrayMemory that holds them (host memory, or a CUDA
// device's: array_memory.hpp). A direct bucket (one piece of one tensor in
// the wire dtype, bucket_plan.hpp) is scaled, reduced and divided where it
// lies; any other goes through one staging buffer, reused for every bucket:
// packed (scaled, converted to the wire dtype), reduced, unpacked (divided)
// back. A tensor whose dtype is not the planned one goes through the
// staging buffer too, converted into and out of the bucket's dtype, so the
// call stays the one every rank planned. The engine (engine.hpp) keeps the
// readiness, the plan order and the waiting; a runner only executes. The
// CUDA runner (cuda_runner.hpp) adds the ordering with the framework's
// stream.
#pragma once

#include <memory>
#include <vector>

#include "nncomm/core/array_memory.hpp"
#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/core/dtype.hpp"
#include "nncomm/core/pack.hpp"
#include "nncomm/core/status.hpp"
#include "nncomm/transports/transport.hpp"

namespace nncomm {

// The tensors of an iteration: where each one's element 0 is (nullptr: not
// written on this rank, reduced as zeros) and its dtype, by tensor index.
struct TensorTable {
  const std::vector<void *> &ptrs;
  const std::vector<DType> &dtypes;
};

class BucketRunner {
public:
  // Reduces on `transport`, which must outlive the runner, staging in
  // `memory`, which must be where the tensors are and ordered with
  // `transport`.
  BucketRunner(Transport &transport, std::unique_ptr<ArrayMemory> memory)
      : transport_(transport), memory_(std::move(memory)) {}
  virtual ~BucketRunner() = default;
  BucketRunner(const BucketRunner &) = delete;
  BucketRunner &operator=(const BucketRunner &) = delete;

  // Allocates what the largest bucket of `plan` needs, once, so that no
  // iteration allocates: a rank whose allocation failed half-way through an
  // iteration could only send zeros.
  virtual Status prepare(const std::vector<Bucket> &plan);
  // Bucket `index` of the plan has all its tensors final: called on the
  // thread that marked the last of them final, as it did (where the
  // framework's work that wrote them is known to be enqueued).
  virtual Status ready(size_t index) { return Status::Ok(); }
  // Starts reducing bucket `index` of the plan, `bucket`: every rank's
  // segments times `scale`, summed, divided by `divisor`. With `zeros`
  // (this rank failed), sends zeros and writes nothing back. With `check`
  // (NNCOMM_CHECK_FINITE), the segments are checked for NaN and infinity
  // as they are packed (or before they are reduced in place), for
  // nonfinite(), and the bucket is sent all the same. `*work` completes
  // with the reduction.
  Status start(size_t index, const Bucket &bucket, const TensorTable &tensors,
               float scale, int divisor, bool zeros, bool check,
               WorkPtr *work);
  // As start(), for a bucket hook (bucket_hook.hpp) to reduce instead of
  // the transport: packs it into the staging buffer, `*buffer`, times
  // `scale`, and finish() divides it by `divisor` as it unpacks
  // (`*hook_divisor` 1). With `in_place` (the hook reduces where the
  // bucket lies), a direct bucket that start() would reduce in place, with
  // `scale` 1, is handed over as it lies instead, the hook to divide it by
  // `*hook_divisor` (`divisor`), and finish() writes nothing back.
  Status stage(size_t index, const Bucket &bucket, const TensorTable &tensors,
               float scale, int divisor, bool zeros, bool check,
               bool in_place, void **buffer, int *hook_divisor);
  // Writes the bucket started last back into its tensors, once its work
  // has completed.
  virtual Status finish();
  // Appends to `*tensors` each tensor whose segment held a NaN or an
  // infinity in the buckets started with `check` since the last call,
  // which must all be reduced (their work completed): on a device, the
  // findings are then known to be on their way to the host, and no wait
  // for the device is added before the transport's.
  Status nonfinite(std::vector<size_t> *tensors);
  // Every bucket of the iteration is reduced and written back: makes the
  // framework's later work see them. Called on the framework's thread.
  virtual Status close() { return Status::Ok(); }
  // The CUDA stream (a cudaStream_t) the staging buffer's packing and
  // unpacking are enqueued on, in order with the transport's work; nullptr
  // where the staging buffer is host memory.
  virtual void *stream() const { return nullptr; }
  // The CUDA device of the staging buffer; -1 for host memory.
  virtual int device() const { return -1; }

protected:
  // What start() reads of bucket `index` from here on must be what the
  // framework wrote (ready() was called for it).
  virtual Status follow(size_t index) { return Status::Ok(); }
  // Bucket `index`, `bucket`, is packed (`staged`) or, reduced where it
  // lies, about to be: its reduction comes next.
  virtual Status packed(size_t index, const Bucket &bucket, bool staged) {
    return Status::Ok();
  }

private:
  // Where `bucket` is reduced in place (checked first, with `check`), or
  // nullptr where it is staged: see in_place() in bucket_runner.cpp.
  Status direct_piece(const Bucket &bucket, const TensorTable &tensors,
                      bool zeros, bool precise, bool check, void **piece);
  // Packs `bucket` into buffer_ for finish() to unpack, scaling as `s`.
  Status pack(const Bucket &bucket, const TensorTable &tensors,
              const ScalingSplit &s, bool zeros, bool check);

  Transport &transport_;
  const std::unique_ptr<ArrayMemory> memory_;
  std::vector<PackSegment> segments_;
  std::vector<size_t> checked_; // the tensor of each finding, in order
  std::vector<bool> found_;     // the findings, reused
  // The staged bucket started last: unpacked by finish().
  PackTable table_;
  char *buffer_ = nullptr;
  DType wire_ = DType::kFloat32;
  int divisor_ = 1;
  bool unpack_ = false;
};

} // namespace nncomm

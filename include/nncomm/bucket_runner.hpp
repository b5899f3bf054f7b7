// BucketRunner: how one bucket of an engine's plan is reduced where its
// tensors live: packed (scaled, converted to the wire dtype), reduced over
// the transport, unpacked (divided) back. The host runner (host_runner.hpp)
// works on host memory; a CUDA runner, on device memory through the CUDA
// packer, sits beside it. The engine (engine.hpp) keeps the readiness, the
// plan order and the waiting; a runner only executes.
#pragma once

#include <vector>

#include "nncomm/bucket_plan.hpp"
#include "nncomm/dtype.hpp"
#include "nncomm/pack.hpp"
#include "nncomm/status.hpp"
#include "nncomm/transport.hpp"

namespace nncomm {

// The tensors of an iteration: where each one's element 0 is (nullptr: not
// written on this rank, reduced as zeros) and its dtype, by tensor index.
struct TensorTable {
  const std::vector<void *> &ptrs;
  const std::vector<DType> &dtypes;
};

class BucketRunner {
public:
  virtual ~BucketRunner() = default;
  // Allocates what the largest bucket of `plan` needs, once, so that no
  // iteration allocates: a rank whose allocation failed half-way through an
  // iteration could only send zeros.
  virtual Status prepare(const std::vector<Bucket> &plan) = 0;
  // Bucket `index` of the plan has all its tensors final: called on the
  // thread that marked the last of them final, as it did (where the
  // framework's work that wrote them is known to be enqueued).
  virtual Status ready(size_t index) { return Status::Ok(); }
  // Starts reducing bucket `index` of the plan, `bucket`: every rank's
  // segments times `scale`, summed, divided by `divisor`. With `zeros`
  // (this rank failed), sends zeros and writes nothing back. `*work`
  // completes with the reduction.
  virtual Status start(size_t index, const Bucket &bucket,
                       const TensorTable &tensors, float scale, int divisor,
                       bool zeros, WorkPtr *work) = 0;
  // Writes the bucket started last back into its tensors, once its work
  // has completed.
  virtual Status finish() = 0;
  // Every bucket of the iteration is reduced and written back: makes the
  // framework's later work see them. Called on the framework's thread.
  virtual Status close() { return Status::Ok(); }
};

// What every runner decides the same way. Where a direct bucket of this
// rank lies, in the planned dtype, to be reduced in place; nullptr when it
// must go through staging instead (not direct, `zeros`, a gradient never
// written here, or one in another dtype than planned).
void *in_place(const Bucket &bucket, const TensorTable &tensors, bool zeros);
// `bucket`'s segments as the packer takes them (`*segments` refilled):
// null tensors, read as zeros, with `zeros`.
void staged_segments(const Bucket &bucket, const TensorTable &tensors,
                     bool zeros, std::vector<PackSegment> *segments);

} // namespace nncomm

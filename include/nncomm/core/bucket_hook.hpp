// BucketHook: a reduction of the engine's buckets that replaces the
// transport's all-reduce, as PyTorch DDP's communication hooks do
// (register_comm_hook): the engine packs the bucket as it always does,
// hands the packed buffer to the hook, and unpacks what the hook leaves
// there; a hook that reduces in place may be handed a direct bucket where
// it lies instead (the gradient's own memory), and divides it itself. The
// Python hooks of all_reduce_callback, gradient_reducer and
// DistributedSolver are one (pyx/bucket_hooks.pxi).
#pragma once

#include <cstddef>

#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"
#include "nncomm/core/wait.hpp"
#include "nncomm/transports/transport.hpp"

namespace nncomm {

// A bucket of an iteration, packed and waiting for its reduction.
struct HookedBucket {
  size_t index;         // in the plan's launch order
  size_t buckets;       // in the plan
  const Bucket *bucket; // its segments
  void *buffer;         // `count` elements of `dtype`: this rank's, scaled
  size_t count;
  DType dtype;
  // What the hook divides the sum by: 1 where the engine divides as it
  // unpacks; the iteration's divisor for a bucket handed over in place.
  int divisor;
  // Where `buffer` is device memory: the CUDA stream its packing was
  // enqueued on, which the hook's device work and collectives follow and
  // the unpacking after it, and the CUDA device; nullptr and -1 for host
  // memory.
  void *stream;
  int device;
};

class BucketHook {
public:
  virtual ~BucketHook() = default;
  // Leaves in `bucket.buffer` the sum over the ranks of their buffers,
  // divided by `bucket.divisor`, communicating on `transport` alone,
  // waiting as `polling` says. Called on the engine's thread for every
  // bucket on every rank, in the same order (with zeros where this rank
  // failed). A failure must be every rank's: the engine then sends nothing
  // more this iteration, so a hook agrees with the other ranks on how its
  // call went before it returns.
  virtual Status reduce(const HookedBucket &bucket, Transport &transport,
                        const Polling &polling) = 0;
  // Whether direct buckets may be handed over where they lie, to be
  // reduced there and divided by HookedBucket::divisor.
  virtual bool reduces_in_place() const { return false; }
};

} // namespace nncomm

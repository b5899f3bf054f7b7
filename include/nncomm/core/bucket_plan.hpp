// The bucket plan of a reduction: which pieces of which tensors travel in
// which bucket, for the callback engine's gradients and for the fused
// messages of the list collectives alike. A pure function of the tensors'
// sizes and dtypes, so every rank that passes the same tensors gets the
// same plan and issues the same calls in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nncomm/core/dtype.hpp"

namespace nncomm {

struct TensorSpec {
  size_t count; // elements
  DType dtype;
};

// `count` elements of tensor `tensor`, from its element `tensor_offset`.
// A bucket's segments lie end to end in it, in their order (pack.hpp).
struct Segment {
  size_t tensor;
  size_t tensor_offset;
  size_t count;
};

struct Bucket {
  DType dtype; // the dtype on the wire
  size_t count = 0;
  // One piece of one tensor, already in the wire dtype: reduced where it
  // lies, without the copies into and out of a staging buffer.
  bool direct = false;
  std::vector<Segment> segments;
  std::vector<size_t> tensors; // distinct tensors with a segment here
  // The highest of its tensors' priorities (prioritize()); in the plan's
  // fingerprint, so that ranks given different priorities are refused.
  double priority = 0;
};

// Fills buckets of up to `pack_size` elements with `tensors` taken in
// `order`, splitting a tensor across buckets where it does not fit.
// With `keep_dtype`, a bucket holds one dtype and travels in it (a bucket
// per dtype is open at a time); otherwise every bucket travels in `wire`.
// A tensor of at least `direct_bytes` that needs no conversion gets direct
// buckets of its own, up to `pack_size` elements each, placed when its turn
// comes while the open buckets keep filling. Empty tensors get no segment.
// Buckets are listed in launch order: the open buckets last, in the order
// their dtypes were first used.
std::vector<Bucket> plan_buckets(const std::vector<TensorSpec> &tensors,
                                 const std::vector<size_t> &order,
                                 size_t pack_size, bool keep_dtype, DType wire,
                                 size_t direct_bytes);

// Gives each bucket of `plan` the highest of its tensors' `priorities`
// (by tensor index) and sorts the plan by it, highest first, ties in plan
// order: a static launch order, the same on every rank given the same
// priorities.
void prioritize(const std::vector<double> &priorities,
                std::vector<Bucket> *plan);

// Merges consecutive buckets of `plan` of one dtype, each under
// `floor_bytes`, into buckets of at least `floor_bytes` (the last of a run
// may stay smaller), for a transport whose every operation costs a fixed
// round that outweighs a small bucket's bytes (config::ipc_bucket_bytes()).
// A merged bucket takes the highest priority of its parts; adjacent pieces
// of one tensor become one segment, and direct pieces of one tensor that
// join into one stay direct. Deterministic, so ranks that agreed on `plan`
// and share the floor run the same merged plan. 0: `plan` as it is.
void merge_buckets(size_t floor_bytes, std::vector<Bucket> *plan);

// The same on two ranks only if their plans are: what the ranks compare
// before they run a plan.
uint64_t plan_fingerprint(const std::vector<Bucket> &plan);

} // namespace nncomm

// OwnerReduction: ZeRO stage 2's reduction of the engine's buckets, a
// BucketHook (bucket_hook.hpp). The reduced tensors lie end to end in one
// element space in which each rank owns one contiguous range
// (python/nncomm/sharded_state.py); a rank updates only the elements it
// owns, so each element of a bucket is summed onto its owner alone: the
// bucket is reduce-scattered in equal blocks, then each run of it that one
// rank owns is collected by that rank from the blocks' holders. Elements a
// rank does not own are left NaN there, so that a gradient read where it
// was not reduced is loudly wrong, never plausibly so.
#pragma once

#include <cstddef>
#include <vector>

#include "nncomm/core/bucket_hook.hpp"

namespace nncomm {

// `count` elements of a bucket's buffer from `offset` on, owned by `owner`.
struct OwnerRun {
  size_t offset;
  size_t count;
  int owner;
};

// The runs of `bucket` (its segments end to end from offset 0), each as
// long as one rank owns its elements, in buffer order. Tensor t's element
// i is element `starts[t] + i` of the space; rank r owns
// [bounds[r], bounds[r + 1]), `bounds` rising from 0. Fails on a tensor
// with no start or an element beyond the last bound.
Status owner_runs(const Bucket &bucket, const std::vector<size_t> &starts,
                  const std::vector<size_t> &bounds,
                  std::vector<OwnerRun> *runs);

class OwnerReduction : public BucketHook {
public:
  OwnerReduction(std::vector<size_t> starts, std::vector<size_t> bounds);
  // Leaves each run's sum on its owner, divided by `bucket.divisor`; the
  // other ranks' copies of the run become NaN.
  Status reduce(const HookedBucket &bucket, Transport &transport,
                const Polling &polling) override;
  // Direct buckets are reduced where they lie: no staging copies.
  bool reduces_in_place() const override { return true; }

private:
  const std::vector<size_t> starts_;
  const std::vector<size_t> bounds_;
  std::vector<OwnerRun> runs_; // reused from bucket to bucket
  std::vector<char> scratch_;  // this rank's block of a bucket, reused
};

} // namespace nncomm

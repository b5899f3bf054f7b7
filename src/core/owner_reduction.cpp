#include "nncomm/core/owner_reduction.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "nncomm/host/elementwise.hpp"

namespace nncomm {

namespace {

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
         dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// Fills `count` elements of floating `dtype` at `data` with a quiet NaN.
void fill_nan(void *data, size_t count, DType dtype) {
  switch (dtype) {
  case DType::kFloat32:
    std::fill_n(static_cast<float *>(data), count,
                std::numeric_limits<float>::quiet_NaN());
    return;
  case DType::kFloat64:
    std::fill_n(static_cast<double *>(data), count,
                std::numeric_limits<double>::quiet_NaN());
    return;
  default: {
    const uint16_t nan = dtype == DType::kFloat16 ? 0x7e00 : 0x7fc0;
    char *out = static_cast<char *>(data);
    for (size_t i = 0; i < count; ++i)
      std::memcpy(out + 2 * i, &nan, 2);
  }
  }
}

} // namespace

Status owner_runs(const Bucket &bucket, const std::vector<size_t> &starts,
                  const std::vector<size_t> &bounds,
                  std::vector<OwnerRun> *runs) {
  runs->clear();
  size_t offset = 0;
  for (const Segment &s : bucket.segments) {
    if (s.tensor >= starts.size()) {
      return Status::InvalidArgument(
          "the sharded reduction knows " + std::to_string(starts.size()) +
          " gradients; a bucket holds gradient " + std::to_string(s.tensor));
    }
    size_t at = starts[s.tensor] + s.tensor_offset;
    const size_t end = at + s.count;
    while (at < end) {
      // The owner: the last rank whose range starts at or before `at`.
      const auto next = std::upper_bound(bounds.begin(), bounds.end(), at);
      if (next == bounds.end()) {
        return Status::InvalidArgument(
            "gradient " + std::to_string(s.tensor) + " reaches element " +
            std::to_string(end) + " of the sharded space, which has " +
            std::to_string(bounds.back()));
      }
      const int owner = static_cast<int>(next - bounds.begin()) - 1;
      const size_t count = std::min(end, *next) - at;
      if (!runs->empty() && runs->back().owner == owner &&
          runs->back().offset + runs->back().count == offset)
        runs->back().count += count;
      else
        runs->push_back({offset, count, owner});
      offset += count;
      at += count;
    }
  }
  return Status::Ok();
}

OwnerReduction::OwnerReduction(std::vector<size_t> starts,
                               std::vector<size_t> bounds)
    : starts_(std::move(starts)), bounds_(std::move(bounds)) {}

Status OwnerReduction::reduce(const HookedBucket &bucket,
                              Transport &transport, const Polling &polling) {
  const int ranks = transport.size();
  const int me = transport.rank();
  if (bounds_.size() != static_cast<size_t>(ranks) + 1) {
    return Status::InvalidArgument(
        "the sharded reduction has ranges for " +
        std::to_string(bounds_.size() - 1) + " ranks; the group has " +
        std::to_string(ranks));
  }
  // Checked before any collective: the same answer on every rank (one plan).
  if (!is_floating(bucket.dtype)) {
    return Status::InvalidArgument(
        std::string("gradients sharded over their owners must be floating "
                    "point, not ") + dtype_name(bucket.dtype));
  }
  NNCOMM_RETURN_IF_ERROR(owner_runs(*bucket.bucket, starts_, bounds_, &runs_));
  const auto finish = [&](Status started, WorkPtr &work) {
    NNCOMM_RETURN_IF_ERROR(started);
    return wait_for(*work, me == 0, &polling);
  };
  const DType dt = bucket.dtype;
  const size_t size = dtype_size(dt);
  char *buffer = static_cast<char *>(bucket.buffer);
  // Rank k sums block k, [k * block, (k + 1) * block), of the bucket; the
  // few elements past the last block are all-reduced. A reduce onto each
  // run's owner would move no more bytes, but MPICH's took 2.7 times as
  // long as its all-reduce of a 4 MiB bucket on 2 and 4 ranks, its
  // reduce-scatter 0.2 times (bench/zero_bench.py --primitives).
  // Sums only: each owner divides its own runs at the end, by its own
  // divisor (a rank whose copy of a direct bucket is staged, in another
  // dtype, has the engine divide as it unpacks; one reducing it in place
  // divides here), whoever held their block.
  const size_t block = bucket.count / ranks;
  const size_t blocks_end = block * ranks;
  WorkPtr work;
  if (block > 0) {
    if (scratch_.size() < block * size)
      scratch_.resize(block * size);
    NNCOMM_RETURN_IF_ERROR(
        finish(transport.start_reduce_scatter(buffer, scratch_.data(), block,
                                              dt, 1, &work),
               work));
  }
  if (blocks_end < bucket.count) {
    NNCOMM_RETURN_IF_ERROR(
        finish(transport.start_allreduce(buffer + blocks_end * size,
                                         bucket.count - blocks_end, dt, 1.0f,
                                         1, &work),
               work));
  }
  // Each run's owner collects its elements from the blocks' holders.
  const std::vector<size_t> none(ranks, 0);
  for (const OwnerRun &run : runs_) {
    const size_t lo = run.offset;
    const size_t hi = std::min(run.offset + run.count, blocks_end);
    Blocks send{none, none}, recv{none, none};
    bool others = false; // another rank holds some of the run
    for (int k = 0; k < ranks; ++k) {
      const size_t a = std::max(lo, k * block);
      const size_t b = std::min(hi, (k + 1) * block);
      if (a >= b)
        continue;
      others = others || k != run.owner;
      if (k == me) {
        send.counts[run.owner] = b - a;
        send.offsets[run.owner] = a - k * block;
      }
      if (me == run.owner) {
        recv.counts[k] = b - a;
        recv.offsets[k] = a;
      }
    }
    if (others) {
      NNCOMM_RETURN_IF_ERROR(finish(
          transport.start_alltoallv(scratch_.data(), send, buffer, recv, dt,
                                    &work),
          work));
    } else if (me == run.owner && lo < hi) {
      // All in this rank's own block: nothing travels.
      std::memcpy(buffer + lo * size,
                  scratch_.data() + (lo - me * block) * size,
                  (hi - lo) * size);
    }
  }
  for (const OwnerRun &run : runs_) {
    char *piece = buffer + run.offset * size;
    if (run.owner != me)
      fill_nan(piece, run.count, dt);
    else if (bucket.divisor != 1)
      convert_scaled(piece, dt, piece, dt, run.count, 1.0f, bucket.divisor);
  }
  return Status::Ok();
}

} // namespace nncomm

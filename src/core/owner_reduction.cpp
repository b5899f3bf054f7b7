#include "nncomm/core/owner_reduction.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

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
  if (bounds_.size() != static_cast<size_t>(transport.size()) + 1) {
    return Status::InvalidArgument(
        "the sharded reduction has ranges for " +
        std::to_string(bounds_.size() - 1) + " ranks; the group has " +
        std::to_string(transport.size()));
  }
  // Checked before any reduce: the same answer on every rank (one plan).
  if (!is_floating(bucket.dtype)) {
    return Status::InvalidArgument(
        std::string("gradients sharded over their owners must be floating "
                    "point, not ") + dtype_name(bucket.dtype));
  }
  NNCOMM_RETURN_IF_ERROR(owner_runs(*bucket.bucket, starts_, bounds_, &runs_));
  const size_t size = dtype_size(bucket.dtype);
  char *buffer = static_cast<char *>(bucket.buffer);
  for (const OwnerRun &run : runs_) {
    char *piece = buffer + run.offset * size;
    WorkPtr work;
    NNCOMM_RETURN_IF_ERROR(transport.start_reduce(piece, run.count,
                                                  bucket.dtype, run.owner, 1,
                                                  &work));
    NNCOMM_RETURN_IF_ERROR(wait_for(*work, transport.rank() == 0, &polling));
    if (run.owner != transport.rank())
      fill_nan(piece, run.count, bucket.dtype);
  }
  return Status::Ok();
}

} // namespace nncomm

#include "nncomm/core/bucket_runner.hpp"

#include <algorithm>
#include <string>

namespace nncomm {

namespace {

// Where a direct bucket of this rank lies, in the planned dtype, to be
// reduced in place; nullptr when it must go through staging instead (not
// direct, `zeros`, a gradient never written here, one in another dtype
// than planned, or a scaling the transport would make less precise than
// packing does: `precise` false).
void *in_place(const Bucket &bucket, const TensorTable &tensors, bool zeros,
               bool precise) {
  const Segment &first = bucket.segments[0];
  char *ptr = static_cast<char *>(tensors.ptrs[first.tensor]);
  if (!bucket.direct || zeros || !precise || ptr == nullptr ||
      tensors.dtypes[first.tensor] != bucket.dtype)
    return nullptr;
  return ptr + first.tensor_offset * dtype_size(bucket.dtype);
}

// `bucket`'s segments as the packer takes them (`*segments` refilled):
// null tensors, read as zeros, with `zeros`.
void staged_segments(const Bucket &bucket, const TensorTable &tensors,
                     bool zeros, std::vector<PackSegment> *segments) {
  segments->clear();
  for (const Segment &s : bucket.segments) {
    segments->push_back({zeros ? nullptr : tensors.ptrs[s.tensor],
                         tensors.dtypes[s.tensor], s.tensor_offset, s.count});
  }
}

// Appends to `*tensors` the tensor of each row of `bucket`'s pack table,
// whose rows are its non-empty segments in order.
void tensors_of_rows(const Bucket &bucket, std::vector<size_t> *tensors) {
  for (const Segment &s : bucket.segments) {
    if (s.count != 0)
      tensors->push_back(s.tensor);
  }
}

} // namespace

Status BucketRunner::prepare(const std::vector<Bucket> &plan) {
  size_t bytes = 0;
  for (const Bucket &b : plan)
    bytes = std::max(bytes, b.count * dtype_size(b.dtype));
  return memory_->reserve(std::max<size_t>(bytes, 1), &buffer_);
}

Status BucketRunner::direct_piece(const Bucket &bucket,
                                  const TensorTable &tensors, bool zeros,
                                  bool precise, bool check, void **piece) {
  *piece = in_place(bucket, tensors, zeros, precise);
  if (*piece != nullptr && check) {
    NNCOMM_RETURN_IF_ERROR(
        memory_->check_finite(*piece, bucket.count, bucket.dtype));
    checked_.push_back(bucket.segments[0].tensor);
  }
  return Status::Ok();
}

Status BucketRunner::start(size_t index, const Bucket &bucket,
                           const TensorTable &tensors, float scale,
                           int divisor, bool zeros, bool check,
                           WorkPtr *work) {
  unpack_ = false;
  NNCOMM_RETURN_IF_ERROR(follow(index));
  const bool precise =
      transport_.scales_precisely(bucket.dtype, scale, divisor);
  void *piece = nullptr;
  NNCOMM_RETURN_IF_ERROR(
      direct_piece(bucket, tensors, zeros, precise, check, &piece));
  if (piece != nullptr) {
    NNCOMM_RETURN_IF_ERROR(packed(index, bucket, false));
    return transport_.start_allreduce(piece, bucket.count, bucket.dtype, scale,
                                      divisor, work);
  }
  const ScalingSplit s = split_scaling(*memory_, bucket.dtype, scale, divisor);
  NNCOMM_RETURN_IF_ERROR(pack(bucket, tensors, s, zeros, check));
  NNCOMM_RETURN_IF_ERROR(packed(index, bucket, true));
  return transport_.start_allreduce(buffer_, table_.count, bucket.dtype,
                                    s.reduce_scale, s.reduce_divisor, work);
}

Status BucketRunner::stage(size_t index, const Bucket &bucket,
                           const TensorTable &tensors, float scale,
                           int divisor, bool zeros, bool check, bool in_place,
                           void **buffer, int *hook_divisor) {
  unpack_ = false;
  *hook_divisor = 1;
  NNCOMM_RETURN_IF_ERROR(follow(index));
  if (in_place && scale == 1.0f) {
    // The hook divides as the transport's reduce does, in the dtype.
    NNCOMM_RETURN_IF_ERROR(
        direct_piece(bucket, tensors, zeros, true, check, buffer));
    if (*buffer != nullptr) {
      *hook_divisor = divisor;
      return packed(index, bucket, false);
    }
  }
  const ScalingSplit s = split_scaling(*memory_, bucket.dtype, scale, divisor);
  if (s.reduce_scale != 1.0f || s.reduce_divisor != 1) {
    // The hook would have to scale: it is promised a plain sum.
    return Status::InvalidArgument(
        std::string("a bucket hook needs buckets that nncomm scales while "
                    "packing; ") + dtype_name(bucket.dtype) +
        " buckets on this memory are scaled by the transport");
  }
  NNCOMM_RETURN_IF_ERROR(pack(bucket, tensors, s, zeros, check));
  *buffer = buffer_;
  return packed(index, bucket, true);
}

Status BucketRunner::pack(const Bucket &bucket, const TensorTable &tensors,
                          const ScalingSplit &s, bool zeros, bool check) {
  staged_segments(bucket, tensors, zeros, &segments_);
  NNCOMM_RETURN_IF_ERROR(build_pack_table(segments_.data(), segments_.size(),
                                          bucket.dtype, &table_));
  NNCOMM_RETURN_IF_ERROR(
      memory_->reserve(table_.count * dtype_size(bucket.dtype), &buffer_));
  if (check && !zeros) {
    NNCOMM_RETURN_IF_ERROR(
        memory_->pack_checked(table_, buffer_, bucket.dtype, s.pack_scale));
    tensors_of_rows(bucket, &checked_);
  } else {
    NNCOMM_RETURN_IF_ERROR(
        memory_->pack(table_, buffer_, bucket.dtype, s.pack_scale));
  }
  wire_ = bucket.dtype;
  divisor_ = s.unpack_divisor;
  unpack_ = !zeros;
  return Status::Ok();
}

Status BucketRunner::nonfinite(std::vector<size_t> *tensors) {
  if (checked_.empty())
    return Status::Ok();
  Status status = memory_->findings(&found_);
  if (status.ok() && found_.size() != checked_.size()) {
    status = Status::RuntimeError(
        "nncomm's NaN/infinity check lost track of its findings");
  }
  for (size_t i = 0; status.ok() && i < checked_.size(); ++i) {
    if (found_[i])
      tensors->push_back(checked_[i]);
  }
  // Checks of this iteration are never carried into the next.
  checked_.clear();
  return status;
}

Status BucketRunner::finish() {
  if (!unpack_)
    return Status::Ok();
  unpack_ = false;
  return memory_->unpack(table_, buffer_, wire_, divisor_);
}

} // namespace nncomm

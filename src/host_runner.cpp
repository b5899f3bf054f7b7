#include "nncomm/host_runner.hpp"

#include <algorithm>

namespace nncomm {

Status HostRunner::prepare(const std::vector<Bucket> &plan) {
  size_t bytes = 0;
  for (const Bucket &b : plan)
    bytes = std::max(bytes, b.count * dtype_size(b.dtype));
  char *unused = nullptr;
  return staging_.reserve(bytes, &unused);
}

Status HostRunner::start(size_t, const Bucket &bucket,
                         const TensorTable &tensors, float scale, int divisor,
                         bool zeros, WorkPtr *work) {
  unpack_ = false;
  if (void *piece = in_place(bucket, tensors, zeros)) {
    return transport_.start_allreduce(piece, bucket.count, bucket.dtype, scale,
                                      divisor, work);
  }
  staged_segments(bucket, tensors, zeros, &segments_);
  NNCOMM_RETURN_IF_ERROR(build_pack_table(segments_.data(), segments_.size(),
                                          bucket.dtype, &table_));
  NNCOMM_RETURN_IF_ERROR(
      staging_.reserve(table_.count * dtype_size(bucket.dtype), &buffer_));
  NNCOMM_RETURN_IF_ERROR(pack_host(table_, buffer_, bucket.dtype, scale));
  wire_ = bucket.dtype;
  divisor_ = divisor;
  unpack_ = !zeros;
  return transport_.start_allreduce(buffer_, table_.count, bucket.dtype, 1.0f,
                                    1, work);
}

Status HostRunner::finish() {
  if (!unpack_)
    return Status::Ok();
  unpack_ = false;
  return unpack_host(table_, buffer_, wire_, 1.0f, divisor_);
}

} // namespace nncomm

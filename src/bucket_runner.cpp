#include "nncomm/bucket_runner.hpp"

namespace nncomm {

void *in_place(const Bucket &bucket, const TensorTable &tensors, bool zeros) {
  const Segment &first = bucket.segments[0];
  char *ptr = static_cast<char *>(tensors.ptrs[first.tensor]);
  if (!bucket.direct || zeros || ptr == nullptr ||
      tensors.dtypes[first.tensor] != bucket.dtype)
    return nullptr;
  return ptr + first.tensor_offset * dtype_size(bucket.dtype);
}

void staged_segments(const Bucket &bucket, const TensorTable &tensors,
                     bool zeros, std::vector<PackSegment> *segments) {
  segments->clear();
  for (const Segment &s : bucket.segments) {
    segments->push_back({zeros ? nullptr : tensors.ptrs[s.tensor],
                         tensors.dtypes[s.tensor], s.tensor_offset, s.count});
  }
}

} // namespace nncomm

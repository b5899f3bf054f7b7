#include "nncomm/core/pack.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "nncomm/host/elementwise.hpp"

namespace nncomm {

namespace {

bool known(DType dt) {
  switch (dt) {
  case DType::kFloat32:
  case DType::kFloat64:
  case DType::kFloat16:
  case DType::kBFloat16:
  case DType::kInt32:
  case DType::kInt64: return true;
  }
  return false;
}

std::string where(size_t i) { return "segment " + std::to_string(i) + ": "; }

// Integers travel only as themselves: a conversion or a scale would change
// their values silently.
Status check_integers(DType wire, float scale, int divisor) {
  if (dtype_is_floating(wire) || (scale == 1.0f && divisor == 1))
    return Status::Ok();
  return Status::InvalidArgument(
      "integer buckets cannot be scaled or divided (scale " +
      std::to_string(scale) + ", divisor " + std::to_string(divisor) + ")");
}

char *element(uint64_t address, size_t index, DType dt) {
  return reinterpret_cast<char *>(address) + index * dtype_size(dt);
}

// Elements a checking pack converts and then checks at a time: at most
// 32 KiB of tensor, still in L1 when the check reads it again, so that the
// check adds no pass over memory.
constexpr size_t kCheckedChunk = 4096;

// convert_scaled of a row that also says whether its tensor is finite: a
// plain copy checks as it copies; a conversion, chunk by chunk.
bool convert_checked(char *slot, DType wire, const char *tensor, DType dt,
                     size_t count, float scale) {
  if (dt == wire && scale == 1.0f)
    return copy_finite(slot, tensor, dt, count);
  bool finite = true;
  for (size_t done = 0; done < count; done += kCheckedChunk) {
    const size_t n = std::min(kCheckedChunk, count - done);
    const char *from = tensor + done * dtype_size(dt);
    convert_scaled(slot + done * dtype_size(wire), wire, from, dt, n, scale,
                   1);
    finite &= all_finite(from, dt, n);
  }
  return finite;
}

} // namespace

Status build_pack_table(const PackSegment *segments, size_t n, DType wire,
                        PackTable *table) {
  if (!known(wire))
    return Status::InvalidArgument("unknown wire dtype");
  table->entries.clear();
  table->count = 0;
  for (size_t i = 0; i < n; ++i) {
    const PackSegment &s = segments[i];
    if (!known(s.dtype))
      return Status::InvalidArgument(where(i) + "unknown dtype");
    if (dtype_is_floating(s.dtype) != dtype_is_floating(wire) ||
        (!dtype_is_floating(wire) && s.dtype != wire)) {
      return Status::InvalidArgument(
          where(i) + "integer tensors travel only in their own dtype");
    }
    const uintptr_t address = reinterpret_cast<uintptr_t>(s.tensor);
    if (address % dtype_size(s.dtype) != 0) {
      return Status::InvalidArgument(
          where(i) + "tensor address is not aligned to its element size");
    }
    if (s.count == 0)
      continue;
    PackEntry e;
    e.address = address == 0 ? 0 : address + s.offset * dtype_size(s.dtype);
    e.bucket_offset = table->count;
    e.count = s.count;
    e.first_tile = 0;
    e.dtype = static_cast<int32_t>(s.dtype);
    e.reserved = 0;
    table->entries.push_back(e);
    table->count += s.count;
  }
  return Status::Ok();
}

Status check_bucket_address(const void *bucket, size_t count, DType wire) {
  if (bucket == nullptr && count > 0)
    return Status::InvalidArgument("bucket address is 0");
  if (reinterpret_cast<uintptr_t>(bucket) % dtype_size(wire) == 0)
    return Status::Ok();
  return Status::InvalidArgument(
      "bucket address is not aligned to the wire dtype's element size");
}

Status pack_host(const PackTable &table, void *bucket, DType wire,
                 float scale, std::vector<size_t> *nonfinite) {
  NNCOMM_RETURN_IF_ERROR(check_bucket_address(bucket, table.count, wire));
  NNCOMM_RETURN_IF_ERROR(check_integers(wire, scale, 1));
  const uint64_t base = reinterpret_cast<uintptr_t>(bucket);
  for (size_t r = 0; r < table.entries.size(); ++r) {
    const PackEntry &e = table.entries[r];
    char *slot = element(base, e.bucket_offset, wire);
    if (e.address == 0) {
      std::memset(slot, 0, e.count * dtype_size(wire));
      continue;
    }
    const char *tensor = element(e.address, 0, DType(e.dtype));
    if (nonfinite == nullptr) {
      convert_scaled(slot, wire, tensor, DType(e.dtype), e.count, scale, 1);
    } else if (!convert_checked(slot, wire, tensor, DType(e.dtype), e.count,
                                scale)) {
      nonfinite->push_back(r);
    }
  }
  return Status::Ok();
}

Status unpack_host(const PackTable &table, const void *bucket, DType wire,
                   float scale, int divisor) {
  if (divisor < 1)
    return Status::InvalidArgument("divisor must be at least 1");
  NNCOMM_RETURN_IF_ERROR(check_bucket_address(bucket, table.count, wire));
  NNCOMM_RETURN_IF_ERROR(check_integers(wire, scale, divisor));
  const uint64_t base = reinterpret_cast<uintptr_t>(bucket);
  for (const PackEntry &e : table.entries) {
    if (e.address == 0)
      continue;
    convert_scaled(element(e.address, 0, DType(e.dtype)), DType(e.dtype),
                   element(base, e.bucket_offset, wire), wire, e.count, scale,
                   divisor);
  }
  return Status::Ok();
}

} // namespace nncomm

#include "nncomm/core/bucket_plan.hpp"

#include <algorithm>
#include <cstring>

#include "nncomm/core/fingerprint.hpp"

namespace nncomm {

std::vector<Bucket> plan_buckets(const std::vector<TensorSpec> &tensors,
                                 const std::vector<size_t> &order,
                                 size_t pack_size, bool keep_dtype, DType wire,
                                 size_t direct_bytes) {
  std::vector<Bucket> plan;
  // The bucket being filled for each wire dtype, in order of first use.
  std::vector<Bucket> open;
  auto open_bucket = [&](DType dt) -> Bucket & {
    for (Bucket &b : open) {
      if (b.dtype == dt)
        return b;
    }
    open.emplace_back();
    open.back().dtype = dt;
    return open.back();
  };
  for (size_t t : order) {
    const TensorSpec &spec = tensors[t];
    const DType dt = keep_dtype ? spec.dtype : wire;
    if (spec.count * dtype_size(dt) >= direct_bytes && spec.dtype == dt) {
      for (size_t done = 0; done < spec.count; done += pack_size) {
        Bucket b;
        b.dtype = dt;
        b.direct = true;
        b.count = std::min(pack_size, spec.count - done);
        b.segments.push_back({t, done, b.count});
        b.tensors.push_back(t);
        plan.push_back(std::move(b));
      }
      continue;
    }
    size_t done = 0;
    while (done < spec.count) {
      Bucket &b = open_bucket(dt);
      const size_t take = std::min(spec.count - done, pack_size - b.count);
      b.segments.push_back({t, done, take});
      if (b.tensors.empty() || b.tensors.back() != t)
        b.tensors.push_back(t);
      b.count += take;
      done += take;
      if (b.count == pack_size) {
        plan.push_back(std::move(b));
        b = Bucket();
        b.dtype = dt;
      }
    }
  }
  for (Bucket &b : open) {
    if (b.count > 0)
      plan.push_back(std::move(b));
  }
  return plan;
}

void prioritize(const std::vector<double> &priorities,
                std::vector<Bucket> *plan) {
  for (Bucket &b : *plan) {
    b.priority = priorities[b.tensors[0]];
    for (size_t t : b.tensors)
      b.priority = std::max(b.priority, priorities[t]);
  }
  std::stable_sort(plan->begin(), plan->end(),
                   [](const Bucket &a, const Bucket &b) {
                     return a.priority > b.priority;
                   });
}

namespace {

// Appends `from`'s pieces to `into`, as one bucket.
void append(Bucket &&from, Bucket *into) {
  for (const Segment &s : from.segments) {
    Segment *last = into->segments.empty() ? nullptr : &into->segments.back();
    if (last != nullptr && last->tensor == s.tensor &&
        last->tensor_offset + last->count == s.tensor_offset) {
      last->count += s.count;
    } else {
      into->segments.push_back(s);
    }
  }
  for (size_t t : from.tensors) {
    if (std::find(into->tensors.begin(), into->tensors.end(), t) ==
        into->tensors.end())
      into->tensors.push_back(t);
  }
  into->count += from.count;
  into->priority = std::max(into->priority, from.priority);
  // Pieces of one tensor that join into one are still reduced where they
  // lie.
  into->direct = into->direct && from.direct && into->segments.size() == 1;
}

} // namespace

void merge_buckets(size_t floor_bytes, std::vector<Bucket> *plan) {
  if (floor_bytes == 0 || plan->size() < 2)
    return;
  std::vector<Bucket> merged;
  bool open = false; // whether merged.back() takes more
  auto bytes = [](const Bucket &b) { return b.count * dtype_size(b.dtype); };
  for (Bucket &b : *plan) {
    // A bucket that reaches the floor itself goes as it is.
    if (open && merged.back().dtype == b.dtype && bytes(b) < floor_bytes) {
      append(std::move(b), &merged.back());
    } else {
      merged.push_back(std::move(b));
    }
    open = bytes(merged.back()) < floor_bytes;
  }
  plan->swap(merged);
}

uint64_t plan_fingerprint(const std::vector<Bucket> &plan) {
  Fingerprint f;
  f.add(plan.size());
  for (const Bucket &b : plan) {
    // -0.0 and 0.0 are one priority, with one pattern.
    const double priority = b.priority + 0.0;
    uint64_t bits;
    std::memcpy(&bits, &priority, sizeof bits);
    f.add(static_cast<uint64_t>(b.dtype)).add(b.count).add(b.direct);
    // Each half apart: priorities that differ in their exponent alone
    // would differ in the hash's top bits alone, which products never
    // carry down, and collide there.
    f.add(bits >> 32).add(bits & 0xffffffffu);
    f.add(b.segments.size());
    for (const Segment &s : b.segments)
      f.add(s.tensor).add(s.tensor_offset).add(s.count);
  }
  return f.value();
}

} // namespace nncomm

// What the tests compare against: arrays of nncomm's dtypes, random values,
// and the reduction nncomm promises, computed element by element without
// any of nncomm's code: each rank's share times `scale`, rounded to the
// wire dtype; the shares summed in rank order (as the fake transport sums
// them) in the wire dtype, a 16-bit float sum rounded after each addition;
// the sum divided by `divisor`, rounded to the dtype it is stored in.
// Arithmetic is in double where float64 takes part and in float otherwise
// (host_ops.hpp); float arithmetic is done here in double and rounded to
// float, which gives the same result for one +, * or / (double has more
// than 2 * 24 + 2 bits).
#pragma once

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "nncomm/core/dtype.hpp"

namespace unit {

// An array in host memory, aligned for any dtype.
class Array {
public:
  Array(nncomm::DType dtype, size_t count);

  nncomm::DType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * nncomm::dtype_size(dtype_); }
  void *data() { return storage_.data(); }
  const void *data() const { return storage_.data(); }

  // Element i, exactly.
  double get(size_t i) const;
  // Stores `value` rounded to the dtype once.
  void set(size_t i, double value);
  Array slice(size_t offset, size_t count) const;

private:
  nncomm::DType dtype_;
  size_t count_;
  std::vector<double> storage_; // 8-byte aligned; holds the bytes
};

// Non-zero values spread over a few binades, for floating dtypes;
// integers small enough that sums of a few never overflow.
Array random_array(nncomm::DType dtype, size_t count, std::mt19937_64 &rng);

// `value` rounded once to `dtype`.
double round_to(nncomm::DType dtype, double value);

// The reduction of `shares` (one per rank, of one count; nullptr: zeros, as
// a rank without the array sends, but not all nullptr), as described
// above, stored as `out`.
Array reduced(const std::vector<const Array *> &shares, nncomm::DType wire,
              float scale, int divisor, nncomm::DType out);

// "" when `got` and `want` hold the same bytes; else the first difference.
std::string first_difference(const Array &got, const Array &want);

} // namespace unit

#define CHECK_SAME(got, want)                                                  \
  CHECK_EQ(::unit::first_difference(got, want), std::string())

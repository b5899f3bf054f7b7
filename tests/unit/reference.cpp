#include "reference.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "check.hpp"
#include "nncomm/host/bfloat16.hpp"

namespace unit {

using nncomm::DType;

namespace {

template <typename T> double load(const void *p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

template <typename T> void store(void *p, T v) { std::memcpy(p, &v, sizeof v); }

// The type nncomm computes in where `a` and `b` meet (integers meet only
// their own dtype).
DType arithmetic(DType a, DType b) {
  if (!nncomm::dtype_is_floating(a))
    return a;
  return a == DType::kFloat64 || b == DType::kFloat64 ? DType::kFloat64
                                                      : DType::kFloat32;
}

double load(DType dtype, const char *p) {
  switch (dtype) {
  case DType::kFloat32: return load<float>(p);
  case DType::kFloat64: return load<double>(p);
  case DType::kFloat16: return load<_Float16>(p);
  case DType::kBFloat16: return load<nncomm::BFloat16>(p);
  case DType::kInt32: return load<int32_t>(p);
  case DType::kInt64: return load<int64_t>(p);
  }
  return 0;
}

void store(DType dtype, char *p, double value) {
  switch (dtype) {
  case DType::kFloat32: return store(p, static_cast<float>(value));
  case DType::kFloat64: return store(p, value);
  case DType::kFloat16: return store(p, static_cast<_Float16>(value));
  case DType::kBFloat16: return store(p, nncomm::BFloat16(value));
  case DType::kInt32: return store(p, static_cast<int32_t>(value));
  case DType::kInt64: return store(p, static_cast<int64_t>(value));
  }
}

} // namespace

// Never empty: an array of no elements still has an address (nullptr
// would make it a zeroing array).
Array::Array(DType dtype, size_t count)
    : dtype_(dtype), count_(count),
      storage_(1 + count * nncomm::dtype_size(dtype) / 8) {}

double Array::get(size_t i) const {
  return load(dtype_, reinterpret_cast<const char *>(storage_.data()) +
                          i * nncomm::dtype_size(dtype_));
}

void Array::set(size_t i, double value) {
  store(dtype_,
        reinterpret_cast<char *>(storage_.data()) +
            i * nncomm::dtype_size(dtype_),
        value);
}

Array Array::slice(size_t offset, size_t count) const {
  Array part(dtype_, count);
  if (count > 0) {
    std::memcpy(part.data(),
                static_cast<const char *>(data()) +
                    offset * nncomm::dtype_size(dtype_),
                part.bytes());
  }
  return part;
}

double round_to(DType dtype, double value) {
  char slot[8];
  store(dtype, slot, value);
  return load(dtype, slot);
}

Array random_array(DType dtype, size_t count, std::mt19937_64 &rng) {
  Array a(dtype, count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = rng();
    if (!nncomm::dtype_is_floating(dtype)) {
      a.set(i, static_cast<double>(bits % 2001) - 1000);
      continue;
    }
    // 24 random significant bits, a magnitude in [2^-7, 2^6), a sign.
    const double significand = static_cast<double>((bits >> 40) | (1u << 23));
    const int exponent = static_cast<int>(bits % 13) - 6 - 24;
    a.set(i, std::ldexp(bits & 16 ? -significand : significand, exponent));
  }
  return a;
}

Array reduced(const std::vector<const Array *> &shares, DType wire,
              float scale, int divisor, DType out) {
  size_t count = 0;
  for (const Array *share : shares) {
    if (share != nullptr)
      count = share->count();
  }
  Array result(out, count);
  for (size_t i = 0; i < count; ++i) {
    double sum = 0;
    for (size_t r = 0; r < shares.size(); ++r) {
      const Array *share = shares[r];
      double x = 0; // a missing share is sent as zeros, unscaled
      if (share != nullptr) {
        x = round_to(wire,
                     round_to(arithmetic(share->dtype(), wire),
                              share->get(i) * static_cast<double>(scale)));
      }
      sum = r == 0 ? x
                   : round_to(wire, round_to(arithmetic(wire, wire), sum + x));
    }
    result.set(i, round_to(arithmetic(wire, out), sum / divisor));
  }
  return result;
}

std::string first_difference(const Array &got, const Array &want) {
  std::ostringstream out;
  if (got.dtype() != want.dtype() || got.count() != want.count()) {
    out << got.count() << " " << show(got.dtype()) << " instead of "
        << want.count() << " " << show(want.dtype());
    return out.str();
  }
  if (got.count() == 0 ||
      std::memcmp(got.data(), want.data(), got.bytes()) == 0)
    return "";
  size_t i = 0;
  while (std::memcmp(static_cast<const char *>(got.data()) +
                         i * nncomm::dtype_size(got.dtype()),
                     static_cast<const char *>(want.data()) +
                         i * nncomm::dtype_size(want.dtype()),
                     nncomm::dtype_size(got.dtype())) == 0)
    ++i;
  out.precision(17);
  out << "element " << i << " of " << got.count() << " is " << got.get(i)
      << ", expected " << want.get(i);
  return out.str();
}

} // namespace unit

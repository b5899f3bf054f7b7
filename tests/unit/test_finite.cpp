// The NaN/infinity check's host kernels (NNCOMM_CHECK_FINITE): all_finite
// and copy_finite against std::isfinite for every float16 and bfloat16 bit
// pattern and for float32/float64 edge values (-0.0, subnormals, the
// largest finite, signalling and negative NaNs) at every position of
// arrays around the vector width, so that vector bodies and tails are
// both covered; and pack_host reporting exactly the rows that hold one,
// through plain copies and conversions, in chunks and across them, packing
// the same bytes as without the check.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "check.hpp"
#include "nncomm/core/pack.hpp"
#include "nncomm/host/bfloat16.hpp"
#include "nncomm/host/elementwise.hpp"

using namespace nncomm;
using namespace unit;

namespace {

template <typename T> T from_bits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// One element of `dt` checked alone and copied: the verdict `want`, the
// copy bit for bit.
void check_one(const void *element, DType dt, bool want) {
  CHECK_EQ(all_finite(element, dt, 1), want);
  uint64_t copy = 0;
  CHECK_EQ(copy_finite(&copy, element, dt, 1), want);
  CHECK(std::memcmp(&copy, element, dtype_size(dt)) == 0);
}

// `value` at each position of finite arrays of 1 to 70 elements makes
// the whole array as finite as `value` is.
template <typename T> void check_everywhere(DType dt, T value, bool finite) {
  for (size_t n = 1; n <= 70; ++n) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<T> v(n, static_cast<T>(1.5f));
      v[at] = value;
      std::vector<T> copy(n);
      CHECK_EQ(all_finite(v.data(), dt, n), finite);
      CHECK_EQ(copy_finite(copy.data(), v.data(), dt, n), finite);
      CHECK(std::memcmp(copy.data(), v.data(), n * sizeof(T)) == 0);
    }
  }
}

} // namespace

TEST(all_finite_agrees_with_isfinite_for_every_16_bit_pattern) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const _Float16 half = from_bits<_Float16>(b);
    check_one(&half, DType::kFloat16, std::isfinite(static_cast<float>(half)));
    const float widened = from_bits<float>(static_cast<uint64_t>(b) << 16);
    check_one(&b, DType::kBFloat16, std::isfinite(widened));
  }
  // Integers have no NaN.
  const int64_t ones = -1;
  check_one(&ones, DType::kInt64, true);
  check_one(&ones, DType::kInt32, true);
}

TEST(all_finite_float32_and_float64_edge_values_anywhere) {
  using F = std::numeric_limits<float>;
  const float floats[] = {-0.0f, F::denorm_min(), -F::denorm_min(),
                          F::min(), F::max(), -F::max()};
  for (float f : floats)
    check_everywhere(DType::kFloat32, f, true);
  const float bad_floats[] = {F::infinity(), -F::infinity(), F::quiet_NaN(),
                              -F::quiet_NaN(), F::signaling_NaN(),
                              from_bits<float>(0x7f800001u)};
  for (float f : bad_floats)
    check_everywhere(DType::kFloat32, f, false);
  using D = std::numeric_limits<double>;
  const double doubles[] = {-0.0, D::denorm_min(), D::max(), -D::max()};
  for (double d : doubles)
    check_everywhere(DType::kFloat64, d, true);
  const double bad_doubles[] = {D::infinity(), -D::infinity(),
                                D::quiet_NaN(), D::signaling_NaN(),
                                from_bits<double>(0xfff0000000000001ull)};
  for (double d : bad_doubles)
    check_everywhere(DType::kFloat64, d, false);
  const _Float16 half_edges[] = {from_bits<_Float16>(0x8000),
                                 from_bits<_Float16>(0x0001),
                                 from_bits<_Float16>(0x7bff)};
  for (_Float16 h : half_edges)
    check_everywhere(DType::kFloat16, h, true);
  check_everywhere(DType::kFloat16, from_bits<_Float16>(0xfc00), false);
  check_everywhere(DType::kFloat16, from_bits<_Float16>(0x7e00), false);
}

TEST(pack_host_reports_the_rows_holding_nan_or_infinity) {
  // Row 0 a plain copy (float32 on float32), row 1 a float16 conversion,
  // row 2 float64, row 3 zeros (no tensor), row 4 two checking chunks
  // and more, its infinity in the second; rows 0 and 2 stay finite.
  std::vector<float> a(300, 0.25f);
  std::vector<_Float16> b(20, static_cast<_Float16>(2.0f));
  std::vector<double> c(7, -0.0);
  std::vector<float> d(9000, 1.0f);
  b[19] = from_bits<_Float16>(0x7e00);
  d[5000] = -std::numeric_limits<float>::infinity();
  const PackSegment segments[] = {{a.data(), DType::kFloat32, 10, 290},
                                  {b.data(), DType::kFloat16, 0, 20},
                                  {c.data(), DType::kFloat64, 0, 7},
                                  {nullptr, DType::kFloat32, 0, 5},
                                  {d.data(), DType::kFloat32, 0, 9000}};
  for (float scale : {1.0f, 0.5f}) {
    PackTable table;
    CHECK_OK(build_pack_table(segments, 5, DType::kFloat32, &table));
    std::vector<float> plain(table.count), checked(table.count);
    CHECK_OK(pack_host(table, plain.data(), DType::kFloat32, scale));
    std::vector<size_t> rows;
    CHECK_OK(pack_host(table, checked.data(), DType::kFloat32, scale, &rows));
    CHECK_EQ(rows, (std::vector<size_t>{1, 4}));
    CHECK(std::memcmp(plain.data(), checked.data(),
                      plain.size() * sizeof(float)) == 0);
  }
  // Every row finite: nothing reported.
  b[19] = static_cast<_Float16>(0.0f);
  d[5000] = 3.0f;
  PackTable table;
  CHECK_OK(build_pack_table(segments, 5, DType::kFloat16, &table));
  std::vector<_Float16> message(table.count);
  std::vector<size_t> rows;
  CHECK_OK(pack_host(table, message.data(), DType::kFloat16, 1.0f, &rows));
  CHECK(rows.empty());
}

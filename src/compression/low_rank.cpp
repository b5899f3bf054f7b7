#include "nncomm/compression/low_rank.hpp"

#include <type_traits>
#include <vector>

namespace nncomm {

namespace {

// Eight floats in one vector (GCC's and Clang's vector extension: AVX's
// register where the build enables it, two SSE registers where not),
// loaded and stored at any float's alignment, and allowed to alias floats
// (as immintrin.h's __m256_u is).
typedef float Vec __attribute__((vector_size(32), aligned(4), may_alias));
constexpr size_t kWidth = 8;

Vec load(const float *p) { return *reinterpret_cast<const Vec *>(p); }
void store(float *p, Vec v) { *reinterpret_cast<Vec *>(p) = v; }

// A dot product's independent partial sums (two vectors): one accumulator
// would make it a chain of dependent additions. Fixed, so that its
// rounding does not depend on the vector width.
constexpr size_t kLanes = 2 * kWidth;
// Columns of P (rows of Q^T) done in one sweep along a row: each sweep
// reads the row once for up to this many of them.
constexpr size_t kBlock = 4;
// Rows of M the second pass adds into Q^T in one sweep.
constexpr size_t kRows = 4;

// The end of dots(): the elements from `tail` on, then the lanes.
template <size_t B>
void finish_dots(const float *row, const float *qt, size_t m, size_t tail,
                 const Vec (&lanes)[B][2], float *out) {
  for (size_t c = 0; c < B; ++c) {
    float sum = 0.0f;
    for (size_t j = tail; j < m; ++j)
      sum += row[j] * qt[c * m + j];
    for (size_t l = 0; l < kLanes; ++l)
      sum += lanes[c][l / kWidth][l % kWidth];
    out[c] = sum;
  }
}

// out[c] = dot(row, qt + c * m) for c < B: lane l sums the elements
// j = l (mod 16) of the whole sixteens, then the rest are summed in order,
// then the lanes in order.
template <size_t B>
void dots(const float *row, const float *qt, size_t m, float *out) {
  Vec lanes[B][2] = {};
  size_t j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    const Vec x0 = load(row + j), x1 = load(row + j + kWidth);
    for (size_t c = 0; c < B; ++c) {
      lanes[c][0] += x0 * load(qt + c * m + j);
      lanes[c][1] += x1 * load(qt + c * m + j + kWidth);
    }
  }
  finish_dots<B>(row, qt, m, j, lanes, out);
}

// out[j] (= or +=, `add`) sum over c < B of a[c] * rows[c * m + j], the
// terms added in c's order.
template <size_t B>
void combine(const float *coefficients, const float *rows, size_t m,
             bool add, float *out) {
  float a[B];  // in registers: `out` might alias `coefficients`
  for (size_t c = 0; c < B; ++c)
    a[c] = coefficients[c];
  size_t j = 0;
  for (; j + kWidth <= m; j += kWidth) {
    Vec sum = a[0] * load(rows + j);
    if (add)
      sum = load(out + j) + sum;
    for (size_t c = 1; c < B; ++c)
      sum += a[c] * load(rows + c * m + j);
    store(out + j, sum);
  }
  for (; j < m; ++j) {
    float sum = a[0] * rows[j];
    if (add)
      sum = out[j] + sum;
    for (size_t c = 1; c < B; ++c)
      sum += a[c] * rows[c * m + j];
    out[j] = sum;
  }
}

// out[c * m + j] += a[i * r + c] * rows[i * m + j] for c < B, i < R,
// the rows added in i's order: each element of `out` stays in a register
// over R rows instead of being loaded and stored for every one.
template <size_t B, size_t R>
void scatter(const float *coefficients, size_t r, const float *rows,
             size_t m, float *out) {
  float a[R][B];  // in registers: `out` might alias `coefficients`
  for (size_t i = 0; i < R; ++i)
    for (size_t c = 0; c < B; ++c)
      a[i][c] = coefficients[i * r + c];
  size_t j = 0;
  for (; j + kWidth <= m; j += kWidth) {
    Vec sums[B];
    for (size_t c = 0; c < B; ++c)
      sums[c] = load(out + c * m + j);
    for (size_t i = 0; i < R; ++i) {
      const Vec x = load(rows + i * m + j);
      for (size_t c = 0; c < B; ++c)
        sums[c] += a[i][c] * x;
    }
    for (size_t c = 0; c < B; ++c)
      store(out + c * m + j, sums[c]);
  }
  for (; j < m; ++j)
    for (size_t c = 0; c < B; ++c) {
      float sum = out[c * m + j];
      for (size_t i = 0; i < R; ++i)
        sum += a[i][c] * rows[i * m + j];
      out[c * m + j] = sum;
    }
}

// Calls kernel<B>(c, B) over c = 0, kBlock, 2 kBlock, ... < r, B the
// block's width (the last may be narrower).
template <typename Kernel> void by_blocks(size_t r, Kernel &&kernel) {
  for (size_t c = 0; c < r; c += kBlock) {
    switch (r - c < kBlock ? r - c : kBlock) {
    case 1: kernel(c, std::integral_constant<size_t, 1>()); break;
    case 2: kernel(c, std::integral_constant<size_t, 2>()); break;
    case 3: kernel(c, std::integral_constant<size_t, 3>()); break;
    default: kernel(c, std::integral_constant<size_t, 4>()); break;
    }
  }
}

// out = P's row `p` (r values, each times `scale`) times Q^T: a row of
// P Q^T.
void estimate_row(const float *p, const float *qt, size_t r, size_t m,
                  float scale, float *out) {
  float a[kBlock];
  by_blocks(r, [&](size_t c, auto width) {
    constexpr size_t B = decltype(width)::value;
    for (size_t k = 0; k < B; ++k)
      a[k] = p[c + k] * scale;
    combine<B>(a, qt + c * m, m, c > 0, out);
  });
}

// Row i of low_rank_project: M's row (into `k` with error feedback) and
// its first B dot products with Q, in one sweep. `estimate` holds the last
// estimate's r coefficients (P's row times the scale), or is null.
template <size_t B>
void project_row(const float *g, float *k, const float *estimate,
                 const float *qt_last, size_t r, const float *qt, size_t m,
                 float *p) {
  // M's elements j .. j + 7: g + (kept - estimate), or g.
  auto row = [&](size_t j) {
    if (k == nullptr)
      return load(g + j);
    Vec v = load(k + j);
    if (estimate != nullptr) {
      Vec e = estimate[0] * load(qt_last + j);
      for (size_t c = 1; c < r; ++c)
        e += estimate[c] * load(qt_last + c * m + j);
      v = v - e;
    }
    v = load(g + j) + v;
    store(k + j, v);
    return v;
  };
  Vec lanes[B][2] = {};
  size_t j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    const Vec x0 = row(j), x1 = row(j + kWidth);
    for (size_t c = 0; c < B; ++c) {
      lanes[c][0] += x0 * load(qt + c * m + j);
      lanes[c][1] += x1 * load(qt + c * m + j + kWidth);
    }
  }
  const size_t tail = j;
  if (k != nullptr) {
    for (; j < m; ++j) {
      float v = k[j];
      if (estimate != nullptr) {
        float e = estimate[0] * qt_last[j];
        for (size_t c = 1; c < r; ++c)
          e += estimate[c] * qt_last[c * m + j];
        v = v - e;
      }
      k[j] = g[j] + v;
    }
  }
  finish_dots<B>(k != nullptr ? k : g, qt, m, tail, lanes, p);
}

} // namespace

void low_rank_project(const LowRankMatrix &a, float estimate_scale,
                      const float *qt, float *p) {
  const bool estimated = a.kept != nullptr && a.p_last != nullptr;
  std::vector<float> estimate(estimated ? a.r : 0);
  for (size_t i = 0; i < a.n; ++i) {
    for (size_t c = 0; c < estimate.size(); ++c)
      estimate[c] = a.p_last[i * a.r + c] * estimate_scale;
    const float *g = a.gradient + i * a.m;
    float *k = a.kept != nullptr ? a.kept + i * a.m : nullptr;
    // The first block makes M's row; the others read it (from cache).
    by_blocks(a.r, [&](size_t c, auto width) {
      constexpr size_t B = decltype(width)::value;
      if (c == 0)
        project_row<B>(g, k, estimated ? estimate.data() : nullptr,
                       a.qt_last, a.r, qt, a.m, p + i * a.r);
      else
        dots<B>(k != nullptr ? k : g, qt + c * a.m, a.m, p + i * a.r + c);
    });
  }
}

void low_rank_back_project(const LowRankMatrix &a, const float *p,
                           float *qt) {
  const float *source = a.kept != nullptr ? a.kept : a.gradient;
  for (size_t k = 0; k < a.r * a.m; ++k)
    qt[k] = 0.0f;
  // Adds rows i .. i + R - 1 of M.
  auto add_rows = [&](size_t i, auto rows) {
    by_blocks(a.r, [&](size_t c, auto width) {
      scatter<decltype(width)::value, decltype(rows)::value>(
          p + i * a.r + c, a.r, source + i * a.m, a.m, qt + c * a.m);
    });
  };
  size_t i = 0;
  for (; i + kRows <= a.n; i += kRows)
    add_rows(i, std::integral_constant<size_t, kRows>());
  for (; i < a.n; ++i)
    add_rows(i, std::integral_constant<size_t, 1>());
}

void low_rank_expand(const LowRankMatrix &a, const float *p,
                     const float *qt) {
  for (size_t i = 0; i < a.n; ++i)
    estimate_row(p + i * a.r, qt, a.r, a.m, 1.0f, a.gradient + i * a.m);
}

} // namespace nncomm

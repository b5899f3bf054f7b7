// PowerSGD's passes over one float32 gradient matrix on the host (Vogels,
// Karimireddy and Jaggi, NeurIPS 2019), for nncomm.hooks.PowerSGD. Pure
// functions over host memory; the sums over the ranks and the
// orthonormalization of P between the passes are the caller's.
//
// Per iteration, with error feedback, the method sends P = M Q and then
// Q = M^T P (P orthonormalized after its sum) for M = gradient + residual,
// and keeps residual = M - P Q^T / size. Writing that residual is a pass of
// its own over M. These passes keep M itself instead (`kept`) and subtract
// the last estimate while they read M for the next P, from the last
// factors (n r + r m floats): the same arithmetic in three passes (one of
// them reading only, one writing only), where the residual's form takes
// five.
//
// Rows are done one at a time (the first pass makes a row of M, subtracting
// the estimate, and its dot products with Q in one sweep of vector
// registers); Q is given transposed (r x m: each of its r columns
// contiguous), so that every inner loop runs along a row. Every sum's
// order is fixed (16 lanes per dot product) whatever vector width the
// build has, so that ranks built alike compute the same bits of P Q^T from
// the same P and Q.
#pragma once

#include <cstddef>

namespace nncomm {

// An n x m row-major gradient matrix and its rank-r factors' state.
struct LowRankMatrix {
  size_t n;
  size_t m;
  size_t r;
  float *gradient;
  // n x m: this rank's M, carried from one iteration to the next (error
  // feedback); null without error feedback.
  float *kept;
  // The last iteration's P (n x r, orthonormalized) and Q^T (r x m, summed
  // over the ranks); null before the first estimate.
  const float *p_last;
  const float *qt_last;
};

// The first pass. With error feedback, M = gradient + (kept - p_last
// qt_last * estimate_scale), written to kept; without, M = gradient. Then
// p (n x r) = M Q for the r x m Q^T `qt`.
void low_rank_project(const LowRankMatrix &a, float estimate_scale,
                      const float *qt, float *p);

// The second pass: qt (r x m) = P^T M, for M as low_rank_project left it.
void low_rank_back_project(const LowRankMatrix &a, const float *p,
                           float *qt);

// The third: gradient = P Q^T (n x r by r x m).
void low_rank_expand(const LowRankMatrix &a, const float *p,
                     const float *qt);

} // namespace nncomm

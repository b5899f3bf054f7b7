// How every nncomm kernel, host or device, applies a scale and a divisor:
// x * scale / divisor. Dividing, rather than multiplying by 1 / divisor,
// rounds as numpy's x / n does. A power-of-two divisor is folded into the
// scale instead: 1 / divisor is then exact, so the product rounds as the
// division would (results in the subnormal range excepted, where the
// unfolded form rounds twice), and costs a fraction of it. The scale is a
// float32 value, also where the arithmetic is in float64.
#pragma once

#include <cmath>

namespace nncomm {

struct Scaling {
  float multiply;
  float divide; // 1 when there is nothing to divide by
};

inline Scaling make_scaling(float scale, int divisor) {
  int exponent = 0;
  if (std::frexp(static_cast<float>(divisor), &exponent) == 0.5f)
    return {scale / static_cast<float>(divisor), 1.0f};
  return {scale, static_cast<float>(divisor)};
}

} // namespace nncomm

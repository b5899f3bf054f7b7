#include "nncomm/core/launch_tuner.hpp"

#include <algorithm>

namespace nncomm {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
} // namespace

LaunchTuner::LaunchTuner(std::optional<Launch> fixed)
    : decided_(fixed.has_value()), next_(fixed.value_or(Launch::kEager)) {}

void LaunchTuner::record(double seconds) {
  if (decided_)
    return;
  ++iteration_;
  if (iteration_ > kWarmup) {
    (next_ == Launch::kEager ? eager_ : deferred_).push_back(seconds);
  }
  if (static_cast<int>(deferred_.size()) == kSamples &&
      static_cast<int>(eager_.size()) == kSamples) {
    decided_ = true;
    next_ =
        median(deferred_) < median(eager_) ? Launch::kDeferred : Launch::kEager;
    return;
  }
  if (iteration_ >= kWarmup) {
    next_ =
        deferred_.size() <= eager_.size() ? Launch::kDeferred : Launch::kEager;
  }
}

} // namespace nncomm

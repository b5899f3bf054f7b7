// When the callback engine launches its buckets.
//
// Eager: each bucket as soon as its gradients are final, overlapping the
// reduction with the rest of backward. That wins when communication has
// resources of its own (a network to wait on, a spare core). Deferred: all
// buckets once backward has produced the last gradient. That wins when
// every core is busy computing, as with one rank per core on shared
// memory: there the reduction's CPU work cannot hide behind backward, it
// can only slow it, and reducing during backward costs more CPU (polling,
// caches) than reducing after it.
//
// With the automatic choice, the tuner times both on the first iterations
// and keeps the faster. It is fed the iteration times summed over the
// group's ranks, which every rank sees alike, so all ranks choose alike.
#pragma once

#include <optional>
#include <vector>

namespace nncomm {

enum class Launch { kEager, kDeferred };

class LaunchTuner {
public:
  // `fixed`: always that schedule; empty: choose by measurement.
  explicit LaunchTuner(std::optional<Launch> fixed);

  // The schedule of the coming iteration.
  Launch next() const { return next_; }
  // The iteration launched with next() took `seconds`, summed over ranks.
  void record(double seconds);
  // Whether the choice is made (always, for a fixed schedule).
  bool decided() const { return decided_; }

private:
  // Iterations not timed (plans checked, memory touched the first time),
  // then this many timed iterations of each schedule, alternating.
  static constexpr int kWarmup = 2;
  static constexpr int kSamples = 3;

  int iteration_ = 0;
  bool decided_;
  Launch next_;
  std::vector<double> eager_, deferred_;
};

} // namespace nncomm

// The launch tuner: a fixed schedule stays; the automatic choice times
// both schedules after its warm-up and keeps the one of smaller median.
#include <functional>

#include "check.hpp"
#include "nncomm/core/launch_tuner.hpp"

using namespace nncomm;

namespace {

constexpr Launch E = Launch::kEager;
constexpr Launch D = Launch::kDeferred;

// Two untimed iterations, then three of each schedule, alternating.
const std::vector<Launch> kTuning = {E, E, D, E, D, E, D, E};

// Runs `tuner` for `iterations`, each taking `seconds(schedule, iteration)`;
// returns the schedules it ran.
std::vector<Launch> run(LaunchTuner &tuner, int iterations,
                        const std::function<double(Launch, int)> &seconds) {
  std::vector<Launch> ran;
  for (int i = 0; i < iterations; ++i) {
    ran.push_back(tuner.next());
    tuner.record(seconds(tuner.next(), i));
  }
  return ran;
}

} // namespace

TEST(launch_tuner_fixed_schedule_never_changes) {
  for (Launch fixed : {E, D}) {
    LaunchTuner tuner(fixed);
    CHECK(tuner.decided());
    const std::vector<Launch> ran =
        run(tuner, 12, [](Launch l, int) { return l == E ? 9.0 : 1.0; });
    CHECK_EQ(ran, std::vector<Launch>(12, fixed));
    CHECK(tuner.decided());
  }
}

TEST(launch_tuner_keeps_the_faster_schedule) {
  for (Launch faster : {E, D}) {
    LaunchTuner tuner(std::nullopt);
    const auto seconds = [&](Launch l, int) { return l == faster ? 1.0 : 2.0; };
    CHECK_EQ(run(tuner, 8, seconds), kTuning);
    CHECK(tuner.decided());
    CHECK_EQ(run(tuner, 5, seconds), std::vector<Launch>(5, faster));
  }
}

TEST(launch_tuner_compares_medians_after_the_warmup) {
  // Deferred is faster but for one outlier (its mean is larger); the
  // warm-up iterations, slow as first iterations are, do not count.
  LaunchTuner tuner(std::nullopt);
  const auto seconds = [](Launch l, int i) {
    if (i < 2)
      return 1000.0;
    if (l == D)
      return i == 4 ? 100.0 : 1.0;
    return 2.0;
  };
  CHECK_EQ(run(tuner, 8, seconds), kTuning);
  CHECK(tuner.decided());
  CHECK_EQ(tuner.next(), D);
}

TEST(launch_tuner_keeps_eager_on_a_tie) {
  LaunchTuner tuner(std::nullopt);
  run(tuner, 8, [](Launch, int) { return 1.0; });
  CHECK(tuner.decided());
  CHECK_EQ(tuner.next(), E);
}

// What transport.hpp offers beside the interface: fail_together, which
// every rank passes its own outcome of a set-up step, on the fake
// transport's ranks.
#include <string>
#include <vector>

#include "check.hpp"
#include "fake_transport.hpp"

using namespace nncomm;
using namespace unit;

namespace {

// fail_together on `outcomes.size()` ranks, rank r passing outcomes[r].
std::vector<Status> together(const std::vector<Status> &outcomes) {
  const int size = static_cast<int>(outcomes.size());
  FakeWorld world(size);
  std::vector<Status> got(size);
  run_ranks(size, [&](int rank) {
    auto transport = world.transport(rank);
    got[rank] = fail_together(*transport, outcomes[rank], "setting up X");
  });
  return got;
}

} // namespace

TEST(fail_together_passes_where_every_rank_succeeded) {
  for (const Status &s : together({Status::Ok(), Status::Ok(), Status::Ok()}))
    CHECK_OK(s);
}

TEST(fail_together_names_the_failing_rank_and_its_error_everywhere) {
  const Status mine = Status::OutOfMemory("cudaMalloc failed: out of memory");
  const std::vector<Status> got =
      together({Status::Ok(), mine, Status::Ok()});
  // The failing rank keeps its own; the others' is of the same kind.
  CHECK_EQ(got[1].code(), StatusCode::kOutOfMemory);
  CHECK_EQ(got[1].message(), mine.message());
  for (int r : {0, 2}) {
    CHECK_EQ(got[r].code(), StatusCode::kOutOfMemory);
    CHECK_EQ(got[r].message(),
             std::string("group rank 1 failed setting up X: cudaMalloc "
                         "failed: out of memory"));
  }
}

TEST(fail_together_names_every_failing_rank_and_the_first_ones_error) {
  // An interruption is its own rank's: the others raise a RuntimeError.
  const std::vector<Status> got =
      together({Status::Interrupted(), Status::Ok(),
                Status::Transport("ncclGetUniqueId failed")});
  CHECK_EQ(got[0].code(), StatusCode::kInterrupted);
  CHECK_EQ(got[2].message(), std::string("ncclGetUniqueId failed"));
  CHECK_EQ(got[1].code(), StatusCode::kRuntimeError);
  CHECK_EQ(got[1].message(), std::string("group ranks [0, 2] failed setting "
                                         "up X; rank 0: interrupted"));
}

TEST(fail_together_cuts_a_long_error_for_the_other_ranks) {
  const std::string long_message = "cudaMalloc failed: " +
                                   std::string(400, 'x');
  const std::vector<Status> got =
      together({Status::Ok(), Status::RuntimeError(long_message)});
  CHECK_EQ(got[1].message(), long_message);
  const std::string prefix = "group rank 1 failed setting up X: ";
  CHECK_EQ(got[0].message(), prefix + long_message.substr(0, 247));
}

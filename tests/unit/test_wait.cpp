// wait_for on fake operations: it returns once the last rank arrives,
// however the waiting thread polls; and the ways a wait fails, which leave
// the process unable to communicate (each test runs in a process of its
// own): a timeout naming the ranks that never came, then the job's abort;
// a cancelled wait; an interrupted one.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/core/wait.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Stands in for MPI_Abort: records the reason and, like it, never returns
// (wait.cpp aborts the process when the job abort returns).
struct JobAbort {
  std::mutex mutex;
  std::condition_variable called;
  bool aborted = false;
  std::string reason;
};
JobAbort job_abort;

void record_abort(const char *reason) {
  {
    std::lock_guard<std::mutex> lock(job_abort.mutex);
    job_abort.aborted = true;
    job_abort.reason = reason;
  }
  job_abort.called.notify_all();
  for (;;)
    pause();
}

// Starts an all-reduce on `transport`, whose other ranks never come.
WorkPtr start_alone(FakeTransport &transport, Array &buf) {
  WorkPtr work;
  CHECK_OK(transport.start_allreduce(buf.data(), buf.count(), buf.dtype(),
                                     1.0f, 1, &work));
  return work;
}

// Checks that nothing starts any more, for `reason`.
void check_broken(FakeTransport &transport, const std::string &reason) {
  const Status refused = refuse_if_broken();
  CHECK_EQ(refused.code(), StatusCode::kCommunicator);
  CHECK_CONTAINS(refused.message(), reason);
  WorkPtr work;
  CHECK_EQ(transport.start_barrier(&work).code(), StatusCode::kCommunicator);
}

int always_interrupted() { return 1; }

} // namespace

TEST(wait_for_returns_once_the_last_rank_arrives) {
  // Rank 0 waits on its caller's thread, rank 1 as a background thread
  // pausing between tests, rank 2 as one in a hurry; rank 3 comes late.
  std::mt19937_64 rng(1);
  const int size = 4;
  FakeWorld world(size);
  world.set_delay(3, std::chrono::milliseconds(150));
  std::vector<Array> before, after;
  for (int r = 0; r < size; ++r)
    before.push_back(random_array(DType::kFloat32, 100, rng));
  after = before;
  const std::atomic<bool> hurry{true};
  const Polling paused{200, nullptr, nullptr};
  const Polling hurried{200, &hurry, nullptr};
  const Polling *polling[] = {nullptr, &paused, &hurried, nullptr};
  const auto start = Clock::now();
  run_ranks(size, [&](int rank) {
    auto transport = world.transport(rank);
    CHECK_OK(transport->allreduce(after[rank].data(), 100, DType::kFloat32,
                                  1.0f, 1, polling[rank]));
    CHECK(seconds_since(start) >= 0.15);
  });
  std::vector<const Array *> shares;
  for (const Array &a : before)
    shares.push_back(&a);
  for (const Array &a : after)
    CHECK_SAME(a, reduced(shares, DType::kFloat32, 1.0f, 1, DType::kFloat32));
  CHECK_OK(refuse_if_broken());
}

TEST(wait_for_returns_the_operations_failure) {
  FakeWorld world(2);
  world.fail_operation(1, 0);
  run_ranks(2, [&](int rank) {
    auto transport = world.transport(rank);
    const Status status = transport->barrier();
    CHECK_EQ(status.code(),
             rank == 1 ? StatusCode::kTransport : StatusCode::kOk);
  });
  // A failed operation is not a failed wait: the process goes on.
  CHECK_OK(refuse_if_broken());
}

TEST(operation_label_names_the_innermost_operation) {
  CHECK_EQ(OperationLabel::current(), std::string("an operation"));
  {
    OperationLabel outer("all_reduce of %zu arrays", 3);
    CHECK_EQ(OperationLabel::current(), std::string("all_reduce of 3 arrays"));
    {
      OperationLabel inner("gradient bucket %zu of %zu", 2, 7);
      CHECK_EQ(OperationLabel::current(),
               std::string("gradient bucket 2 of 7"));
    }
    CHECK_EQ(OperationLabel::current(), std::string("all_reduce of 3 arrays"));
  }
  CHECK_EQ(OperationLabel::current(), std::string("an operation"));
}

TEST(wait_timeout_names_missing_world_ranks_then_aborts_the_job) {
  const double timeout = config::timeout_seconds();
  if (!(timeout > 0 && timeout <= 2))
    SKIP("needs NNCOMM_TIMEOUT=1");
  set_job_abort(record_abort);
  // Group ranks 1 and 2, world ranks 5 and 8, never come.
  FakeWorld world(3, {3, 5, 8});
  auto transport = world.transport(0);
  Array buf(DType::kFloat32, 4);
  WorkPtr work = start_alone(*transport, buf);
  const auto start = Clock::now();
  Status status;
  {
    OperationLabel label("all_reduce of %zu arrays", 1);
    status = wait_for(*work, true, nullptr);
  }
  const double waited = seconds_since(start);
  CHECK_EQ(status.code(), StatusCode::kCommunicator);
  CHECK_CONTAINS(status.message(),
                 "all_reduce of 1 arrays (operation 0 on the group of world "
                 "ranks [3, 5, 8]) did not complete in 1 s (NNCOMM_TIMEOUT)");
  CHECK_CONTAINS(status.message(), "world ranks [5, 8] never arrived");
  CHECK(waited >= timeout && waited < timeout + 1.5);
  check_broken(*transport, "world ranks [5, 8] never arrived");

  // The job is aborted shortly after, so no rank is left behind.
  std::unique_lock<std::mutex> lock(job_abort.mutex);
  CHECK(job_abort.called.wait_for(lock, std::chrono::seconds(10),
                                  [] { return job_abort.aborted; }));
  const double after = seconds_since(start) - waited;
  CHECK(after >= kAbortAfterTimeoutSeconds - 0.5 &&
        after < kAbortAfterTimeoutSeconds + 2);
  CHECK_CONTAINS(job_abort.reason, "world ranks [5, 8] never arrived");
}

TEST(wait_cancelled_refuses_every_later_operation) {
  FakeWorld world(2);
  auto transport = world.transport(0);
  Array buf(DType::kFloat64, 4);
  WorkPtr work = start_alone(*transport, buf);
  const std::atomic<bool> cancel{true};
  const Polling polling{50, nullptr, &cancel};
  const Status status = wait_for(*work, false, &polling);
  CHECK_EQ(status.code(), StatusCode::kCommunicator);
  CHECK_CONTAINS(status.message(), "cancelled");
  check_broken(*transport, "a wait for other ranks was cancelled");
}

TEST(wait_interrupted_refuses_every_later_operation) {
  set_interrupt_check(always_interrupted);
  FakeWorld world(2);
  auto transport = world.transport(0);
  Array buf(DType::kFloat16, 4);
  WorkPtr work = start_alone(*transport, buf);
  const auto start = Clock::now();
  Status status;
  {
    OperationLabel label("barrier");
    status = wait_for(*work, false, nullptr);
  }
  CHECK_EQ(status.code(), StatusCode::kInterrupted);
  CHECK(seconds_since(start) < 1);
  check_broken(*transport, "a wait was interrupted (barrier)");
}

TEST(wait_on_a_background_thread_ignores_interrupts) {
  // Such a thread must not take the GIL to run Python's handlers.
  set_interrupt_check(always_interrupted);
  FakeWorld world(2);
  world.set_delay(1, std::chrono::milliseconds(300));
  const Polling polling{50, nullptr, nullptr};
  run_ranks(2, [&](int rank) {
    auto transport = world.transport(rank);
    Array buf(DType::kFloat32, 3);
    CHECK_OK(transport->allreduce(buf.data(), 3, DType::kFloat32, 1.0f, 1,
                                  &polling));
  });
  CHECK_OK(refuse_if_broken());
}

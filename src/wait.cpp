#include "nncomm/wait.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include <mpi.h>

namespace nncomm {

namespace {
std::atomic<int (*)()> interrupt_check{nullptr};
std::atomic<bool> failed{false};
std::mutex reason_mutex;
std::string failure_reason;

void abort_job() {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "nncomm: world rank %d is aborting the job: %s\n",
               rank, failure_reason.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}
} // namespace

void set_interrupt_check(int (*check)()) { interrupt_check = check; }

bool interrupted() {
  int (*check)() = interrupt_check.load();
  return check != nullptr && check() != 0;
}

void mark_broken(const std::string &reason, bool abort_soon) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex);
    if (failure_reason.empty())
      failure_reason = reason;
  }
  const bool first = !failed.exchange(true);
  if (abort_soon && first) {
    std::thread([] {
      std::this_thread::sleep_for(
          std::chrono::duration<double>(kAbortAfterTimeoutSeconds));
      abort_job();
    }).detach();
  }
}

bool broken(std::string *reason) {
  if (!failed.load())
    return false;
  std::lock_guard<std::mutex> lock(reason_mutex);
  *reason = failure_reason;
  return true;
}

void abort_if_broken() {
  if (failed.load())
    abort_job();
}

} // namespace nncomm

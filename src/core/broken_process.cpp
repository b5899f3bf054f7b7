#include "nncomm/core/broken_process.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "nncomm/observability/flight_recorder.hpp"

namespace nncomm {

namespace {
std::atomic<void (*)(const char *)> job_abort{nullptr};
std::atomic<bool> failed{false};
std::mutex reason_mutex;
std::string failure_reason;

void abort_job() {
  void (*abort)(const char *) = job_abort.load();
  if (abort != nullptr)
    abort(failure_reason.c_str());
  std::fprintf(stderr, "nncomm: aborting: %s\n", failure_reason.c_str());
  std::fflush(stderr);
  std::abort();
}
} // namespace

void set_job_abort(void (*abort)(const char *)) { job_abort = abort; }

void mark_broken(const std::string &reason, bool abort_soon) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex);
    if (failure_reason.empty())
      failure_reason = reason;
  }
  const bool first = !failed.exchange(true);
  if (first)
    FlightRecorder::dump_after(reason);
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

Status refuse_if_broken() {
  std::string reason;
  if (broken(&reason)) {
    return Status::Communicator("nncomm can no longer communicate: " + reason +
                                "; the job is being aborted");
  }
  return Status::Ok();
}

void abort_if_broken() {
  if (failed.load())
    abort_job();
}

} // namespace nncomm

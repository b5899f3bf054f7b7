#include "nncomm/core/wait.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "nncomm/observability/config.hpp"
#include "nncomm/observability/flight_recorder.hpp"
#include "nncomm/observability/timeline.hpp"

namespace nncomm {

namespace {
std::atomic<int (*)()> interrupt_check{nullptr};

thread_local const OperationLabel *operation_label = nullptr;
thread_local const Polling *thread_polling = nullptr;

// Tests made back to back before a wait first looks at the clock: about
// 5 µs on a 2-rank shared-memory job.
constexpr int kSpinTests = 64;
// How long a wait goes on testing without yielding: long enough for a
// small collective between ranks of one machine (a 64 KiB broadcast takes
// about 10 µs on 2 ranks, and each yield adds a system call's
// microsecond), short beside a time slice, so that a rank sharing its
// core with another soon gives it up.
constexpr std::chrono::microseconds kSpinTime(20);
// How long a wait lasts before it tells the other ranks it is here
// (Work::inspect); late enough that a healthy job never does.
constexpr double kInspectAfterSeconds = 1.0;

// Puts a stall report on the timeline's stalls track.
void trace_stall(const char *name, const std::string &message) {
  if (!Timeline::on())
    return;
  TimelineArgs args;
  args.key = "message";
  args.text = message;
  Timeline::instant(Track::kStalls, name, std::move(args));
}
} // namespace

std::string rank_list(const std::vector<int> &ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

OperationLabel::OperationLabel(const char *format, size_t a, size_t b)
    : format_(format), a_(a), b_(b), previous_(operation_label) {
  operation_label = this;
}

OperationLabel::~OperationLabel() { operation_label = previous_; }

const OperationLabel *OperationLabel::innermost() { return operation_label; }

std::string OperationLabel::current() {
  if (operation_label == nullptr)
    return "an operation";
  char text[256];
  std::snprintf(text, sizeof text, operation_label->format_,
                operation_label->a_, operation_label->b_);
  return text;
}

PollingScope::PollingScope(const Polling *polling)
    : previous_(thread_polling) {
  thread_polling = polling;
}

PollingScope::~PollingScope() { thread_polling = previous_; }

Status wait_for(Work &work, bool warn, const Polling *polling) {
  using clock = std::chrono::steady_clock;
  if (polling == nullptr)
    polling = thread_polling;
  // Most operations of a healthy job complete within a few tests: those
  // are made back to back, before any clock read or yield.
  for (int spin = 0; spin < kSpinTests; ++spin) {
    bool done = false;
    NNCOMM_RETURN_IF_ERROR(work.test(&done));
    if (done)
      return Status::Ok();
  }
  const auto start = clock::now();
  const double timeout = config::timeout_seconds();
  const double stall = config::stall_warning_seconds();
  const auto after = [&](double seconds) {
    return start + std::chrono::duration_cast<clock::duration>(
                       std::chrono::duration<double>(seconds));
  };
  auto next_look = after(kInspectAfterSeconds);
  // Late enough for the other waiting ranks' first reports to be in.
  auto next_warning = after(std::max(stall, 2 * kInspectAfterSeconds));
  auto next_signals = after(0.1);
  for (;;) {
    bool done = false;
    NNCOMM_RETURN_IF_ERROR(work.test(&done));
    if (done)
      return Status::Ok();
    if (polling != nullptr && polling->cancel != nullptr &&
        polling->cancel->load()) {
      mark_broken("a wait for other ranks was cancelled", false);
      return Status::Communicator("the wait for other ranks was cancelled");
    }
    const auto now = clock::now();
    if (polling == nullptr && now >= next_signals) {
      next_signals = now + std::chrono::milliseconds(100);
      if (interrupted()) {
        mark_broken("a wait was interrupted (" + OperationLabel::current() +
                        ")",
                    false);
        return Status::Interrupted();
      }
    }
    if (now >= next_look) {
      next_look = now + std::chrono::milliseconds(200);
      const Stall seen = work.inspect();
      if (!seen.differing.empty()) {
        const std::string message =
            "the ranks of this group make different calls: " +
            OperationLabel::current() + " (" + work.describe() +
            ") here, another call on world ranks " + rank_list(seen.differing);
        mark_broken(message, true);
        return Status::InvalidArgument(message);
      }
      if (!seen.ended.empty()) {
        const std::string message =
            OperationLabel::current() + " (" + work.describe() +
            ") cannot complete: the script of world ranks " +
            rank_list(seen.ended) +
            " ended without making this call (fewer batches than the "
            "others? comm.join() lets ranks with uneven data train "
            "together)";
        trace_stall("ended", message);
        mark_broken(message, true);
        return Status::Communicator(message);
      }
      const double waited = std::chrono::duration<double>(now - start).count();
      // Every stalled rank, not only the one that reports: the job may be
      // killed before any wait times out.
      if (stall > 0 && waited >= stall) {
        FlightRecorder::dump_after_first_stall(
            "stalled in " + OperationLabel::current() + " (" +
            work.describe() + ")");
      }
      const bool timed_out = timeout > 0 && waited >= timeout;
      if (timed_out || (warn && stall > 0 && now >= next_warning)) {
        const std::string what =
            OperationLabel::current() + " (" + work.describe() + ")";
        if (timed_out) {
          std::ostringstream message;
          message << what << " did not complete in " << timeout
                  << " s (NNCOMM_TIMEOUT): ";
          if (seen.known)
            message << "world ranks " << rank_list(seen.missing)
                    << " never arrived (stopped, dead or in another call?)";
          else
            message << "not every rank arrived";
          trace_stall("timeout", message.str());
          mark_broken(message.str(), true);
          return Status::Communicator(message.str());
        }
        next_warning = now + std::chrono::duration_cast<clock::duration>(
                                 std::chrono::duration<double>(stall));
        char stalled[64];
        std::snprintf(stalled, sizeof stalled, "stalled for %.0f s in ",
                      waited);
        const std::string waiting_for =
            seen.known ? "world ranks " + rank_list(seen.missing)
                       : "the other ranks (its transport cannot tell which)";
        const std::string message =
            stalled + what + ": waiting for " + waiting_for;
        trace_stall("stall", message);
        std::fprintf(stderr, "nncomm: %s\n", message.c_str());
        std::fflush(stderr);
      }
    }
    if (now - start < kSpinTime) {
      // Still spinning: test again at once.
    } else if (polling == nullptr ||
               (polling->hurry != nullptr && polling->hurry->load())) {
      // Only a process waiting for its core (more ranks than cores) gets
      // it; otherwise the test comes again at once.
      std::this_thread::yield();
    } else if (polling->interval_us > 0) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(polling->interval_us));
    }
  }
}

void set_interrupt_check(int (*check)()) { interrupt_check = check; }

bool interrupted() {
  int (*check)() = interrupt_check.load();
  return check != nullptr && check() != 0;
}

} // namespace nncomm

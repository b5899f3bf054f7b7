// Waiting for other ranks: the one loop every wait runs (wait_for), and
// what the waits of a process share: Python's signal handlers (Ctrl-C);
// the state after a wait failed is broken_process.hpp's.
//
// A wait is bounded (config::timeout_seconds()), reports stalls (group
// rank 0 prints which ranks have not arrived, config::
// stall_warning_seconds()) and fails at once when the ranks are found making
// different calls, or a rank it waits for has ended its script
// (Work::inspect). A wait that timed out or was interrupted
// leaves an operation that will never complete, so no rank can tell any
// more which calls the others will match: every later operation of the
// process fails at once (refuse_if_broken), and the job is aborted, at exit
// or, after a timeout, shortly after the exception was raised, so that no
// rank is left behind.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "nncomm/core/broken_process.hpp"
#include "nncomm/core/status.hpp"
#include "nncomm/transports/transport.hpp"

namespace nncomm {

// How a background thread waits: it tests the operation every
// `interval_us` microseconds and sleeps in between, so that its core goes
// to computation, until `*hurry` is set: then the computation is itself
// waiting for the reduction, and the thread tests again as soon as the
// scheduler lets it (yielding, so that ranks sharing cores still get
// theirs). Once `*cancel` is set the wait gives up (the thread is being
// stopped). Such a thread never runs Python's signal handlers. Without a
// Polling, the caller's thread tests, yielding in between, and runs them.
struct Polling {
  int interval_us = 0;
  const std::atomic<bool> *hurry = nullptr;
  const std::atomic<bool> *cancel = nullptr;
};

// Waits until `work` completes. `warn`: this rank prints stall warnings
// (one rank of the group does). Without a `polling`, as the thread's
// PollingScope says, if any.
Status wait_for(Work &work, bool warn, const Polling *polling);

// For its scope, the waits of this thread that pass no Polling wait as
// `polling` says: a background thread making a group's collectives, which
// name none (async_queue.hpp).
class PollingScope {
public:
  explicit PollingScope(const Polling *polling);
  ~PollingScope();
  PollingScope(const PollingScope &) = delete;
  PollingScope &operator=(const PollingScope &) = delete;

private:
  const Polling *previous_;
};

// Names the operation under way on this thread in stall reports and
// timeout messages, for its scope: a printf format with up to two integers
// (e.g. "all_reduce of %zu arrays"), formatted only when a message needs it.
class OperationLabel {
public:
  explicit OperationLabel(const char *format, size_t a = 0, size_t b = 0);
  ~OperationLabel();
  static std::string current();
  // This thread's innermost label, or null (the flight recorder keeps its
  // parts, to format only when it writes them out).
  static const OperationLabel *innermost();
  const char *format() const { return format_; }
  size_t a() const { return a_; }
  size_t b() const { return b_; }

private:
  const char *format_;
  size_t a_, b_;
  const OperationLabel *previous_;
};

// Ranks as the messages of waits list them: "[0, 2]".
std::string rank_list(const std::vector<int> &ranks);

// `check` runs Python's signal handlers and returns non-zero when one
// raised. Waiting threads call it about every 100 ms; the engine's thread
// never does (it must not take the GIL).
void set_interrupt_check(int (*check)());
bool interrupted();

} // namespace nncomm

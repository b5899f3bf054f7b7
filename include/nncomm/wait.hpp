// What every wait for other ranks shares in a process: Python's signal
// handlers (Ctrl-C) and the state after a wait failed.
//
// A wait that timed out or was interrupted leaves an MPI operation that
// will never complete, so no rank can tell any more which calls the others
// will match: every later wait of the process fails at once, and the job is
// aborted (MPI_Abort), at exit or, after a timeout, shortly after the
// exception was raised, so that no rank is left behind.
#pragma once

#include <string>

namespace nncomm {

// `check` runs Python's signal handlers and returns non-zero when one
// raised. Waiting threads call it about every 100 ms; the engine's thread
// never does (it must not take the GIL).
void set_interrupt_check(int (*check)());
bool interrupted();

// Seconds between the exception a timeout raises and MPI_Abort.
constexpr double kAbortAfterTimeoutSeconds = 5;

// Records why waits can no longer be trusted; with `abort_soon`, aborts the
// job kAbortAfterTimeoutSeconds later unless the process exits first.
void mark_broken(const std::string &reason, bool abort_soon);
// Whether a wait failed earlier; `*reason` says why.
bool broken(std::string *reason);
// MPI_Abort on the world if a wait failed: the process cannot finalize MPI
// with an operation pending. Called at interpreter exit.
void abort_if_broken();

} // namespace nncomm

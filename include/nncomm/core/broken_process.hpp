// The process after a wait failed: a wait that timed out or was
// interrupted leaves an operation that will never complete, so no rank can
// tell any more which calls the others will match. The process is marked
// broken: every later operation fails at once (refuse_if_broken), and the
// job is aborted, at exit or, after a timeout, shortly after the exception
// was raised, so that no rank is left behind (wait.hpp's waits mark it).
#pragma once

#include <string>

#include "nncomm/core/status.hpp"

namespace nncomm {

// How the job is ended after a failed wait, `reason` being why (the
// transport's: MPI_Abort on the world); without one, the process aborts.
void set_job_abort(void (*abort_job)(const char *reason));

// Seconds between the exception a timeout raises and the job's abort.
constexpr double kAbortAfterTimeoutSeconds = 5;

// Records why waits can no longer be trusted; with `abort_soon`, aborts the
// job kAbortAfterTimeoutSeconds later unless the process exits first.
void mark_broken(const std::string &reason, bool abort_soon);
// Whether a wait failed earlier; `*reason` says why.
bool broken(std::string *reason);
// Fails once a wait has failed in this process: operations refuse to start.
Status refuse_if_broken();
// Aborts the job if a wait failed: the process cannot finalize MPI with an
// operation pending. Called at interpreter exit.
void abort_if_broken();

} // namespace nncomm

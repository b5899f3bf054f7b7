# What the module sets up once per process: Python's signal handlers run
# during waits for other ranks (Ctrl-C interrupts them), a process whose
# wait failed aborts the job at exit instead of hanging in MPI_Finalize
# with an operation pending (src/core/broken_process.cpp), and one that
# exits otherwise tells the other ranks, whose waits for it then fail
# (src/transports/ended_ranks.cpp).


cdef extern from "Python.h":
    # Declared here without Cython's "except -1", which would report a
    # raising handler as unraisable instead of leaving its exception set.
    int check_signals "PyErr_CheckSignals" () noexcept


cdef int run_signal_handlers() noexcept nogil:
    with gil:
        if check_signals() == 0:
            return 0
        PyErr_Fetch(&_signal_raised[0], &_signal_raised[1],
                    &_signal_raised[2])
        return 1


set_interrupt_check(run_signal_handlers)


def _at_exit():
    with nogil:
        leave_job()


atexit.register(_at_exit)


cdef object _previous_excepthook = None


def _abort_job_after(kind, value, traceback):
    """sys.excepthook of a job of several ranks: an exception that ends
    this rank's script aborts the job at exit (atexit's _at_exit),
    as mpi4py's runner does, instead of leaving the other ranks waiting for
    this one until NNCOMM_TIMEOUT. At an interactive prompt (python -i) a
    traceback ends no script, and nothing more happens."""
    _previous_excepthook(kind, value, traceback)
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return
    mark_broken(f"an uncaught {kind.__name__} ended the script on world "
                f"rank {MPI.COMM_WORLD.Get_rank()}".encode(), False)


cdef int abort_job_on_uncaught_exceptions() except -1:
    """Installs _abort_job_after, once, over the hook in place."""
    global _previous_excepthook
    if _previous_excepthook is None:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _abort_job_after
    return 0

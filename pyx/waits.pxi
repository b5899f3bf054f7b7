# What the module sets up once per process: Python's signal handlers run
# during waits for other ranks (Ctrl-C interrupts them), and a process
# whose wait failed aborts the job at exit instead of hanging in
# MPI_Finalize with an operation pending (src/core/broken_process.cpp).


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


def _abort_if_broken():
    with nogil:
        abort_if_broken()


atexit.register(_abort_if_broken)

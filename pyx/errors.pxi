# Turning a C++ Status into a Python exception.

from cpython.ref cimport PyObject
from cpython.exc cimport PyErr_Restore

from nncomm.errors import (BucketHookError, CommunicatorError,
                           NonFiniteGradientError)

# The exception a signal handler raised during a wait (Ctrl-C's
# KeyboardInterrupt), kept aside while the wait unwinds without the GIL and
# raised again by raise_status.
cdef PyObject* _signal_raised[3]


cdef int raise_status(const Status& status) except -1:
    message = status.message().decode("utf-8", "replace")
    if status.code() == StatusCode.kInterrupted:
        if _signal_raised[0] != NULL:
            PyErr_Restore(_signal_raised[0], _signal_raised[1],
                          _signal_raised[2])
            _signal_raised[0] = _signal_raised[1] = _signal_raised[2] = NULL
            return -1
        raise KeyboardInterrupt(message)
    if status.code() == StatusCode.kCommunicator:
        raise CommunicatorError(message)
    if status.code() == StatusCode.kInvalidArgument:
        raise ValueError(message)
    if status.code() == StatusCode.kOutOfMemory:
        raise MemoryError(message)
    raise RuntimeError(message)


cdef inline int CHKSTATUS(const Status& status) except -1 nogil:
    # Takes the GIL only on failure, so callers may stay in nogil blocks.
    if status.ok():
        return 0
    with gil:
        return raise_status(status)


cdef int refuse_direct_construction(self, str maker) except -1:
    """Raises TypeError: the classes whose objects nncomm makes itself (by
    __new__, which skips __init__) hold nothing usable when Python calls
    them, and would crash at their first method."""
    raise TypeError(f"{type(self).__name__} objects are made by {maker}, "
                    f"not directly")

# Turning a C++ Status into a Python exception.

cdef int raise_status(const Status& status) except -1:
    message = status.message().decode("utf-8", "replace")
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

# Named groups of world ranks.

cdef class _Group:
    """A named set of world ranks; `core` (the C++ Group: transports,
    memory and the queue that orders its collectives) is empty where this
    rank is not a member."""
    cdef unique_ptr[Group] core
    cdef readonly list ranks

    def __cinit__(self, list ranks):
        self.ranks = ranks

    cdef int check(self, Status status) except -1:
        """Raises `status`'s error, if any, after the advice of the group's
        device path, if it was opened by the call; the call's site is no
        longer recorded."""
        end_call_site()
        if deref(self.core).has_advice():
            # Cython pushes no frame: 1 is the user's call.
            warnings.warn(deref(self.core).take_advice().decode(),
                          RuntimeWarning, stacklevel=1)
        return CHKSTATUS(status)

    cdef bint same_everywhere(self, uint64_t value, const char *what) \
            except -1:
        """Whether every rank of the group passed the same `value` (one
        small all-reduce), `what` naming it in stall reports (a literal,
        without %). Collective."""
        cdef cpp_bool same = False
        cdef Status status
        with nogil:
            status = deref(self.core).agree(value, &same, what)
        CHKSTATUS(status)
        return same

    cdef int barrier(self) except -1:
        """Blocks until every rank of the group has called it."""
        cdef Status status
        with nogil:
            status = deref(self.core).barrier()
        return CHKSTATUS(status)

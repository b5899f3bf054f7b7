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

    cdef tuple union_of(self, tuple indices, Py_ssize_t n):
        """The indices (in [0, `n`)) that any rank of the group passed, in
        ascending order: one all-gather of `n` bits per rank. Collective;
        every rank must pass the same `n`."""
        bits = np.zeros((n + 63) // 64 * 64 or 64, np.uint8)
        bits[list(indices)] = 1
        cdef uint64_t[::1] mine = np.packbits(
            bits, bitorder="little").view(np.uint64)
        everyone = np.zeros((len(self.ranks), mine.shape[0]), np.uint64)
        cdef uint64_t[:, ::1] out = everyone
        cdef Status status
        with nogil:
            status = deref(self.core).allgather(&mine[0], &out[0, 0],
                                                mine.shape[0], DType.kInt64)
        CHKSTATUS(status)
        anywhere = np.unpackbits(np.bitwise_or.reduce(everyone).view(
            np.uint8), bitorder="little")[:n]
        return tuple(np.flatnonzero(anywhere).tolist())

    cdef int barrier(self) except -1:
        """Blocks until every rank of the group has called it."""
        cdef Status status
        with nogil:
            status = deref(self.core).barrier()
        return CHKSTATUS(status)

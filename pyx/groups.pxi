# Named groups of world ranks.

cdef class _Group:
    """A named set of world ranks; `core` (the C++ Group: transports,
    memory and the queue that orders its collectives) is empty where this
    rank is not a member."""
    cdef unique_ptr[Group] core
    cdef readonly list ranks
    cdef unique_ptr[AsyncQueue] queue  # from its first async_op=True call

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

    cdef AsyncQueue* async_queue(self) except NULL:
        """The queue of the group's nonblocking collectives, made at the
        first (collective: every rank's first such call on the group is the
        same call)."""
        cdef Status status
        if not self.queue:
            with nogil:
                status = AsyncQueue.Create(deref(self.core), engine_poll_us(),
                                           &self.queue)
            CHKSTATUS(status)
        return self.queue.get()

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

    cdef int unite(self, object words, const char *what) except -1:
        """Sets each of `words` (a 1-d uint64 numpy array of the same
        length on every rank) to the bitwise OR of every rank's (one small
        all-reduce), `what` naming it as same_everywhere's. Collective."""
        cdef uint64_t[::1] view = words
        cdef Status status
        with nogil:
            status = deref(self.core).unite(&view[0], view.shape[0], what)
        return CHKSTATUS(status)

    cdef int barrier(self) except -1:
        """Blocks until every rank of the group has called it."""
        cdef Status status
        with nogil:
            status = deref(self.core).barrier()
        return CHKSTATUS(status)


# What a rank whose new_group arguments were refused passes to the
# agreement on the group: no group's fingerprint.
cdef uint64_t _REFUSED_GROUP = 0x6e6f2d67726f7570


cdef tuple _checked_group(name_ranks, Py_ssize_t size, dict groups):
    """new_group's argument (name, ranks) checked against a world of `size`
    ranks and the `groups` there are: the name and the list of ranks."""
    if not isinstance(name_ranks, (tuple, list)) or len(name_ranks) != 2:
        raise TypeError("new_group takes one tuple (name, ranks)")
    name, ranks = name_ranks
    if not isinstance(name, str):
        raise TypeError(
            f"the group name must be a str, not {type(name).__name__}")
    if name in groups:
        raise ValueError(f"group {name!r} already exists")
    try:
        ranks = [operator.index(r) for r in ranks]
    except TypeError:
        raise TypeError(
            f"the ranks of group {name!r} must be a list of ints, "
            f"got {ranks!r}") from None
    if not ranks:
        raise ValueError(f"group {name!r} has no ranks")
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(
                f"rank {r} of group {name!r} is out of range [0, {size})")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"group {name!r} lists a rank twice: {ranks}")
    return name, ranks

# Uneven inputs: the C++ join scope (transports/join.hpp) of this process,
# and the Join (python/nncomm/join.py) that opened it, which callbacks ask
# at each backward whether to count the ranks still training.

from nncomm.errors import InputsExhaustedError

cdef object _joining = None  # the open Join, or None
cdef _Group _joining_group = None  # the group it is over


cdef int drain_async_queues() except -1:
    """Waits until the collectives started with async_op=True have run:
    the scope opens, is left and closes between collectives, on every
    thread."""
    cdef Status status
    with nogil:
        status = AsyncQueue.DrainAll()
    return CHKSTATUS(status)


cdef int open_join(_Group group, join) except -1:
    """Opens the scope of `join` over `group`. Collective."""
    global _joining, _joining_group
    cdef cpp_bool throw_early = join.throw_on_early_termination
    drain_async_queues()
    cdef Status status
    with nogil:
        status = deref(group.core).open_join(throw_early)
    CHKSTATUS(status)
    _joining = join
    _joining_group = group
    return 0


cdef tuple leave_join(uint64_t steps):
    """This rank's data ended after `steps` updates: (group rank that
    trained last, whether the scope ended at a count that found a rank
    gone)."""
    cdef int last = 0
    cdef cpp_bool terminated = False
    drain_async_queues()
    cdef Status status
    with nogil:
        status = Join.Leave(steps, &last, &terminated)
    CHKSTATUS(status)
    return last, terminated


cdef int close_join(str why) except -1:
    """Ends the scope here; with `why`, first tells the other ranks that
    this one leaves it with an error."""
    global _joining, _joining_group
    try:
        if why is not None:
            Join.Abandon(why.encode())
        else:
            drain_async_queues()
    finally:
        Join.Close()
        _joining = None
        _joining_group = None
    return 0


cdef bint joining():
    """Whether a comm.join() scope is open in this process."""
    return _joining is not None


cdef int joined_divisor(_Group group, bint division) except -1:
    """A backward's divisor on `group` (1 without `division`): with a Join
    that counts the ranks still training, after one count round, by which
    a rank that left makes every rank raise InputsExhaustedError
    (throw_on_early_termination) or the average divide by those left
    (divide_by_initial_world_size=False)."""
    cdef int size = len(group.ranks)
    if _joining is None or group is not _joining_group or \
            not _joining.counts_ranks:
        return size if division else 1
    cdef int training = 0
    cdef Status status
    with nogil:
        status = deref(group.core).count_training(&training)
    CHKSTATUS(status)
    if training == size:
        return size if division else 1
    if _joining.throw_on_early_termination:
        raise InputsExhaustedError(
            f"{size - training} of {size} ranks exhausted their inputs "
            f"(comm.join(throw_on_early_termination=True)): raised on every "
            f"rank")
    return training if division else 1

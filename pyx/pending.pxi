# Nonblocking collectives (async_op=True): started on the group's queue
# (src/collectives/async_queue.cpp), waited for through a Pending.

from cpython.ref cimport Py_INCREF, Py_XDECREF


# Its group (and so the queue that runs its call) must outlive it: the
# collector must not clear its attributes before __dealloc__.
@cython.no_gc_clear
cdef class Pending:
    """A collective started with ``async_op=True``, as Horovod's handles
    (``allreduce_async``, ``synchronize``) and PyTorch's ``Work``
    (``async_op=True``, ``wait``): it runs on a thread of nncomm's, after
    the group's nonblocking collectives started before it, while the caller
    goes on. Its arrays must be neither read nor written until :meth:`wait`
    has returned.

    Example:

    .. code-block:: python

        pending = comm.all_reduce(grads, division=True, async_op=True)
        # ... work that does not touch grads ...
        pending.wait()
    """
    cdef shared_ptr[PendingCall] core
    cdef _Group group  # keeps the queue
    # The arrays, whose memory the call reads and writes: a reference of
    # its own that the collector does not see, so that no cycle through
    # them frees one before __dealloc__ has waited for the call.
    cdef PyObject* kept
    cdef bint waited

    def __init__(self, *args, **kwargs):
        refuse_direct_construction(self, "the collectives' async_op=True")

    def is_completed(self):
        """Whether the collective has run, successfully or not (PyTorch's
        ``Work.is_completed``, Horovod's ``poll``); never blocks.

        Returns:
            bool
        """
        cdef cpp_bool done
        with nogil:
            done = deref(self.core).done()
        return done

    def wait(self):
        """Blocks until the collective has run (Horovod's ``synchronize``,
        PyTorch's ``Work.wait``), then raises what the blocking call would
        have raised, if it failed. Ctrl-C ends the wait with
        KeyboardInterrupt, the collective going on; ``wait()`` may be called
        again, and as often as wished.
        """
        cdef Status status
        with nogil:
            status = deref(self.core).wait(True)
        if status.code() != StatusCode.kInterrupted:
            self.waited = True
        self.group.check(status)

    def __dealloc__(self):
        if not self.core:
            return
        cdef Status status
        # The call writes into the arrays this object keeps alive.
        with nogil:
            status = deref(self.core).wait(False)
        Py_XDECREF(self.kept)
        if not status.ok() and not self.waited:
            warnings.warn(
                f"a collective started with async_op=True failed, and "
                f"nothing waited for it: "
                f"{status.message().decode('utf-8', 'replace')}",
                RuntimeWarning)


cdef Pending start_async(_Group g, CallKind kind, Placed arrays, keep,
                         int root, bint division, bint fuse, Placed one):
    """Starts the collective `kind` on `g`'s queue, with the arguments its
    blocking call passes the group: `arrays` (reduced, broadcast, gathered
    into or scattered from) and `one` (all_gather's send, reduce_scatter's
    recv: where the call is placed; or None); `keep`: what must outlive it
    (the arrays whose memory it uses). Made here, not in the blocking
    calls, which so build no GroupCall."""
    cdef GroupCall call
    call.kind = kind
    call.where = arrays.where if one is None else one.where
    call.arrays = arrays.refs
    if one is not None:
        call.one = one.refs[0]
    call.root = root
    call.division = division
    call.fuse = fuse
    cdef AsyncQueue* queue = g.async_queue()
    cdef Pending pending = Pending.__new__(Pending)
    pending.group = g
    Py_INCREF(keep)
    pending.kept = <PyObject*>keep
    call.site = _call_site()
    pending.core = queue.start(call)
    end_call_site()
    return pending

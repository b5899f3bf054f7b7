# Named groups of world ranks.

cdef class _Group:
    """A named set of world ranks; `core` (the C++ Group: transport, host
    memory and the queue that orders its collectives) is empty where this
    rank is not a member. `device`, its collectives on GPU memory, is made
    when the group first communicates GPU arrays."""
    cdef unique_ptr[Group] core
    cdef unique_ptr[DeviceGroup] device
    cdef readonly list ranks

    def __cinit__(self, list ranks):
        self.ranks = ranks

    cdef DeviceGroup* devices(self, const void* ptr) except NULL:
        """The group's collectives on the GPU holding `ptr`; made (a
        collective call of the group's ranks) the first time."""
        cdef Status status
        if not self.device:
            with nogil:
                status = DeviceGroup.Create(deref(self.core), ptr,
                                            &self.device)
            CHKSTATUS(status)
            advice = self.device.get().advice().decode()
            if advice:
                # Cython pushes no frame: 1 is the user's call.
                warnings.warn(advice, RuntimeWarning, stacklevel=1)
        return self.device.get()

    cdef Status placed(self, GpuArrays arrays):
        """Whether `arrays` are on the device this group communicates GPU
        memory on (before its first GPU collective: on one device), asked
        of this rank alone."""
        if self.device:
            return self.device.get().check_device(arrays.refs)
        return check_on_device(arrays.refs, -1)

    cdef bint same_everywhere(self, uint64_t value) except -1:
        """Whether every rank of the group passed the same `value` (one
        small all-reduce). Collective."""
        cdef cpp_bool same = False
        cdef Status status
        with nogil:
            status = deref(self.core).agree(value, &same)
        CHKSTATUS(status)
        return same

    cdef int barrier(self) except -1:
        """Blocks until every rank of the group has called it."""
        cdef Status status
        with nogil:
            status = deref(self.core).barrier()
        return CHKSTATUS(status)

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
        return self.device.get()

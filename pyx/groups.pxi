# Named groups of world ranks.

cdef class _Group:
    """A named set of world ranks; `core` (the C++ Group: transport, fusion
    buffer and the queue that orders its collectives) is empty where this
    rank is not a member."""
    cdef unique_ptr[Group] core
    cdef readonly list ranks

    def __cinit__(self, list ranks):
        self.ranks = ranks

# Named groups of world ranks.

cdef class _Group:
    """A named set of world ranks; `transport` is null where this rank is
    not a member. Each group packs in its own buffer, so that collectives on
    different groups may run at once from different threads."""
    cdef unique_ptr[MpiTransport] transport
    cdef FusionBuffer fusion
    cdef readonly list ranks

    def __cinit__(self, list ranks):
        self.ranks = ranks

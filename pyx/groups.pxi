# Named groups of world ranks.

cdef class _Group:
    """A named set of world ranks; `transport` is null where this rank is
    not a member. Each group packs in its own buffer, so that collectives on
    different groups may run at once from different threads; `busy` makes
    those on one group take turns (they share the buffer and the
    transport's operation count)."""
    cdef unique_ptr[MpiTransport] transport
    cdef FusionBuffer fusion
    cdef mutex busy
    cdef readonly list ranks

    def __cinit__(self, list ranks):
        self.ranks = ranks

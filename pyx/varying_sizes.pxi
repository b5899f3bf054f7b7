# Collectives whose sizes differ between ranks (alltoall, all_gather of
# varying sizes): what a rank sends, checked before any rank communicates;
# the heads the ranks exchange first, which tell every rank what it
# receives and whether any rank's arguments are bad (a rank alone cannot
# raise without leaving the others waiting); the memory of the call.


# Columns of a head: what a rank tells the others before the data moves.
cdef enum:
    _STATE   # _BAD, _RECV
    _COUNT   # rows (or elements) this rank sends the one receiving the head
    _LAYOUT  # digest of dtype, memory and row shape: equal on every rank
    _LIST    # all_gather: digest of the sizes of this rank's receive list
    _HEAD    # the number of columns

# _STATE's flags.
cdef enum:
    _BAD = 1   # this rank's arguments are bad: it raises their error
    _RECV = 2  # this rank gave a receive array, whose size it alone checks


def _digest(value):
    """A 64-bit digest of `value`'s repr: equal on every rank for equal
    values (ints, strs, tuples and lists of them)."""
    return int.from_bytes(
        hashlib.blake2b(repr(value).encode(), digest_size=8).digest(),
        "little", signed=True)


cdef class _Sent:
    """The array a rank sends, checked: its shape, dtype and memory
    (`gpu`: the collected GPU array; None for an NdArray)."""
    cdef object array
    cdef str what
    cdef tuple shape
    cdef object dtype
    cdef GpuArrays gpu
    cdef bint device  # in device memory: a GPU array, or of a CUDA context

    cdef Py_ssize_t row(self):
        """Elements per row (of the first dimension)."""
        return math.prod(self.shape[1:])

    cdef object layout(self, bint rows):
        """What must be the same on every rank: dtype, memory and, sending
        `rows`, the shape of a row."""
        return _digest((rows, self.device, self.dtype.str,
                        self.shape[1:] if rows else ()))

    cdef str describe(self, bint rows):
        where = "GPU" if self.device else "host"
        kind = f"rows of shape {self.shape[1:]}" if rows else "arrays"
        return f"{self.dtype} {kind} in {where} memory"


cdef _Sent _sent(x, str what, bint cuda):
    """`x` (named `what`), which a rank sends, checked; `cuda`: the
    communicator's context computes on CUDA."""
    cdef _Sent s = _Sent.__new__(_Sent)
    s.array = x
    s.what = what
    if is_gpu_array(x):
        s.gpu = collect_gpu([x], what, None)
        s.shape = tuple(x.__cuda_array_interface__["shape"])
        s.dtype = s.gpu.dtypes[0]
    elif isinstance(x, NdArray):
        s.shape = tuple(x.shape)
        s.dtype = dtype_of(x)
        dtype_code(s.dtype, what)
    else:
        raise TypeError(f"{what} must be an nnabla NdArray or a GPU array, "
                        f"not {type(x).__name__}")
    s.device = s.gpu is not None or cuda
    return s


cdef int _check_rows(_Sent send) except -1:
    if not send.shape:
        raise ValueError(f"{send.what} is 0-d; it must have a first "
                         f"dimension of rows")
    return 0


cdef list _split(_Sent send, splits, Py_ssize_t ranks):
    """The rows `send` sends each group rank: `splits`, checked, or as
    many for each."""
    _check_rows(send)
    rows = send.shape[0]
    if splits is None:
        if rows % ranks:
            raise ValueError(
                f"{send.what} has {rows} rows, which do not split equally "
                f"over the group's {ranks} ranks; pass splits")
        return [rows // ranks] * ranks
    try:
        split = [operator.index(s) for s in splits]
    except TypeError:
        raise TypeError(f"splits must be a sequence of ints, one per group "
                        f"rank, not {splits!r}") from None
    if len(split) != ranks:
        raise ValueError(f"splits has {len(split)} entries; the group has "
                         f"{ranks} ranks")
    if any(s < 0 for s in split):
        raise ValueError(f"splits {split} has a negative entry")
    if sum(split) != rows:
        raise ValueError(f"splits {split} sum to {sum(split)}; "
                         f"{send.what} has {rows} rows")
    return split


cdef int _check_makeable(_Sent send, str what) except -1:
    """Refuses `what` None where the receiving array cannot be made: that of
    a GPU array is CuPy's."""
    if send.gpu is not None:
        try:
            import cupy  # noqa: F401
        except ImportError:
            raise TypeError(
                f"{what} is None and {send.what} is a GPU array: nncomm "
                f"makes the receiving array with CuPy, which is not "
                f"installed; pass one") from None
    return 0


cdef int _check_receivers(_Sent send, list recv, str what) except -1:
    """Refuses receiving arrays in other memory than `send`'s; GPU arrays
    also of another dtype or stream, not contiguous, or read-only (NdArrays
    take `send`'s dtype)."""
    gpu = send.gpu is not None
    kind = "a GPU array" if gpu else "an nnabla NdArray"
    for i, x in enumerate(recv):
        if is_gpu_array(x) != gpu or not (gpu or isinstance(x, NdArray)):
            raise TypeError(f"{what}[{i}] is a {type(x).__name__}; "
                            f"{send.what} is {kind}, and so must be the "
                            f"arrays receiving")
    if gpu:
        check_same_stream(send.gpu.stream,
                          collect_gpu(recv, what, send.dtype).stream,
                          f"{send.what} and {what}")
    return 0


cdef int _check_apart(_Sent send, recv) except -1:
    """Refuses a receiving array that is, or overlaps, the one sent: MPI
    reads one while it writes the other."""
    cdef GpuArrays r
    overlap = recv is send.array
    if send.gpu is not None:
        r = collect_gpu([recv], "recv", None)
        a = <uintptr_t>send.gpu.refs[0].ptr
        b = <uintptr_t>r.refs[0].ptr
        size = send.dtype.itemsize
        overlap = a < b + r.refs[0].count * size and \
            b < a + send.gpu.refs[0].count * size
    if overlap:
        raise ValueError(f"recv is, or shares memory with, {send.what}; "
                         f"the received rows need an array of their own")
    return 0


cdef object _exchange_heads(_Group g, mine, bint to_each):
    """Every group rank's head for this rank, one row each: `mine` holds
    one row per group rank, row r for rank r (`to_each`: an alltoall), or
    one row for all (an all-gather)."""
    theirs = np.empty((len(g.ranks), _HEAD), np.int64)
    cdef int64_t[:, ::1] out = mine
    cdef int64_t[:, ::1] into = theirs
    cdef ArrayRef send, recv
    send.ptr = &out[0, 0]
    send.count = mine.size
    recv.ptr = &into[0, 0]
    recv.count = theirs.size
    send.dtype = recv.dtype = DType.kInt64
    send.tag = recv.tag = 0
    cdef vector[size_t] counts
    cdef vector[ArrayRef] recvs
    cdef Placement host
    cdef Status status
    if to_each:
        counts.assign(len(g.ranks), _HEAD)
        with nogil:
            status = deref(g.core).alltoall(host, send, counts, recv, counts)
    else:
        recvs.push_back(recv)
        with nogil:
            status = deref(g.core).all_gather(host, send, recvs)
    CHKSTATUS(status)
    return theirs


cdef int _check_heads(heads, error, str what, group, _Sent send,
                      bint rows) except -1:
    """Raises, on every rank, what the ranks' `heads` tell: this rank's own
    `error`; ranks whose arguments were bad; ranks whose arrays differ in
    dtype, memory or, sending `rows`, the shape of a row."""
    if error is not None:
        raise error
    bad = np.flatnonzero(heads[:, _STATE] & _BAD).tolist()
    if bad:
        raise ValueError(f"{what}: group ranks {bad} of group {group!r} "
                         f"passed invalid arguments")
    layouts = heads[:, _LAYOUT]
    if (layouts != layouts[0]).any():
        alike = {}
        for r, layout in enumerate(layouts.tolist()):
            alike.setdefault(layout, []).append(r)
        first, *others = alike.values()
        raise ValueError(
            f"{what}: the ranks of group {group!r} send different kinds of "
            f"arrays (dtype, host or GPU memory, shape of a row, or rows "
            f"against a list): one on group ranks {first}"
            + "".join(f", another on {rs}" for rs in others)
            + f"; here {send.describe(rows)}")
    return 0


cdef int _check_list_sizes(heads, list counts, list recv, group) except -1:
    """Raises ValueError on every rank unless every rank's ndarray_list has
    the sizes of the ranks' ndarrays (`counts`), naming the ranks whose
    list does not."""
    bad = np.flatnonzero(heads[:, _LIST] != _digest(counts)).tolist()
    if not bad:
        return 0
    here = [f"ndarray_list[{r}] has {elements(x)} elements, group rank "
            f"{r}'s ndarray {c}"
            for r, (x, c) in enumerate(zip(recv, counts))
            if elements(x) != c]
    raise ValueError(
        f"all_gather: the ndarray_list of group ranks {bad} of group "
        f"{group!r} does not have the sizes of the ranks' ndarrays, "
        f"{counts}" + ("; here " + ", ".join(here) if here else ""))


cdef int _agree_alone(_Group g, problem, str what, group,
                      str others) except -1:
    """Raises ValueError on every rank of `g` where any rank has a
    `problem` only it can see: the problem here, `others` elsewhere,
    naming the ranks. One 8-byte all-gather."""
    cdef int64_t mine = problem is not None
    flags = np.empty(len(g.ranks), np.int64)
    cdef int64_t[::1] out = flags
    cdef Status status
    with nogil:
        status = deref(g.core).allgather(&mine, &out[0], 1, DType.kInt64)
    CHKSTATUS(status)
    if problem is not None:
        raise ValueError(problem)
    if flags.any():
        raise ValueError(f"{what}: group ranks "
                         f"{np.flatnonzero(flags).tolist()} of group "
                         f"{group!r} {others}")
    return 0


cdef object _new_array(_Sent send, tuple shape):
    """A new receiving array of `shape` in `send`'s dtype and memory: an
    NdArray, which the communicator's context allocates as it is
    collected; for a GPU array, a CuPy array on its device, allocated on
    its stream (CuPy's memory pool then reuses the memory only after the
    work on that stream, which the collective's results are ordered
    before)."""
    if send.gpu is None:
        return NdArray(shape)
    import cupy
    cdef uintptr_t ptr = <uintptr_t>send.gpu.refs[0].ptr
    device = cupy.cuda.runtime.pointerGetAttributes(ptr).device if ptr \
        else cupy.cuda.runtime.getDevice()
    with cupy.cuda.Device(device), \
            cupy.cuda.ExternalStream(<uintptr_t>send.gpu.stream):
        return cupy.empty(shape, send.dtype)


cdef int _gather_varying(_Group g, _Sent send, list counts, list recv,
                         NnablaContext context) except -1:
    """Group rank r's `send` (`counts[r]` elements) into recv[r], or into
    the one array of `recv` (checked by _check_receivers or made by
    _new_array), after those of the ranks before r."""
    cdef Placed sent = place([send.array], context, send.what, None)
    cdef Placed into = place(recv, context, "ndarray_list", send.dtype)
    cdef vector[size_t] c = counts
    cdef Status status
    with nogil:
        status = deref(g.core).all_gatherv(sent.where, sent.refs[0], c,
                                           into.refs)
    return g.check(status)


cdef bint _gathers_blocks_of_one_size(ndarray, ndarray_list,
                                      Py_ssize_t ranks):
    """Whether all_gather's arguments are nnabla's: one array of the
    group's blocks, or a list of arrays all of `ndarray`'s size (or
    arguments its checks refuse); otherwise the sizes differ between ranks,
    or `ndarray_list` is None (Horovod's allgather)."""
    if ndarray_list is None:
        return False
    if not isinstance(ndarray_list, (list, tuple)) or \
            len(ndarray_list) != ranks:
        return True
    arrays = [ndarray, *ndarray_list]
    if not all(isinstance(x, NdArray) or is_gpu_array(x) for x in arrays):
        return True
    return all(elements(x) == elements(ndarray) for x in ndarray_list)

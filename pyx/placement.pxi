# A call's arrays where they lie: the one way from the arrays a user passes
# to what the core's Group takes (their memory and a Placement), so that no
# collective branches on host and device memory.


cdef GpuArrays device_arrays(list arrays, NnablaContext context, str what,
                             dtype):
    """The device memory of `arrays` (named `what` in errors): GPU arrays,
    or NdArrays of `context` where it computes on CUDA, whose memory is on
    its device; None where `arrays` is host memory (or empty). `dtype` as
    collect() and collect_gpu() take it."""
    if not arrays:
        return None
    if is_gpu_array(arrays[0]):
        return collect_gpu(arrays, what, dtype)
    if not context.cuda:
        return None
    return on_nnabla_stream(collect(arrays, context, what, dtype, False))


cdef int check_disjoint(const vector[ArrayRef]& refs, str what) except -1:
    """Refuses the arrays of one reduction (`what`) whose memory overlaps:
    one array twice, or two views of one array. Reduced in place, such an
    array would count twice in the fused path and be overwritten in the
    direct one. Arrays without memory yet (zeroing) or without elements are
    left out; collectives that only read a list, or write the same bytes
    into it, take overlapping arrays."""
    if refs.size() < 2:
        return 0
    cdef vector[pair[uintptr_t, size_t]] starts
    cdef size_t i
    for i in range(refs.size()):
        if refs[i].ptr != NULL and refs[i].count > 0:
            starts.push_back(pair[uintptr_t, size_t](
                <uintptr_t>refs[i].ptr, i))
    sort(starts.begin(), starts.end())
    cdef size_t k, a, b
    for k in range(1, starts.size()):
        a, b = starts[k - 1].second, starts[k].second
        if starts[k].first < starts[k - 1].first + \
                refs[a].count * dtype_size(refs[a].dtype):
            raise ValueError(
                f"{what}[{min(a, b)}] and {what}[{max(a, b)}] share memory; "
                f"a reduction takes each array once")
    return 0


cdef class Placed:
    """A call's arrays, ready for the core: their memory and dtypes, and
    where they lie (`where`: the host, or a device and the stream their
    producer works on). Made by :func:`place`."""
    cdef vector[ArrayRef] refs
    cdef list dtypes
    cdef Placement where
    cdef ArrayList host  # NdArrays in host memory; None on a device
    cdef bint foreign  # GPU arrays (another framework's), not NdArrays

    cdef Materializer materializer(self):
        """What writes an array left zeroing (host memory only)."""
        cdef Materializer none
        if self.host is not None:
            return self.host.materializer()
        none.fn = NULL  # device arrays are never left zeroing
        none.context = NULL
        return none


cdef Placed place(list arrays, NnablaContext context, str what, dtype,
                  bint zeroing_as_null=False):
    """`arrays` (named `what`) read and placed: GPU arrays on their device;
    NdArrays of `context` on its device where it computes on CUDA, on
    nnabla's stream, in host memory otherwise. `dtype` and
    `zeroing_as_null` (host memory only) as collect() takes them."""
    cdef Placed self = Placed.__new__(Placed)
    cdef GpuArrays gpu = device_arrays(arrays, context, what, dtype)
    if gpu is None:
        self.host = collect(arrays, context, what, dtype, zeroing_as_null)
        # Taken, not copied: the materializer reads the arrays, not these.
        self.refs.swap(self.host.refs)
        self.dtypes = self.host.dtypes
        return self
    self.refs.swap(gpu.refs)
    self.dtypes = gpu.dtypes
    self.where = gpu.placement()
    self.foreign = is_gpu_array(arrays[0])
    return self


cdef int check_same_place(Placed a, Placed b, str names) except -1:
    """Refuses the two sides of a call (`names`) mixing GPU arrays and
    NdArrays, or coming from different streams."""
    if a.foreign != b.foreign:
        raise TypeError(f"{names} mix GPU arrays and NdArrays; pass both "
                        f"of one kind")
    return check_same_stream(a.where.stream, b.where.stream, names)

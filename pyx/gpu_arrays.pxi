# GPU arrays as the C++ core sees them: objects that describe their device
# memory with __cuda_array_interface__ (CuPy's arrays, among others), read
# without nnabla, with the stream their producer works on.

cdef bint is_gpu_array(x):
    # NdArrays first: a failed attribute lookup costs a microsecond, which
    # every host collective would pay.
    return not isinstance(x, NdArray) and \
        hasattr(x, "__cuda_array_interface__")


cdef Py_ssize_t elements(x) except -1:
    """The number of elements of an NdArray or a GPU array."""
    if not is_gpu_array(x):
        return x.size
    count = 1
    for n in x.__cuda_array_interface__["shape"]:
        count *= n
    return count


cdef class GpuArrays:
    """The memory of a list of GPU arrays, ready for the C++ core. Made by
    :func:`collect_gpu`."""
    cdef vector[ArrayRef] refs
    cdef list dtypes
    # The stream the arrays' producer works on (the interface's "stream":
    # 1 is the legacy default stream, 2 the per-thread one, as CUDA's own
    # handles for them are); collectives are ordered with it.
    cdef CudaStream stream

    cdef Placement placement(self):
        """On the arrays' device, ordered with their stream."""
        cdef Placement where
        where.on_device = True
        where.stream = self.stream
        return where


cdef GpuArrays collect_gpu(list arrays, str what, dtype):
    """Reads the device pointers, counts and dtypes of `arrays` (named `what`
    in errors), validating every array before anything is communicated.
    `dtype`, unless None, is the dtype every array must have."""
    cdef GpuArrays self = GpuArrays.__new__(GpuArrays)
    cdef ArrayRef ref
    self.dtypes = []
    streams = set()
    for i, x in enumerate(arrays):
        interface = x.__cuda_array_interface__
        dt = np.dtype(interface["typestr"])
        code = dtype_code(dt, f"{what}[{i}]")
        if dtype is not None and dt != dtype:
            raise TypeError(f"{what}[{i}] is {dt}; {dtype} expected")
        shape = tuple(interface["shape"])
        count = elements(x)
        strides = interface.get("strides")
        if strides is not None and count > 1:
            expected = []
            step = dt.itemsize
            for n in reversed(shape):
                expected.append(step)
                step *= n
            if tuple(strides) != tuple(reversed(expected)):
                raise ValueError(
                    f"{what}[{i}] is not contiguous (strides {strides}); "
                    f"nncomm communicates contiguous arrays")
        address, readonly = interface["data"]
        if readonly:
            raise ValueError(f"{what}[{i}] is read-only")
        streams.add(interface.get("stream") or 0)
        self.dtypes.append(dt)
        ref.ptr = <void*><uintptr_t>address
        ref.count = count
        ref.dtype = <DType><int>code
        ref.tag = 0
        self.refs.push_back(ref)
    if len(streams) > 1:
        raise ValueError(
            f"the arrays of {what} come from different CUDA streams "
            f"{sorted(streams)}; synchronise them onto one first")
    self.stream = <CudaStream><uintptr_t>(streams.pop() if streams else 0)
    return self


cdef int check_same_stream(CudaStream a, CudaStream b, str names) except -1:
    """Refuses the two sides of a call (`names`) coming from different
    streams."""
    if a != b:
        raise ValueError(
            f"{names} come from different CUDA streams "
            f"({<uintptr_t>a} and {<uintptr_t>b}); synchronise them onto "
            f"one first")
    return 0


cdef int check_distinct_memory(list arrays, str what) except -1:
    """Refuses GPU arrays whose memory overlaps (one array twice, or two
    views of the same memory), as check_distinct refuses NdArrays."""
    return check_disjoint(collect_gpu(arrays, what, None).refs, what)

# nnabla NdArrays as the C++ core sees them: pointers, element counts and
# dtype codes, read as NdArray.data_ptr reads them (through libnnabla's own
# functions, nnabla_arrays.hpp, where nncomm knows nnabla's types), so that
# collectives work on nnabla's own memory; in a CUDA context, device memory
# on nnabla's stream.

# nnabla's default element type: the dtype of an array never written yet.
_DEFAULT_DTYPE = np.dtype(np.float32)

# numpy dtypes to their codes, for the arrays' own dtypes.
cdef dict _DTYPE_CODES = {np.dtype(name): code
                          for name, code in DTYPE_CODES.items()
                          if name != "bfloat16"}


cdef list as_ndarray_list(data, str what):
    """`data` (an NdArray, or a list or tuple of them; or GPU arrays, see
    gpu_arrays.pxi, all of them) as a list."""
    if isinstance(data, NdArray) or is_gpu_array(data):
        return [data]
    if not isinstance(data, (list, tuple)):
        raise TypeError(
            f"{what} must be an nnabla NdArray or a list of NdArrays, "
            f"not {type(data).__name__}")
    gpu = len(data) > 0 and is_gpu_array(data[0])
    for i, x in enumerate(data):
        if gpu and not is_gpu_array(x):
            raise TypeError(
                f"{what}[{i}] is a {type(x).__name__}, not a GPU array "
                f"(__cuda_array_interface__) as {what}[0] is")
        if not gpu and not isinstance(x, NdArray):
            raise TypeError(
                f"{what}[{i}] is a {type(x).__name__}, not an nnabla NdArray "
                f"(pass a Variable's .data or .grad)")
    return list(data)


cdef int check_distinct(list arrays, str what) except -1:
    """Refuses a list that holds one array twice: reduced in place, it would
    count twice in the fused path and be overwritten in the direct one."""
    if arrays and is_gpu_array(arrays[0]):
        return check_distinct_memory(arrays, what)
    if len(arrays) > 1 and len(set(arrays)) != len(arrays):
        seen = {}
        for i, x in enumerate(arrays):
            if x in seen:
                raise ValueError(
                    f"{what}[{seen[x]}] and {what}[{i}] are the same array; "
                    f"a reduction takes each array once")
            seen[x] = i
    return 0


cdef dict parameter_names():
    """The data and gradient arrays of nnabla's registered parameters, to a
    number the same on every rank for the same parameter."""
    names = {}
    for name, v in nn.get_parameters(grad_only=False).items():
        tag = zlib.crc32(name.encode()) + 1
        names[v.data] = tag
        names[v.grad] = tag << 32
    return names


cdef list gradient_names(list grads):
    """The name of the parameter whose gradient each of `grads` is, among
    nnabla's registered parameters; None where none."""
    names = {} if nn is None else {
        v.grad: name for name, v in nn.get_parameters(grad_only=False).items()}
    found = []
    for x in grads:
        try:
            found.append(names.get(x))
        except TypeError:  # an unhashable GPU array
            found.append(None)
    return found


cdef object dtype_of(x, unwritten=_DEFAULT_DTYPE):
    """The dtype of NdArray `x`; `unwritten` for one never written, for
    which nnabla has none to report."""
    try:
        return x.dtype
    except RuntimeError:
        return unwritten


cdef void* _materialize(void* context, size_t index) noexcept with gil:
    cdef ArrayList arrays = <ArrayList>context
    try:
        return arrays.pointer(index, write_only=True)
    except BaseException:
        return NULL


cdef class NnablaContext:
    """An nnabla context as nncomm reads NdArrays in it: the context
    (`ctx`), whether it computes on CUDA (`cuda`: reading a context's
    backends costs about a microsecond), and, where libnnabla's NdArray
    functions can be called (`calls` not NULL), the context as
    nbla::Context (`cpp`), taken once, as nnabla's communicators take
    theirs. Made by :func:`nnabla_context`."""
    cdef readonly object ctx
    cdef bint cuda
    cdef Context cpp
    cdef const NdArrayCalls* calls


cdef NnablaContext nnabla_context(ctx):
    cdef NnablaContext self = NnablaContext.__new__(NnablaContext)
    self.ctx = ctx
    self.cuda = computes_on_cuda(ctx)
    self.calls = ndarray_calls()
    if self.calls != NULL:
        self.cpp = as_context(ctx)
    return self


cdef Context as_context(ctx):
    """nnabla context `ctx` as nbla::Context."""
    cdef Context context
    context.backend = [str(b).encode() for b in ctx.backend]
    context.array_class = str(ctx.array_class).encode()
    context.device_id = str(ctx.device_id).encode()
    return context


cdef class ArrayList:
    """The memory of a list of NdArrays, ready for the C++ core. Made by
    :func:`collect`."""
    cdef vector[ArrayRef] refs
    cdef list arrays
    cdef list dtypes
    cdef NnablaContext context

    cdef void* pointer(self, size_t index, bint write_only) except? NULL:
        x = self.arrays[index]
        return <void*><uintptr_t>x.data_ptr(self.dtypes[index],
                                            self.context.ctx, write_only)

    cdef Materializer materializer(self):
        cdef Materializer m
        m.fn = _materialize
        m.context = <void*>self
        return m



cdef int check_floating(list dtypes, str what) except -1:
    """Refuses averaging (division=True) arrays that are not floating."""
    for i, dt in enumerate(dtypes):
        if dt.kind != "f":
            raise TypeError(
                f"division=True averages, which needs floating-point "
                f"data; {what}[{i}] is {dt}")
    return 0


cdef int dtype_code(dt, str what) except -1:
    """The core's code of numpy dtype `dt`, that of array `what`."""
    code = _DTYPE_CODES.get(dt)
    if code is None:
        raise TypeError(
            f"{what} has dtype {dt}; nncomm communicates "
            f"float32, float64, float16, int32 and int64")
    return code


cdef ArrayList collect(list arrays, NnablaContext context, str what, dtype,
                       bint zeroing_as_null):
    """Reads the pointers, counts and dtypes of `arrays` (named `what` in
    errors), validating every array before anything is communicated, so that
    a bad argument raises on each rank that passed it.

    `dtype`, unless None, forces receive buffers to the sender's dtype; their old contents
    are not read. With `zeroing_as_null`, arrays still zeroing keep their
    flag and get a null pointer (read as zeros).
    """
    cdef ArrayList self = ArrayList.__new__(ArrayList)
    cdef ArrayRef ref
    # With every call checked, arrays are named by their parameters, so that
    # ranks passing same-shaped arrays in another order are told apart.
    names = parameter_names() \
        if check_calls() == CallChecks.kEvery else None
    self.arrays = arrays
    self.dtypes = []
    self.context = context
    self.refs.reserve(len(arrays))
    # The numpy type number `dtype` forces, as libnnabla takes it.
    cdef int forced = -1 if dtype is None else dtype.num
    for i, x in enumerate(arrays):
        ref.tag = 0 if names is None else names.get(x, 0)
        if context.calls != NULL and \
                _read_directly(context, x, forced, zeroing_as_null, &ref):
            self.refs.push_back(ref)
            self.dtypes.append(_CODE_DTYPES[<int>ref.dtype]
                               if dtype is None else dtype)
            continue
        # Where nnabla threw, or the dtype is not one nncomm moves: read as
        # nnabla's Python API reads it, which names the problem.
        dt = dtype_of(x) if dtype is None else dtype
        code = dtype_code(dt, f"{what}[{i}]")
        self.dtypes.append(dt)
        ref.count = x.size
        ref.dtype = <DType><int>code
        ref.ptr = NULL
        self.refs.push_back(ref)
        if not (zeroing_as_null and x.zeroing):
            self.refs[i].ptr = self.pointer(i, dtype is not None)
    return self


# The numpy dtypes of the codes.
cdef dict _CODE_DTYPES = {code: dt for dt, code in _DTYPE_CODES.items()}


cdef bint _read_directly(NnablaContext context, x, int forced,
                         bint zeroing_as_null, ArrayRef* ref) except -1:
    """Reads NdArray `x` into `ref` (all but its tag) as collect() does,
    through libnnabla's functions (`context.calls`); False where nnabla
    threw or its dtype is not one nncomm moves."""
    cdef void* ndarray = ndarray_of(<PyObject *>x)
    cdef long count
    cdef int type
    cdef cpp_bool zeroed
    if not context.calls.head(ndarray, &count, &type, &zeroed):
        return False
    if forced >= 0:
        type = forced
    cdef int code = ndarray_dtype_code(type)
    if code < 0:
        return False
    ref.count = count
    ref.dtype = <DType>code
    ref.ptr = NULL
    if zeroing_as_null and zeroed:
        return True
    return context.calls.memory(ndarray, type, context.cpp, forced >= 0,
                                &ref.ptr)


# nnabla-ext-cuda computes on the legacy default stream: CUDA's handle 1.
cdef uintptr_t _NNABLA_STREAM = 1


cdef bint computes_on_cuda(ctx):
    """Whether nnabla context `ctx` computes on a GPU."""
    return any(not str(b).startswith("cpu")
               for b in getattr(ctx, "backend", None) or [])


cdef GpuArrays on_nnabla_stream(ArrayList arrays):
    """NdArrays collected in a CUDA context (their pointers are device
    memory) as GPU arrays of nnabla's stream."""
    cdef GpuArrays self = GpuArrays.__new__(GpuArrays)
    self.refs = arrays.refs
    self.dtypes = arrays.dtypes
    self.stream = <CudaStream>_NNABLA_STREAM
    return self

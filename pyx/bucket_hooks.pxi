# Bucket hooks (PyTorch DDP's register_comm_hook): a Python callable that
# reduces each bucket of an engine in place of its all-reduce, on the
# engine's thread (include/nncomm/core/bucket_hook.hpp). The hook
# communicates through its GradBucket's collectives, on the engine's own
# transport, with the engine's bounded, stall-inspected waits.
#
# Ranks must make the same calls, and a hook may raise on one rank between
# two of them. So every collective of a hook is preceded by a small round
# (an int64 all-reduce, the same on every rank whatever it is doing) that
# says whether every rank is at a collective, and the same one; a hook that
# has returned (or raised) takes part in such rounds until every rank's
# has. A rank whose round shows another rank elsewhere stops its hook with
# HookAborted; the last round tells every rank which ranks' hooks raised.
# Only once every rank is at the same collective does it go out.

# The header of a round: at a collective (1/0), the collective's signature
# and its square (equal on every rank only if the sums are size times
# them), ranks whose hooks were stopped by another's, then one flag per
# rank: its hook raised.
cdef int _AT, _SIGNATURE, _SQUARE, _ABORTED, _RAISED
_AT, _SIGNATURE, _SQUARE, _ABORTED, _RAISED = range(5)

BucketGradient = collections.namedtuple(
    "BucketGradient", "index name shape start count offset")
BucketGradient.__doc__ = """A gradient's part in a bucket: `index` in the
reduced list, its parameter's `name` (None where unknown), its whole
`shape`, and its elements `start` to `start + count` (in C order) at
`offset` in the bucket's flat buffer. A gradient larger than a bucket is
split over several."""


class DeviceBuffer:
    """A GPU bucket's flat buffer, in device memory: what
    ``cupy.asarray(buffer)`` or ``torch.as_tensor(buffer, device="cuda")``
    read through ``__cuda_array_interface__``, whose ``stream`` is the
    bucket's (:attr:`GradBucket.stream`). Valid during the hook's call
    only."""

    def __init__(self, address, count, dtype, stream):
        self.shape = (count,)
        self.size = count
        self.dtype = dtype
        # The interface's stream 0 is not allowed: 1 is the legacy default.
        self.__cuda_array_interface__ = {
            "shape": self.shape, "typestr": dtype.str,
            "data": (address, False), "version": 3, "strides": None,
            "stream": stream or 1}


class HookAborted(RuntimeError):
    """Raised by a GradBucket's collective when another rank's hook raised
    or made another call: the hook should let it propagate."""


cdef class GradBucket:
    """A bucket of gradients handed to a bucket hook (``hook=`` of
    :meth:`Communicator.all_reduce_callback`,
    :meth:`Communicator.gradient_reducer` and
    :class:`nncomm.DistributedSolver`), as PyTorch's ``GradBucket``.

    The hook reduces ``buffer``, this rank's gradients of the bucket
    packed into one flat numpy array (times `scale_grad`, in the bucket's
    wire dtype), to the sum over the group's ranks: in place (returning
    None or the buffer) or returning an array of the same shape and dtype.
    nncomm then writes it back into the gradients, divided by the group's
    size where the reduction averages. The buffer and this object are valid
    during the call only. The hook runs on the engine's thread while
    backward goes on, holding the GIL; it communicates only through the
    collectives below, which every rank must call in the same order.

    For gradients on a CUDA device, ``buffer`` is a :class:`DeviceBuffer`
    in device memory (:attr:`on_device`), packed on :attr:`stream`: the
    hook reduces it in place (returning None or it), its device work
    enqueued on that stream, which the collectives below follow and the
    writing back comes after. Where CuPy is installed, the stream and
    device are CuPy's current ones during the call. An array written on
    another stream must be synchronized before a collective reads it.
    """
    cdef _HookCaller caller
    cdef const HookedBucket* hooked
    cdef Transport* transport
    cdef const Polling* polling
    cdef readonly object buffer
    cdef readonly list gradients
    cdef object aborted  # why another rank stopped this hook, or None
    cdef Status failure  # the transport's, once a collective failed

    @property
    def index(self):
        """int: the bucket's place in the launch order, the same on every
        rank."""
        self._check_open()
        return self.hooked.index

    @property
    def is_last(self):
        """bool: whether it is the iteration's last bucket."""
        self._check_open()
        return self.hooked.index + 1 == self.hooked.buckets

    @property
    def rank(self):
        """int: this rank's rank in the group."""
        self._check_open()
        return self.transport.rank()

    @property
    def size(self):
        """int: the number of ranks in the group."""
        self._check_open()
        return self.transport.size()

    @property
    def group(self):
        """str: the name of the group reduced over."""
        return self.caller.group_name

    @property
    def on_device(self):
        """bool: whether the bucket is in a CUDA device's memory."""
        self._check_open()
        return self.hooked.stream != NULL

    @property
    def stream(self):
        """int: the CUDA stream (a ``cudaStream_t``) the bucket is packed
        and unpacked on, which the hook's device work must follow; 0 for
        a host bucket."""
        self._check_open()
        return <uintptr_t>self.hooked.stream

    @property
    def device(self):
        """int: the bucket's CUDA device; -1 for a host bucket."""
        self._check_open()
        return self.hooked.device

    def all_reduce(self, array, division=False, wire_dtype=None):
        """Sums the contiguous numpy `array` over the group's ranks, in
        place, on the engine's transport.

        Args:
            array (array): A numpy array: float16, float32 or float64,
                C-contiguous; on a GPU bucket, an array of the bucket's
                device with ``__cuda_array_interface__`` (the buffer, a
                CuPy array).
            division (bool): Divide the sum by the group's size.
            wire_dtype (str): Send it in ``'float16'`` or ``'bfloat16'``,
                converted as ``wire_dtype=`` of
                :meth:`Communicator.all_reduce_callback` converts buckets;
                host buckets only.

        Returns:
            array: `array`, reduced.

        Raises:
            RuntimeError: another rank's hook raised or made another call
                (``HookAborted``: let it propagate).
            ValueError: an array nncomm cannot reduce.
            NotImplementedError: `wire_dtype` on a GPU bucket.
        """
        cdef ArrayRef ref = self._array_of(array)
        code = <int>ref.dtype
        wire = code if wire_dtype is None else _wire_code(None, wire_dtype)
        if wire != code and self.hooked.stream != NULL:
            raise NotImplementedError(
                "a GPU bucket's all_reduce sends an array in its own dtype; "
                "convert it on the device first (with CuPy: "
                "nncomm.hooks.fp16_compress)")
        cdef size_t count = ref.count
        cdef void* data = ref.ptr
        self._round(("all_reduce", count, code, wire,
                     1 if division else 0))
        cdef int divisor = self.transport.size() if division else 1
        if wire == code:
            self._check(self._allreduce(data, count, <DType>code, divisor))
            return array
        cdef PackSegment segment
        segment.tensor = data
        segment.dtype = <DType>code
        segment.offset = 0
        segment.count = count
        cdef PackTable table
        scratch = np.empty(count * dtype_size(<DType>wire), np.uint8)
        cdef void* message = <void*><uintptr_t>scratch.ctypes.data
        self._check(build_pack_table(&segment, 1, <DType>wire, &table))
        self._check(pack_host(table, message, <DType>wire, 1.0))
        self._check(self._allreduce(message, count, <DType>wire, 1))
        self._check(unpack_host(table, message, <DType>wire, 1.0, divisor))
        return array

    def all_gather(self, array, out=None):
        """Every rank's contiguous `array`, on the engine's transport.

        Args:
            array (array): A numpy array: float16, float32 or float64,
                C-contiguous, of the same shape on every rank; on a GPU
                bucket, an array of its device with
                ``__cuda_array_interface__``.
            out (array): Where to gather, ``size`` times `array`'s
                elements of its dtype, contiguous (of the same kind as
                `array`); needed on a GPU bucket, made otherwise.

        Returns:
            array: `out`, or a new numpy array of shape
            ``(size,) + array.shape``; row r is rank r's.

        Raises:
            RuntimeError: another rank's hook raised or made another call
                (``HookAborted``: let it propagate).
            ValueError: an array nncomm cannot gather, or an `out` of
                another size or dtype, or none on a GPU bucket.
        """
        cdef ArrayRef ref = self._array_of(array)
        cdef size_t count = ref.count
        cdef int size = self.transport.size()
        if out is None and self.hooked.stream != NULL:
            raise ValueError("a GPU bucket's all_gather needs out=, an "
                             "array of its device")
        if out is None:
            out = np.empty((size,) + array.shape, array.dtype)
        cdef ArrayRef into = self._array_of(out)
        if into.dtype != ref.dtype or into.count != count * size:
            raise ValueError(
                f"all_gather's out must hold {size} x {count} elements of "
                f"the array's dtype, not {into.count} of dtype code "
                f"{<int>into.dtype}")
        self._round(("all_gather", count, <int>ref.dtype))
        cdef const void* send = ref.ptr
        cdef void* recv = into.ptr
        cdef DType code = ref.dtype
        cdef unique_ptr[Work] work
        cdef Status status
        with nogil:
            status = self.transport.start_allgather(send, recv, count, code,
                                                    &work)
            if status.ok():
                status = wait_for(deref(work), self.transport.rank() == 0,
                                  self.polling)
        self._check(status)
        return out

    cdef int _check_open(self) except -1:
        if self.hooked == NULL:
            raise RuntimeError("a GradBucket is valid only during the call "
                               "of its hook")
        return 0

    cdef ArrayRef _array_of(self, array) except *:
        """Where `array` is, its elements and dtype: a float numpy array on
        a host bucket, a GPU array on a GPU bucket."""
        self._check_open()
        cdef ArrayRef ref
        if self.hooked.stream != NULL:
            if not is_gpu_array(array):
                raise ValueError(
                    f"a GPU bucket's collectives take arrays of its device "
                    f"(with __cuda_array_interface__), not "
                    f"{_describe_result(array)}")
            ref = collect_gpu([array], "array", None).refs[0]
            if <int>ref.dtype not in (<int>DType.kFloat16,
                                      <int>DType.kFloat32,
                                      <int>DType.kFloat64):
                raise ValueError(f"a bucket's collectives take float16, "
                                 f"float32 or float64 arrays, not dtype "
                                 f"code {<int>ref.dtype}")
        else:
            if not isinstance(array, np.ndarray) or \
                    not array.flags.c_contiguous or \
                    array.dtype.kind != "f" or array.dtype not in _DTYPE_CODES:
                raise ValueError(
                    f"a bucket's collectives take C-contiguous float16, "
                    f"float32 or float64 numpy arrays, not "
                    f"{_describe_result(array)}")
            ref.ptr = <void*><uintptr_t>array.ctypes.data
            ref.count = array.size
            ref.dtype = <DType><int>_DTYPE_CODES[array.dtype]
        if self.aborted is not None:
            raise HookAborted(self.aborted)
        return ref

    cdef Status _allreduce(self, void* data, size_t count, DType dt,
                           int divisor, bint on_host=False):
        """Sums `data` on the engine's transport, or with `on_host` on its
        host transport (the rounds' headers, in host memory whatever the
        bucket's is)."""
        cdef Status status
        cdef Transport* t = &self.transport.host() if on_host \
            else self.transport
        with nogil:
            status = t.allreduce(data, count, dt, 1.0, divisor, self.polling)
        return status

    cdef int _check(self, Status status) except -1:
        """Raises where `status` failed: the transport's failure (nothing
        more can be sent) is kept for the engine."""
        if not status.ok():
            self.failure = status
            self.aborted = status.message().decode()
            raise RuntimeError(self.aborted)
        return 0

    cdef object _round(self, signature, bint raised=False):
        """One round of the header (above): at the collective `signature`
        or, with None, done with the hook (`raised`: it raised). Returns
        the summed header; raises HookAborted at a collective that not
        every rank is at."""
        cdef int size = self.transport.size()
        cdef int64_t s = 0
        header = np.zeros(_RAISED + size, np.int64)
        if signature is not None:
            s = (zlib.crc32(repr(signature).encode()) & 0xFFFFF) + 1
            header[_AT] = 1
            header[_SIGNATURE] = s
            header[_SQUARE] = s * s
        else:
            header[_ABORTED] = self.aborted is not None
            header[_RAISED + self.transport.rank()] = raised
        self._check(self._allreduce(<void*><uintptr_t>header.ctypes.data,
                                    header.size, DType.kInt64, 1, True))
        if signature is not None and not (header[_AT] == size and
                                          header[_SIGNATURE] == size * s and
                                          header[_SQUARE] == size * s * s):
            self.aborted = (
                "another rank's hook raised" if header[_RAISED:].any() else
                "the ranks' hooks made different collectives (another "
                "kind, size or dtype, or another number of them)")
            raise HookAborted(self.aborted)
        return header

    cdef list _finish_rounds(self, bint raised):
        """Takes part in rounds until every rank's hook is done (`raised`:
        this one raised). Returns the group ranks whose hooks raised, and
        -1 where some hook was stopped by another's."""
        while True:
            header = self._round(None, raised)
            if header[_AT] == 0:
                return [r for r in range(self.transport.size())
                        if header[_RAISED + r]] + \
                    ([-1] if header[_ABORTED] else [])


cdef class OwnerReducing:
    """ZeRO stage 2's bucket reduction, a hook in C++
    (include/nncomm/core/owner_reduction.hpp) that
    :class:`nncomm.DistributedSolver` with ``shard="gradients"`` passes
    to :meth:`Communicator.all_reduce_callback`: each element of a bucket
    is summed onto the group rank that owns it, and left NaN on the
    others.

    Args:
        starts (list of int): Where each reduced gradient begins in the
            element space, in the order of the callback's `data`.
        bounds (list of int): Group rank r owns elements ``bounds[r]`` to
            ``bounds[r + 1]``; one more than the group's ranks.
    """
    cdef unique_ptr[OwnerReduction] core

    def __cinit__(self, starts, bounds):
        bounds = [int(b) for b in bounds]
        if len(bounds) < 2 or bounds[0] != 0 or bounds != sorted(bounds):
            raise ValueError(f"bounds must rise from 0, one per rank and "
                             f"one more, not {bounds}")
        self.core.reset(new OwnerReduction([int(s) for s in starts], bounds))


cdef class _HookCaller:
    """Calls a bucket hook for an engine: the PythonHook the engine is
    given, or an OwnerReducing's own, and what the latest iteration's
    Python hook raised."""
    cdef unique_ptr[PythonHook] core
    cdef BucketHook* native  # an OwnerReducing's, which `hook` keeps alive
    cdef readonly object hook
    cdef str group_name
    cdef list ranks  # world ranks of the group
    cdef list data
    cdef list names
    cdef list shapes
    cdef object error  # this rank's hook's exception, latest iteration
    cdef str message  # why the latest iteration's hook failed, or None

    cdef BucketHook* begin(self):
        self.error = None
        self.message = None
        return self.native if self.native != NULL else self.core.get()

    cdef int raise_failure(self) except -1:
        """Raises the hook's failure of the latest iteration, if any, as a
        BucketHookError chained to this rank's own exception."""
        if self.message is not None:
            raise BucketHookError(self.message) from self.error
        return 0

    cdef list gradients_of(self, const HookedBucket& hooked):
        if self.names is None:
            self.names = gradient_names(self.data)
        if self.shapes is None:
            self.shapes = [tuple(getattr(x, "shape", ())) for x in self.data]
        cdef const Bucket* bucket = hooked.bucket
        cdef size_t offset = 0
        cdef size_t k
        cdef Segment segment
        found = []
        for k in range(bucket.segments.size()):
            segment = bucket.segments[k]
            if segment.count == 0:
                continue
            found.append(BucketGradient(
                segment.tensor, self.names[segment.tensor],
                self.shapes[segment.tensor], segment.tensor_offset,
                segment.count, offset))
            offset += segment.count
        return found

    cdef str describe(self, const HookedBucket& hooked):
        return (f"the bucket hook {_hook_name(self.hook)} (bucket "
                f"{hooked.index + 1} of {hooked.buckets})")


cdef str _hook_name(hook):
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return repr(name)


cdef str _describe_result(x):
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"a {type(x).__name__}"


cdef Status _call_hook(void* owner, const HookedBucket& hooked,
                       Transport& transport,
                       const Polling& polling) noexcept with gil:
    cdef _HookCaller caller = <_HookCaller>owner
    cdef GradBucket bucket = GradBucket.__new__(GradBucket)
    bucket.caller = caller
    bucket.hooked = &hooked
    bucket.transport = &transport
    bucket.polling = &polling
    cdef size_t nbytes = hooked.count * dtype_size(hooked.dtype)
    cdef str where = caller.describe(hooked)
    raised = None
    try:
        if hooked.dtype == DType.kBFloat16:
            raise TypeError(
                "bfloat16 buckets have no numpy or CuPy dtype; give the "
                "reduction wire_dtype='bfloat16' without a hook" +
                ("" if hooked.stream != NULL else ", or send float32 "
                 "buckets with the bucket's all_reduce(wire_dtype="
                 "'bfloat16')"))
        dtype = _NUMPY_OF_CODE[<int>hooked.dtype]
        if hooked.stream != NULL:
            bucket.buffer = DeviceBuffer(<uintptr_t>hooked.buffer,
                                         hooked.count, np.dtype(dtype),
                                         <uintptr_t>hooked.stream)
        else:
            view = np.asarray(<char[:max(nbytes, 1)]><char*>hooked.buffer)
            bucket.buffer = view[:nbytes].view(dtype)
        bucket.gradients = caller.gradients_of(hooked)
        with _current_stream(hooked):
            result = caller.hook(bucket)
        if result is not None and result is not bucket.buffer and \
                hooked.stream != NULL:
            raise ValueError(
                f"{where} returned {_describe_result(result)}; a GPU "
                f"bucket's hook reduces bucket.buffer in place and returns "
                f"None or it")
        if result is not None and result is not bucket.buffer:
            if not isinstance(result, np.ndarray) or \
                    result.shape != bucket.buffer.shape or \
                    result.dtype != bucket.buffer.dtype:
                raise ValueError(
                    f"{where} returned {_describe_result(result)}; it must "
                    f"return None or an array of the bucket's shape "
                    f"{bucket.buffer.shape} and dtype {bucket.buffer.dtype}")
            bucket.buffer[...] = result
    except HookAborted as e:
        if bucket.aborted is None:
            raised = e  # the user's own
    except BaseException as e:
        raised = e
    try:
        if not bucket.failure.ok():
            return bucket.failure  # the transport failed: nothing is sent
        failed = bucket._finish_rounds(raised is not None)
    except BaseException as e:
        return bucket.failure if not bucket.failure.ok() else \
            Status.RuntimeError(f"{where}: {e}".encode())
    finally:
        bucket.hooked = NULL  # what it points to is the engine's
    if not failed:
        return Status()
    world = [caller.ranks[r] for r in failed if r >= 0]
    if raised is not None:
        caller.error = raised
        caller.message = (f"{where} raised on world rank "
                          f"{caller.ranks[transport.rank()]}: "
                          f"{type(raised).__name__}: {raised}")
    elif world:
        caller.message = (f"{where} raised on world rank(s) {world}; their "
                          f"exceptions say why")
    else:
        caller.message = (f"{where}: the ranks' hooks made different "
                          f"collectives (another kind, size or dtype, or "
                          f"another number of them)")
    return Status.RuntimeError(caller.message.encode())


cdef dict _NUMPY_OF_CODE = {code: dt for dt, code in _DTYPE_CODES.items()}


cdef object _current_stream(const HookedBucket& hooked):
    """For a GPU bucket where CuPy is installed, the context that makes the
    bucket's device and stream CuPy's current ones; otherwise none."""
    if hooked.stream == NULL:
        return contextlib.nullcontext()
    try:
        import cupy
    except ImportError:
        return contextlib.nullcontext()
    both = contextlib.ExitStack()
    both.enter_context(cupy.cuda.Device(hooked.device))
    both.enter_context(cupy.cuda.ExternalStream(<uintptr_t>hooked.stream))
    return both


cdef _HookCaller hook_caller(hook, _Group group, str group_name, list data,
                             list names, bint on_device):
    """The caller of `hook` (None: no hook) for an engine reducing `data`
    (named by `names`; None: by nnabla's parameter names) over `group`."""
    if hook is None:
        return None
    if not callable(hook) and not isinstance(hook, OwnerReducing):
        raise TypeError(f"hook must be a callable taking a "
                        f"nncomm.GradBucket, not {hook!r}")
    if on_device and isinstance(hook, OwnerReducing):
        raise NotImplementedError(
            "DistributedSolver(shard='gradients') reduces buckets in host "
            "memory; on a CUDA device use shard='state'")
    cdef _HookCaller caller = _HookCaller.__new__(_HookCaller)
    caller.hook = hook
    caller.group_name = group_name
    caller.ranks = group.ranks
    caller.data = data
    caller.names = names
    if isinstance(hook, OwnerReducing):
        caller.native = (<OwnerReducing>hook).core.get()
    else:
        caller.core.reset(new PythonHook(<HookCall>_call_hook, <void*>caller))
    return caller

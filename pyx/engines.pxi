# The engine (src/core/engine.cpp) as Python sees it: one engine thread per
# set of gradients, made at its first plan, serving every later plan of
# them (all_reduce_callback's: nnabla_adapter/backward_hook.pxi, one per
# graph and dtypes), and driven by hand through GradientReducer by code
# that knows itself when each gradient is final (a CuPy or custom training
# loop). The group makes the engine where the gradients lie
# (Group::create_engine): on MPI in host memory, through the CUDA packer on
# its device path.

# What the caches of engines and plans are bounded by: memory. An engine
# is charged its thread (the 8 MiB of stack a thread reserves) and
# communicators as _ENGINE_BYTES, plus its staging buffer; a plan, its
# tables.
cdef size_t _ENGINE_BYTES = 8 << 20

cdef dict _WIRE_DTYPES = {
    "float": np.dtype(np.float32),
    "half": np.dtype(np.float16),
    "double": np.dtype(np.float64),
}


cdef dict _FLOAT_CODES = {dt: code for dt, code in _DTYPE_CODES.items()
                          if dt.kind == "f"}
cdef dict _FLOAT_DTYPES = {code: dt for dt, code in _FLOAT_CODES.items()}


cdef object wire_dtype_of(ctx):
    """The dtype a context's type_config reduces in: 'cpu:half' -> float16."""
    backend = str(ctx.backend[0]) if ctx.backend else "cpu:float"
    return _WIRE_DTYPES.get(backend.partition(":")[2], _DEFAULT_DTYPE)


cdef class _EngineThread:
    """An engine thread over a set of gradients, with its transport (and,
    on a device, its CUDA runner), made once; its plans are _Plans."""
    cdef unique_ptr[Engine] engine
    cdef size_t staging  # bytes of the largest bucket of its plans

    @property
    def bytes(self):
        """What the engine holds, as the caches count it."""
        return _ENGINE_BYTES + self.staging


cdef class _Plan:
    """A bucket plan on an engine thread: its id there, the gradients the
    plan leaves for the end (those no rank's backward reaches), and the
    sizes and dtypes it was planned for. Dropped from the engine with it."""
    cdef _EngineThread thread
    cdef size_t id
    cdef uint64_t fingerprint  # plan_fingerprint(): the same on every rank
    cdef readonly size_t bytes  # its tables, as the caches count them
    cdef list unreached
    cdef list buckets  # per bucket of the plan: its gradients
    cdef vector[long] sizes
    cdef vector[int] codes  # per gradient: its dtype code when planned
    cdef bint converted  # this iteration, a gradient came in another dtype
    cdef _HookCaller hook  # the latest iteration's bucket hook, or None
    # Per gradient, its buckets not written back yet, and the buckets
    # written back as last seen: newly_written_back()'s, made at its first
    # call in an iteration.
    cdef list left
    cdef size_t written

    cdef str mark_ndarray(self, Py_ssize_t i, x, NnablaContext context,
                          str when, str planned, bint as_planned=False):
        """Hands NdArray `x`, gradient `i`, to the engine at its memory now
        (in `context`); a dtype other than planned is converted into and
        out of its bucket this time. With `as_planned`, `x` still zeroing
        gets its memory in the planned dtype (which nnabla's functions
        would have written, where an array never written reports
        float32). Returns why it cannot be, or None: `when` says when `x`
        changed, `planned` when it was planned."""
        dt = _FLOAT_DTYPES.get(self.codes[i]) if as_planned and x.zeroing \
            else dtype_of(x)
        code = _FLOAT_CODES.get(dt)
        if code is None:
            return (f"data[{i}] became {dt} {when}; gradients must be "
                    f"float32, float16 or float64")
        if x.size != self.sizes[i]:
            return (f"data[{i}] has {x.size} elements, {self.sizes[i]} "
                    f"{planned}")
        self.converted = self.converted or code != self.codes[i]
        cdef void* ptr = <void*><uintptr_t>x.data_ptr(dt, context.ctx)
        self.core().mark_ready(i, ptr, <DType><int>code)
        return None

    cdef Engine* core(self):
        return self.thread.engine.get()

    cdef list beyond(self, tuple reached):
        """The gradients in the plan that `reached` (a backward's) leaves
        out: in a plan over what several ranks' backwards reach, those this
        rank's does not."""
        if <Py_ssize_t>self.sizes.size() - len(self.unreached) == len(reached):
            return []
        skipped = set(self.unreached).union(reached)
        return [i for i in range(self.sizes.size()) if i not in skipped]

    cdef int begin(self, float scale, int divisor, bint check_finite,
                   _HookCaller hook) except -1:
        """Starts an iteration of this plan; with `check_finite`, every
        gradient is checked for NaN and infinity before it leaves; with
        `hook`, the hook reduces every bucket."""
        self.hook = hook
        self.left = None
        self.converted = False
        return CHKSTATUS(self.core().begin(
            self.id, scale, divisor, check_finite,
            <BucketHook*>NULL if hook is None else hook.begin()))

    cdef int check_finished(self, const Status& status, list data,
                            list names, list ranks) except -1:
        """Raises what an iteration's finish() `status` says: for a NaN or
        an infinity found (on any rank of the group, whose world `ranks`
        these are), NonFiniteGradientError naming the gradients of `data`
        by `names` (None: by nnabla's parameter names, where found); for
        a bucket hook that failed, BucketHookError."""
        if not status.ok() and self.hook is not None:
            self.hook.raise_failure()
        if status.code() != StatusCode.kNonFinite:
            return CHKSTATUS(status)
        raise nonfinite_error(
            data, names, {ranks[report.rank]: (report.count, report.tensors)
                          for report in self.core().nonfinite()})

    cdef list newly_written_back(self):
        """The gradients whose last bucket the engine has written back
        since the last call in this iteration."""
        cdef size_t written = self.core().written_back()
        if self.left is None:
            self.written = 0
            self.left = [0] * self.sizes.size()
            for tensors in self.buckets:
                for i in tensors:
                    self.left[i] += 1
        done = []
        for b in range(self.written, written):
            for i in self.buckets[b]:
                self.left[i] -= 1
                if self.left[i] == 0:
                    done.append(i)
        self.written = written
        return done

    cdef list launch_order(self):
        """The gradients of each bucket of the latest iteration, in the
        order the buckets went out."""
        return [self.buckets[b] for b in self.core().launched()]

    def __dealloc__(self):
        if self.thread is not None:
            self.core().drop_plan(self.id)


cpdef object nonfinite_error(list data, list names, dict found):
    """The NonFiniteGradientError of `found`, world rank -> (how many of
    its gradients held a NaN or an infinity, the first of them by index in
    `data`), naming them by `names` (None: by nnabla's parameter names,
    where found)."""
    if names is None:
        names = gradient_names(data)
    return NonFiniteGradientError(
        {rank: [describe_gradient(data, i, names) for i in tensors]
         for rank, (_, tensors) in found.items()},
        {rank: count for rank, (count, _) in found.items()})


cdef str describe_gradient(list data, Py_ssize_t i, list names):
    """Gradient `i` of `data` for a message: its parameter's name where
    known (DistributedSolver's `data` is a list of its own), else its place
    in `data`; and its shape."""
    shape = tuple(getattr(data[i], "shape", ()))
    if names[i] is None:
        return f"data[{i}] (shape {shape})"
    return f"{names[i]!r} (shape {shape})"


cpdef bint check_finite_of(check_finite) except -1:
    """`check_finite` of all_reduce_callback, gradient_reducer,
    DistributedSolver and QuantizedReducer: None takes
    NNCOMM_CHECK_FINITE."""
    if check_finite is None:
        return check_finite_setting()
    if check_finite not in (True, False):
        raise TypeError(f"check_finite must be None, True or False, not "
                        f"{check_finite!r}")
    return check_finite == True


cdef object priorities_of(priority, Py_ssize_t n):
    """`priority` of all_reduce_callback or gradient_reducer, checked:
    None, "forward", or a tuple of `n` finite floats."""
    if priority is None:
        return None
    what = (f"priority must be None, 'forward' or a number per gradient "
            f"({n}), not {priority!r}")
    if isinstance(priority, str):
        if priority != "forward":
            raise ValueError(what)
        return priority
    try:
        values = tuple(float(p) for p in priority)
    except (TypeError, ValueError):
        raise TypeError(what) from None
    if len(values) != n or not all(math.isfinite(p) for p in values):
        raise ValueError(what)
    return values


cdef int check_device_conversions(tuple codes, int wire) except -1:
    """Refuses gradients on a device whose conversion to the `wire` dtype
    the CUDA packer cannot make (to or from float64), before anything is
    planned."""
    names = {code: name for name, code in DTYPE_CODES.items()}
    float64 = DTYPE_CODES["float64"]
    for i, code in enumerate(codes):
        if code != wire and float64 in (code, wire):
            raise TypeError(
                f"data[{i}] is {names[code]} and the wire dtype "
                f"{names[wire]}: on a CUDA device nncomm converts between "
                f"float32, float16 and bfloat16 only; " +
                ("reduce float64 gradients in float64 (keep_dtype=True)"
                 if code == float64 else
                 "choose one of them as wire_dtype"))
    return 0


_PLANS_DIFFER = ("the ranks of this group disagree on the gradients to "
                 "reduce (their number, sizes, dtypes or priorities)")


# Marks the value of an agreement on a plan reused: a rank reusing a plan
# never agrees with one making it anew, even the same, as the two go on to
# different calls (commit_plan agrees a second time).
cdef uint64_t _REUSED = 0x5eed


cdef class _Draft:
    """A bucket plan made on this rank, before the group agrees on it
    (agree_on_draft) and the engine takes it (commit_plan)."""
    cdef vector[Bucket] buckets
    cdef uint64_t fingerprint  # plan_fingerprint(): the same on every rank
    cdef Status placed  # whether the gradients lie where the group works
    cdef list order
    cdef tuple sizes
    cdef tuple codes

    cdef uint64_t proposal(self):
        """What this rank passes to the group's agreement on the plan."""
        return self.fingerprint if self.placed.ok() else self.fingerprint ^ 1


cdef _Draft draft_plan(_Group group, list order, tuple sizes, tuple codes,
                       size_t pack_size, bint keep_dtype, int wire,
                       GpuArrays device, tuple priorities):
    """The plan over gradients of `sizes` and dtype `codes` launching
    buckets in `order` (indices; the others are left out of the plan),
    sorted by `priorities` (one per gradient), highest first, where given.
    Host memory with `device` None; otherwise the memory of `device`'s
    arrays, which must be where `group` communicates. Local."""
    cdef vector[TensorSpec] specs
    cdef TensorSpec spec
    floating = set(_FLOAT_CODES.values())
    for i, (size, code) in enumerate(zip(sizes, codes)):
        if code not in floating:
            raise TypeError(f"data[{i}] is not floating; gradients must be "
                            f"float32, float16 or float64")
        spec.count = size
        spec.dtype = <DType><int>code
        specs.push_back(spec)
    if device is not None and not keep_dtype:
        check_device_conversions(codes, wire)
    cdef _Draft draft = _Draft.__new__(_Draft)
    cdef vector[size_t] launch_order = order
    draft.buckets = plan_buckets(specs, launch_order, pack_size, keep_dtype,
                                 <DType><int>wire, direct_bytes())
    if priorities is not None:
        prioritize(priorities, &draft.buckets)
    if device is not None:
        draft.placed = deref(group.core).check_placed(device.refs)
    draft.fingerprint = plan_fingerprint(draft.buckets)
    draft.order = order
    draft.sizes = sizes
    draft.codes = codes
    return draft


cdef int agree_on_draft(_Group group, _Draft draft) except -1:
    """Raises on every rank of `group` unless every rank drafted the same
    plan, on gradients where its group communicates: one small all-reduce,
    which a rank whose gradients are elsewhere spoils. Collective."""
    if not group.same_everywhere(draft.proposal(),
                                 b"agreeing on a new plan of gradient "
                                 b"buckets"):
        CHKSTATUS(draft.placed)  # this rank's own reason
        raise ValueError(_PLANS_DIFFER + ", or a rank's are on another GPU "
                         "than its group's")
    return CHKSTATUS(draft.placed)


cdef _Plan commit_plan(_Group group, _Draft draft, list data,
                       GpuArrays device, _EngineThread thread):
    """The plan of `draft`, which every rank of `group` agreed on, over
    `data` on `thread` (None: a new engine thread, in `device`'s memory or,
    without, host memory). Collective: raises on every rank unless every
    rank has its buffers."""
    if thread is None:
        thread = _new_thread(group, len(data), device)
    if device is not None:
        # The thread has opened the group's device path, whose transport
        # says how small a bucket is worth its own operation.
        merge_buckets(deref(group.core).bucket_floor_bytes(), &draft.buckets)
    cdef _Plan made = _Plan.__new__(_Plan)
    made.fingerprint = draft.fingerprint
    planned = set(draft.order)
    made.unreached = [i for i in range(len(data)) if i not in planned]
    made.sizes = draft.sizes
    made.codes = draft.codes
    made.buckets = []
    made.bytes = 0
    cdef size_t staging = thread.staging
    cdef Bucket* bucket
    for b in range(draft.buckets.size()):
        bucket = &draft.buckets[b]
        made.buckets.append(tuple(bucket.tensors))
        made.bytes += (_BUCKET_BYTES + 3 * 8 * bucket.segments.size()
                       + 8 * bucket.tensors.size())
        staging = max(staging, bucket.count * dtype_size(bucket.dtype))
    # Every rank must know whether every rank has its buffer, or one
    # that failed alone would leave the others waiting for its buckets.
    cdef Status prepared = thread.engine.get().add_plan(draft.buckets,
                                                        &made.id)
    if prepared.ok():
        made.thread = thread  # from here, the plan is dropped with `made`
    all_prepared = group.same_everywhere(
        prepared.ok(), b"agreeing that every rank has its gradient buckets")
    CHKSTATUS(prepared)
    if not all_prepared:
        raise MemoryError("another rank of the group could not allocate "
                          "the engine's staging buffer")
    thread.staging = staging
    return made


cdef _Plan make_plan(_Group group, list data, list order, tuple sizes,
                     tuple codes, size_t pack_size, bint keep_dtype,
                     int wire, GpuArrays device, tuple priorities,
                     _EngineThread thread):
    """draft_plan's plan over `data`, agreed and committed on `thread`
    (None: a new engine thread).

    Collective over the group: every rank must plan the same buckets, and
    have its buffers, or this raises on every rank.
    """
    cdef _Draft draft = draft_plan(group, order, sizes, codes, pack_size,
                                   keep_dtype, wire, device, priorities)
    agree_on_draft(group, draft)
    return commit_plan(group, draft, data, device, thread)


# A Bucket's own bytes, its vectors' storage aside.
cdef size_t _BUCKET_BYTES = sizeof(Bucket)


cdef _EngineThread _new_thread(_Group group, size_t count, GpuArrays device):
    """An engine thread over `count` gradients of `group`, in `device`'s
    memory (None: host memory). Collective over the group.

    The engine communicates on a transport of its own: two engines on one
    group (say, callbacks chained for two halves of the model) must not
    interleave their collectives on a shared one."""
    cdef _EngineThread thread = _EngineThread.__new__(_EngineThread)
    cdef int poll_us = engine_poll_us()
    cdef Placement where
    cdef vector[ArrayRef] gradients
    if device is not None:
        where = device.placement()
        gradients = device.refs
    cdef Status status
    with nogil:
        status = deref(group.core).create_engine(where, gradients, count,
                                                 poll_us, &thread.engine)
    group.check(status)
    return thread


cdef class GradientReducer:
    """Gradients all-reduced in buckets by nncomm's engine thread as each
    becomes final, as :meth:`Communicator.all_reduce_callback` does during
    nnabla's backward, for code that says itself when a gradient is final:
    a training loop on CuPy arrays, or another framework's backward.

    Made by :meth:`Communicator.gradient_reducer`. Each iteration calls
    :meth:`begin`, then :meth:`ready` once per gradient as it becomes final
    (in any order; buckets still go out in the order every rank planned,
    by priority where given), then :meth:`finish` (or ``with reducer:`` around
    the iteration). On
    GPU arrays nothing waits for the device: a
    gradient is final once the work writing it is enqueued on the arrays'
    stream, and work enqueued there after :meth:`finish` sees the reduced
    gradients.

    Example:

    .. code-block:: python

        reducer = comm.gradient_reducer(grads, 2 << 20, division=True)
        for batch in data:
            reducer.begin()
            for i in backward_order:      # as each gradient is computed
                compute_gradient(i)
                reducer.ready(i)
            reducer.finish()              # grads hold the mean over ranks
    """
    cdef _Group group
    cdef _Plan _plan
    cdef list data
    cdef NnablaContext context
    cdef GpuArrays gpu  # the gradients' device memory; None on the host
    # GPU arrays keep their memory; an NdArray's is read at each ready().
    cdef bint fixed
    cdef float scale
    cdef int divisor
    cdef bint check_finite
    cdef _HookCaller hook
    cdef bytearray marked  # per gradient: ready() called this iteration
    cdef bint active

    def __init__(self, *args, **kwargs):
        refuse_direct_construction(self, "Communicator.gradient_reducer")

    @property
    def launch_order(self):
        """list of tuple of int: the gradients of each bucket of the latest
        iteration, in the order the buckets went out (the plan's: with a
        `priority`, highest first)."""
        return self._plan.launch_order()

    def begin(self):
        """Starts an iteration: every gradient is pending again.

        Raises:
            RuntimeError: the previous iteration was not finished.
        """
        if self.active:
            raise RuntimeError("this reducer's iteration is still under "
                               "way; finish() it before beginning another")
        self._plan.begin(self.scale, self.divisor, self.check_finite,
                         self.hook)
        self.marked = bytearray(len(self.data))
        self.active = True

    def ready(self, Py_ssize_t index):
        """Gradient `index` is final: its bucket goes out once every
        gradient in it is.

        Args:
            index (int): Position of the gradient in the reducer's list.

        Raises:
            IndexError: no such gradient.
            RuntimeError: outside an iteration, or twice in one. The
                iteration then fails on every rank, at :meth:`finish`.
        """
        if not self.active:
            raise RuntimeError("ready() outside an iteration; call begin() "
                               "first")
        if not 0 <= index < len(self.data):
            raise IndexError(f"gradient {index} out of range: the reducer "
                             f"has {len(self.data)}")
        if self.marked[index]:
            self._fail(f"gradient {index} was made ready twice in one "
                       f"iteration")
        self.marked[index] = 1
        if self.fixed:
            self._plan.core().mark_ready(
                index, self.gpu.refs[index].ptr, self.gpu.refs[index].dtype)
            return
        error = self._plan.mark_ndarray(
            index, self.data[index], self.context,
            "since the reducer was made",
            "when the reducer was made")
        if error is not None:
            self._fail(error)

    def fail(self, message):
        """Ends the iteration as failed on this rank: the remaining buckets
        go out as zeros, so no rank waits for this one, and :meth:`finish`
        raises `message` here and a RuntimeError on the other ranks.

        Args:
            message (str): Why.
        """
        if self.active:
            self._plan.core().fail(str(message).encode())

    def finish(self):
        """Waits until every bucket is reduced and written back; gradients
        never made ready are reduced with what they hold.

        Raises:
            RuntimeError: this rank or another failed during the iteration;
                the gradients were not all reduced.
            NonFiniteGradientError: with `check_finite`, a gradient held a
                NaN or an infinity on some rank; raised on every rank.
        """
        if not self.active:
            raise RuntimeError("finish() outside an iteration; call begin() "
                               "first")
        try:
            for i in range(len(self.data)):
                if not self.marked[i]:
                    self.ready(i)
        except RuntimeError:
            pass  # the iteration failed here, which finish() reports
        self.active = False
        cdef Engine* engine = self._plan.core()
        cdef Status status
        with nogil:
            status = engine.finish()
        self._plan.check_finished(status, self.data, None, self.group.ranks)

    def __enter__(self):
        """``with reducer:`` is one iteration: begin() on entry, finish() on
        exit; an exception inside fails the iteration (so no other rank
        waits for this one) and propagates."""
        self.begin()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finish()
            return False
        self.fail(f"the iteration raised {exc_type.__name__}: {exc}")
        try:
            self.finish()
        except RuntimeError:
            pass  # that failure is `exc`'s
        return False

    cdef int _fail(self, str message) except -1:
        self._plan.core().fail(message.encode())
        raise RuntimeError(message)


cdef GradientReducer make_reducer(_Group group, list grads,
                                  NnablaContext context, order,
                                  size_t pack_size, bint division,
                                  float scale, bint keep_dtype, int wire,
                                  priority, bint check_finite, hook,
                                  str group_name):
    """The reducer of Communicator.gradient_reducer, its arguments
    checked."""
    cdef GradientReducer self = GradientReducer.__new__(GradientReducer)
    self.group = group
    self.data = grads
    self.context = context
    self.gpu = device_arrays(grads, context, "data", None)
    self.fixed = len(grads) > 0 and is_gpu_array(grads[0])
    self.hook = hook_caller(hook, group, group_name, grads, None,
                            self.gpu is not None)
    if self.gpu is not None:
        sizes = tuple(<Py_ssize_t>self.gpu.refs[i].count
                      for i in range(len(grads)))
        codes = tuple(<int>self.gpu.refs[i].dtype for i in range(len(grads)))
    else:
        sizes = tuple(x.size for x in grads)
        codes = tuple(_DTYPE_CODES.get(dtype_of(x), -1) for x in grads)
    n = len(grads)
    order = list(reversed(range(n))) if order is None else \
        [operator.index(i) for i in order]
    if sorted(order) != list(range(n)):
        raise ValueError(f"order must list each of the {n} gradients' "
                         f"indices once, got {order}")
    priorities = priorities_of(priority, n)
    if priorities == "forward":
        # The gradients final last, which the next forward uses first.
        position = {i: k for k, i in enumerate(order)}
        priorities = tuple(float(position[i]) for i in range(n))
    self._plan = make_plan(group, grads, order, sizes, codes, pack_size,
                           keep_dtype, wire, self.gpu, priorities, None)
    self.scale = scale
    self.divisor = len(group.ranks) if division else 1
    self.check_finite = check_finite
    self.active = False
    return self


cdef Py_ssize_t _gradient_checks(list grads, pack_size, str what) except -1:
    """Refuses gradients an engine cannot reduce, and returns `pack_size`
    as an int."""
    check_distinct(grads, "data")
    for i, x in enumerate(grads):
        dt = dtype_of(x) if not is_gpu_array(x) else \
            np.dtype(x.__cuda_array_interface__["typestr"])
        if dt.kind != "f" or dt not in _DTYPE_CODES:
            raise TypeError(f"data[{i}] is {dt}; gradients must be "
                            f"float32, float16 or float64")
    try:
        size = operator.index(pack_size)
    except TypeError:
        raise TypeError(f"pack_size must be an int, "
                        f"not {type(pack_size).__name__}") from None
    if size <= 0:
        raise ValueError(f"pack_size must be a positive number of "
                         f"elements, got {size}")
    if not _engine_threads():
        raise RuntimeError(
            f"{what} runs MPI on an engine thread and needs MPI initialized "
            f"with MPI_THREAD_MULTIPLE (mpi4py's default; check "
            f"mpi4py.rc.thread_level)")
    return size


cdef int _wire_code(ctx, wire_dtype) except -1:
    """The code of the dtype an engine's buckets travel in: `wire_dtype`
    (a floating dtype's name, or a numpy dtype), or else the context's."""
    if wire_dtype is None:
        return _DTYPE_CODES[wire_dtype_of(ctx)]
    name = wire_dtype if isinstance(wire_dtype, str) else \
        np.dtype(wire_dtype).name
    if name not in ("float32", "float16", "bfloat16", "float64"):
        raise ValueError(f"wire_dtype must be 'float32', 'float16', "
                         f"'bfloat16' or 'float64', not {wire_dtype!r}")
    return DTYPE_CODES[name]

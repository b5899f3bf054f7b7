# all_reduce_callback: gradients all-reduced by a C++ engine thread while
# nnabla's backward goes on. The hook here is the framework adapter: it
# counts, per gradient, the functions still to write it (graph.py), and hands
# each gradient to the engine (src/engine.cpp) once the last one has.

from nncomm.graph import analyze

# Bounds on what is kept per set of gradients: analyses of distinct graphs
# (each keeps its graph alive, so few: a script that builds a new graph
# every iteration needs only the latest), and engines (one thread each) for
# distinct sets of reached gradients.
cdef int _MAX_ANALYSES = 2
cdef int _MAX_ENGINES = 4
cdef int _MAX_STATES = 16

cdef dict _WIRE_DTYPES = {
    "float": np.dtype(np.float32),
    "half": np.dtype(np.float16),
    "double": np.dtype(np.float64),
}


cdef dict _WIRE_ITEMSIZE = {code: dt.itemsize
                            for dt, code in _DTYPE_CODES.items()}


cdef object wire_dtype_of(ctx):
    """The dtype a context's type_config reduces in: 'cpu:half' -> float16."""
    backend = str(ctx.backend[0]) if ctx.backend else "cpu:float"
    return _WIRE_DTYPES.get(backend.partition(":")[2], _DEFAULT_DTYPE)


cdef void remember(dict cache, key, value, int bound):
    """Inserts into a dict used as a small FIFO cache."""
    if len(cache) >= bound:
        del cache[next(iter(cache))]
    cache[key] = value


cdef class _Engine:
    """An engine thread with its fixed bucket plan, and the gradients the
    plan leaves for the end (those the graph does not reach)."""
    cdef unique_ptr[Engine] engine
    cdef _Group group
    cdef list unreached
    cdef list dtypes  # per gradient: its planned dtype code (keep_dtype)


cdef class _CallbackState:
    """What callbacks over the same gradients share across iterations and
    across callback objects: graph analyses and engines, so that a static
    graph is analysed once and steady-state iterations allocate nothing."""
    cdef dict analyses
    cdef dict engines
    cdef dict _positions

    def __cinit__(self):
        self.analyses = {}
        self.engines = {}
        self._positions = None

    cdef dict positions(self, list grads):
        """Gradient array to its position in the list."""
        if self._positions is None:
            self._positions = {x: i for i, x in enumerate(grads)}
        return self._positions


cdef class AllReduceCallback:
    """The hook returned by :meth:`Communicator.all_reduce_callback`; pass it
    as ``loss.backward(function_post_hook=cb)``."""
    cdef _Group group
    cdef _CallbackState state
    cdef list data
    cdef dict positions
    cdef object ctx
    cdef bint division
    cdef bint keep_dtype
    cdef float scale
    cdef size_t pack_size
    cdef int wire
    # The backward under way.
    cdef bint active
    cdef object root
    cdef object graph
    cdef _Engine current
    cdef vector[int] pending
    cdef Py_ssize_t calls_left

    @property
    def schedule(self):
        """str: when the engine of the latest backward will launch its
        buckets:
        ``'eager'`` (each as soon as its gradients are final, overlapping
        the rest of backward), ``'deferred'`` (all once backward has made
        the last gradient), or ``'tuning'`` while the automatic choice is
        timing both on the first iterations. ``None`` before the first
        backward. ``NNCOMM_LAUNCH=eager`` or ``deferred`` fixes it.
        """
        if self.current is None:
            return None
        cdef cpp_bool decided = False
        cdef Launch launch = self.current.engine.get().launch(&decided)
        if not decided:
            return "tuning"
        return "eager" if launch == Launch.kEager else "deferred"

    def __call__(self, f):
        if self.active and f == self.root:
            self._abandon()
        if not self.active:
            self._begin(f)
        written = self.graph.consumers.get(f)
        if written is None:
            self._fail(f"backward called {f.name}, which was not in the "
                       f"graph when this backward started; was the graph "
                       f"changed? Gradients were not all-reduced")
        for i in written:
            self.pending[i] -= 1
            if self.pending[i] == 0:
                self._ready(i)
        self.calls_left -= 1
        if self.calls_left == 0:
            self._finish()

    cdef int _begin(self, f) except -1:
        graph = self.state.analyses.get(f)
        if graph is None or not graph.still_valid():
            graph = analyze(f, self.positions)
            remember(self.state.analyses, f, graph, _MAX_ANALYSES)
        cdef _Engine engine = self.state.engines.get(graph.reached)
        if engine is None:
            engine = self._new_engine(graph.reached)
            remember(self.state.engines, graph.reached, engine, _MAX_ENGINES)
        self.graph = graph
        self.root = f
        self.current = engine
        self.pending = graph.counts
        self.calls_left = len(graph.functions)
        engine.engine.get().begin(self.scale,
                                  len(self.group.ranks) if self.division else 1)
        self.active = True
        return 0

    cdef _Engine _new_engine(self, tuple reached):
        cdef vector[TensorSpec] specs
        cdef TensorSpec spec
        codes = []
        for x in self.data:
            code = _DTYPE_CODES[dtype_of(x)]
            codes.append(code)
            spec.count = x.size
            spec.dtype = <DType><int>code
            specs.push_back(spec)
        # Gradients of the last layers are final first: plan those first.
        cdef vector[size_t] order = list(reversed(reached))
        # Every rank must plan the same buckets, or their MPI calls would not
        # match: one small all-reduce, once per new plan.
        signature = hash((tuple(x.size for x in self.data),
                          tuple(codes) if self.keep_dtype else (), reached,
                          self.pack_size, self.keep_dtype, self.wire))
        cdef cpp_bool same = False
        cdef Status status
        cdef uint64_t value = <uint64_t>(signature & 0xFFFFFFFFFFFFFFFF)
        with nogil:
            status = deref(self.group.transport).agree(value, &same)
        CHKSTATUS(status)
        if not same:
            raise ValueError(
                "the ranks of this group disagree on the gradients this "
                "callback reduces (their number, sizes or dtypes, or which "
                "of them the graph reaches)")
        # The engine's own communicator: two callbacks on one group (say,
        # chained for two halves of the model) must not interleave their
        # collectives on a shared one.
        cdef unique_ptr[MpiTransport] own
        with nogil:
            status = deref(self.group.transport).Duplicate(&own)
        CHKSTATUS(status)
        cdef _Engine engine = _Engine.__new__(_Engine)
        engine.group = self.group
        planned = set(reached)
        engine.unreached = [i for i in range(len(self.data))
                            if i not in planned]
        engine.dtypes = codes
        engine.engine.reset(new Engine(
            move(own), len(self.data),
            plan_buckets(specs, order, self.pack_size, self.keep_dtype,
                         <DType><int>self.wire,
                         direct_bytes() // _WIRE_ITEMSIZE[self.wire]),
            engine_poll_us()))
        return engine

    cdef int _ready(self, Py_ssize_t i) except -1:
        x = self.data[i]
        dt = dtype_of(x)
        code = _DTYPE_CODES.get(dt)
        if code is None or (self.keep_dtype and code != self.current.dtypes[i]):
            self._fail(f"data[{i}] became {dt} during backward; the callback "
                       f"planned it as {self.current.dtypes[i]}")
        cdef void* ptr = <void*><uintptr_t>x.data_ptr(dt, self.ctx)
        self.current.engine.get().mark_ready(i, ptr, <DType><int>code)
        return 0

    cdef int _abandon(self) except -1:
        """Closes a backward that stopped part-way (an exception in a hook
        or a function ends nnabla's backward at once): the engine sends its
        remaining buckets zero-filled and the tail is reduced, the calls
        every other rank made to finish that backward, so the ranks stay
        matched whether they stopped too or not; then the new backward goes
        on."""
        warnings.warn("the previous backward ended before all of its "
                      "functions ran; its gradients were not all-reduced",
                      RuntimeWarning)
        self.current.engine.get().fail(b"abandoned")
        try:
            self._finish()
        except RuntimeError:
            pass  # the abandoned backward's own failure, reported above
        return 0

    cdef int _fail(self, str message) except -1:
        # The engine still sends every remaining bucket (zeros) and then the
        # failure flag, so the other ranks learn of it instead of waiting.
        self.current.engine.get().fail(message.encode())
        return self._finish()

    cdef int _finish(self) except -1:
        self.active = False
        cdef Engine* engine = self.current.engine.get()
        cdef Status status
        with nogil:
            status = engine.finish()
        # Every rank reduces the unreached gradients, whatever happened
        # above, so that the ranks' MPI calls stay matched.
        cdef ArrayList tail = collect(
            [self.data[i] for i in self.current.unreached], self.ctx, "data",
            None, True)
        cdef Materializer materialize = tail.materializer()
        cdef Status tail_status
        with nogil:
            tail_status = all_reduce_list(
                deref(self.group.transport), self.group.fusion, tail.refs,
                self.division, self.scale, True, materialize)
        CHKSTATUS(status)
        CHKSTATUS(tail_status)
        return 0


def plan_gradient_buckets(counts, dtypes, order, pack_size, keep_dtype, wire,
                          direct_count):
    """The bucket plan the engine would run, for inspection and tests.

    Args:
        counts (list of int): elements per tensor.
        dtypes (list of numpy dtypes): per tensor.
        order (list of int): tensor indices in launch order.
        pack_size (int): elements per bucket.
        keep_dtype (bool): one dtype per bucket, travelling in it.
        wire (numpy dtype): the dtype buckets travel in otherwise.
        direct_count (int): tensors of this many elements or more, in the
            wire dtype, get direct buckets of their own.

    Returns:
        list of (numpy dtype, direct, list of (tensor, tensor_offset, count)),
        in launch order; a bucket's segments lie end to end in it.
    """
    cdef vector[TensorSpec] specs
    cdef TensorSpec spec
    for count, dt in zip(counts, dtypes):
        spec.count = count
        spec.dtype = <DType><int>_DTYPE_CODES[np.dtype(dt)]
        specs.push_back(spec)
    names = {code: dt for dt, code in _DTYPE_CODES.items()}
    cdef vector[Bucket] plan = plan_buckets(
        specs, list(order), pack_size, keep_dtype,
        <DType><int>_DTYPE_CODES[np.dtype(wire)], direct_count)
    return [(names[<int>b.dtype], b.direct,
             [(s.tensor, s.tensor_offset, s.count)
              for s in b.segments])
            for b in plan]

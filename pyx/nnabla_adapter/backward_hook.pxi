# all_reduce_callback: gradients all-reduced by a C++ engine thread while
# nnabla's backward goes on. The hook here is the framework adapter: it
# counts, per gradient, the functions still to write it (graph.py's analysis,
# as a ReadinessTable: src/core/readiness.cpp), and hands each gradient to the
# engine (src/core/engine.cpp) once the last one has. Most calls are counted
# in C++ with no Python (backward_counts.hpp); this hook handles the others.
# A backward ends (engine finish, unreached gradients reduced) at the last
# function the analysis expects, or, for a callback whose caller owns the
# loop (DistributedSolver), when that caller says backward returned.
#
# What a backward in flight needs lives in the state shared by every
# callback over the same gradients (_CallbackState.backward), not in a
# callback object: a new callback each iteration then still sees, and
# closes, a backward that stopped part-way.

# Bounds on what is kept per set of gradients: analyses of distinct graphs
# (each keeps its graph alive, so few: a script that builds a new graph
# every iteration needs only the latest), the words a rank sends to agree
# on a cached plan, and, by memory (engines.pxi), the plans of its engine
# thread; and of sets of gradients, each with its engine thread, per group
# (some 30 threads at most).
cdef int _MAX_ANALYSES = 2
cdef int _MAX_AGREEMENTS = 64
cdef size_t _PLANS_BYTES = 16 << 20
cdef size_t _STATES_BYTES = 256 << 20
_WORD = (1 << 64) - 1  # a word of the plan's agreement

# The states with a backward in flight, on any thread. A thread that enters
# nncomm anywhere else (another backward, a collective, a solver) while its
# own backward is still in flight knows that backward has stopped part-way.
cdef set _in_flight = set()


cdef int remember(dict cache, key, value, size_t budget,
                  measure=None) except -1:
    """Inserts into a dict used as a small FIFO cache, then drops its oldest
    entries until what they hold (`measure(entry)`; 1 each without it) is
    within `budget`, keeping the new one and any whose backward is in
    flight."""
    cache[key] = value
    held = sum(measure(v) for v in cache.values()) if measure is not None \
        else len(cache)
    for old in list(cache):
        if held <= budget:
            break
        entry = cache[old]
        if old is key or (isinstance(entry, _CallbackState) and
                           entry in _in_flight):
            continue
        held -= measure(entry) if measure is not None else 1
        del cache[old]
    return 0


# Per thread: the depth of nncomm calls made by nnabla's own functions
# during a backward (sync batch normalization's all_reduce, nnabla_types.pxi),
# which do not mean that the backward in flight stopped.
_inside = threading.local()


cdef class _FromInsideBackward:
    """Context manager around an nncomm call that an nnabla function makes
    while backward runs."""

    def __enter__(self):
        _inside.depth = getattr(_inside, "depth", 0) + 1

    def __exit__(self, *exc):
        _inside.depth -= 1
        return False


cdef int close_stopped_backwards(str entry, uintptr_t call=0) except -1:
    """Closes the backwards of this thread that stopped part-way, before
    `entry` (what this thread is doing instead) goes on; `call`: the key
    (key_of) of a hook call's Function, whose own backward is not closed.

    A backward stopped by an exception nncomm saw (nncomm.chain_hooks) was
    closed at once; any other means an exception nncomm did not see, or a
    graph analysis that missed the end of backward. It is closed as failed
    (the other ranks raise for it), with a RuntimeWarning here, and `entry`
    goes on: raising would skip `entry` on this rank alone, and the ranks'
    next calls would pair one step apart. (An exception ending backward
    was this rank's error already.) A call made by one of nnabla's
    functions inside backward closes nothing.
    """
    if not _in_flight or getattr(_inside, "depth", 0):
        return 0
    thread = threading.get_ident()
    cdef _Backward bw
    for state in list(_in_flight):
        bw = (<_CallbackState>state).backward
        if bw is not None and bw.thread == thread and \
                (call == 0 or bw.readiness().last() != call):
            message = (
                f"the last backward over these gradients returned (or "
                f"raised) before {bw.describe_missing()} ran, and {entry} "
                f"came next: it was closed as failed, its gradients were "
                f"not all-reduced (use nncomm.chain_hooks to combine a "
                f"hook with the callback, so that an exception closes it "
                f"at once)")
            (<_CallbackState>state).close(message, False)
            warnings.warn(message, RuntimeWarning)
    return 0


def _before_solver():
    # nnabla calls this before a solver reads the gradients (update,
    # weight_decay, clip_grad_by_norm, ...), once per parameter; a no-op
    # unless a backward of this thread stopped part-way. Raising here would
    # not help: nnabla goes on updating the other parameters. So the
    # stopped backward's remaining gradients are reduced as they are, which
    # is what the solver must see if backward did end there.
    if not _in_flight:
        return
    for state in list(_in_flight):
        flush_stopped((<_CallbackState>state).backward, "when a solver started")


cdef int flush_stopped(_Backward bw, str when) except -1:
    """Ends, `when`, `bw` where it is a backward of this thread that
    returned: one that returned before functions the graph analysis
    expected has what is left reduced, with a RuntimeWarning; one whose
    caller ends it (DistributedSolver's) may have run them all."""
    if bw is None or bw.thread != threading.get_ident():
        return 0
    if bw.readiness().calls_left():
        warnings.warn(
            f"backward returned before {bw.describe_missing()} ran, which "
            f"nncomm's graph analysis expected; the remaining gradients "
            f"were all-reduced {when}", RuntimeWarning)
    return (<AllReduceCallback>bw.owner)._flush(bw)


cdef bint _solver_hooked = False


cdef int hook_solvers() except -1:
    """Makes every nnabla solver close stopped backwards first, so that no
    solver step applies gradients that were not all-reduced."""
    global _solver_hooked
    if not _solver_hooked:
        nn.set_solver_pre_hook("nncomm", _before_solver)
        _solver_hooked = True
    return 0


cdef tuple _dtype_bits(words, Py_ssize_t n):
    """The two byte arrays in the words of a plan's agreement, per gradient
    of `n`: its dtype as a bit where backward reaches it, and where not."""
    width = (n + 7) // 8
    return (words[4:4 + width].view(np.uint8)[:n],
            words[4 + width:].view(np.uint8)[:n])


cdef inline int _highest_code(bits) except -2:
    """Of dtype codes held as bits (one per rank's dtype), the highest:
    the dtype that the ranks holding a gradient in several reduce it in."""
    return int(bits).bit_length() - 1


cdef list _recasts(list unreached, words, list data):
    """Of the gradients that no rank's backward reaches (`unreached`),
    which end up in different dtypes on different ranks where their
    histories differ (a rank allocates one its backward skips in the plan's
    dtype, which nnabla's functions on another may write in another), those
    this rank holds in another dtype than the highest code any rank does
    (per gradient, the ranks' dtypes as bits in the agreed `words`), with
    that dtype: cast, all ranks reduce them alike."""
    if not unreached:
        return []
    idle = _dtype_bits(words, len(data))[1]
    recast = []
    for i in unreached:
        bits = int(idle[i])
        if bits & (bits - 1):  # several dtypes
            dt = _FLOAT_DTYPES.get(_highest_code(bits))
            if dt is not None and dtype_of(data[i]) != dt:
                recast.append((i, dt))
    return recast


cdef uintptr_t key_of(f) except? 0:
    """The key of Function `f`'s call in a ReadinessTable: its hash, which
    nnabla's Function makes the address of its graph node, as nnabla's C++
    callback sees the function."""
    cdef Py_ssize_t h = hash(f)
    return <uintptr_t>h


cdef class _Analysis:
    """A graph analysis (graph.py's BackwardGraph) and its ReadinessTable."""
    cdef object graph
    cdef shared_ptr[ReadinessTable] table


cdef _Analysis analysis_of(f, dict positions):
    """The analysis of the backward that starts at Function `f`, over the
    gradients at `positions`."""
    cdef _Analysis self = _Analysis.__new__(_Analysis)
    self.graph = analyze(f, positions)
    cdef vector[uintptr_t] keys = [key_of(g) for g in self.graph.functions]
    cdef vector[vector[size_t]] written = [
        self.graph.consumers[g][1] for g in self.graph.functions]
    self.table.reset(new ReadinessTable(keys, written, len(positions)))
    return self


cdef class _Backward:
    """One backward in flight over a set of gradients, counted by its
    state's BackwardCounts (`counts`: the state is kept alive by
    `owner`)."""
    cdef object owner  # the AllReduceCallback whose call began it
    cdef object graph
    cdef _Plan plan
    cdef list early  # in the plan, not reached here: ready from the start
    # (gradient, dtype): reached by no rank, and held here in another dtype
    # than on some other rank: cast before they are reduced at the end.
    cdef list recast
    cdef BackwardCounts* counts
    cdef object thread
    cdef int divisor  # the engine's: the group's size, or comm.join()'s

    cdef const Readiness* readiness(self):
        return &self.counts.readiness()

    cdef str describe_missing(self):
        cdef const Readiness* counted = self.readiness()
        missing = [f.name for f, (i, _) in self.graph.consumers.items()
                   if not counted.called(i)]
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        return f"{len(missing)} of its functions ({shown})"


cdef class _CallbackState:
    """What callbacks over the same gradients share across iterations and
    across callback objects: graph analyses, the engine thread and its
    plans, so that a static graph is analysed once and steady-state
    iterations allocate nothing, and the backward in flight."""
    cdef dict analyses  # first Function of a backward -> its _Analysis
    cdef shared_ptr[BackwardCounts] counts
    cdef list grads  # kept alive: `counts` reads their nbla::NdArrays
    cdef _EngineThread thread  # made with the first plan
    # The plans, by what backward reaches here where every rank runs the
    # same plan, else (_union_plan) by what it reaches on any rank; and by
    # the former, what _agreed_plan sends for them.
    cdef dict plans
    cdef dict agreements
    cdef dict _positions
    cdef _Backward backward
    cdef _Plan latest
    cdef _Group group
    # The gradients' dtype codes the plans are made for, read again when a
    # gradient became final in another dtype (`replan`).
    cdef tuple codes
    cdef bint replan

    def __cinit__(self, _Group group, list grads, NnablaContext context):
        self.analyses = {}
        self.plans = {}
        self.agreements = {}
        self._positions = None
        self.group = group
        self.grads = grads
        self.counts = backward_counts(grads, context)

    @property
    def bytes(self):
        """What the state holds of engines, as the caches count it."""
        if self.thread is None:
            return 0
        return self.thread.bytes + sum(p.bytes for p in self.plans.values())

    cdef dict positions(self, list grads):
        """Gradient array to its position in the list."""
        if self._positions is None:
            self._positions = {x: i for i, x in enumerate(grads)}
        return self._positions

    cdef int close(self, str message, bint raise_it) except -1:
        """Ends the backward in flight as failed: the engine sends its
        remaining buckets zero-filled and the failure round, and the tail is
        reduced, which are the calls every other rank makes to finish that
        backward, so the ranks stay matched whether they stopped too or
        not. Raises `message` with `raise_it`."""
        cdef _Backward bw = self.backward
        # An analysis that mispredicted must not be used again.
        self.analyses.clear()
        bw.plan.core().fail(message.encode())
        try:
            (<AllReduceCallback>bw.owner)._finish(bw)
        except CommunicatorError:
            raise  # not about this backward: no rank can communicate
        except RuntimeError:
            if raise_it:
                raise
        return 0


cdef class AllReduceCallback:
    """The hook returned by :meth:`Communicator.all_reduce_callback`; pass it
    as ``loss.backward(function_post_hook=cb)``."""
    cdef _Group group
    cdef _CallbackState state
    cdef list data
    cdef dict positions
    cdef NnablaContext context
    cdef bint division
    cdef bint keep_dtype
    cdef float scale
    cdef size_t pack_size
    cdef int wire
    cdef object priority  # None, "forward" or a number per gradient
    cdef bint check_finite
    cdef _HookCaller hook  # the bucket hook, or None
    cdef list names  # per gradient, its parameter's name; None: looked up
    # Its caller ends each backward when backward returned
    # (_backward_returned), not the last function the analysis expects.
    cdef bint caller_ends

    def __init__(self, *args, **kwargs):
        refuse_direct_construction(self, "Communicator.all_reduce_callback")

    @property
    def launch_order(self):
        """list of tuple of int: the gradients of each bucket of the latest
        backward, in the order the buckets went out (the plan's: with a
        `priority`, highest first); ``None`` before the first."""
        if self.state.latest is None:
            return None
        return self.state.latest.launch_order()

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
        if self.state.latest is None:
            return None
        cdef cpp_bool decided = False
        cdef Launch launch = self.state.latest.core().launch(
            self.state.latest.id, &decided)
        if not decided:
            return "tuning"
        return "eager" if launch == Launch.kEager else "deferred"

    def backward_raised(self):
        """Tells the callback that the backward under way is ending with an
        exception, so that it is closed now (the other ranks then raise
        instead of waiting for this one) and the next backward goes on.
        :func:`nncomm.chain_hooks` calls it when a hook raises.
        """
        if self.state.backward is not None and \
                self.state.backward.thread == threading.get_ident():
            self.state.close("backward raised on this rank", False)

    def _end_when_backward_returns(self):
        """Makes the caller end each backward of this callback: not at the
        last function the graph analysis expects, but when the caller calls
        :meth:`_backward_returned` (or :meth:`backward_raised`). For
        DistributedSolver, which runs the backward."""
        self.caller_ends = True

    def _name_gradients(self, names):
        """Names the gradients, one name per array of `data` (None where
        unknown), for the messages of NonFiniteGradientError and the
        buckets of a hook; by default they are looked up in nnabla's
        parameter scope. For DistributedSolver, which knows its
        parameters' names."""
        self.names = list(names)
        if self.hook is not None:
            self.hook.names = self.names

    def _newly_written_back(self):
        """The gradients (indices into `data`) of the backward under way
        on this thread whose buckets the engine has all reduced and written
        back since the last call: nnabla's to use again. For
        DistributedSolver(shard="gradients"), which releases those this
        rank does not own while backward goes on."""
        cdef _Backward bw = self.state.backward
        if bw is None or bw.thread != threading.get_ident():
            return []
        return bw.plan.newly_written_back()

    def _backward_returned(self):
        """nnabla's backward returned: ends the backward of these gradients
        still open on this thread (engine finish; the unreached gradients,
        and any still waiting for functions the graph analysis expected
        that did not run, reduced with their values, the latter with a
        RuntimeWarning). nnabla's end of backward calls it
        (communicator_callbacks=), and DistributedSolver after
        ``loss.backward``."""
        flush_stopped(self.state.backward, "when backward returned")

    def __call__(self, f):
        cdef uintptr_t key = key_of(f)
        cdef BackwardCounts* counts = self.state.counts.get()
        if counts.try_count(key):
            return
        cdef const Readiness* counted = &counts.readiness()
        cdef _Backward bw = self.state.backward
        cdef long index = -1
        if bw is not None:
            if key == counted.last():
                self._fail(bw, "two callbacks over the same gradients were "
                           "called for one function of one backward (e.g. "
                           "chained twice); give each backward one callback "
                           "per set of gradients")
            index = counted.table().find(key)
            if index < 0 and self.caller_ends:
                # Until its caller ends it, every call is this backward's.
                self._unexpected(bw, f, key)
                return
            if index < 0 and bw.graph.feeds_a_called_function(f):
                self._fail(bw, f"backward called {f.name}, which the graph "
                           f"analysis did not expect (was the graph changed "
                           f"during backward?); gradients were not "
                           f"all-reduced")
            if index < 0 or counted.called(index):
                # `f` starts another backward: the one in flight stopped
                # part-way (this raises).
                close_stopped_backwards("another backward")
                bw = None
        if bw is None:
            close_stopped_backwards("another backward", key)
            self._refuse_overlap(key)
            bw = self._begin(f)
            index = counted.table().find(key)
            if index < 0:
                self._fail(bw, f"backward called {f.name} first, which the "
                           f"graph analysis says it skips; gradients were "
                           f"not all-reduced")
        cdef vector[size_t] ready
        counts.count(index, key, &ready)
        for i in ready:
            self._ready(bw, i)
        if counted.calls_left() == 0 and not self.caller_ends:
            self._finish(bw)

    cdef int _unexpected(self, _Backward bw, f, uintptr_t key) except -1:
        """`f`, which the graph analysis did not expect, ran in a backward
        whose caller ends it: its writes are in the gradients' reductions
        (a gradient the analysis did not reach is reduced at the end, one
        still pending when its last expected writer has run), unless a
        gradient it writes was already handed to the engine: that raises."""
        for i in gradients_written(f.inputs, self.positions):
            if bw.graph.counts[i] and bw.readiness().pending(i) == 0 or \
                    i in bw.early:
                self._fail(bw, f"backward called {f.name}, which the graph "
                           f"analysis did not expect, after a gradient it "
                           f"writes was all-reduced (was the graph changed "
                           f"during backward?); gradients were not "
                           f"all-reduced")
        bw.counts.set_last(key)
        return 0

    cdef int _refuse_overlap(self, uintptr_t key) except -1:
        """Refuses a second callback in this backward (chained with this
        one, so called for the same function, `key`) that reduces some of
        the same gradients: they would be summed twice."""
        thread = threading.get_ident()
        cdef _Backward other
        for state in _in_flight:
            other = (<_CallbackState>state).backward
            if other.thread == thread and other.readiness().last() == key and \
                    not self.positions.keys().isdisjoint(
                        (<_CallbackState>state)._positions):
                (<AllReduceCallback>other.owner)._fail(
                    other, "two callbacks chained in one backward reduce "
                    "some of the same gradients, which would be summed "
                    "twice")
        return 0

    cdef _Backward _begin(self, f):
        cdef _Analysis analysis = self.state.analyses.get(f)
        if analysis is None or not analysis.graph.still_valid():
            analysis = analysis_of(f, self.positions)
            remember(self.state.analyses, f, analysis, _MAX_ANALYSES)
        graph = analysis.graph
        # The plan follows the gradients as they are now: a parameter
        # reshaped, or a gradient that became final in another dtype than
        # planned during the last backward, gets a plan of its own.
        sizes = tuple(x.size for x in self.data)
        if self.state.codes is None or self.state.replan:
            # A gradient never written counts as the dtype nnabla's
            # functions write it in (the context's type_config), so that
            # ranks whose backwards write it and ranks that never did plan
            # it alike.
            unwritten = wire_dtype_of(self.context.ctx)
            self.state.codes = tuple(
                _DTYPE_CODES.get(dtype_of(x, unwritten), -1)
                for x in self.data)
            self.state.replan = False
        cdef _Plan plan
        plan, words = self._agreed_plan(graph.reached, sizes,
                                        self.state.codes, graph.forward)
        cdef int divisor = joined_divisor(self.group, self.division)
        plan.begin(self.scale, divisor, self.check_finite, self.hook)
        cdef _Backward bw = _Backward.__new__(_Backward)
        bw.divisor = divisor
        bw.owner = self
        bw.graph = graph
        bw.plan = plan
        bw.counts = self.state.counts.get()
        bw.counts.start(analysis.table, plan.core(), &plan.sizes,
                        &plan.codes, self.caller_ends)
        bw.thread = threading.get_ident()
        self.state.backward = bw
        self.state.latest = plan
        _in_flight.add(self.state)
        bw.recast = _recasts(plan.unreached, words, self.data)
        bw.early = plan.beyond(graph.reached)
        for i in bw.early:
            self._ready(bw, i, True)  # not written by this rank's backward
        return bw

    cdef tuple _agreed_plan(self, tuple reached, tuple sizes, tuple codes,
                            tuple forward):
        """The plan of this backward, the same on every rank of the group,
        from one small all-reduce (a bitwise OR over the ranks): where
        every rank runs the same plan over what its own backward reaches
        (the one cached, or a new one), that plan; else _union_plan's.
        With it, the words the ranks agreed with (_dtype_bits). Raises
        ValueError on every rank where the ranks' gradients differ in
        number, sizes or priorities, or a rank's lie on another GPU than
        its group's. Collective."""
        priorities = forward if self.priority == "forward" else self.priority
        key = (reached, sizes, codes, priorities)
        cdef _Plan plan = self.state.plans.get(key)
        cdef _Draft draft = None
        cdef GpuArrays device = None
        refused = None
        if plan is None:
            # Gradients of the last layers are final first: planned first.
            device = self._device()
            try:
                draft = draft_plan(self.group, list(reversed(reached)), sizes,
                                   codes, self.pack_size, self.keep_dtype,
                                   self.wire, device, priorities)
            except (TypeError, ValueError) as e:
                refused = e  # raised once the others know
        # What this rank passes, made once per cached plan.
        sent = self.state.agreements.get(key) if plan is not None else None
        if sent is None:
            sent = self._agreement(plan, draft, refused, reached, sizes, codes)
            if plan is not None:
                remember(self.state.agreements, key, sent, _MAX_AGREEMENTS)
        words = sent.copy()
        n = len(sizes)
        if len(reached) < n:
            held, idle = _dtype_bits(words, n)
            for i in np.flatnonzero(held == 0).tolist():
                idle[i] = 1 << _DTYPE_CODES.get(dtype_of(self.data[i]), 0)
        self.group.unite(words, b"agreeing on the plan of gradient buckets")
        if refused is not None:
            raise refused
        if draft is not None:
            CHKSTATUS(draft.placed)  # this rank's own reason
        united, mine = words[:4].tolist(), sent[:4].tolist()
        if united[:2] != mine[:2]:
            raise ValueError(_PLANS_DIFFER + ", or a rank's are on another "
                             "GPU than its group's")
        if united[2:] != mine[2:]:
            return self._union_plan(sizes, _dtype_bits(words, n)[0]), words
        if plan is None:
            plan = commit_plan(self.group, draft, self.data, device,
                               self.state.thread)
            self._keep(key, plan)
        return plan, words

    cdef object _agreement(self, _Plan plan, _Draft draft, refused,
                           tuple reached, tuple sizes, tuple codes):
        """What this rank passes to _agreed_plan's all-reduce, its dtypes
        of the gradients its backward does not reach left out: what every
        rank must pass alike, whatever its backward reaches; the plan it
        would run, `plan` cached or `draft` new (one reused never matches
        one made anew, as the two go on to different calls); per gradient
        its dtype as a bit, where backward reaches it (`held`), then where
        not (`idle`: its dtype now, which nnabla says is float32 for one
        never written)."""
        usable = refused is None and (draft is None or draft.placed.ok())
        rest = _digest((sizes, self.priority, usable)) & _WORD
        proposal = plan.fingerprint ^ _REUSED if plan is not None else \
            draft.proposal() if draft is not None else 0
        n = len(sizes)
        words = np.zeros(4 + 2 * ((n + 7) // 8), np.uint64)
        words[:4] = [rest, rest ^ _WORD, proposal, proposal ^ _WORD]
        held = _dtype_bits(words, n)[0]
        for i in reached:
            held[i] = 1 << codes[i]
        return words

    cdef _Plan _union_plan(self, tuple sizes, held):
        """Where the ranks' backwards reach different gradients (a branch
        or a loss only some ranks take, a layer frozen on some), as PyTorch
        DDP's find_unused_parameters: the plan over the gradients that any
        rank's backward reaches (`held`: per gradient, the dtypes those
        ranks hold it in, as bits), in the dtype they hold it in (the
        highest code, should they differ), which a rank whose backward does
        not reach one hands to the engine as its backward begins, with
        what it holds (zeros after zero_grad). Its buckets go in gradient
        order (backward's where data lists parameters as made), as the
        ranks' graphs, which `priority="forward"` follows, differ.
        Collective where the plan is new."""
        priorities = None if self.priority == "forward" else self.priority
        anywhere = tuple(np.flatnonzero(held).tolist())
        codes = tuple(_highest_code(bits) if bits else self.wire
                      for bits in held.tolist())
        union = (anywhere, sizes, codes, priorities, "union")
        # Every rank has made the same plans and dropped the same (their
        # caches fill alike, measured alike), so all find it or none.
        cdef _Plan plan = self.state.plans.get(union)
        if plan is None:
            plan = make_plan(self.group, self.data, list(reversed(anywhere)),
                             sizes, codes, self.pack_size, self.keep_dtype,
                             self.wire, self._device(), priorities,
                             self.state.thread)
            self._keep(union, plan)
        return plan

    cdef int _keep(self, key, _Plan plan) except -1:
        """Caches `plan` under `key` on the state, whose engine thread it
        runs on."""
        remember(self.state.plans, key, plan, _PLANS_BYTES,
                 operator.attrgetter("bytes"))
        self.state.thread = plan.thread
        return 0

    cdef GpuArrays _device(self):
        """The gradients' device memory (on a CUDA context, where the
        engine works on nnabla's stream); None on the host."""
        return device_arrays(self.data[:1], self.context, "data", None)

    cdef int _ready(self, _Backward bw, Py_ssize_t i,
                    bint as_planned=False) except -1:
        error = bw.plan.mark_ndarray(
            i, self.data[i], self.context, "during backward",
            "when this backward began (reshaped during backward?)",
            as_planned)
        if error is not None:
            self._fail(bw, error)
        # The next backward plans for the dtypes the gradients have then.
        self.state.replan = self.state.replan or bw.plan.converted
        return 0

    cdef int _flush(self, _Backward bw) except -1:
        """Ends a backward that returned: every gradient still pending (its
        remaining functions will not run) is reduced with what it holds, and
        an analysis that expected them is not used again."""
        if bw.readiness().calls_left():
            self.state.analyses.clear()
        cdef vector[size_t] ready
        bw.counts.flush(&ready)
        for i in ready:
            self._ready(bw, i)
        return self._finish(bw)

    cdef int _fail(self, _Backward bw, str message) except -1:
        # The engine still sends every remaining bucket (zeros) and then the
        # failure flag, so the other ranks learn of it instead of waiting.
        self.state.close(message, False)
        raise RuntimeError(message)

    cdef int _finish(self, _Backward bw) except -1:
        self.state.backward = None
        bw.counts.stop()
        _in_flight.discard(self.state)
        cdef Engine* engine = bw.plan.core()
        if self.check_finite:
            # No bucket holds them: checked here, reported with the rest.
            for i in bw.plan.unreached:
                x = self.data[i]
                if not x.zeroing and not np.isfinite(x.data).all():
                    engine.note_nonfinite(i)
        cdef Status status
        with nogil:
            status = engine.finish()
        if status.code() == StatusCode.kInterrupted:
            CHKSTATUS(status)  # nothing can be sent any more
        # Every rank reduces the unreached gradients, whatever happened
        # above, so that the ranks' MPI calls stay matched.
        try:
            for i, dt in bw.recast:
                self.data[i].cast(dt, self.context.ctx)
            all_reduce_list(self.group, [self.data[i]
                                         for i in bw.plan.unreached],
                            self.context, self.division,
                            self.scale * len(self.group.ranks) / bw.divisor
                            if self.division else self.scale, True)
        finally:
            bw.plan.check_finished(status, self.data, self.names,
                                   self.group.ranks)
        return 0


def plan_gradient_buckets(counts, dtypes, order, pack_size, keep_dtype, wire,
                          direct_bytes, floor_bytes=0):
    """The bucket plan the engine would run, for inspection and tests.

    Args:
        counts (list of int): elements per tensor.
        dtypes (list of numpy dtypes): per tensor.
        order (list of int): tensor indices in launch order.
        pack_size (int): elements per bucket.
        keep_dtype (bool): one dtype per bucket, travelling in it.
        wire (numpy dtype): the dtype buckets travel in otherwise.
        direct_bytes (int): tensors of this many bytes or more, in the
            wire dtype, get direct buckets of their own.
        floor_bytes (int): consecutive buckets merged up to this many
            bytes, as the engine does on a transport with that floor
            (CUDA IPC: ``NNCOMM_IPC_BUCKET_BYTES``); 0: none merged.

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
        <DType><int>_DTYPE_CODES[np.dtype(wire)], direct_bytes)
    merge_buckets(floor_bytes, &plan)
    return [(names[<int>b.dtype], b.direct,
             [(s.tensor, s.tensor_offset, s.count)
              for s in b.segments])
            for b in plan]

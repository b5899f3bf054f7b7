# Communicator: nnabla's Communicator API over MPI, on nnabla's own memory.

_FINALIZED = ("the communicator is finalized; no call may follow "
              "finalize()")


cdef class Communicator:
    """Data-parallel communicator over MPI, with nnabla's Communicator API.

    Create it with :func:`nncomm.communicators.MultiProcessDataParallelCommunicator`
    and call :meth:`init` on every rank. Collectives take an
    :obj:`nnabla.NdArray` or a list of them and work on the arrays' own host
    memory; the GIL is released while MPI runs.

    Example:

    .. code-block:: python

        # mpiexec -n 2 python this.py
        import nnabla as nn
        import nncomm.communicators as C
        from nnabla.ext_utils import get_extension_context

        comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
        comm.init()
        x = nn.NdArray.from_numpy_array(np.full(3, comm.rank, np.float32))
        comm.all_reduce(x, division=True)
    """
    cdef object _ctx
    cdef NnablaContext _context  # _ctx as arrays are read in it
    cdef bint _initialized
    cdef dict _groups
    cdef dict _callback_states  # group name -> its _CallbackStates
    cdef list _ctx_params
    cdef tuple _workers
    cdef bint _finalized

    def __cinit__(self, ctx):
        backends = [str(b) for b in getattr(ctx, "backend", None) or []]
        if not backends or any(not b.startswith(("cpu", "cuda", "cudnn"))
                               for b in backends):
            raise ValueError(
                "nncomm's communicator needs a CPU or CUDA context, as from "
                f"get_extension_context('cpu'); got backend {backends}")
        self._context = nnabla_context(ctx)
        if self._context.cuda:
            # Collectives would fail on their first array otherwise.
            missing = cuda_context.missing_pieces()
            if missing:
                raise ValueError(cuda_context.refusal(backends, missing))
        self._ctx = ctx
        self._initialized = False
        self._groups = {}
        self._callback_states = {}
        self._ctx_params = []

    # -- set-up -------------------------------------------------------------

    def init(self):
        """Initializes the communicator: duplicates ``MPI_COMM_WORLD`` and
        finds this process's ranks. Call it once, on every rank. With
        ``NNCOMM_TIMELINE=path`` set, starts the timeline there (see
        :meth:`start_timeline`). In a job of several ranks, an exception
        that then ends the script aborts the job at exit (through
        ``sys.excepthook``, after the traceback), as ``python -m mpi4py``
        does, rather than leave the other ranks waiting for this one until
        ``NNCOMM_TIMEOUT``; a script that ends otherwise (``sys.exit()``,
        ``MPI.Finalize()`` included) makes the ranks that wait for this
        one in a call it never made raise
        :class:`~nncomm.CommunicatorError` within seconds.

        Raises:
            nncomm.errors.DataParallelError: In a job of several ranks,
                whatever keeps it from running data-parallel (settings
                that differ between ranks, say, or an MPI that cannot
                join the launcher's job), on every rank, the cause named.
                It passes through ``except Exception`` wrappers that would
                otherwise leave each rank training alone.
        """
        if self._finalized:
            raise RuntimeError(_FINALIZED)
        if self._initialized:
            raise RuntimeError("the communicator is already initialized")
        check_joined(MPI.COMM_WORLD.Get_size())
        with SeveralRanks("initializing nncomm's communicator"):
            self._join_world()
        self._initialized = True
        if MPI.COMM_WORLD.Get_size() > 1:
            abort_job_on_uncaught_exceptions()
        take_sync_batch_normalization()

    cdef _join_world(self):
        CHKSTATUS(validate())
        flight_recorder_start(MPI.COMM_WORLD.Get_rank(),
                              MPI.COMM_WORLD.Get_size())
        name_nccl_candidates()
        world = _Group(list(range(MPI.COMM_WORLD.Get_size())))
        cdef MPI_Comm comm = (<MPI.Comm>MPI.COMM_WORLD).ob_mpi
        cdef Status status
        with nogil:
            status = Group.Create(comm, &world.core)
        CHKSTATUS(status)
        with nogil:
            status = listen_for_ended_ranks()
        CHKSTATUS(status)
        _agree_on_settings(world)
        flight_recorder_name_job(world)
        self._workers = _gather_workers(world)
        if not timeline_path().empty():
            timeline_start(world, timeline_path())
        self._groups["world"] = world

    def finalize(self):
        """Ends the communicator's use, as CNTK's ``finalize()``: its MPI
        communicators are freed, and every later call but
        :meth:`is_capable` raises RuntimeError. MPI itself stays
        initialized (mpi4py finalizes it at exit, and other code may still
        use it). Call it on every rank; callbacks and reducers made before
        keep their group until they are dropped. A second call does
        nothing. A timeline being recorded is stopped first
        (:meth:`stop_timeline`).
        """
        if self._finalized:
            return
        timeline_stop(self._world())
        self._groups = {}
        self._callback_states = {}
        self._ctx_params = []
        self._finalized = True

    cdef _Group _world(self):
        if self._finalized:
            raise RuntimeError(_FINALIZED)
        if not self._initialized:
            raise RuntimeError(
                "the communicator is not initialized; call init() first")
        return self._groups["world"]

    @property
    def name(self):
        """Name of the communicator."""
        return "MultiProcessDataParallelCommunicatorMpi"

    @property
    def size(self):
        """Number of processes in the world group."""
        return deref(self._world().core).size()

    @property
    def rank(self):
        """Rank of this process in the world group."""
        return deref(self._world().core).rank()

    @property
    def local_rank(self):
        """Rank of this process among the processes on its host."""
        return deref(self._world().core).local_rank()

    @property
    def transport(self):
        """str: How the world group communicates device memory: ``'nccl'``,
        ``'ipc'`` (CUDA IPC: ranks of one GPU reading each other's memory)
        or ``'mpi'`` (through pinned host memory), as
        ``NNCOMM_GPU_TRANSPORT`` and the ranks' GPUs decided at its first
        collective on GPU arrays; ``'mpi'`` before that, as for host
        memory."""
        return deref(self._world().core).device_transport().decode()

    def is_main(self):
        """
        Returns:
            bool: Whether this process is world rank 0, the one that
            usually logs and saves.
        """
        return self.rank == 0

    def workers(self):
        """
        Returns:
            list of :obj:`WorkerDescriptor`: Every process of the job, by
            world rank (host names gathered once, by :meth:`init`).
        """
        self._world()
        return list(self._workers)

    def current_worker(self):
        """
        Returns:
            :obj:`WorkerDescriptor`: This process.
        """
        rank = self.rank  # refuses a communicator not initialized
        return self._workers[rank]

    def is_capable(self, name):
        """Whether this process supports a feature, as BytePS's
        ``is_capable``; answered locally, before :meth:`init` too.

        Args:
            name (str): ``"gpu"`` (collectives on CUDA memory: a build with
                CUDA and a visible device), ``"nccl"`` (those through NCCL:
                ``"gpu"``, and NCCL loads as ``NNCOMM_NCCL_LIBRARY`` says),
                ``"callback"`` (:meth:`all_reduce_callback`) or
                ``"gradient_reducer"`` (both need MPI initialized with
                ``MPI_THREAD_MULTIPLE``).

        Returns:
            bool: Whether the feature works here.

        Example:

        .. code-block:: python

            if comm.is_capable("callback"):
                cb = comm.all_reduce_callback(grads, 2 << 20)
        """
        test = _CAPABILITIES.get(name)
        if test is None:
            raise ValueError(f"unknown capability {name!r}; known: "
                             f"{sorted(_CAPABILITIES)}")
        return test()

    def barrier(self):
        """Blocks until every process of the world group has called it."""
        cdef _Group world = self._world()
        close_stopped_backwards("a barrier")
        note_call_site()
        world.barrier()
        end_call_site()

    def abort(self):
        """Terminates every process of the MPI job, after writing this
        rank's flight record (see :meth:`dump_flight_record`)."""
        cdef _Group world = self._world()
        with nogil:
            FlightRecorder.dump_after(b"comm.abort()")
        deref(world.core).abort(-1)

    def dump_flight_record(self, path=None):
        """Writes this rank's flight record, as PyTorch's flight recorder
        dumps NCCL's: the last ``NNCOMM_FLIGHT_RECORDER`` (default 2000)
        operations of each of this process's communicators (group and
        callback engines), each with its position (the same on every rank
        making the same calls), kind, the nncomm call it belongs to, sizes,
        dtype, root, fingerprint, state (``enqueued``, ``started``,
        ``completed``, ``failed``), times and the Python line that made it.
        nncomm writes it by itself when a wait times out or first stalls,
        when the ranks make different calls, before an abort, on a fatal
        signal and on ``SIGUSR1``; ``python -m nncomm.flight DIR`` reads
        every rank's file and names the rank that diverged first (see
        :mod:`nncomm.flight`). Not collective: any rank may call it, at any
        time.

        Args:
            path (str): The directory to write into, created if missing;
                by default ``NNCOMM_FLIGHT_RECORDER_DIR``, else
                ``nncomm-flight-<uid>`` in the temporary directory.

        Returns:
            str: The file written, ``nncomm-flight-<world rank>.json`` in
            that directory; None where ``NNCOMM_FLIGHT_RECORDER=0`` (nothing
            is recorded).

        Example:

        .. code-block:: python

            try:
                train()
            except Exception:
                # then, anywhere: python -m nncomm.flight flight
                comm.dump_flight_record("flight")
                raise
        """
        self._world()
        return flight_record_dump(path)

    # -- uneven inputs --------------------------------------------------------

    def join(self, joinables=None, divide_by_initial_world_size=True,
             throw_on_early_termination=False):
        """A context manager for ranks whose data ends at different steps, as
        PyTorch's ``Join``: a rank whose loop ends inside it keeps taking
        part, with zeros, in every collective the other ranks still make
        (callback buckets, solver reductions, metrics), until every rank's
        has ended; then every rank takes the parameters and solver state of
        the rank that trained last. See :class:`nncomm.Join`.

        Args:
            joinables (list): What to make the same on every rank at the
                end: solvers (nnabla's, :class:`nncomm.DistributedSolver`,
                :class:`nncomm.BlockMomentumSolver`: parameters and state)
                and dicts of parameters; ``None``: nnabla's global
                parameters.
            divide_by_initial_world_size (bool): Averages divide by the
                world size even once ranks have left (their zeros count), as
                PyTorch's default; ``False``: by the ranks still training,
                counted at each callback backward (one small all-reduce).
            throw_on_early_termination (bool): Every rank raises
                :class:`nncomm.InputsExhaustedError` at the first callback
                backward after a rank's data ended (one small all-reduce per
                backward), instead of going on without it.

        Returns:
            :class:`nncomm.Join`: enter it with ``with``.

        Example:

        .. code-block:: python

            with comm.join([solver]):
                for x, t in my_batches:   # fewer on some ranks
                    loss.forward()
                    solver.zero_grad()
                    loss.backward(communicator_callbacks=cb)
                    solver.update()
        """
        from nncomm.join import Join
        return Join(self, joinables, divide_by_initial_world_size,
                    throw_on_early_termination)

    def _open_join(self, join):
        """Opens `join`'s scope over the world group. Collective."""
        cdef _Group world = self._world()
        close_stopped_backwards("comm.join()")
        open_join(world, join)

    def _leave_join(self, uint64_t steps):
        """This rank's data ended after `steps` updates: takes part in the
        other ranks' collectives until every rank's has; (world rank that
        trained last, whether the scope ended at a count that found a rank
        gone)."""
        close_stopped_backwards("the end of comm.join()")
        return leave_join(steps)

    def _close_join(self, why=None):
        """Ends the join scope here; with `why`, the other ranks' waits
        fail, naming it."""
        close_join(why)

    # -- timeline -----------------------------------------------------------

    def start_timeline(self, path):
        """Starts recording the job's timeline, as Horovod's
        ``HOROVOD_TIMELINE`` does: a trace of what each rank's communication
        does, for Perfetto (https://ui.perfetto.dev) or chrome://tracing.

        One process per rank, one row per track: ``backward`` (each
        iteration of :meth:`all_reduce_callback` or a
        :meth:`gradient_reducer`), ``gradients`` (each made ready),
        ``engine`` (each bucket packed, reduced and unpacked, and the
        engine's rounds and waits), ``collectives`` (the list collectives,
        with their bytes, dtype and group) and ``stalls`` (stall reports).
        Each rank records into ``path.rank<r>`` on its own, a background
        thread writing; :meth:`stop_timeline` merges the parts into
        `path`. ``NNCOMM_TIMELINE=path`` starts it at :meth:`init`.

        Collective over the world group: every rank calls it with the same
        path; the ranks' clocks start together, after a barrier.

        Args:
            path (str): The file to write (its directory must exist); the
                ranks' parts are written beside it.

        Example:

        .. code-block:: python

            comm.start_timeline("timeline.json")
            for i in range(10):
                train_step()
            comm.stop_timeline()   # timeline.json, all ranks
        """
        timeline_start(self._world(), path)

    def stop_timeline(self):
        """Stops the timeline and merges the ranks' parts into the file
        given to :meth:`start_timeline` (rank 0 writes it, once every rank
        has written its part). Collective over the world group. Without
        it, the interpreter's exit stops the timeline: rank 0 then waits up
        to 10 s for the other ranks' parts; where one is missing or cut
        short, every part is kept for ``python -m nncomm.timeline merge``
        (see :mod:`nncomm.timeline`).

        Returns:
            str: The timeline file's path, on every rank; None when no
            timeline was being recorded.
        """
        return timeline_stop(self._world())

    # -- parameters ---------------------------------------------------------

    def add_context_and_parameters(self, ctx_param_dict):
        """Registers parameters whose gradients :meth:`allreduce` reduces.

        Args:
            ctx_param_dict (:obj:`tuple` of :obj:`Context`, :obj:`dict`):
                A context and a dictionary from names to
                :obj:`nnabla.Variable`.
        """
        if type(ctx_param_dict) != tuple or len(ctx_param_dict) != 2:
            raise TypeError(
                "ctx_param_dict must be a tuple of two elements: "
                "(Context, dict of name to Variable)")
        ctx, params = ctx_param_dict
        if not isinstance(params, dict):
            raise TypeError(
                f"the parameters must be a dict of name to Variable, "
                f"not {type(params).__name__}")
        known = {v for _, registered in self._ctx_params
                 for v in registered.values()}
        for key, v in params.items():
            if not isinstance(v, Variable):
                raise TypeError(
                    f"parameter {key!r} is a {type(v).__name__}, "
                    f"not an nnabla Variable")
            if v in known:
                raise ValueError(f"parameter {key!r} is already added")
            known.add(v)
        self._ctx_params.append((ctx, dict(params)))

    def clear_context_parameters(self):
        """Forgets every registered context and parameter."""
        self._ctx_params = []

    def allreduce(self, bint division=False, bint inplace=False):
        """Deprecated; see :meth:`all_reduce`. All-reduces the gradients of
        the parameters added by :meth:`add_context_and_parameters`.

        Args:
            division (bool): Average instead of sum.
            inplace (bool): Reduce array by array instead of packing.
        """
        grads = [v.grad for _, params in self._ctx_params
                 for v in params.values()]
        self.all_reduce(grads, division=division, inplace=inplace)

    # -- groups -------------------------------------------------------------

    def new_group(self, name_ranks):
        """Creates a named group of world ranks. Every rank calls it.

        Args:
            name_ranks (tuple): ``(name, ranks)``, a :obj:`str` and a list of
                distinct world ranks. Group rank ``i`` is ``ranks[i]``.

        Returns:
            str: The group's name.

        Raises:
            TypeError: A malformed argument.
            ValueError: An existing name, no ranks, a rank out of range or
                twice; ranks that pass different groups raise on every
                rank, and so do the others where one rank's arguments are
                refused.

        Example:

        .. code-block:: python

            group = comm.new_group(("pair", [0, 1]))
            comm.all_reduce(x, group=group)
        """
        cdef _Group world = self._world()
        try:
            name, ranks = _checked_group(name_ranks, len(world.ranks),
                                         self._groups)
        except (TypeError, ValueError):
            # The other ranks may be agreeing on a group of theirs already
            # (create_subgroup): this one takes part, with a value that is
            # no group's, so that they raise too instead of waiting.
            world.same_everywhere(_REFUSED_GROUP, b"new_group")
            raise
        group = _Group(ranks)
        cdef vector[int] cranks = ranks
        cdef string cname = name.encode()
        cdef Status status
        with nogil:
            status = deref(world.core).create_subgroup(cranks, cname,
                                                       &group.core)
        CHKSTATUS(status)
        self._groups[name] = group
        return name

    def list_groups(self):
        """
        Returns:
            dict: Group names to their lists of world ranks, ``"world"``
            included.
        """
        self._world()
        return {name: list(g.ranks) for name, g in self._groups.items()}

    def find_group(self, group):
        """
        Args:
            group (str): Name of a group.

        Returns:
            list: The group's world ranks, or ``[]`` if there is no such group.
        """
        self._world()
        g = self._groups.get(group)
        return [] if g is None else list(g.ranks)

    cdef _Group _member(self, group):
        self._world()
        close_stopped_backwards("another nncomm call")
        note_call_site()
        cdef _Group g = self._groups.get(group)
        if g is None:
            raise ValueError(
                f"unknown group {group!r}; groups: {sorted(self._groups)}")
        if not g.core:
            raise ValueError(
                f"self (rank={self.rank}) is not included in group "
                f"{group!r} (ranks {g.ranks})")
        return g

    # -- collectives --------------------------------------------------------

    def all_reduce(self, data, bint division=False, bint inplace=False,
                   group="world", *, bint async_op=False):
        """Sums arrays over the ranks of a group, in place.

        Arrays that are still zeroing (``NdArray.zeroing``) on every rank are
        skipped and stay zeroing; if any rank wrote one, it is reduced
        everywhere.

        Args:
            data (:obj:`NdArray` or list of :obj:`NdArray`): Arrays to reduce.
            division (bool): Average over the group instead of summing.
            inplace (bool): Reduce array by array, without the packing
                buffer. When false, small arrays are packed into one message
                per dtype.
            group (str): Name of a group.
            async_op (bool): nncomm's own, from PyTorch and Horovod: start
                the reduction and return at once (arrays still zeroing are
                written as zeros first).

        Returns:
            :obj:`Pending` with ``async_op=True`` (wait for it before
            touching the arrays); else None.

        Example:

        .. code-block:: python

            comm.all_reduce([v.grad for v in params.values()], division=True)
        """
        cdef _Group g = self._member(group)
        cdef list data_list = as_ndarray_list(data, "data")
        check_distinct(data_list, "data")
        if not async_op:
            all_reduce_list(g, data_list, self._context, division, 1.0,
                            not inplace)
            return None
        cdef Placed placed = reduced_arrays(data_list, self._context,
                                            division, False)
        return start_async(g, CallKind.kAllReduce, placed, data_list, 0,
                           division, not inplace, None)

    def grouped_all_reduce(self, data_lists, bint division=False,
                           group="world"):
        """Horovod's grouped allreduce: :meth:`all_reduce` of each list of
        arrays as one fused operation, the lists one after another.

        Every array is checked before anything is communicated; an array in
        two lists would be summed twice, and is refused.

        Args:
            data_lists (list of lists of :obj:`NdArray`): The groups of
                arrays; each is reduced as ``all_reduce(list)`` reduces it.
            division (bool): Average over the group instead of summing.
            group (str): Name of a group.

        Example:

        .. code-block:: python

            comm.grouped_all_reduce([[w1.grad, b1.grad], [w2.grad]])
        """
        cdef _Group g = self._member(group)
        if not isinstance(data_lists, (list, tuple)):
            raise TypeError(f"data_lists must be a list of lists of "
                            f"arrays, not {type(data_lists).__name__}")
        lists = [as_ndarray_list(d, f"data_lists[{i}]")
                 for i, d in enumerate(data_lists)]
        for i, arrays in enumerate(lists):
            check_distinct(arrays, f"data_lists[{i}]")
        check_distinct([x for arrays in lists for x in arrays],
                       "data_lists (all lists together)")
        for arrays in lists:
            all_reduce_list(g, arrays, self._context, division, 1.0,
                            True)

    def reduce(self, data, dst, bint division=False, bint inplace=False,
               group="world", *, bint async_op=False):
        """Sums arrays of a group's ranks into rank ``dst``; the others keep
        their arrays unchanged.

        Args:
            data (:obj:`NdArray` or list of :obj:`NdArray`): Arrays to reduce.
            dst (int): Destination rank, within the group.
            division (bool): Average over the group instead of summing.
            inplace (bool): Reduce array by array, without packing.
            group (str): Name of a group.
            async_op (bool): As :meth:`all_reduce`'s.

        Returns:
            :obj:`Pending` with ``async_op=True``; else None.
        """
        cdef _Group g = self._member(group)
        cdef int root = _root(dst, "dst", g, group)
        cdef list data_list = as_ndarray_list(data, "data")
        check_distinct(data_list, "data")
        cdef Placed arrays = reduced_arrays(data_list, self._context,
                                            division, False)
        if async_op:
            return start_async(g, CallKind.kReduce, arrays, data_list,
                               root, division, not inplace, None)
        cdef Status status
        with nogil:
            status = deref(g.core).reduce(arrays.where, arrays.refs, root,
                                          division, not inplace)
        g.check(status)

    def bcast(self, data, src, bint inplace=False, group="world", *,
              bint async_op=False):
        """Copies rank ``src``'s arrays into the other ranks' arrays.

        Args:
            data (:obj:`NdArray` or list of :obj:`NdArray`): Arrays to send
                (on ``src``) or overwrite (elsewhere).
            src (int): Source rank, within the group.
            inplace (bool): Broadcast array by array, without packing.
            group (str): Name of a group.
            async_op (bool): As :meth:`all_reduce`'s.

        Returns:
            :obj:`Pending` with ``async_op=True``; else None.
        """
        cdef _Group g = self._member(group)
        cdef int root = _root(src, "src", g, group)
        cdef list data_list = as_ndarray_list(data, "data")
        cdef Placed arrays = place(data_list, self._context, "data",
                                   None)
        if async_op:
            return start_async(g, CallKind.kBcast, arrays, data_list,
                               root, False, not inplace, None)
        cdef Status status
        with nogil:
            status = deref(g.core).bcast(arrays.where, arrays.refs, root,
                                         not inplace)
        g.check(status)

    def all_gather(self, ndarray, ndarray_list=None, group="world", *,
                   bint async_op=False):
        """Gathers every rank's ``ndarray`` into every rank: nnabla's
        all_gather, and Horovod's allgather, where the ranks' arrays may
        differ in size.

        Where the sizes differ between ranks, the ranks first exchange them
        (and check them: a list whose sizes are not the ranks', or rows
        whose shapes or dtypes differ, raise ValueError on every rank).

        Args:
            ndarray (:obj:`NdArray`, or a GPU array): This rank's
                contribution.
            ndarray_list (list of :obj:`NdArray`, :obj:`NdArray`, or None):
                One array per group rank, array r of group rank r's
                ``ndarray`` size (which may differ between ranks); or, where
                every rank's ``ndarray`` has one size, one array of
                ``group size × ndarray.size`` elements, filled block by block
                in rank order; or None: a new array of every rank's
                ``ndarray`` along the first dimension, in rank order, the
                ranks' numbers of rows free but their other dimensions
                equal (Horovod's allgather). The arrays take ``ndarray``'s
                dtype.
            group (str): Name of a group.
            async_op (bool): As :meth:`all_reduce`'s; where every rank's
                ``ndarray`` has one size and ``ndarray_list`` is given.

        Returns:
            With ``ndarray_list=None``, the new array: an :obj:`NdArray` in
            the communicator's context, or, for a GPU array, a CuPy array on
            its device. With ``async_op=True``, a :obj:`Pending`. Otherwise
            None.

        Example:

        .. code-block:: python

            # rank r has r + 1 rows of 3
            x = nn.NdArray.from_numpy_array(np.full((comm.rank + 1, 3), 1.0))
            everything = comm.all_gather(x)   # (1 + 2 + ... + size) x 3
        """
        cdef _Group g = self._member(group)
        if not _gathers_blocks_of_one_size(ndarray, ndarray_list,
                                           len(g.ranks)):
            if async_op:
                raise ValueError(
                    "all_gather(async_op=True) gathers blocks of one size "
                    "into a given ndarray_list (one array per group rank of "
                    "ndarray's size, or one of them all)")
            return self._all_gatherv(g, ndarray, ndarray_list, group)
        _check_one(ndarray)
        cdef Placed send = place([ndarray], self._context, "ndarray",
                                 None)
        recv_list = as_ndarray_list(ndarray_list, "ndarray_list")
        _check_blocks(recv_list, "ndarray_list", send.refs[0].count,
                      len(g.ranks))
        cdef Placed recv = place(recv_list, self._context,
                                 "ndarray_list", send.dtypes[0])
        check_same_place(send, recv, "ndarray and ndarray_list")
        if async_op:
            return start_async(g, CallKind.kAllGather, recv,
                               (ndarray, recv_list), 0, False, True, send)
        cdef Status status
        with nogil:
            status = deref(g.core).all_gather(send.where, send.refs[0],
                                              recv.refs)
        g.check(status)

    cdef _all_gatherv(self, _Group g, ndarray, recv, group):
        """all_gather of arrays whose sizes differ between ranks: into the
        arrays of `recv` (a list), or into a new array (`recv` None)."""
        cdef _Sent send = None
        cdef bint rows = recv is None
        recv_list = None if rows else list(recv)
        mine = np.zeros((1, _HEAD), np.int64)
        error = None
        try:
            send = _sent(ndarray, "ndarray", self._context.cuda)
            if rows:
                _check_rows(send)
                _check_makeable(send, "ndarray_list")
                mine[0, _COUNT] = send.shape[0]
            else:
                _check_receivers(send, recv_list, "ndarray_list")
                mine[0, _COUNT] = elements(ndarray)
                mine[0, _LIST] = _digest([elements(x) for x in recv_list])
            mine[0, _LAYOUT] = send.layout(rows)
        except (TypeError, ValueError) as e:
            mine[0, _STATE] = _BAD
            error = e
        heads = _exchange_heads(g, mine, False)
        _check_heads(heads, error, "all_gather", group, send, rows)
        counts = heads[:, _COUNT].tolist()
        if rows:
            recv = _new_array(send, (sum(counts),) + send.shape[1:])
            _gather_varying(g, send, [c * send.row() for c in counts],
                            [recv], self._context)
            return recv
        _check_list_sizes(heads, counts, recv_list, group)
        _gather_varying(g, send, counts, recv_list, self._context)

    def alltoall(self, send, recv=None, splits=None, group="world"):
        """Horovod's alltoall: sends each rank of the group some rows of
        ``send`` and receives, in rank order, the rows every rank sends
        this one.

        The first dimension of ``send`` is split into rows, ``splits[r]``
        of them (in order) for group rank r; the other dimensions and the
        dtype must be the same on every rank. The ranks first exchange how
        many rows each sends each (one small alltoall), so a rank learns
        what it receives. Bad arguments raise on every rank of the group,
        where only one rank can see them too.

        Args:
            send (:obj:`NdArray`, or a GPU array): The rows to send.
            recv (:obj:`NdArray`, a GPU array, or None): Receives the rows,
                in ``send``'s dtype; its size must be the rows received
                times the size of a row (its shape is kept). None: a new
                array of shape ``(rows received,) + send.shape[1:]``.
            splits (sequence of int, or None): Rows for each group rank, in
                rank order, none negative, summing to ``send.shape[0]``.
                None: as many for each (``send.shape[0]`` must divide by
                the group's size).
            group (str): Name of a group.

        Returns:
            tuple: ``(recv, received_splits)``: the receiving array (the
            one given, or a new one: an :obj:`NdArray` in the
            communicator's context, or, for a GPU array, a CuPy array on
            its device), and the list of how many rows came from each
            group rank.

        Example:

        .. code-block:: python

            # each rank sends rank r (r + 1) rows of 4
            splits = [r + 1 for r in range(comm.size)]
            x = nn.NdArray.from_numpy_array(np.ones((sum(splits), 4)))
            y, received = comm.alltoall(x, splits=splits)
            # y: (size * (rank + 1), 4); received: [rank + 1] * size
        """
        cdef _Group g = self._member(group)
        cdef Py_ssize_t ranks = len(g.ranks)
        cdef _Sent sent = None
        mine = np.zeros((ranks, _HEAD), np.int64)
        error = rows = None
        try:
            sent = _sent(send, "send", self._context.cuda)
            rows = _split(sent, splits, ranks)
            if recv is None:
                _check_makeable(sent, "recv")
            else:
                _check_receivers(sent, [recv], "recv")
                _check_apart(sent, recv)
                mine[:, _STATE] = _RECV
            mine[:, _COUNT] = rows
            mine[:, _LAYOUT] = sent.layout(True)
        except (TypeError, ValueError) as e:
            mine[:, _STATE] = _BAD
            error = e
        heads = _exchange_heads(g, mine, True)
        _check_heads(heads, error, "alltoall", group, sent, True)
        received = heads[:, _COUNT].tolist()
        row = sent.row()
        if (heads[:, _STATE] & _RECV).any():
            # Only this rank knows the size its recv must have.
            wrong = None
            if recv is not None and elements(recv) != sum(received) * row:
                wrong = (f"recv has {elements(recv)} elements; the "
                         f"{sum(received)} rows received have "
                         f"{sum(received) * row}")
            _agree_alone(g, wrong, "alltoall", group,
                         "passed a recv of the wrong size")
        if recv is None:
            recv = _new_array(sent, (sum(received),) + sent.shape[1:])
        cdef Placed out = place([send], self._context, "send", None)
        cdef Placed into = place([recv], self._context, "recv",
                                 sent.dtype)
        cdef vector[size_t] send_counts = [r * row for r in rows]
        cdef vector[size_t] recv_counts = [r * row for r in received]
        cdef Status status
        with nogil:
            status = deref(g.core).alltoall(out.where, out.refs[0],
                                            send_counts, into.refs[0],
                                            recv_counts)
        g.check(status)
        return recv, received

    def reduce_scatter(self, ndarray_list, ndarray, bint division=False,
                       group="world", *, bint async_op=False):
        """Sums the r-th arrays of every rank into rank r's ``ndarray``.

        Args:
            ndarray_list (list of :obj:`NdArray`, or :obj:`NdArray`): One
                array per group rank, each of ``ndarray``'s size and of one
                dtype; or one array of ``group size × ndarray.size``
                elements.
            ndarray (:obj:`NdArray`): Receives this rank's reduced block, in
                the dtype of ``ndarray_list``.
            division (bool): Average over the group instead of summing.
            group (str): Name of a group.
            async_op (bool): As :meth:`all_reduce`'s.

        Returns:
            :obj:`Pending` with ``async_op=True``; else None.
        """
        cdef _Group g = self._member(group)
        _check_one(ndarray)
        send_list = as_ndarray_list(ndarray_list, "ndarray_list")
        _check_blocks(send_list, "ndarray_list", elements(ndarray),
                      len(g.ranks))
        cdef Placed send = place(send_list, self._context,
                                 "ndarray_list", None)
        for i, dt in enumerate(send.dtypes):
            if dt != send.dtypes[0]:
                raise TypeError(
                    f"ndarray_list mixes dtypes: [0] is "
                    f"{send.dtypes[0]}, [{i}] is {dt}")
        if division:
            check_floating(send.dtypes, "ndarray_list")
        cdef Placed recv = place([ndarray], self._context, "ndarray",
                                 send.dtypes[0])
        check_same_place(send, recv, "ndarray and ndarray_list")
        if async_op:
            return start_async(g, CallKind.kReduceScatter, send,
                               (send_list, ndarray), 0, division, True,
                               recv)
        cdef Status status
        with nogil:
            status = deref(g.core).reduce_scatter(recv.where, send.refs,
                                                  recv.refs[0], division)
        g.check(status)

    def all_reduce_callback(self, data, pack_size, bint division=False,
                            group="world", scale_grad=1,
                            bint keep_dtype=False, *, wire_dtype=None,
                            priority=None, check_finite=None, hook=None):
        """A backward callback that all-reduces gradients while backward
        runs.

        Pass it as nnabla's scripts do, ``loss.backward(
        communicator_callbacks=cb)`` (alone or in a list), or as a hook,
        ``loss.backward(function_post_hook=cb)``. Each gradient is
        handed to a background engine once every function of the graph that
        writes it has run its backward, so shared parameters are reduced
        once, after their last use. The engine reduces buckets of about
        `pack_size` elements in an order fixed on every rank, while backward
        goes on; when backward returns, every array holds the sum over the
        group (the mean with `division`) of the gradients times
        `scale_grad`, as ``all_reduce(data, division)`` after backward would
        give. Gradients the graph does not reach are reduced at the end with
        their current values (an array still zeroing on every rank stays
        zeroing). Create it once and reuse it, or anew every iteration:
        graph analyses, bucket plans and buffers are kept per set of
        gradients.

        Args:
            data (list of :obj:`NdArray`): The gradients, usually
                ``[v.grad for v in nn.get_parameters().values()]``.
            pack_size (int): Elements per bucket (nnabla-examples use
                ``2 << 20``).
            division (bool): Average over the group instead of summing.
            group (str): Name of a group.
            scale_grad (float): Multiplies the gradients while they are
                packed (e.g. to undo a loss scale).
            keep_dtype (bool): Reduce each gradient in its own dtype. When
                false, buckets travel in the context's dtype (float32 for
                ``cpu:float``) and float16 gradients are converted.
            wire_dtype (str): nncomm's own: the dtype buckets travel in
                without `keep_dtype` (``'float32'``, ``'float16'``,
                ``'bfloat16'``, ``'float64'``) instead of the context's;
                each gradient gets the result in its own dtype.
            priority: nncomm's own, after BytePS: ``None`` launches
                buckets in the planned order; ``"forward"`` or a number
                per gradient of `data` (higher first; a bucket has its
                highest) sorts the planned buckets once, highest first,
                ties in the planned order, and launches them in that
                order. ``"forward"`` ranks first what the
                next forward uses first: backward's order reversed.
            check_finite (bool): nncomm's own: check every gradient for
                NaN and infinity before it leaves this rank (as it is
                packed, on the host or by the GPU packing kernel).
                Where one holds some, the reduction still completes and
                every rank raises :class:`nncomm.NonFiniteGradientError`
                at the end of backward, naming the ranks and parameters,
                before any update. ``None`` (default): ``NNCOMM_CHECK_FINITE=1``
                turns it on; off costs nothing.
            hook (callable): nncomm's own, after PyTorch DDP's
                ``register_comm_hook``: called on the engine's thread with
                each bucket, a :class:`nncomm.GradBucket`, it reduces the
                bucket's flat buffer to the sum over the group in place of
                nncomm's all-reduce (in place, or returning an array of its
                shape and dtype), communicating through the bucket's
                collectives; nncomm then divides and writes it back.
                Built in: :mod:`nncomm.hooks` (``fp16_compress``,
                ``bf16_compress``, ``PowerSGD``). A hook that raises, returns
                another shape or dtype, or makes other collectives than
                the other ranks' ends the reduction on every rank with
                :class:`nncomm.BucketHookError`. On a CUDA device the
                buffer is device memory (:class:`nncomm.DeviceBuffer`),
                reduced in place on the bucket's stream.

        Returns:
            callable: An nnabla ``CommunicatorBackwardCallback``, also
            callable as a hook (nnabla 1.39); with another nnabla version
            an :obj:`AllReduceCallback`, a hook only.

        Example:

        .. code-block:: python

            grads = [v.grad for v in nn.get_parameters().values()]
            cb = comm.all_reduce_callback(grads, 2 << 20, division=True)
            loss.backward(clear_buffer=True, communicator_callbacks=cb)
            solver.update()
        """
        cdef _Group g = self._member(group)
        cdef list grads = as_ndarray_list(data, "data")
        if grads and is_gpu_array(grads[0]):
            raise TypeError(
                "all_reduce_callback hooks nnabla's backward, which computes "
                "NdArrays; for GPU arrays of another framework use "
                "gradient_reducer()")
        size = _gradient_checks(grads, pack_size, "all_reduce_callback")
        hook_solvers()
        wire = _wire_code(self._ctx, wire_dtype)
        priorities = priorities_of(priority, len(grads))
        # Kept per group: every rank of a group makes the same callbacks,
        # so each drops the same engines (ranks of other groups make others).
        states = self._callback_states.setdefault(group, {})
        key = (size, keep_dtype, wire, priorities, tuple(grads))
        cdef _CallbackState state = states.get(key)
        if state is None:
            state = _CallbackState(g, grads, self._context)
            remember(states, key, state, _STATES_BYTES,
                     operator.attrgetter("bytes"))
        cdef AllReduceCallback cb = AllReduceCallback.__new__(AllReduceCallback)
        cb.group = g
        cb.state = state
        cb.data = grads
        cb.positions = state.positions(grads)
        cb.context = self._context
        cb.division = division
        cb.keep_dtype = keep_dtype
        cb.scale = float(scale_grad)
        cb.pack_size = size
        cb.wire = wire
        cb.priority = priorities
        cb.check_finite = check_finite_of(check_finite)
        cb.hook = hook_caller(
            hook, g, group, grads, None,
            device_arrays(grads[:1], self._context, "data", None) is not None)
        return as_nnabla_callback(cb)

    def gradient_reducer(self, data, pack_size, bint division=False,
                         group="world", scale_grad=1, bint keep_dtype=False,
                         order=None, wire_dtype=None, priority=None,
                         check_finite=None, hook=None):
        """The engine of :meth:`all_reduce_callback`, driven by hand: for
        training loops that are not nnabla's backward (CuPy arrays, another
        framework) but know when each gradient is final.

        Collective over the group: every rank makes its reducer with the
        same gradients (number, sizes, dtypes) and `order`. Make it once
        and reuse it every iteration: each reducer has an engine thread
        and a communicator of its own, made with it.

        Args:
            data (list of :obj:`NdArray`, or of GPU arrays): The gradients:
                NdArrays of this communicator's context, or arrays with
                ``__cuda_array_interface__`` (CuPy), computed on the stream
                they name (CuPy's current stream when made).
            pack_size (int): Elements per bucket.
            division (bool): Average over the group instead of summing.
            group (str): Name of a group.
            scale_grad (float): Multiplies the gradients while they are
                packed.
            keep_dtype (bool): Reduce each gradient in its own dtype; when
                false, buckets travel in the context's dtype.
            order (list of int): The order the gradients usually become
                final in (buckets are planned in it); by default the
                reverse of `data`'s, as backward computes them.
            wire_dtype (str): As in :meth:`all_reduce_callback`.
            priority: As in :meth:`all_reduce_callback`; ``"forward"``
                ranks the gradients in the reverse of `order`.
            check_finite (bool): As in :meth:`all_reduce_callback`; the
                error is raised by ``finish()``.
            hook (callable): As in :meth:`all_reduce_callback`; its error
                is raised by ``finish()``.

        Returns:
            :obj:`GradientReducer`: ``begin()``, ``ready(i)`` per gradient,
            ``finish()``, each iteration.

        Example:

        .. code-block:: python

            reducer = comm.gradient_reducer(grads, 2 << 20, division=True)
            reducer.begin()
            for i in reversed(range(len(grads))):
                compute_gradient(i)
                reducer.ready(i)
            reducer.finish()
        """
        cdef _Group g = self._member(group)
        cdef list grads = as_ndarray_list(data, "data")
        size = _gradient_checks(grads, pack_size, "gradient_reducer")
        return make_reducer(g, grads, self._context, order, size,
                            division,
                            float(scale_grad), keep_dtype,
                            _wire_code(self._ctx, wire_dtype), priority,
                            check_finite_of(check_finite), hook, group)


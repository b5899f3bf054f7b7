"""DistributedSolver: an nnabla solver whose gradients are all-reduced over
a group of ranks during backward, as Horovod's ``DistributedOptimizer``
wraps a framework's optimizer."""
import numpy as np

from nncomm.compression import (Compression, _bits, _is_int, _Quantized,
                                _WireDtype)
from nncomm.hooks import chain_hooks
from nncomm.quantized import QuantizedReducer
from nncomm.sharded_state import ShardedSolver
from nncomm.solver_wrapper import SolverWrapper
from nncomm.sparse import embedding_indices, sparse_all_reduce, touched_rows

_OPS = ("average", "sum")
_SHARDS = (None, "state", "gradients")


class DistributedSolver(SolverWrapper):
    """Wraps an nnabla solver so that every rank steps with the gradients
    of all ranks: Horovod's ``DistributedOptimizer`` in nnabla's idiom.

    :meth:`backward` runs ``loss.backward`` with the gradients all-reduced
    while it goes on (:meth:`Communicator.all_reduce_callback`, the user's
    own ``function_post_hook`` chained before it; the reduction ends when
    ``loss.backward`` returns), or, with quantized compression, after it
    (:class:`nncomm.quantized.QuantizedReducer`);
    :meth:`update` steps the wrapped solver, and refuses to when the
    gradients were not all reduced. Every other solver method
    (``weight_decay``, ``clip_grad_by_norm``, ``set_learning_rate``,
    ``get_states``, ...) is the wrapped solver's, and sees reduced
    gradients.

    Args:
        solver (:obj:`nnabla.solver.Solver`): The solver to wrap, with no
            parameters yet (give them through :meth:`set_parameters`).
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        compression: How gradients travel: :class:`nncomm.Compression`'s
            ``none`` (the context's dtype), ``fp16``, ``bf16`` or
            ``quantized(bits)`` (CNTK's, with error feedback; every
            gradient quantized densely, embedding tables included; not
            with `groups` or a `gradient_predivide_factor`).
        op (str): ``"average"`` (default) divides the sum of the ranks'
            gradients by the group's size; ``"sum"`` keeps the sum.
        gradient_predivide_factor (float): With ``op="average"``, the
            gradients are multiplied by ``1 / factor`` before the sum and
            by ``factor / size`` after it (Horovod's), so that a sum in
            float16 stays in range; the result is the mean all the same.
            A factor other than 1 costs a pass over the gradients.
        backward_passes_per_step (int): Backward passes between updates:
            the first ones accumulate locally (nnabla adds into the
            gradients), the last all-reduces the accumulated sum, as
            Horovod does. Call :meth:`zero_grad` once per update, not per
            pass.
        groups: Horovod's grouped all-reduce: ``None`` (buckets of
            `pack_size`), an int n (the parameters, in registration order,
            cut into n groups of about as many parameters each) or a list
            of lists of parameter Variables. Each group is reduced
            together once all its gradients are final, in one fused
            message (gradients of ``NNCOMM_DIRECT_BYTES`` or more travel
            where they lie); the parameters in no group in buckets of
            `pack_size`.
        pack_size (int): Elements per bucket of the reduction.
        group (str): Name of the communicator's group to reduce over.
        distributed_after (int): CNTK's warm start: each rank trains its
            first `distributed_after` samples alone, then the ranks
            average their parameters and solver states once and train
            data-parallel from there on.
        sparse_as_dense (bool): Reduce embedding tables (parameters the
            graph uses only through ``Embed``) densely. By default their
            gradients are reduced as the rows the step's indices touched
            (:func:`nncomm.sparse_all_reduce`), after backward.
        priority: BytePS's priority scheduling: ``"forward"`` sends the
            buckets in the order the next forward uses their gradients;
            ``None`` (default) sends them in the planned order (backward's).
            As in :meth:`Communicator.all_reduce_callback`.
        check_finite (bool): Check every gradient for NaN and infinity
            before it leaves this rank; where one holds some,
            :meth:`backward` raises :class:`nncomm.NonFiniteGradientError`
            on every rank, naming the ranks and parameters, and
            :meth:`update` refuses to step until the next backward.
            ``None`` (default): ``NNCOMM_CHECK_FINITE=1`` turns it on. Not
            for embedding tables reduced sparsely (their gradients are not
            checked; use `sparse_as_dense`).
        shard: ``None`` (default): every rank keeps the whole solver
            state. ``"state"``: ZeRO stage 1
            (:class:`nncomm.sharded_state.ShardedSolver`): the gradients
            are all-reduced as without it, but each rank of the group
            updates only its 1/N of the parameters' elements, so that the
            solver's state (Adam's moments, ...) is held once over the
            group, and the ranks then all-gather the parameters. Not with
            quantized compression, a warm start (`distributed_after`),
            ``comm.join()``, LARS or LAMB. ``get_states`` is then this
            rank's shard's state, and ``save_states`` /
            ``load_states`` write and read checkpoints that any number
            of ranks can load (:func:`nncomm.consolidate_states` makes an
            ordinary solver's state of one). ``"gradients"``: ZeRO stage
            2, as ``"state"``, but each element of the callback's buckets
            is summed during backward onto the rank that owns it alone (a
            reduce-scatter per bucket, each owner collecting its elements
            from the blocks' holders, in place of the all-reduce), and the
            gradients of parameters this rank owns nothing of are released
            as their buckets are written back (until the next backward
            writes them). A rank's bucketed gradients are then reduced only
            where it owns them, and NaN elsewhere (those backward did not
            reach, and embedding tables reduced sparsely, in full). Not
            with a `hook`, nor on a CUDA device.
        hook (callable): A bucket hook that reduces each bucket in place of
            nncomm's all-reduce (:meth:`Communicator.all_reduce_callback`'s
            `hook`), e.g. ``nncomm.hooks.PowerSGD(rank=2)``; not with
            quantized compression, whose reduction has no buckets, nor with
            a `compression` other than ``none`` (a hook chooses what
            travels).

    Raises:
        ValueError: An argument, or a combination of them, that is not
            supported; the same on every rank.

    Example:

    .. code-block:: python

        comm = C.MultiProcessDataParallelCommunicator(ctx)
        comm.init()
        solver = nncomm.DistributedSolver(S.Adam(1e-3), comm)
        solver.set_parameters(nn.get_parameters())  # rank 0's everywhere
        for x.d, t.d in batches:
            loss.forward()
            solver.zero_grad()
            solver.backward(loss, clear_buffer=True)
            solver.update()
    """

    def __init__(self, solver, comm, compression=Compression.none,
                 op="average", gradient_predivide_factor=1.0,
                 backward_passes_per_step=1, groups=None, pack_size=2 << 20,
                 group="world", distributed_after=0, sparse_as_dense=False,
                 priority=None, check_finite=None, shard=None, hook=None):
        if not isinstance(compression, (_WireDtype, _Quantized)):
            raise TypeError(f"compression must be one of nncomm.Compression's "
                            f"(none, fp16, bf16, quantized(bits)), not "
                            f"{compression!r}")
        if op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, not {op!r}")
        predivide = float(gradient_predivide_factor)
        if not predivide > 0:
            raise ValueError(f"gradient_predivide_factor must be positive, "
                             f"not {gradient_predivide_factor!r}")
        if predivide != 1 and op != "average":
            raise ValueError("gradient_predivide_factor splits an average; "
                             "it needs op='average'")
        if not (groups is None or isinstance(groups, (list, tuple)) or
                isinstance(groups, int) and groups > 0
                and not isinstance(groups, bool)):
            raise ValueError(f"groups must be None, a positive int or a "
                             f"list of lists of parameters, not {groups!r}")
        quantized = isinstance(compression, _Quantized)
        if quantized and groups is not None:
            raise ValueError("groups cannot be used with quantized "
                             "compression: every gradient is quantized and "
                             "exchanged in one all-gather after backward")
        if quantized and predivide != 1:
            raise ValueError("gradient_predivide_factor keeps a 16-bit sum "
                             "in range; quantized gradients are summed in "
                             "float32 once decoded, so it does not apply")
        if not isinstance(backward_passes_per_step, int) or \
                backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive "
                             f"int, not {backward_passes_per_step!r}")
        if not (priority is None or
                isinstance(priority, str) and priority == "forward"):
            raise ValueError(f"priority must be None or 'forward', not "
                             f"{priority!r}")
        if quantized and priority is not None:
            raise ValueError("priority orders the buckets reduced during "
                             "backward; quantized gradients are exchanged "
                             "in one all-gather after it")
        if hook is not None and compression is not Compression.none:
            raise ValueError(f"a hook chooses how buckets travel; it cannot "
                             f"be combined with compression={compression!r}")
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be a callable taking a "
                            f"nncomm.GradBucket, not {hook!r}")
        _check_shard(shard, quantized, distributed_after, hook)
        super().__init__(solver, comm, group, distributed_after)
        if shard is not None:
            self._solver = ShardedSolver(solver, comm, group, shard)
        self._shard = shard
        self._compression = compression
        self._op = op
        self._predivide = predivide
        self._passes_per_step = backward_passes_per_step
        self._groups = groups
        self._pack_size = pack_size
        self._sparse_as_dense = sparse_as_dense
        self._priority = priority
        self._check_finite = check_finite
        self._hook = hook
        self._params = None
        self._names = {}  # gradient array -> its parameter's name
        self._reductions = {}  # tables reduced sparsely -> callbacks' lists
        self._quantizer = None  # the QuantizedReducer, when quantized
        self._graph = (None, {}, set())  # loss, its tables, dense uses
        self._rows = {}  # table -> rows touched in this step's passes
        self._dense = set()  # parameters used densely in this step
        self._samples = 0  # in the backward passes since the last update
        self._passes = 0      # backward passes since the last update
        self._reduced = False  # the last pass all-reduced every gradient

    def _registered(self, params):
        self._params = params
        self._names = {v.grad: name for name, v in params.items()}
        _reductions(params, self._groups, self._pack_size)  # checks groups
        self._reductions = {}
        if isinstance(self._compression, _Quantized):
            self._quantizer = QuantizedReducer(
                self._comm, [v.grad for v in params.values()],
                self._compression.bits, self._compression.error_feedback,
                division=self._op == "average", group=self._group,
                check_finite=self._check_finite)
            self._quantizer._name_gradients(list(params))
        self._new_step()

    def _share_state(self, root):
        # Sharded, each rank's state is of its own elements: nothing to
        # share, and set_parameters made it anew everywhere.
        if self._shard is None:
            super()._share_state(root)

    def zero_grad(self):
        """Zeroes the gradients and starts accumulating anew."""
        self._solver.zero_grad()
        self._new_step()

    def backward(self, loss, clear_buffer=False, function_post_hook=None,
                 num_samples=None, **kwargs):
        """``loss.backward(...)`` with the gradients all-reduced on the
        last pass of a step (during the warm start, without them): each
        goes out once the last function that writes it has run, and the
        reduction ends when ``loss.backward`` returns (the gradients
        backward did not reach are reduced then, with their values).

        Args:
            loss (:obj:`nnabla.Variable`): The loss, after its forward.
            clear_buffer (bool): As :meth:`nnabla.Variable.backward`.
            function_post_hook (callable): The user's hook; it runs before
                the reduction's for each function.
            num_samples (int): Samples in this pass, counted towards
                `distributed_after`; by default the first dimension of the
                graph's data inputs.
            **kwargs: Passed on to :meth:`nnabla.Variable.backward`.
        """
        if self._params is None:
            raise RuntimeError("set_parameters() first: the solver has no "
                               "parameters to reduce")
        if self._passes == self._passes_per_step:
            raise RuntimeError(
                f"{self._passes} backward passes since the last update, "
                f"backward_passes_per_step={self._passes_per_step}; call "
                f"update() (and zero_grad()) between steps")
        distributed = self._warm_start.distributed
        if not distributed:
            self._samples += self._samples_of(loss, num_samples)
        elif not self._sparse_as_dense and self._quantizer is None:
            self._note_rows(loss)  # before clear_buffer can free indices
        self._passes += 1
        self._reduced = False
        last = self._passes == self._passes_per_step
        if not (last and distributed):
            loss.backward(clear_buffer=clear_buffer,
                          function_post_hook=function_post_hook, **kwargs)
            self._reduced = last
            return
        if self._quantizer is not None:
            self._quantized_backward(loss, clear_buffer, function_post_hook,
                                     kwargs)
            self._reduced = True
            return
        tables = {name: rows for name, rows in self._rows.items()
                  if name not in self._dense}
        dense = self._dense_reductions(frozenset(tables))
        division = self._op == "average"
        owners = self._shard == "gradients"
        callbacks = [self._comm.all_reduce_callback(
            grads, pack_size, division=division, group=self._group,
            scale_grad=1 / self._predivide,
            wire_dtype=self._compression.wire_dtype, priority=self._priority,
            check_finite=self._check_finite,
            hook=self._solver.owner_reducing(grads) if owners else self._hook)
            for grads, pack_size in dense]
        for cb, (grads, _) in zip(callbacks, dense):
            cb._name_gradients([self._names.get(g) for g in grads])
        self._reduced_backward(loss, clear_buffer, function_post_hook,
                               callbacks, kwargs,
                               self._releaser(callbacks, dense) if owners
                               else None)
        if self._predivide != 1:
            # Not the released: that would allocate them again.
            released = self._solver.unowned if owners else frozenset()
            for grads, _ in dense:
                for g in grads:
                    if g not in released:
                        g *= self._predivide
        for name, rows in tables.items():
            sparse_all_reduce(self._comm, self._params[name].grad, rows,
                              division, self._group)
        if owners:
            self._solver.release_unowned({g for grads, _ in dense
                                          for g in grads})
        self._reduced = True

    def _releaser(self, callbacks, dense):
        """A function hook releasing, as backward goes on, the gradients
        this rank owns nothing of once `callbacks` have reduced them
        (ZeRO stage 2: a rank's memory holds the other ranks' gradients
        only until they are sent)."""
        pairs = [(cb, grads) for cb, (grads, _) in zip(callbacks, dense)]

        def release(f):
            for cb, grads in pairs:
                for i in cb._newly_written_back():
                    self._solver.release_unowned((grads[i],))
        return release

    @staticmethod
    def _reduced_backward(loss, clear_buffer, hook, callbacks, kwargs,
                          after=None):
        """nnabla's backward with `callbacks` chained after the user's
        `hook`, and `after` after them. Each gradient goes out when its
        last writer has run; the reduction ends (engine finish, the
        gradients backward did not reach reduced with their values) when
        ``loss.backward`` returns, not at the last function the graph
        analysis expects, so functions run after it, or expected ones that
        never ran, leave no gradient unreduced. A backward that raises is closed at once on this rank,
        as chain_hooks does when a hook raises, so that the other ranks
        raise instead of waiting for it."""
        for cb in callbacks:
            cb._end_when_backward_returns()
        try:
            loss.backward(clear_buffer=clear_buffer,
                          function_post_hook=chain_hooks(hook, *callbacks,
                                                         after),
                          **kwargs)
            for cb in callbacks:
                cb._backward_returned()
        except BaseException:
            for cb in callbacks:
                cb.backward_raised()
            raise

    def _quantized_backward(self, loss, clear_buffer, hook, kwargs):
        """nnabla's backward, then the quantized reduction; a backward that
        raises still takes part in the step's exchange, so that the other
        ranks raise instead of waiting for this one."""
        try:
            loss.backward(clear_buffer=clear_buffer, function_post_hook=hook,
                          **kwargs)
        except Exception:
            self._quantizer.fail()
            raise
        self._quantizer.reduce()

    def update(self, **kwargs):
        """Steps the wrapped solver on the all-reduced gradients (during
        the warm start, on this rank's own, and at its end averages the
        model over the group).

        Raises:
            RuntimeError: the gradients were not all reduced: fewer
                backward passes than ``backward_passes_per_step`` since the
                last update, or the last one raised.
        """
        if not self._reduced:
            raise RuntimeError(
                f"the gradients were not all-reduced ({self._passes} of "
                f"{self._passes_per_step} backward passes completed since "
                f"the last update); update() would step this rank alone")
        self._solver.update(**kwargs)
        if not self._warm_start.distributed:
            self._warm_start.trained(self._samples, self._comm,
                                     self._solver, self._group)
        self._new_step()

    def _new_step(self):
        self._passes = 0
        self._samples = 0
        self._rows = {}
        self._dense = set()
        self._reduced = False

    def _note_rows(self, loss):
        """Adds the rows this pass touches in each embedding table, and the
        parameters it uses densely: a table is reduced sparsely only when
        every pass of the step used it as one."""
        if self._graph[0] is not loss:
            self._graph = (loss, *embedding_indices(loss, self._params))
        _, tables, dense = self._graph
        self._dense |= dense
        for name, indices in tables.items():
            rows = touched_rows(indices)
            seen = self._rows.get(name)
            self._rows[name] = rows if seen is None else \
                np.union1d(seen, rows)

    def _dense_reductions(self, tables):
        """(gradients, pack size) per callback, `tables` left out."""
        lists = self._reductions.get(tables)
        if lists is None:
            lists = _reductions(self._params, self._groups, self._pack_size,
                                tables)
            self._reductions[tables] = lists
        return lists


def data_parallel_solver(solver, comm, num_quantization_bits=32,
                         distributed_after=0):
    """CNTK's ``data_parallel_distributed_learner`` in nnabla's idiom: a
    :class:`DistributedSolver` averaging the ranks' gradients, in float32
    or quantized to `num_quantization_bits` per element with error
    feedback (CNTK's 1-bit SGD and its N-bit variant).

    Args:
        solver (:obj:`nnabla.solver.Solver`): The solver to wrap, with no
            parameters yet.
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        num_quantization_bits (int): 32: gradients travel unquantized
            (``Compression.none``); 1 to 8:
            ``Compression.quantized(num_quantization_bits)``.
        distributed_after (int): Samples each rank trains alone first
            (CNTK's warm start).

    Returns:
        :class:`DistributedSolver`

    Raises:
        ValueError: `num_quantization_bits` is neither 32 nor 1 to 8.

    Example:

    .. code-block:: python

        solver = nncomm.data_parallel_solver(S.Momentum(0.05, 0.9), comm,
                                             num_quantization_bits=1)
        solver.set_parameters(nn.get_parameters())
    """
    if _is_int(num_quantization_bits) and num_quantization_bits == 32:
        compression = Compression.none
    else:
        compression = Compression.quantized(_bits(
            num_quantization_bits,
            "num_quantization_bits, unless 32 (no quantization),"))
    return DistributedSolver(solver, comm, compression=compression,
                             distributed_after=distributed_after)


def _check_shard(shard, quantized, distributed_after, hook):
    """ValueError unless DistributedSolver supports `shard` with these
    other arguments."""
    if not (shard is None or isinstance(shard, str) and shard in _SHARDS):
        raise ValueError(f"shard must be one of {_SHARDS}, not {shard!r}")
    if shard is None:
        return
    if quantized:
        raise ValueError(f"shard={shard!r} with quantized compression is "
                         f"not supported: use Compression.none, fp16 or "
                         f"bf16")
    if distributed_after:
        raise ValueError(f"shard={shard!r} with distributed_after (a warm "
                         f"start) is not supported: each rank would train "
                         f"its whole model alone, with the whole solver "
                         f"state that sharding leaves it without")
    if shard == "gradients" and hook is not None:
        raise ValueError("shard='gradients' reduces each bucket onto the "
                         "ranks that own its elements; it takes no hook "
                         "(shard='state' does)")


def _reductions(params, groups, pack_size, skip=frozenset()):
    """(gradients, pack size) per all-reduce callback: one per group, in a
    single bucket, and one for the parameters in none; the parameters named
    in `skip` (reduced otherwise) left out."""
    if groups is None:
        groups = []
    elif isinstance(groups, int):
        variables = [v for name, v in params.items() if name not in skip]
        size, extra = divmod(len(variables), groups)
        starts = [i * size + min(i, extra) for i in range(groups + 1)]
        groups = [variables[a:b] for a, b in zip(starts, starts[1:])]
    names = {v.data: name for name, v in params.items()}
    grouped = set()
    reductions = []
    for i, members in enumerate(groups):
        if not isinstance(members, (list, tuple)):
            raise TypeError(f"groups[{i}] must be a list of parameters, "
                            f"not {type(members).__name__}")
        kept = []
        for v in members:
            name = names.get(getattr(v, "data", None))
            if name is None:
                raise ValueError(f"groups[{i}] holds {v!r}, which is not a "
                                 f"parameter given to set_parameters")
            if name in grouped:
                raise ValueError(f"parameter {name!r} is in two groups")
            grouped.add(name)
            if name not in skip:
                kept.append(v)
        if kept:
            reductions.append(([v.grad for v in kept],
                               max(1, sum(v.size for v in kept))))
    rest = [v.grad for name, v in params.items()
            if name not in grouped and name not in skip]
    if rest:
        reductions.append((rest, pack_size))
    return reductions

"""DistributedSolver: an nnabla solver whose gradients are all-reduced over
a group of ranks during backward, as Horovod's ``DistributedOptimizer``
wraps a framework's optimizer."""
from nncomm.broadcast import broadcast_parameters, broadcast_solver_state
from nncomm.compression import Compression, _WireDtype
from nncomm.hooks import chain_hooks

_OPS = ("average", "sum")


class DistributedSolver:
    """Wraps an nnabla solver so that every rank steps with the gradients
    of all ranks: Horovod's ``DistributedOptimizer`` in nnabla's idiom.

    :meth:`backward` runs ``loss.backward`` with the gradients all-reduced
    while it goes on (:meth:`Communicator.all_reduce_callback`, the user's
    own ``function_post_hook`` chained before it); :meth:`update` steps the
    wrapped solver, and refuses to when the gradients were not all
    reduced. Every other solver method (``weight_decay``,
    ``clip_grad_by_norm``, ``set_learning_rate``, ``get_states``, ...) is
    the wrapped solver's, and sees reduced gradients.

    Args:
        solver (:obj:`nnabla.solver.Solver`): The solver to wrap, with no
            parameters yet (give them through :meth:`set_parameters`).
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        compression: How gradients travel: :class:`nncomm.Compression`'s
            ``none`` (the context's dtype), ``fp16`` or ``bf16``.
        op (str): ``"average"`` (default) divides the sum of the ranks'
            gradients by the group's size; ``"sum"`` keeps the sum.
        backward_passes_per_step (int): Backward passes between updates:
            the first ones accumulate locally (nnabla adds into the
            gradients), the last all-reduces the accumulated sum, as
            Horovod does. Call :meth:`zero_grad` once per update, not per
            pass.
        pack_size (int): Elements per bucket of the reduction.
        group (str): Name of the communicator's group to reduce over.

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
                 op="average", backward_passes_per_step=1, pack_size=2 << 20,
                 group="world"):
        if not isinstance(compression, _WireDtype):
            raise TypeError(f"compression must be one of nncomm.Compression's "
                            f"(none, fp16, bf16), not {compression!r}")
        if op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, not {op!r}")
        if not isinstance(backward_passes_per_step, int) or \
                backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive "
                             f"int, not {backward_passes_per_step!r}")
        ranks = comm.find_group(group)
        if comm.rank not in ranks:
            raise ValueError(f"this rank ({comm.rank}) is not in group "
                             f"{group!r} (ranks {ranks})")
        self._solver = solver
        self._comm = comm
        self._wire_dtype = compression.wire_dtype
        self._op = op
        self._passes_per_step = backward_passes_per_step
        self._pack_size = pack_size
        self._group = group
        self._grads = None
        self._passes = 0      # backward passes since the last update
        self._reduced = False  # the last pass all-reduced every gradient

    @property
    def solver(self):
        """:obj:`nnabla.solver.Solver`: the wrapped solver."""
        return self._solver

    def set_parameters(self, param_dict, reset=True, retain_state=False):
        """Registers parameters with the wrapped solver (its own signature)
        and broadcasts their values and the solver's state (as after
        ``load_states`` on the first rank only) from the group's first
        rank, so that every rank starts, or resumes, from the same model.

        Args:
            param_dict (dict): name -> :obj:`nnabla.Variable`, as from
                ``nn.get_parameters()``.
            reset (bool): As :meth:`nnabla.solver.Solver.set_parameters`.
            retain_state (bool): As
                :meth:`nnabla.solver.Solver.set_parameters`.
        """
        self._solver.set_parameters(param_dict, reset=reset,
                                    retain_state=retain_state)
        params = self._solver.get_parameters()
        broadcast_parameters(self._comm, params, group=self._group)
        broadcast_solver_state(self._comm, self._solver, group=self._group)
        self._grads = [v.grad for v in params.values()]
        self._passes = 0
        self._reduced = False

    def zero_grad(self):
        """Zeroes the gradients and starts accumulating anew."""
        self._solver.zero_grad()
        self._passes = 0
        self._reduced = False

    def backward(self, loss, clear_buffer=False, function_post_hook=None,
                 **kwargs):
        """``loss.backward(...)`` with the gradients all-reduced on the
        last pass of a step.

        Args:
            loss (:obj:`nnabla.Variable`): The loss, after its forward.
            clear_buffer (bool): As :meth:`nnabla.Variable.backward`.
            function_post_hook (callable): The user's hook; it runs before
                the reduction's for each function.
            **kwargs: Passed on to :meth:`nnabla.Variable.backward`.
        """
        if self._grads is None:
            raise RuntimeError("set_parameters() first: the solver has no "
                               "parameters to reduce")
        if self._passes == self._passes_per_step:
            raise RuntimeError(
                f"{self._passes} backward passes since the last update, "
                f"backward_passes_per_step={self._passes_per_step}; call "
                f"update() (and zero_grad()) between steps")
        self._passes += 1
        self._reduced = False
        hook = function_post_hook
        if self._passes == self._passes_per_step:
            cb = self._comm.all_reduce_callback(
                self._grads, self._pack_size,
                division=self._op == "average", group=self._group,
                wire_dtype=self._wire_dtype)
            hook = chain_hooks(function_post_hook, cb)
        loss.backward(clear_buffer=clear_buffer, function_post_hook=hook,
                      **kwargs)
        self._reduced = self._passes == self._passes_per_step

    def update(self, **kwargs):
        """Steps the wrapped solver on the all-reduced gradients.

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
        self._passes = 0
        self._reduced = False

    def __getattr__(self, name):
        # Everything else is the wrapped solver's.
        return getattr(self._solver, name)

"""Training on inputs of uneven length across ranks: :class:`Join`, the
context manager :meth:`nncomm.Communicator.join` returns."""
from nncomm.broadcast import broadcast_parameters, broadcast_solver_state
from nncomm.errors import InputsExhaustedError
from nncomm.sharded_state import sharded_solvers


class Join:
    """Data-parallel training where ranks have different numbers of
    batches, as PyTorch's ``torch.distributed.algorithms.Join``. Opening it
    is collective; a rank whose loop ends leaves it (``__exit__``) and,
    from then on, takes part with zeros in every collective the ranks still
    training make on any group (the callback's buckets, every reduction of
    :class:`nncomm.DistributedSolver` including ``backward_passes_per_step``,
    :class:`nncomm.BlockMomentumSolver`'s blocks, list collectives made for
    metrics). Nothing needs to know in advance what they will call: each
    rank still training describes its collectives to the ranks that left,
    which make the same MPI calls. While no rank has left this costs no
    message and no collective, one ``MPI_Iprobe`` per operation.

    When the last rank leaves, every rank takes the parameters and solver
    state of the rank that trained last (``last_rank``), so all go on from
    the same model.

    A rank that left cannot be the root of a broadcast, and the ranks still
    training cannot make new communicators (a new callback's engine) or
    groups with it: those raise on every rank. A rank that leaves with an
    exception makes the others' next wait raise, naming it.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        joinables (list): What to make the same at the end: solvers
            (nnabla's, or nncomm's wrappers, over the world group) and dicts
            of parameters; ``None``: nnabla's global parameters.
        divide_by_initial_world_size (bool): ``True``: averages divide by
            the world size, the ranks that left adding zeros. ``False``: by
            the ranks still training, counted at each backward of a
            callback on the world group.
        throw_on_early_termination (bool): Every rank raises
            :class:`nncomm.InputsExhaustedError` at the first callback
            backward on the world group after a rank's data ended.

    Example:

    .. code-block:: python

        solver = nncomm.DistributedSolver(S.Adam(), comm)
        solver.set_parameters(nn.get_parameters())
        with comm.join([solver]):
            for x, t in batches_of_this_rank:
                loss.forward()
                solver.zero_grad()
                solver.backward(loss)
                solver.update()
    """

    def __init__(self, comm, joinables=None,
                 divide_by_initial_world_size=True,
                 throw_on_early_termination=False):
        for name, value in (("divide_by_initial_world_size",
                             divide_by_initial_world_size),
                            ("throw_on_early_termination",
                             throw_on_early_termination)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, not "
                                f"{type(value).__name__}")
        if joinables is not None and not isinstance(joinables,
                                                    (list, tuple)):
            joinables = [joinables]
        for j in joinables or ():
            group = getattr(j, "_group", "world")
            if group != "world":
                raise ValueError(f"comm.join() is over the world group; a "
                                 f"{type(j).__name__} over group {group!r} "
                                 f"cannot be made the same at its end")
        if sharded_solvers(comm):
            raise ValueError(
                "comm.join() cannot run beside a DistributedSolver with "
                "shard='state' or 'gradients' on this communicator: a "
                "rank that left would take part in the parameters' "
                "all-gather with zeros for its range of elements")
        self._comm = comm
        self._joinables = joinables
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.throw_on_early_termination = throw_on_early_termination
        self.last_rank = None

    @property
    def counts_ranks(self):
        """bool: whether each callback backward counts the ranks still
        training (one small all-reduce)."""
        return (not self.divide_by_initial_world_size or
                self.throw_on_early_termination)

    def __enter__(self):
        self._steps = self._trained()
        self._comm._open_join(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        exhausted = _exhausted(exc)
        if exhausted is not None:
            # nnabla wraps what a backward hook raises in a SystemError.
            self._comm._close_join()
            if exhausted is exc:
                return False
            raise exhausted
        if exc_type is not None:
            self._comm._close_join(
                f"world rank {self._comm.rank} left comm.join() with "
                f"{exc_type.__name__}: {exc}")
            return False
        try:
            last, terminated = self._comm._leave_join(
                self._trained() - self._steps)
        except BaseException:
            self._comm._close_join()
            raise
        self._comm._close_join()
        if terminated:
            raise InputsExhaustedError(
                f"world rank {self._comm.rank} exhausted its inputs "
                f"(comm.join(throw_on_early_termination=True)): raised on "
                f"every rank")
        self.last_rank = last
        self._synchronize(last)
        return False

    def _trained(self):
        """Updates the joinables' solvers have made (their states' step
        count): the rank that made the most inside the scope trained last,
        whether or not its last steps communicated."""
        steps = 0
        for j in self._joinables or ():
            solver = getattr(j, "solver", j)
            if hasattr(solver, "get_states"):
                states = solver.get_states()
                steps += max((getattr(st, "t", 0) for st in states.values()),
                             default=0)
        return steps

    def _synchronize(self, root):
        """Every rank takes `root`'s parameters and solver states."""
        joinables = self._joinables
        if joinables is None:
            import nnabla as nn
            joinables = [nn.get_parameters(grad_only=False)]
        for j in joinables:
            if hasattr(j, "_after_join"):
                j._after_join(root)
            elif isinstance(j, dict):
                broadcast_parameters(self._comm, j, root=root)
            elif hasattr(j, "get_states"):
                broadcast_parameters(self._comm, j.get_parameters(),
                                     root=root)
                broadcast_solver_state(self._comm, j, root=root)


def _exhausted(exc):
    """The InputsExhaustedError in `exc`'s chain, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, InputsExhaustedError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None

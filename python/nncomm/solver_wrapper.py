"""What the distributed solvers share: an nnabla solver wrapped for a group
of ranks, started from the group's first rank, counting the samples each
backward pass trains, with a warm start, and every other method the
wrapped solver's."""
import numbers

from nncomm.broadcast import broadcast_parameters, broadcast_solver_state
from nncomm.nnabla_adapter.graph import samples_in
from nncomm.warm_start import WarmStart


class SolverWrapper:
    """The base of :class:`nncomm.DistributedSolver` and
    :class:`nncomm.BlockMomentumSolver`, which take note of the parameters
    :meth:`set_parameters` registers in ``_registered``.

    Args:
        solver (:obj:`nnabla.solver.Solver`): The solver to wrap.
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        group (str): Name of the communicator's group to train over.
        distributed_after (int): Samples each rank trains alone first
            (:class:`nncomm.warm_start.WarmStart`).

    Raises:
        ValueError: This rank is not in `group`, or `distributed_after` is
            not a non-negative int.
    """

    def __init__(self, solver, comm, group, distributed_after):
        ranks = comm.find_group(group)
        if comm.rank not in ranks:
            raise ValueError(f"this rank ({comm.rank}) is not in group "
                             f"{group!r} (ranks {ranks})")
        self._solver = solver
        self._comm = comm
        self._group = group
        self._warm_start = WarmStart(distributed_after)

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
        self._share_state(0)
        self._registered(params)

    def _after_join(self, root):
        """comm.join() ended (:class:`nncomm.Join`): every rank takes group
        rank `root`'s parameters and solver state."""
        broadcast_parameters(self._comm, self._solver.get_parameters(),
                             root=root, group=self._group)
        self._share_state(root)

    def _share_state(self, root):
        """Every rank takes group rank `root`'s solver state."""
        broadcast_solver_state(self._comm, self._solver, root=root,
                               group=self._group)

    def _registered(self, params):
        """Takes note of `params` (name to Variable), now registered and the
        same on every rank."""
        raise NotImplementedError

    def _samples_of(self, loss, num_samples):
        """`num_samples`, checked, or else the number of samples the graph
        of `loss` computes on (:func:`nncomm.nnabla_adapter.graph.samples_in`)."""
        if num_samples is None:
            return samples_in(loss, self._solver.get_parameters().values())
        if isinstance(num_samples, bool) or \
                not isinstance(num_samples, numbers.Integral):
            raise TypeError(f"num_samples must be an int, not "
                            f"{type(num_samples).__name__}")
        if num_samples < 0:
            raise ValueError(f"num_samples must not be negative, not "
                             f"{num_samples}")
        return int(num_samples)

    def __getattr__(self, name):
        # Everything else is the wrapped solver's.
        return getattr(self._solver, name)

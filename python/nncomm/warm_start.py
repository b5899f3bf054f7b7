"""Warm start, as CNTK's ``distributed_after``: a rank trains alone on its
first samples, then the ranks average their models once and train
data-parallel from there on."""
from nncomm.broadcast import _agreed, _state_arrays, _variables


def average_model(comm, solver, group="world"):
    """Replaces the parameters of `solver` and its state arrays (momenta,
    Adam's moments) by their mean over the group, in one all-reduce; the
    ranks first agree that they hold the same names and shapes.

    Args:
        comm (:obj:`nncomm.Communicator`): An initialized communicator.
        solver (:obj:`nnabla.solver.Solver`): With its parameters set.
        group (str): Name of a group.

    Raises:
        ValueError: On every rank, when the ranks' parameters or states
            differ in names or shapes.
    """
    def entries():
        params = _variables(solver.get_parameters())
        return ([("parameter " + n, v) for n, v in params]
                + [("state " + n, v) for n, v in _state_arrays(solver)])
    agreed = _agreed(comm, entries, group, "average_model",
                     "parameters and solver states")
    comm.all_reduce([v.data for _, v in agreed], division=True, group=group)


class WarmStart:
    """Counts a rank's samples until `after` of them were trained without
    communication, then averages the model over the group once.

    Each rank counts its own samples, so the ranks switch at the same step
    when they train on batches of one size. Where they do not, the first
    to switch waits in the averaging all-reduce for the others.

    Args:
        after (int): Samples to train locally (0: distributed from the
            start).
    """

    def __init__(self, after):
        if not isinstance(after, int) or isinstance(after, bool) \
                or after < 0:
            raise ValueError(f"distributed_after must be a non-negative "
                             f"int (samples), not {after!r}")
        self.after = after
        self.samples = 0

    @property
    def distributed(self):
        """Whether the warm start is over."""
        return self.samples >= self.after

    def trained(self, num_samples, comm, solver, group):
        """Counts `num_samples` trained locally; averages the model when
        they end the warm start."""
        self.samples += num_samples
        if self.distributed:
            average_model(comm, solver, group)

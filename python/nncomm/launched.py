"""What the launcher says of the job: how many ranks it started, as the
variables launchers set on every rank tell, so that a process knows it is
one of several even where its MPI does not (a launcher of another MPI, or
none reached), and failures to set up the job are not taken for a
single-process run."""
import os
import sys

from nncomm.errors import CommunicatorError, DataParallelError

# The variable each launcher sets to the job's number of ranks.
SIZE_VARIABLES = (
    ("PMI_SIZE", "MPICH's mpiexec (hydra) or srun --mpi=pmi2"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("SLURM_STEP_NUM_TASKS", "srun"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun"),
)


def launched_size(environ=None):
    """The number of ranks the launcher started, and what says so.

    Args:
        environ (dict): The environment (``os.environ`` by default).

    Returns:
        tuple: ``(size, "VARIABLE=value (launcher)")`` for the largest size
        a launcher's variable gives, or ``(1, None)`` where none is set.
    """
    environ = os.environ if environ is None else environ
    size, source = 1, None
    for name, launcher in SIZE_VARIABLES:
        try:
            value = int(environ.get(name, ""))
        except ValueError:
            continue
        if value > size:
            size, source = value, f"{name}={value} ({launcher})"
    return size, source


def job_size():
    """The job's number of ranks, by its launcher's variables or by MPI's
    world where MPI is initialized (it is never initialized here), and what
    the launcher's variable says, or None.

    Returns:
        tuple: ``(size, source)`` as :func:`launched_size` gives them.
    """
    size, source = launched_size()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        size = max(size, mpi.COMM_WORLD.Get_size())
    return size, source


def check_joined(world_size, environ=None):
    """Raises DataParallelError where the launcher started more ranks than
    the `world_size` MPI sees: this process's MPI (mpi4py's) could not join
    the launcher's job and would run alone.
    """
    size, source = launched_size(environ)
    if size > world_size:
        raise DataParallelError(
            f"this process is one of {size} ranks ({source}), but its MPI "
            f"sees a world of {world_size}: the MPI that mpi4py was built "
            f"for cannot join this launcher's job, so every rank would "
            f"train alone. Start the job with nncomm-run, or with the "
            f"mpiexec beside this interpreter (the mpich wheel's)")


class SeveralRanks:
    """Context manager: an Exception raised inside becomes a
    DataParallelError naming `what` and the cause, where the job has
    several ranks (by its launcher or by MPI); elsewhere it passes as it
    is. A CommunicatorError always passes as it is: it ends the job
    anyway (the ranks are aborted shortly after it).

    Example:

    .. code-block:: python

        with SeveralRanks("creating the communicator"):
            comm = Communicator(ctx)
    """

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if kind is None or not issubclass(kind, Exception) or \
                issubclass(kind, CommunicatorError):
            return False
        size, source = job_size()
        if size > 1:
            raise DataParallelError(
                f"{self.what} failed in a job of {size} ranks"
                + (f" ({source})" if source else "")
                + f": {kind.__name__}: {error}") from error
        return False

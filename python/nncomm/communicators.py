"""Factories with the names and signatures of ``nnabla.communicators``."""
from nncomm._nncomm import Communicator
from nncomm.launched import SeveralRanks


def MultiProcessDataParallelCommunicator(ctx):
    """Multi-process data-parallel communicator over MPI.

    One process per rank, launched by ``mpiexec``; collectives run on the
    host memory of nnabla arrays.

    Args:
        ctx (:obj:`nnabla.Context`): A CPU context, as from
            ``get_extension_context("cpu")``.

    Returns:
        :obj:`nncomm.Communicator`: Call ``init()`` on it before use.

    Raises:
        ValueError: `ctx` is not a context nncomm can work in (on a
            single rank).
        nncomm.errors.DataParallelError: The same, in a job of several
            ranks, where it must not be taken for a single-process run.

    Example:

    .. code-block:: python

        import nncomm.communicators as C
        from nnabla.ext_utils import get_extension_context

        comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
        comm.init()
    """
    with SeveralRanks("creating nncomm's communicator"):
        return Communicator(ctx)


# nnabla's aliases, the misspelt one included, so old scripts keep working.
MultiProcessDataParalellCommunicator = MultiProcessDataParallelCommunicator
MultiProcessCommunicator = MultiProcessDataParallelCommunicator
Comm = MultiProcessDataParallelCommunicator
Dist = MultiProcessDataParallelCommunicator

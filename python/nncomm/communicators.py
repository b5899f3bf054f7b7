"""Factories with the names and signatures of ``nnabla.communicators``."""
from nncomm._nncomm import Communicator


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
        ValueError: `ctx` is not a CPU context.

    Example:

    .. code-block:: python

        import nncomm.communicators as C
        from nnabla.ext_utils import get_extension_context

        comm = C.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
        comm.init()
    """
    return Communicator(ctx)


# nnabla's aliases, the misspelt one included, so old scripts keep working.
MultiProcessDataParalellCommunicator = MultiProcessDataParallelCommunicator
MultiProcessCommunicator = MultiProcessDataParallelCommunicator
Comm = MultiProcessDataParallelCommunicator
Dist = MultiProcessDataParallelCommunicator

"""nncomm's exceptions (importable without nnabla or MPI)."""


class CommunicatorError(RuntimeError):
    """The ranks can no longer communicate: a wait for other ranks lasted
    longer than ``NNCOMM_TIMEOUT`` (the message names the operation and the
    ranks that never arrived), or an earlier wait timed out or was
    interrupted. The job is then aborted (``MPI_Abort``) at exit, or a few
    seconds after a timeout, so that no rank is left behind."""

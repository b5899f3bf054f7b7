"""nncomm's exceptions (importable without nnabla or MPI)."""


class CommunicatorError(RuntimeError):
    """The ranks can no longer communicate: a wait for other ranks lasted
    longer than ``NNCOMM_TIMEOUT`` (the message names the operation and the
    ranks that never arrived), or an earlier wait timed out or was
    interrupted. The job is then aborted (``MPI_Abort``) at exit, or a few
    seconds after a timeout, so that no rank is left behind."""


class DataParallelError(BaseException):
    """A job started on several ranks cannot run data-parallel: its
    communicator could not be created or initialized (the message names
    the cause), or its MPI cannot join the launcher's job.

    Raised on every rank. It derives from BaseException, not Exception, on
    purpose: nnabla-style scripts create their communicator inside
    ``try: ... except Exception:`` and carry on alone when it fails, which
    under an N-rank launcher trains N unrelated models writing the same
    files. This exception passes through such wrappers and ends the job.
    The original exception is its ``__cause__``.
    """


class InputsExhaustedError(RuntimeError):
    """A rank's data ended inside
    ``comm.join(throw_on_early_termination=True)``: raised on every rank at
    the same backward (the first whose count of the ranks still training
    found one gone), so that all stop together, as PyTorch's ``Join``
    with the same option."""

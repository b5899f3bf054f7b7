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


class NonFiniteGradientError(FloatingPointError):
    """A gradient held a NaN or an infinity before it left its rank, with
    the check on (``check_finite=True`` or ``NNCOMM_CHECK_FINITE=1``).

    Raised on every rank of the group at the same point, where the
    reduction ends (the end of backward for
    :meth:`Communicator.all_reduce_callback` and
    :meth:`DistributedSolver.backward`, :meth:`GradientReducer.finish`,
    :meth:`QuantizedReducer.reduce`),
    so before any rank's solver updates anything; the message names the
    ranks and parameters. The gradients of that step are not usable (they
    hold the non-finite sum), but the communicator is: catch it, zero the
    gradients and go on with the next batch. A ``FloatingPointError``, as
    numpy's ``seterr(invalid='raise')`` raises, so an ``ArithmeticError``.

    Attributes:
        ranks (tuple of int): The world ranks whose gradients held one.
        parameters (dict): World rank -> tuple of its non-finite gradients,
            by parameter name where known (else ``data[i]`` and shape),
            at most 8 per rank.
        counts (dict): World rank -> how many of its gradients held one.
    """

    def __init__(self, parameters, counts):
        self.parameters = {r: tuple(p) for r, p in parameters.items()}
        self.counts = dict(counts)
        self.ranks = tuple(sorted(self.parameters))
        where = "; ".join(
            f"rank {r}: " + ", ".join(self.parameters[r])
            + (f" and {self.counts[r] - len(self.parameters[r])} more"
               if self.counts[r] > len(self.parameters[r]) else "")
            for r in self.ranks)
        super().__init__(
            f"non-finite gradients (NaN or infinity) before the all-reduce, "
            f"on {where}; every rank raises this before any update: skip "
            f"the step (zero the gradients) or stop")

    def __reduce__(self):
        return type(self), (self.parameters, self.counts)


class BucketHookError(RuntimeError):
    """A bucket hook (``hook=`` of :meth:`Communicator.all_reduce_callback`,
    :meth:`Communicator.gradient_reducer`, :class:`nncomm.DistributedSolver`)
    raised, returned an array of another shape or dtype than its bucket's,
    or made other collectives than the other ranks' hooks.

    Raised on every rank of the group where the reduction ends, naming the
    hook, the bucket and the world ranks whose hooks raised; on those, it is
    chained to the hook's own exception. The gradients of that step were
    not all reduced."""

"""Built-in bucket hooks (``hook=`` of ``all_reduce_callback``,
``gradient_reducer`` and :class:`nncomm.DistributedSolver`): the 16-bit wire
dtypes, and PowerSGD (Vogels et al., NeurIPS 2019), as PyTorch DDP's
``ddp_comm_hooks`` give them. Import them from :mod:`nncomm.hooks`.
On GPU buckets they work on the device through CuPy."""
import collections
import warnings

import numpy as np

from nncomm import _low_rank

F32 = np.float32
# The largest factor rank nncomm._low_rank's passes take: they sweep Q^T
# once per row of M, which beyond this outruns the cache, and BLAS's
# blocked products are faster (bench/powersgd_passes_bench.py).
_LOW_RANK_MAX_RANK = 8


def _array_module(bucket, what):
    """numpy for a host bucket; CuPy for a GPU bucket, whose buffer hooks
    compute on with it."""
    if not bucket.on_device:
        return np
    try:
        import cupy
    except ImportError:
        raise RuntimeError(f"nncomm.hooks.{what} on a GPU bucket computes "
                           f"with CuPy, which is not installed") from None
    return cupy


def fp16_compress(bucket):
    """Sends the bucket in float16: half the bytes of float32, as
    ``wire_dtype='float16'`` does (the same conversion), for a reduction
    that otherwise has a hook's place. On a GPU bucket, converted on the
    device with CuPy.

    Args:
        bucket (:obj:`nncomm.GradBucket`): The bucket.

    Example:

    .. code-block:: python

        cb = comm.all_reduce_callback(grads, 2 << 20, division=True,
                                      hook=nncomm.hooks.fp16_compress)
    """
    xp = _array_module(bucket, "fp16_compress")
    if xp is np:
        bucket.all_reduce(bucket.buffer, wire_dtype="float16")
        return
    flat = xp.asarray(bucket.buffer)
    half = flat.astype(xp.float16)
    bucket.all_reduce(half)
    flat[...] = half


def bf16_compress(bucket):
    """Sends the bucket in bfloat16: half the bytes of float32 with its
    range, as ``wire_dtype='bfloat16'`` does. Host buckets only (CuPy has
    no bfloat16; ``wire_dtype='bfloat16'`` needs no hook).

    Args:
        bucket (:obj:`nncomm.GradBucket`): The bucket.
    """
    if bucket.on_device:
        raise NotImplementedError(
            "nncomm.hooks.bf16_compress converts on the host; on a GPU "
            "bucket give the reduction wire_dtype='bfloat16' instead of a "
            "hook")
    bucket.all_reduce(bucket.buffer, wire_dtype="bfloat16")


class _Matrix:
    """A gradient of a bucket reduced as two low-rank factors: its place in
    the flat buffer (`offset`, n x m elements), the Q^T (r x m) its next
    iteration starts from, and the last estimate's factors, kept between
    iterations: P (n x r, orthonormal; with error feedback only) and the
    summed Q^T (None before the first), and whether the bucket's kept M
    still has that estimate to subtract (`estimated`)."""

    def __init__(self, offset, n, m, qt):
        self.offset = offset
        self.n = n
        self.m = m
        self.qt = qt
        self.p_last = None
        self.qt_last = None
        self.estimated = False

    def last(self):
        """The last estimate's P and Q^T for the next step to subtract
        from M, or (None, None): none yet, no error feedback, or the error
        feedback restarted."""
        if not self.estimated or self.p_last is None:
            return None, None
        return self.p_last, self.qt_last

    def keep(self, p, qt, error_feedback, warm_start):
        """Keeps this iteration's factors (P orthonormal, Q^T summed)."""
        if self.qt_last is None:
            self.qt_last = qt.copy()
            if error_feedback:
                self.p_last = p.copy()
        else:
            self.qt_last[...] = qt
            if self.p_last is not None:
                self.p_last[...] = p
        self.estimated = True
        if warm_start:
            self.qt[...] = _unit_rows(qt)


def _unit_rows(qt):
    """Q^T's rows (Q's columns) scaled to unit length, in float32 at least.
    A warm start from the summed Q as it is would grow P = M Q by the ranks
    and the gradients' scale at every step, until a 16-bit bucket
    overflows; the scale changes nothing else (P is orthonormalized after
    its sum). A zero row stays zero."""
    wide = qt.astype(np.promote_types(qt.dtype, F32))
    norms = (wide * wide).sum(axis=1, keepdims=True) ** 0.5
    norms[norms == 0] = 1
    return (wide / norms).astype(qt.dtype)


def _rows(g):
    """Where the whole rows of gradient part `g` (a BucketGradient) lie in
    its bucket's buffer, and how many of how many elements: (offset, n, m);
    n is 0 for a vector. A gradient split between buckets is split between
    rows too, mostly: each bucket's whole rows are a matrix of their own."""
    if len(g.shape) < 2:
        return g.offset, 0, 0
    m = int(np.prod(g.shape[1:]))
    first = -(-g.start // m)
    n = max((g.start + g.count) // m - first, 0)
    return g.offset + first * m - g.start, n, m


class _ArrayPasses:
    """PowerSGD's passes (include/nncomm/compression/low_rank.hpp) as array
    operations of `xp`: for GPU buckets (CuPy) and 16-bit host ones. Float32
    host buckets take nncomm._low_rank's, which do each in one sweep. The
    first pass may leave anything in `gradient`: the third writes it."""

    def __init__(self, xp):
        self.xp = xp

    def project(self, gradient, kept, p_last, qt_last, scale, qt, p):
        source = gradient
        if kept is not None:
            kept += gradient
            if p_last is not None:
                self.xp.matmul(p_last * scale, qt_last, out=gradient)
                kept -= gradient
            source = kept
        self.xp.matmul(source, qt.T, out=p)

    def back_project(self, gradient, kept, p, qt):
        self.xp.matmul(p.T, gradient if kept is None else kept, out=qt)

    def expand(self, gradient, p, qt):
        self.xp.matmul(p, qt, out=gradient)


def _host(array):
    """A copy of `array` in host memory (None stays None)."""
    if array is None:
        return None
    return array.copy() if isinstance(array, np.ndarray) else array.get()


# A bucket's PowerSGD state as pickled: the group rank and size that kept
# it, M (None without error feedback), and per matrix its Q^T, last P and
# Q^T, and whether M holds that estimate.
_SavedBucket = collections.namedtuple("_SavedBucket",
                                      ["rank", "size", "kept", "matrices"])


class _BucketState:
    """What PowerSGD keeps of one bucket: its matrices, the elements sent
    densely, M per matrix (in a buffer of the bucket's shape; None without
    error feedback), the array module they are arrays of (numpy, or CuPy on
    a device), the passes that compute on them, and the ranks' count."""

    def __init__(self, matrices, dense, kept, xp, passes, rank, size):
        self.matrices = matrices
        self.dense = dense  # indices into the flat buffer
        self.kept = kept
        self.xp = xp
        self.passes = passes
        self.rank = rank
        self.size = size

    def saved(self):
        """This state in host arrays, for pickle."""
        return _SavedBucket(
            self.rank, self.size, _host(self.kept),
            [tuple(map(_host, (x.qt, x.p_last, x.qt_last))) + (x.estimated,)
             for x in self.matrices])

    def restore(self, saved):
        """Takes a saved state of the same bucket (its layout, and the
        hook's settings, are the same). Q is every rank's alike, M this
        rank's own: M is taken only from a state this group rank saved,
        with this many ranks; otherwise the error feedback restarts.

        Returns:
            bool: whether M was taken.
        """
        xp = self.xp
        for x, (qt, p_last, qt_last, estimated) in zip(self.matrices,
                                                       saved.matrices):
            # In the bucket's dtype, should its wire dtype have changed.
            x.qt[...] = xp.asarray(qt)
            x.p_last = None if p_last is None else xp.asarray(
                p_last, x.qt.dtype)
            x.qt_last = None if qt_last is None else xp.asarray(
                qt_last, x.qt.dtype)
            x.estimated = estimated
        if (saved.rank, saved.size) == (self.rank, self.size):
            if self.kept is not None:
                self.kept[...] = xp.asarray(saved.kept)
            return True
        self.restart()
        return False

    def residual(self):
        """What compression left out of this rank's gradients, for the next
        iteration, in a new array: M - P Q^T / size per matrix."""
        residual = self.xp.zeros_like(self.kept)
        for x in self.matrices:
            region = slice(x.offset, x.offset + x.n * x.m)
            residual[region] = self.kept[region]
            p_last, qt_last = x.last()
            if p_last is not None:
                residual[region] -= (p_last @ qt_last).reshape(-1) / self.size
        return residual

    def restart(self):
        """Starts the error feedback afresh: after a step that did not
        finish, M holds what is not known to be that step's (nor finite)."""
        if self.kept is not None:
            self.kept[...] = 0
        for x in self.matrices:
            x.estimated = False


class PowerSGD:
    """PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as a bucket
    hook: each gradient of two or more dimensions, viewed as an n x m
    matrix M (its first dimension by the rest), travels as two rank-r
    factors instead of n x m elements. A gradient split between buckets is
    a matrix per bucket: the rows the bucket holds whole (the rest of a
    row that straddles two buckets travels densely).

    Per bucket and iteration: M gets the residual of the previous one added
    (error feedback); P = M Q is summed over the ranks, together with the
    bucket's other elements (vectors, partial rows, and matrices too small
    for factors to save bytes), which travel densely;
    P is orthonormalized (QR); Q = M^T P is summed; the sum's estimate
    P Q^T replaces M, and M - P Q^T / size is the new residual. Q starts
    random (drawn from the seed, the iteration and the matrix: the same on
    every rank) and, with `warm_start`, starts the next iteration from
    this one's, its columns scaled to unit length (one power iteration per
    step then refines the same subspace). Before `start_iter` every bucket
    is summed densely, as without a hook. On GPU buckets it computes on the
    device with CuPy (Q drawn on the host). A step whose hook fails
    (raises, or another rank's did) restarts the error feedback of the
    buckets it did not finish: their residual is zero afterwards.

    On float32 host buckets the passes over M run in C++ without the GIL,
    three per iteration (M kept instead of the residual: see
    include/nncomm/compression/low_rank.hpp).

    Its state (Q, and M and P with error feedback, per bucket) is
    allocated at a bucket's first compressed iteration and reused; one hook
    object serves one reduction (a callback, reducer or solver) of one set
    of gradients.

    For a checkpoint, pickle the hook on every rank (its settings, its
    iteration and each bucket's state, in host memory); unpickled, it goes
    on where it stopped, each bucket taking its state at its next
    iteration. M is each rank's own: a bucket whose state was saved by
    another group rank, or with another number of ranks, keeps its Qs and
    restarts its error feedback, with a RuntimeWarning.

    Args:
        rank (int): r, the factors' rank: bytes per matrix (n + m) r
            instead of n m.
        start_iter (int): Iterations summed densely first (the first steps
            change fastest).
        error_feedback (bool): Add what compression lost to the next
            iteration's gradient (needed for the method's accuracy).
        min_compression_rate (float): A matrix is compressed only where
            n m >= rate (n + m) r.
        warm_start (bool): Start each iteration's Q from the last one's.
        seed (int): The random Qs' seed (non-negative), the same on every
            rank.

    Raises:
        ValueError: an argument out of range.

    Example:

    .. code-block:: python

        solver = nncomm.DistributedSolver(
            S.Momentum(0.05, 0.9), comm,
            hook=nncomm.hooks.PowerSGD(rank=2, start_iter=10))
    """

    def __init__(self, rank=1, start_iter=10, error_feedback=True,
                 min_compression_rate=2.0, warm_start=True, seed=0):
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"rank must be a positive int, not {rank!r}")
        if not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"start_iter must be a non-negative int, not "
                             f"{start_iter!r}")
        if not min_compression_rate > 0:
            raise ValueError(f"min_compression_rate must be positive, not "
                             f"{min_compression_rate!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, not "
                             f"{seed!r}")
        self.rank = rank
        self.start_iter = start_iter
        self.error_feedback = bool(error_feedback)
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = bool(warm_start)
        self.seed = seed
        self.iteration = 0
        self._buckets = {}  # (index, layout) -> _BucketState

    def __call__(self, bucket):
        if self.iteration < self.start_iter:
            bucket.all_reduce(bucket.buffer)
        else:
            held = self._state(bucket)
            try:
                self._compress(bucket, held)
            except BaseException:
                held.restart()
                raise
        if bucket.is_last:
            self.iteration += 1

    def state(self, index):
        """The factors and residual of bucket `index` (for inspection).

        Args:
            index (int): The bucket's index.

        Returns:
            tuple: (list of each matrix's Q (m x r arrays: the last sum, or
            the first Q before one), the residual (a new array of the
            bucket's flat shape; None without error feedback)), or None
            before its first compressed iteration (for a hook unpickled,
            before its first iteration).
        """
        for (i, _), held in self._buckets.items():
            if i == index and isinstance(held, _BucketState):
                residual = None if held.kept is None else held.residual()
                return [(m.qt if m.qt_last is None else m.qt_last).T
                        for m in held.matrices], residual
        return None

    def __getstate__(self):
        """For pickle, as a checkpoint: the settings, the iteration and each
        bucket's state, in host memory."""
        state = dict(self.__dict__)
        state["_buckets"] = {key: held.saved() if isinstance(
            held, _BucketState) else held
            for key, held in self._buckets.items()}
        return state

    def _state(self, bucket):
        layout = tuple((g.index, g.start, g.count) for g in bucket.gradients)
        key = (bucket.index, layout)
        held = self._buckets.get(key)
        if not isinstance(held, _BucketState):
            saved = held
            held = self._new_state(bucket)
            self._buckets[key] = held
            if saved is not None and not held.restore(saved):
                warnings.warn(
                    f"nncomm.hooks.PowerSGD: bucket {bucket.index}'s state "
                    f"was saved by group rank {saved.rank} of {saved.size} "
                    f"and loaded on rank {bucket.rank} of {bucket.size}: "
                    f"its Qs go on, its error feedback restarts (each "
                    f"rank's is its own: save and load the hook on every "
                    f"rank)", RuntimeWarning)
        for k, m in enumerate(held.matrices):
            # Drawn until a step has summed a Q (and at every step without
            # a warm start), from the step and the matrix alone: a rank
            # whose hook missed a step that failed draws what the others
            # draw.
            if m.qt_last is None or not self.warm_start:
                m.qt[...] = held.xp.asarray(self._draw_t(
                    m.qt.shape, m.qt.dtype, bucket.index, k))
        return held

    def _draw_t(self, shape, dtype, index, k):
        """The random Q^T (r x m) of matrix `k` of bucket `index` at this
        iteration: drawn as Q (m x r)."""
        rng = np.random.default_rng((self.seed, self.iteration, index, k))
        return rng.standard_normal(shape[::-1]).astype(dtype).T

    def _new_state(self, bucket):
        xp = _array_module(bucket, "PowerSGD")
        dtype = np.dtype(bucket.buffer.dtype)
        passes = _low_rank if xp is np and dtype == F32 and \
            self.rank <= _LOW_RANK_MAX_RANK else _ArrayPasses(xp)
        matrices = []
        dense = []
        for g in bucket.gradients:
            begin, n, m = _rows(g)
            r = min(self.rank, n, m)
            end = begin + n * m
            if r and n * m >= self.min_compression_rate * (n + m) * r:
                matrices.append(_Matrix(begin, n, m, xp.empty((r, m),
                                                              dtype)))
                dense += [np.arange(g.offset, begin),
                          np.arange(end, g.offset + g.count)]
            else:
                dense.append(np.arange(g.offset, g.offset + g.count))
        dense = np.concatenate(dense) if dense else np.zeros(0, np.int64)
        kept = xp.zeros(bucket.buffer.shape, dtype) \
            if self.error_feedback else None
        return _BucketState(matrices, xp.asarray(dense), kept, xp, passes,
                            bucket.rank, bucket.size)

    def _compress(self, bucket, held):
        xp = held.xp
        passes = held.passes
        flat = xp.asarray(bucket.buffer)

        def matrix(buffer, x):
            if buffer is None:
                return None
            return buffer[x.offset:x.offset + x.n * x.m].reshape(x.n, x.m)

        views = [(matrix(flat, x), matrix(held.kept, x))
                 for x in held.matrices]
        # The dense elements and every P in one message.
        message = xp.empty(held.dense.size + sum(x.n * x.qt.shape[0]
                                                 for x in held.matrices),
                           flat.dtype)
        message[:held.dense.size] = flat[held.dense]
        ps = []
        at = held.dense.size
        for x, (view, m) in zip(held.matrices, views):
            p = message[at:at + x.n * x.qt.shape[0]].reshape(x.n, -1)
            passes.project(view, m, *x.last(), 1.0 / bucket.size, x.qt, p)
            ps.append(p)
            at += p.size
        bucket.all_reduce(message)
        flat[held.dense] = message[:held.dense.size]
        if not held.matrices:
            return
        qts = xp.empty(sum(x.qt.size for x in held.matrices), flat.dtype)
        at = 0
        for x, (view, m), p in zip(held.matrices, views, ps):
            # numpy's QR has no float16.
            p[...] = xp.linalg.qr(p.astype(np.promote_types(p.dtype, F32),
                                           copy=False))[0]
            qt = qts[at:at + x.qt.size].reshape(x.qt.shape)
            passes.back_project(view, m, p, qt)
            at += qt.size
        bucket.all_reduce(qts)
        at = 0
        for x, (view, _), p in zip(held.matrices, views, ps):
            qt = qts[at:at + x.qt.size].reshape(x.qt.shape)
            at += qt.size
            passes.expand(view, p, qt)
            x.keep(p, qt, held.kept is not None, self.warm_start)


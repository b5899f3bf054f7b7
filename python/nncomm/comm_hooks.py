"""Built-in bucket hooks (``hook=`` of ``all_reduce_callback``,
``gradient_reducer`` and :class:`nncomm.DistributedSolver`): the 16-bit wire
dtypes, and PowerSGD (Vogels et al., NeurIPS 2019), as PyTorch DDP's
``ddp_comm_hooks`` give them. Import them from :mod:`nncomm.hooks`.
On GPU buckets they work on the device through CuPy."""
import numpy as np

F32 = np.float32


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
    the flat buffer (`offset`, n x m elements) and its Q, kept between
    iterations."""

    def __init__(self, offset, n, m, q):
        self.offset = offset
        self.n = n
        self.m = m
        self.q = q


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


class _BucketState:
    """What PowerSGD keeps of one bucket: its matrices, the elements sent
    densely, the residual of error feedback (None without it), and the
    array module they are arrays of (numpy, or CuPy on a device)."""

    def __init__(self, matrices, dense, residual, xp):
        self.matrices = matrices
        self.dense = dense  # indices into the flat buffer
        self.residual = residual
        self.xp = xp


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
    random (the same seed on every rank) and, with `warm_start`, starts
    the next iteration from this one's (one power iteration per step then
    refines the same subspace). Before `start_iter` every bucket is summed
    densely, as without a hook. On GPU buckets it computes on the device
    with CuPy (Q drawn on the host from the same seed).

    Its state (Q and the residual per bucket) is allocated at a bucket's
    first compressed iteration and reused; one hook object serves one
    reduction (a callback, reducer or solver) of one set of gradients.

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
        seed (int): The random Q's seed, the same on every rank.

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
        self.rank = rank
        self.start_iter = start_iter
        self.error_feedback = bool(error_feedback)
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = bool(warm_start)
        self.iteration = 0
        self._rng = np.random.default_rng(seed)
        self._buckets = {}  # (index, layout) -> _BucketState

    def __call__(self, bucket):
        if self.iteration < self.start_iter:
            bucket.all_reduce(bucket.buffer)
        else:
            self._compress(bucket, self._state(bucket))
        if bucket.is_last:
            self.iteration += 1

    def state(self, index):
        """The factors and residual of bucket `index` (for inspection).

        Args:
            index (int): The bucket's index.

        Returns:
            tuple: (list of each matrix's Q (m x r arrays), the residual
            (the bucket's flat shape; None without error feedback)), or
            None before its first compressed iteration.
        """
        for (i, _), kept in self._buckets.items():
            if i == index:
                return [m.q for m in kept.matrices], kept.residual
        return None

    def _state(self, bucket):
        layout = tuple((g.index, g.start, g.count) for g in bucket.gradients)
        key = (bucket.index, layout)
        kept = self._buckets.get(key)
        if kept is None:
            kept = self._new_state(bucket)
            self._buckets[key] = kept
        elif not self.warm_start:
            for m in kept.matrices:
                m.q[...] = kept.xp.asarray(self._draw(m.q.shape, m.q.dtype))
        return kept

    def _draw(self, shape, dtype):
        return self._rng.standard_normal(shape).astype(dtype)

    def _new_state(self, bucket):
        xp = _array_module(bucket, "PowerSGD")
        dtype = np.dtype(bucket.buffer.dtype)
        matrices = []
        dense = []
        for g in bucket.gradients:
            begin, n, m = _rows(g)
            r = min(self.rank, n, m)
            end = begin + n * m
            if r and n * m >= self.min_compression_rate * (n + m) * r:
                q = xp.asarray(self._draw((m, r), dtype))
                matrices.append(_Matrix(begin, n, m, q))
                dense += [np.arange(g.offset, begin),
                          np.arange(end, g.offset + g.count)]
            else:
                dense.append(np.arange(g.offset, g.offset + g.count))
        dense = np.concatenate(dense) if dense else np.zeros(0, np.int64)
        residual = xp.zeros(bucket.buffer.shape, dtype) \
            if self.error_feedback else None
        return _BucketState(matrices, xp.asarray(dense), residual, xp)

    def _compress(self, bucket, kept):
        xp = kept.xp
        flat = xp.asarray(bucket.buffer)
        if kept.residual is not None:
            flat += kept.residual
        views = [flat[x.offset:x.offset + x.n * x.m].reshape(x.n, x.m)
                 for x in kept.matrices]
        # The dense elements and every P in one message.
        message = xp.empty(kept.dense.size + sum(x.n * x.q.shape[1]
                                                 for x in kept.matrices),
                           flat.dtype)
        message[:kept.dense.size] = flat[kept.dense]
        ps = []
        at = kept.dense.size
        for x, view in zip(kept.matrices, views):
            p = message[at:at + x.n * x.q.shape[1]].reshape(x.n, -1)
            xp.matmul(view, x.q, out=p)
            ps.append(p)
            at += p.size
        bucket.all_reduce(message)
        flat[kept.dense] = message[:kept.dense.size]
        if not kept.matrices:
            return
        qs = xp.empty(sum(x.q.size for x in kept.matrices), flat.dtype)
        at = 0
        for x, view, p in zip(kept.matrices, views, ps):
            # numpy's QR has no float16.
            p[...] = xp.linalg.qr(p.astype(np.promote_types(p.dtype, F32),
                                           copy=False))[0]
            q = qs[at:at + x.q.size].reshape(x.q.shape)
            xp.matmul(view.T, p, out=q)
            at += q.size
        bucket.all_reduce(qs)
        at = 0
        for x, view, p in zip(kept.matrices, views, ps):
            x.q[...] = qs[at:at + x.q.size].reshape(x.q.shape)
            at += x.q.size
            if kept.residual is not None:
                # M (this rank's) less the estimate of the mean, written
                # where the residual lives: no temporary of M's size.
                region = kept.residual[x.offset:x.offset + x.n * x.m]
                region = region.reshape(x.n, x.m)
                xp.matmul(p / bucket.size, x.q.T, out=region)
                xp.subtract(view, region, out=region)
            xp.matmul(p, x.q.T, out=view)

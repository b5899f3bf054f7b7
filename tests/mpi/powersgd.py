"""nncomm.hooks.PowerSGD against a numpy reference of the same algorithm,
computed in float64 from every rank's gradients (each rank rebuilds them),
with the same seed and order of the random Qs. The reference is given the
buckets' layout (what each bucket's BucketGradients say) and nothing else:

- over five iterations, with start_iter=2: the first two are the dense sum,
  bitwise what a reducer without a hook gives; then the gradients, each
  matrix's Q and this rank's residual follow the reference (error feedback
  and warm start exercised), for rank 1 with error feedback and warm start
  and rank 2 without either; in one bucket, and in buckets of 100 elements,
  which split the matrices: each bucket's whole rows are a matrix;
- when rank 1's hook raises at one iteration (the first compressed one,
  or a later one), the other ranks' in its first collective: that
  iteration raises BucketHookError everywhere, the ranks whose PowerSGD
  was interrupted restart their residuals at zero, no Q moves, and the
  next iterations follow the reference (with and without a warm start);
- in float16 buckets (numpy's QR has none: it runs in float32), as in
  float32 ones within float16's rounding;
- a hook pickled between compressed iterations and unpickled (a
  checkpoint) goes on bitwise as the one never stopped;
- the elements of no matrix (vectors, partial rows, matrices too small for
  factors to save bytes: 3 x 2, and 6 x 10 at rank 2) are bitwise the
  dense sum at every iteration; the others are not.
"""
import pickle

import numpy as np

import nncomm
from _harness import Checker, contribution, make_comm, nd, set_grad

F32 = np.float32
SHAPES = [(20, 12), (12,), (6, 5, 2), (3, 2)]
ITERATIONS = 5
START = 2
SEED = 5


def grad(rank, it, i):
    return contribution(f"powersgd{it}-{i}", rank, SHAPES[i], F32, "rand")


def matrices(layout, rank):
    """(offset in the bucket, n, m, gradient, first element) of each matrix
    of a bucket of `layout` (its BucketGradients) at factor rank `rank`:
    the rows of each gradient of 2+ dimensions that it holds whole, where
    n m >= 2 (n + m) r."""
    found = []
    for g in layout:
        if len(g.shape) < 2:
            continue
        m = int(np.prod(g.shape[1:]))
        first = -(-g.start // m)
        n = (g.start + g.count) // m - first
        r = min(rank, n, m)
        if n > 0 and n * m >= 2.0 * (n + m) * r:
            found.append((g.offset + first * m - g.start, n, m, g.index,
                          first * m))
    return found


def draw(it, b, k, m, r):
    """Matrix k of bucket b's random Q at the hook's iteration `it`."""
    rng = np.random.default_rng((SEED, it, b, k))
    return rng.standard_normal((m, r)).astype(F32).astype(np.float64)


def reference(size, rank, layouts, error_feedback, warm_start, failed=None,
              restarted=()):
    """Per iteration, the mean per gradient (None at iteration `failed`,
    whose hooks fail: the ranks in `restarted` were in the middle of
    theirs, and start their residuals afresh); at the end, the Qs of
    bucket 0 and every rank's residual of it."""
    qs, residuals = {}, {}
    results = []
    done = 0  # the hook's count: iterations it finished
    for it in range(ITERATIONS):
        if it == failed:
            for key in list(residuals):
                if key[2] in restarted:
                    residuals[key] = 0
            results.append(None)
            continue
        grads = [[grad(r, it, i).astype(np.float64).reshape(-1)
                  for i in range(len(SHAPES))] for r in range(size)]
        means = [sum(g[i] for g in grads) / size for i in range(len(SHAPES))]
        for b, layout in enumerate(layouts if done >= START else []):
            flats = [np.concatenate([grads[r][g.index][g.start:g.start +
                                                       g.count]
                                     for g in layout]) for r in range(size)]
            for k, (offset, n, m, i, first) in enumerate(
                    matrices(layout, rank)):
                r_ = min(rank, n, m)
                if (b, k) not in qs or not warm_start:
                    qs[(b, k)] = draw(done, b, k, m, r_)
                ms = [flats[r][offset:offset + n * m].reshape(n, m) +
                      residuals.get((b, k, r), 0) for r in range(size)]
                p = np.linalg.qr(sum(x @ qs[(b, k)] for x in ms))[0]
                qs[(b, k)] = sum(x.T @ p for x in ms)
                estimate = p @ qs[(b, k)].T
                if error_feedback:
                    for r in range(size):
                        residuals[(b, k, r)] = ms[r] - estimate / size
                means[i][first:first + n * m] = (estimate / size).reshape(-1)
        results.append([x.reshape(s) for x, s in zip(means, SHAPES)])
        done += 1
    return results, qs, residuals


class Layouts:
    """Wraps a hook, recording each bucket's BucketGradients."""

    def __init__(self, hook):
        self.hook = hook
        self.seen = {}

    def __call__(self, bucket):
        self.seen[bucket.index] = list(bucket.gradients)
        return self.hook(bucket)


class FailsOnce:
    """Wraps a hook: on rank `rank`, at iteration `failed`, raises instead
    of calling it (the other ranks' hooks then fail in their collectives)."""

    def __init__(self, hook, rank, failed):
        self.hook = hook
        self.rank = rank
        self.failed = failed
        self.iteration = 0

    def __call__(self, bucket):
        try:
            if self.iteration == self.failed and bucket.rank == self.rank:
                raise RuntimeError("a hook failing on purpose")
            return self.hook(bucket)
        finally:
            if bucket.is_last:
                self.iteration += 1


class Resumed:
    """Wraps a hook: before iteration `at`, it is replaced by its pickled
    copy, as a job restarted from a checkpoint would make it."""

    def __init__(self, hook, at):
        self.hook = hook
        self.at = at
        self.iteration = 0
        self.copied = False

    def __call__(self, bucket):
        if self.iteration == self.at and not self.copied:
            self.hook = pickle.loads(pickle.dumps(self.hook))
            self.copied = True
        self.hook(bucket)
        if bucket.is_last:
            self.iteration += 1


def check_resumed(ck, comm):
    """A hook pickled between two compressed iterations goes on bitwise
    as the one never stopped, on every rank (each its own M)."""
    def hook():
        return nncomm.hooks.PowerSGD(rank=2, start_iter=START, seed=SEED)

    for pack_size in (1 << 20, 100):
        whole = run(comm, hook(), pack_size)
        resumed = run(comm, Resumed(hook(), START + 1), pack_size)
        ck.true(all(np.array_equal(a, b) for it in range(ITERATIONS)
                    for a, b in zip(whole[it], resumed[it])),
                f"pack {pack_size}: resumed from a pickle, as never stopped")


def run(comm, hook, pack_size, wire_dtype=None, failed=None):
    """Each iteration's reduced gradients; None at iteration `failed`,
    which must raise BucketHookError."""
    grads = [nd(np.zeros(s, F32)) for s in SHAPES]
    reducer = comm.gradient_reducer(grads, pack_size, division=True,
                                    hook=hook, wire_dtype=wire_dtype)
    results = []
    for it in range(ITERATIONS):
        for i in range(len(SHAPES)):
            set_grad(grads[i], grad(comm.rank, it, i))
        try:
            with reducer:
                pass
        except nncomm.BucketHookError:
            if it != failed:
                raise
            results.append(None)
            continue
        assert it != failed, f"iteration {it} did not fail"
        results.append([np.array(g.data) for g in grads])
    return results


def compressed_elements(layouts, rank):
    """Per gradient, a mask of the elements some matrix holds."""
    masks = [np.zeros(int(np.prod(s)), bool) for s in SHAPES]
    for layout in layouts:
        for _, n, m, i, first in matrices(layout, rank):
            masks[i][first:first + n * m] = True
    return [mask.reshape(s) for mask, s in zip(masks, SHAPES)]


def check(ck, comm, rank, error_feedback, warm_start, pack_size,
          failed=None):
    """With `failed`, world rank 1's hook raises at that iteration: the
    others' PowerSGD is interrupted in its first collective."""
    what = (f"rank {rank} ef={error_feedback} warm={warm_start} "
            f"pack={pack_size} failed={failed}")
    hook = nncomm.hooks.PowerSGD(rank=rank, start_iter=START,
                                 error_feedback=error_feedback,
                                 warm_start=warm_start, seed=SEED)
    recorded = Layouts(hook if failed is None else
                       FailsOnce(hook, 1, failed))
    got = run(comm, recorded, pack_size, failed=failed)
    dense = run(comm, None, pack_size)
    layouts = [recorded.seen[b] for b in sorted(recorded.seen)]
    expected, qs, residuals = reference(
        comm.size, rank, layouts, error_feedback, warm_start, failed,
        set(range(comm.size)) - {1})
    masks = compressed_elements(layouts, rank)
    ck.true(masks[0].any() and not masks[1].any() and not masks[3].any(),
            f"{what}: which gradients are matrices")
    for it in range(ITERATIONS):
        if it == failed:
            continue
        for i in range(len(SHAPES)):
            where = f"{what}: iteration {it}, gradient {i}"
            done = it - (failed is not None and it > failed)
            mask = masks[i] if done >= START else np.zeros(SHAPES[i], bool)
            ck.true(np.array_equal(got[it][i][~mask], dense[it][i][~mask]),
                    f"{where}: dense, as without a hook")
            if not mask.any():
                continue
            want = expected[it][i][mask]
            ck.true(np.allclose(got[it][i][mask], want, rtol=0,
                                atol=1e-4 * np.abs(want).max()),
                    f"{where}: factors",
                    f"{np.abs(got[it][i][mask] - want).max()} off")
            ck.true(not np.allclose(got[it][i][mask], dense[it][i][mask],
                                    rtol=1e-3),
                    f"{where}: compressed, not dense")
    kept_qs, kept_residual = hook.state(0)
    blocks = matrices(layouts[0], rank)
    ck.equal(len(kept_qs), len(blocks), f"{what}: a Q per matrix")
    for k, q in enumerate(kept_qs):
        ck.true(np.allclose(q, qs[(0, k)], rtol=0,
                            atol=1e-4 * np.abs(qs[(0, k)]).max()),
                f"{what}: bucket 0's Q {k}",
                f"{np.abs(q - qs[(0, k)]).max()} off")
    ck.equal(kept_residual is None, not error_feedback,
             f"{what}: a residual with error feedback")
    if error_feedback:
        outside = np.ones(kept_residual.size, bool)
        for k, (offset, n, m, _, _) in enumerate(blocks):
            mine = kept_residual[offset:offset + n * m]
            outside[offset:offset + n * m] = False
            want = residuals[(0, k, comm.rank)].reshape(-1)
            ck.true(np.allclose(mine, want, rtol=0,
                                atol=1e-4 * np.abs(want).max()),
                    f"{what}: bucket 0's residual {k}",
                    f"{np.abs(mine - want).max()} off")
        ck.true(not kept_residual[outside].any(),
                f"{what}: no residual outside the matrices")


def check_half(ck, comm):
    """float16 buckets: as float32's, within float16's rounding."""
    half, single = (run(comm, nncomm.hooks.PowerSGD(rank=2, start_iter=0,
                                                    seed=SEED), 1 << 20, w)
                    for w in ("float16", None))
    for i in range(len(SHAPES)):
        scale = np.abs(single[-1][i]).max()
        ck.true(np.allclose(half[-1][i], single[-1][i], rtol=0,
                            atol=0.02 * scale), f"float16 gradient {i}",
                f"{np.abs(half[-1][i] - single[-1][i]).max()} of {scale}")


def main():
    ck = Checker("powersgd")
    comm, _ = make_comm()
    for pack_size in (1 << 20, 100):
        check(ck, comm, 1, True, True, pack_size)
        check(ck, comm, 2, False, False, pack_size)
    # A failure at the first compressed step, and after an estimate.
    check(ck, comm, 1, True, True, 1 << 20, failed=START)
    check(ck, comm, 3, True, False, 1 << 20, failed=START + 1)
    check(ck, comm, 2, True, True, 1 << 20, failed=START + 1)
    check_half(ck, comm)
    check_resumed(ck, comm)
    ck.raises(ValueError, "rank", "rank 0", nncomm.hooks.PowerSGD, rank=0)
    ck.raises(ValueError, "start_iter", "a negative start",
              nncomm.hooks.PowerSGD, start_iter=-1)
    ck.finish()


if __name__ == "__main__":
    main()

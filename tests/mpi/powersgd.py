"""nncomm.hooks.PowerSGD against a numpy reference of the same algorithm,
computed in float64 from every rank's gradients (each rank rebuilds them),
with the same seed and order of the random Qs:

- over five iterations, with start_iter=2: the first two are the dense sum,
  bitwise what a reducer without a hook gives; then the gradients, each
  matrix's Q and this rank's residual follow the reference (error feedback
  and warm start exercised), for rank 1 with error feedback and warm start
  and rank 2 without either;
- vectors, matrices too small for factors to save bytes (at rank 2, a
  6 x 10 matrix) and gradients split between buckets travel densely:
  bitwise the dense sum at every iteration.
"""
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


def compressed(rank):
    """The gradients reduced as factors at factor rank `rank`, in the order
    the bucket holds them (the reverse of the list's, as planned)."""
    found = []
    for i in reversed(range(len(SHAPES))):
        shape = SHAPES[i]
        if len(shape) < 2:
            continue
        n, m = shape[0], int(np.prod(shape[1:]))
        r = min(rank, n, m)
        if n * m >= 2.0 * (n + m) * r:
            found.append(i)
    return found


def reference(size, rank, error_feedback, warm_start):
    """Per iteration, the mean the ranks get per gradient; and at the end,
    each matrix's Q and every rank's residual."""
    rng = np.random.default_rng(SEED)
    matrices = compressed(rank)
    dims = {i: (SHAPES[i][0], int(np.prod(SHAPES[i][1:]))) for i in matrices}
    qs = {i: rng.standard_normal((dims[i][1], min(rank, *dims[i])))
          .astype(F32).astype(np.float64) for i in matrices}
    residual = {(r, i): np.zeros(dims[i]) for r in range(size)
                for i in matrices}
    results = []
    for it in range(ITERATIONS):
        grads = [[grad(r, it, i).astype(np.float64) for i in
                  range(len(SHAPES))] for r in range(size)]
        means = [sum(g[i] for g in grads) / size for i in range(len(SHAPES))]
        if it >= START:
            if it > START and not warm_start:
                for i in matrices:
                    qs[i] = rng.standard_normal(qs[i].shape).astype(
                        F32).astype(np.float64)
            for i in matrices:
                ms = [grads[r][i].reshape(dims[i]) + residual[(r, i)]
                      for r in range(size)]
                p = np.linalg.qr(sum(m @ qs[i] for m in ms))[0]
                qs[i] = sum(m.T @ p for m in ms)
                estimate = p @ qs[i].T
                for r in range(size):
                    if error_feedback:
                        residual[(r, i)] = ms[r] - estimate / size
                means[i] = (estimate / size).reshape(SHAPES[i])
        results.append(means)
    return results, qs, residual


def run(comm, hook, pack_size):
    grads = [nd(np.zeros(s, F32)) for s in SHAPES]
    reducer = comm.gradient_reducer(grads, pack_size, division=True,
                                    hook=hook)
    results = []
    for it in range(ITERATIONS):
        for i in range(len(SHAPES)):
            set_grad(grads[i], grad(comm.rank, it, i))
        with reducer:
            pass
        results.append([np.array(g.data) for g in grads])
    return results


def check(ck, comm, rank, error_feedback, warm_start):
    what = f"rank {rank} ef={error_feedback} warm={warm_start}"
    hook = nncomm.hooks.PowerSGD(rank=rank, start_iter=START,
                                 error_feedback=error_feedback,
                                 warm_start=warm_start, seed=SEED)
    got = run(comm, hook, 1 << 20)
    dense = run(comm, None, 1 << 20)
    expected, qs, residual = reference(comm.size, rank, error_feedback,
                                       warm_start)
    matrices = compressed(rank)
    for it in range(ITERATIONS):
        for i in range(len(SHAPES)):
            where = f"{what}: iteration {it}, gradient {i}"
            if it < START or i not in matrices:
                ck.true(np.array_equal(got[it][i], dense[it][i]),
                        f"{where}: dense, as without a hook")
                continue
            scale = np.abs(expected[it][i]).max()
            ck.true(np.allclose(got[it][i], expected[it][i], rtol=0,
                                atol=1e-4 * scale), f"{where}: factors",
                    f"{np.abs(got[it][i] - expected[it][i]).max()} off")
            ck.true(not np.allclose(got[it][i], dense[it][i], rtol=1e-3),
                    f"{where}: compressed, not dense")
    kept_qs, kept_residual = hook.state(0)
    ck.equal(len(kept_qs), len(matrices), f"{what}: a Q per matrix")
    for q, i in zip(kept_qs, matrices):
        ck.true(np.allclose(q, qs[i], rtol=0, atol=1e-4 * np.abs(qs[i]).max()),
                f"{what}: gradient {i}'s Q",
                f"{np.abs(q - qs[i]).max()} off")
    ck.equal(kept_residual is None, not error_feedback,
             f"{what}: a residual with error feedback")
    if error_feedback:
        offset = 0
        for i in reversed(range(len(SHAPES))):
            count = int(np.prod(SHAPES[i]))
            mine = kept_residual[offset:offset + count]
            offset += count
            if i not in matrices:
                ck.true(not mine.any(), f"{what}: no residual for {i}")
                continue
            want = residual[(comm.rank, i)].reshape(-1)
            ck.true(np.allclose(mine, want, rtol=0,
                                atol=1e-4 * np.abs(want).max()),
                    f"{what}: gradient {i}'s residual",
                    f"{np.abs(mine - want).max()} off")


def check_split(ck, comm):
    """Every gradient split between buckets of 50 elements, or a vector, or
    small: all dense."""
    hook = nncomm.hooks.PowerSGD(rank=1, start_iter=0, seed=SEED)
    got = run(comm, hook, 50)
    dense = run(comm, None, 50)
    for it in range(ITERATIONS):
        for i in range(len(SHAPES)):
            ck.true(np.array_equal(got[it][i], dense[it][i]),
                    f"split buckets: iteration {it}, gradient {i} dense")


def main():
    ck = Checker("powersgd")
    comm, _ = make_comm()
    check(ck, comm, 1, True, True)
    check(ck, comm, 2, False, False)
    check_split(ck, comm)
    ck.raises(ValueError, "rank", "rank 0", nncomm.hooks.PowerSGD, rank=0)
    ck.raises(ValueError, "start_iter", "a negative start",
              nncomm.hooks.PowerSGD, start_iter=-1)
    ck.finish()


if __name__ == "__main__":
    main()

"""PowerSGD's passes over float32 host gradients: nncomm's C++
(``nncomm._low_rank``) against the same passes as numpy array operations
(``nncomm.comm_hooks._ArrayPasses``, which 16-bit and GPU buckets take),
in one run, in one process; neither MPI nor nnabla is needed:

    OMP_NUM_THREADS=1 python bench/powersgd_passes_bench.py

The gradients: compression_bench.py's 8 matrices of 2048 x 2048 (33.6 M
float32), with error feedback and a last estimate (a step after the
first). Per factor rank r: the best of ``--repeat`` times of each pass over
all 8 (project: M and P = M Q; back-project: Q = M^T P; expand: P Q^T),
their sum, and numpy's over nncomm's; and one copy of the gradients (``np.copyto``
into a buffer of their size) as the unit of memory traffic: the three
passes move 5 such gradients' worth of bytes (read G and M, write M; read
M; write G), a copy 2.
"""
import argparse
import time

import numpy as np

from nncomm import _low_rank
from nncomm.comm_hooks import _ArrayPasses

F32 = np.float32


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def passes_ms(passes, matrices, r, repeat, seed):
    rng = np.random.default_rng(seed)
    n, m = matrices[0].shape
    kept = [rng.standard_normal((n, m)).astype(F32) for _ in matrices]
    p_last = np.linalg.qr(rng.standard_normal((n, r)))[0].astype(F32)
    qt_last = rng.standard_normal((r, m)).astype(F32)
    p = np.empty((n, r), F32)
    qt = np.empty((r, m), F32)
    scratch = [g.copy() for g in matrices]  # _ArrayPasses writes into G
    project = best(lambda: [passes.project(g, k, p_last, qt_last, 0.5,
                                           qt_last, p)
                            for g, k in zip(scratch, kept)], repeat)
    back = best(lambda: [passes.back_project(g, k, p, qt)
                         for g, k in zip(scratch, kept)], repeat)
    expand = best(lambda: [passes.expand(g, p_last, qt_last)
                           for g in scratch], repeat)
    return project, back, expand


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--matrices", type=int, default=8)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    matrices = [rng.standard_normal((args.size, args.size)).astype(F32)
                for _ in range(args.matrices)]
    flat = np.concatenate([g.reshape(-1) for g in matrices])
    out = np.empty_like(flat)
    copy = best(lambda: np.copyto(out, flat), args.repeat)
    print(f"# {args.matrices} matrices {args.size} x {args.size} "
          f"({flat.size / 1e6:.1f} M float32); one copy of them: "
          f"{copy:.1f} ms")
    print("| r | passes | project ms | back-project ms | expand ms | "
          "total ms | total / copy | numpy / nncomm |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in args.ranks:
        totals = {}
        for name, passes in (("nncomm", _low_rank),
                             ("numpy", _ArrayPasses(np))):
            times = passes_ms(passes, matrices, r, args.repeat, r)
            totals[name] = sum(times)
            ratio = totals[name] / totals["nncomm"]
            print(f"| {r} | {name} | " +
                  " | ".join(f"{t:.1f}" for t in times) +
                  f" | {totals[name]:.1f} | {totals[name] / copy:.2f} | "
                  f"{ratio:.2f} |")


if __name__ == "__main__":
    main()

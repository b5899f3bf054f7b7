"""All-reduce throughput and latency: nncomm against raw mpi4py.

Run with two ranks:

    .venv/bin/mpiexec -n 2 .venv/bin/python bench/allreduce_bench.py

For each size (float32 unless ``--dtype`` says otherwise, 4 KiB to 64 MiB)
it times, in the same run and
interleaved round by round so that machine noise hits both alike:

- ``raw``: ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)`` on a numpy array,
- ``raw@nd``: the same call on a numpy view of an nnabla NdArray's memory,
- ``nncomm``: ``comm.all_reduce(x)`` on an NdArray (``inplace=False``).

Each figure is the best of ``--rounds`` rounds. Bus bandwidth follows
nccl-tests: ``bytes / time * 2 (n - 1) / n``. ``ratio`` is nncomm's bus
bandwidth over raw's (above 1: nncomm is faster); ``lat x`` is nncomm's
latency over raw's.

``--dtype float16`` measures the host's half-precision sums (mpich reduces
float16 natively, so ``raw`` stays a fair baseline); nncomm's build needs the
CPU's F16C instructions for them (setup.py adds ``-mf16c`` where it can).

``--csv PATH`` also writes the figures, one row per size and method (columns
bytes, method, seconds, busbw_gbps, dtype, ranks), for ``bench/plot.py``.
"""
import argparse
import csv
import ctypes
import time

import nnabla as nn
import numpy as np
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 32 << 20, 64 << 20]


def best_seconds(fn, iters, world):
    world.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters
    # Every rank reports the slowest rank's time, as a collective finishes
    # only when its last rank does.
    return world.allreduce(elapsed, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.05,
                        help="seconds per measurement (sets iterations)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES,
                        help="message sizes in bytes")
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "float16"])
    parser.add_argument("--csv", metavar="PATH",
                        help="also write the figures to this CSV file")
    args = parser.parse_args()

    ctx = get_extension_context("cpu")
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    world = MPI.COMM_WORLD
    n = world.size
    if comm.rank == 0:
        print(f"# {n} ranks, {args.dtype}, best of {args.rounds} rounds")
        print(f"{'bytes':>10} {'raw us':>9} {'raw GB/s':>9} {'raw@nd GB/s':>11} "
              f"{'nncomm us':>10} {'nncomm GB/s':>11} {'ratio':>6} {'lat x':>6}")
    rows = []
    for nbytes in args.sizes:
        dtype = np.dtype(args.dtype)
        count = nbytes // dtype.itemsize
        a = np.ones(count, dtype)
        x = nn.NdArray.from_numpy_array(np.ones(count, dtype))
        address = x.data_ptr(dtype, ctx)
        view = np.frombuffer(
            (ctypes.c_char * nbytes).from_address(address), dtype)
        methods = {
            "raw": lambda: world.Allreduce(MPI.IN_PLACE, a),
            "raw@nd": lambda: world.Allreduce(MPI.IN_PLACE, view),
            "nncomm": lambda: comm.all_reduce(x),
        }
        one = best_seconds(methods["raw"], 3, world)
        iters = max(3, int(args.budget / max(one, 1e-7)))
        best = {name: float("inf") for name in methods}
        for _ in range(args.rounds):
            for name, fn in methods.items():
                best[name] = min(best[name], best_seconds(fn, iters, world))
        busbw = {k: nbytes / t * 2 * (n - 1) / n / 1e9 for k, t in best.items()}
        if comm.rank == 0:
            print(f"{nbytes:>10} {best['raw'] * 1e6:>9.1f} {busbw['raw']:>9.2f} "
                  f"{busbw['raw@nd']:>11.2f} {best['nncomm'] * 1e6:>10.1f} "
                  f"{busbw['nncomm']:>11.2f} "
                  f"{busbw['nncomm'] / busbw['raw']:>6.2f} "
                  f"{best['nncomm'] / best['raw']:>6.2f}", flush=True)
        rows += [[nbytes, name, best[name], busbw[name], args.dtype, n]
                 for name in methods]
    if args.csv and comm.rank == 0:
        with open(args.csv, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["bytes", "method", "seconds", "busbw_gbps",
                          "dtype", "ranks"])
            out.writerows(rows)


if __name__ == "__main__":
    main()

"""Collective throughput and latency: nncomm against raw mpi4py.

Run with two ranks:

    .venv/bin/mpiexec -n 2 .venv/bin/python bench/allreduce_bench.py \\
        [--collectives all_reduce bcast all_gather]

For each collective (all_reduce unless ``--collectives`` names others; one
table each) and each size (float32 unless ``--dtype`` says otherwise, 4 KiB
to 64 MiB) it times, in the same run and interleaved round by round so that
machine noise hits all alike:

- ``raw``: mpi4py's call on numpy arrays: ``Allreduce(MPI.IN_PLACE, a)``,
  ``Bcast(a, root=0)`` or ``Allgather(a, b)``,
- ``raw@nd``: the same call on numpy views of nnabla NdArrays' memory,
- ``nncomm``: ``comm.all_reduce(x)`` (``inplace=False``),
  ``comm.bcast(x, 0)`` or ``comm.all_gather(x, y)`` on NdArrays, ``y`` one
  array of every rank's block.

A size is what each rank sends: ``b`` holds a block of it per rank. Each
figure is the best of ``--rounds`` rounds. Bus bandwidth follows
nccl-tests: ``bytes / time`` times ``2 (n - 1) / n`` for all_reduce, 1 for
bcast and ``n - 1`` for all_gather (nccl-tests' ``(n - 1) / n`` of the
``n`` blocks received). ``ratio`` is nncomm's bus bandwidth over raw's
(above 1: nncomm is faster), ``@nd`` over raw@nd's; ``lat x`` is nncomm's
latency over raw's.

``--dtype float16`` measures the host's half-precision sums (mpich reduces
float16 natively, so ``raw`` stays a fair baseline); nncomm's build needs the
CPU's F16C instructions for them (setup.py adds ``-mf16c`` where it can).

``--csv PATH`` also writes all_reduce's figures, one row per size and
method (columns bytes, method, seconds, busbw_gbps, dtype, ranks), for
``bench/plot.py``'s all-reduce picture; it is refused with other
collectives.
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

# Bus bandwidth over algorithm bandwidth (bytes / time), at n ranks.
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "bcast": lambda n: 1,
    "all_gather": lambda n: n - 1,
}


def best_seconds(fn, iters, world):
    world.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters
    # Every rank reports the slowest rank's time, as a collective finishes
    # only when its last rank does.
    return world.allreduce(elapsed, op=MPI.MAX)


def ndarray_and_view(count, dtype, ctx):
    """An NdArray of `count` ones and a numpy view of its memory."""
    x = nn.NdArray.from_numpy_array(np.ones(count, dtype))
    address = x.data_ptr(dtype, ctx)
    nbytes = count * dtype.itemsize
    view = np.frombuffer(
        (ctypes.c_char * nbytes).from_address(address), dtype)
    return x, view


def methods_of(collective, count, dtype, comm, ctx, world):
    """The three calls timed for `collective` on `count` elements."""
    n = world.size
    a = np.ones(count, dtype)
    x, view = ndarray_and_view(count, dtype, ctx)
    if collective == "all_reduce":
        return {
            "raw": lambda: world.Allreduce(MPI.IN_PLACE, a),
            "raw@nd": lambda: world.Allreduce(MPI.IN_PLACE, view),
            "nncomm": lambda: comm.all_reduce(x),
        }
    if collective == "bcast":
        return {
            "raw": lambda: world.Bcast(a, root=0),
            "raw@nd": lambda: world.Bcast(view, root=0),
            "nncomm": lambda: comm.bcast(x, 0),
        }
    b = np.ones(count * n, dtype)
    y, gathered = ndarray_and_view(count * n, dtype, ctx)
    return {
        "raw": lambda: world.Allgather(a, b),
        "raw@nd": lambda: world.Allgather(view, gathered),
        "nncomm": lambda: comm.all_gather(x, y),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.05,
                        help="seconds per measurement (sets iterations)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES,
                        help="message sizes in bytes")
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "float16"])
    parser.add_argument("--collectives", nargs="+", default=["all_reduce"],
                        choices=list(BUS_FACTORS),
                        help="the collectives to time, a table each")
    parser.add_argument("--csv", metavar="PATH",
                        help="also write all_reduce's figures to this CSV "
                        "file")
    args = parser.parse_args()
    if args.csv and args.collectives != ["all_reduce"]:
        parser.error("--csv writes all_reduce's figures only")

    ctx = get_extension_context("cpu")
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    world = MPI.COMM_WORLD
    n = world.size
    dtype = np.dtype(args.dtype)
    rows = []
    for collective in args.collectives:
        factor = BUS_FACTORS[collective](n)
        if comm.rank == 0:
            print(f"# {collective}, {n} ranks, {args.dtype}, "
                  f"best of {args.rounds} rounds")
            print(f"{'bytes':>10} {'raw us':>9} {'raw GB/s':>9} "
                  f"{'raw@nd GB/s':>11} {'nncomm us':>10} "
                  f"{'nncomm GB/s':>11} {'ratio':>6} {'@nd':>6} "
                  f"{'lat x':>6}")
        for nbytes in args.sizes:
            count = nbytes // dtype.itemsize
            methods = methods_of(collective, count, dtype, comm, ctx, world)
            one = best_seconds(methods["raw"], 3, world)
            iters = max(3, int(args.budget / max(one, 1e-7)))
            best = {name: float("inf") for name in methods}
            for _ in range(args.rounds):
                for name, fn in methods.items():
                    best[name] = min(best[name],
                                     best_seconds(fn, iters, world))
            busbw = {k: nbytes / t * factor / 1e9 for k, t in best.items()}
            if comm.rank == 0:
                print(f"{nbytes:>10} {best['raw'] * 1e6:>9.1f} "
                      f"{busbw['raw']:>9.2f} {busbw['raw@nd']:>11.2f} "
                      f"{best['nncomm'] * 1e6:>10.1f} "
                      f"{busbw['nncomm']:>11.2f} "
                      f"{busbw['nncomm'] / busbw['raw']:>6.2f} "
                      f"{busbw['nncomm'] / busbw['raw@nd']:>6.2f} "
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

"""What ``comm.join()`` costs: collectives inside a join scope while every
rank trains, and once the last rank has left and only takes part.

Run with two ranks:

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python \
        bench/join_bench.py

For each size, in one run and interleaved round by round, the mean time of
one ``comm.all_reduce`` of a float32 NdArray on world rank 0:

- ``plain``: outside any join scope;
- ``joined``: inside ``comm.join()``, no rank has left (goal: the same as
  ``plain``: no message, no collective, one ``MPI_Iprobe`` per operation);
- ``left``: inside ``comm.join()`` after the last rank left at once: it
  takes part, with zeros, from the descriptions rank 0 sends it.

It prints the medians over ``--rounds`` rounds and the ratios
``joined/plain`` and ``left/plain``.
"""
import argparse
import os
import statistics
import time

import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C


def timed(comm, array, calls):
    """Seconds per all_reduce of `array` on this rank, over `calls`."""
    for _ in range(min(calls, 10)):
        comm.all_reduce([array])
    start = time.perf_counter()
    for _ in range(calls):
        comm.all_reduce([array])
    return (time.perf_counter() - start) / calls


def one_round(comm, array, calls, kind):
    """One timing of `kind`: rank 0's seconds per call (None elsewhere)."""
    if kind == "plain":
        return timed(comm, array, calls)
    last = comm.size - 1
    with comm.join([]):
        if kind == "left" and comm.rank == last:
            return None
        return timed(comm, array, calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1, 16384, 1 << 20],
                        help="float32 elements per all_reduce")
    args = parser.parse_args()
    ctx = get_extension_context("cpu")
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    if comm.rank == 0:
        print(f"# {comm.size} ranks, load average %.2f %.2f %.2f"
              % os.getloadavg(), flush=True)
    kinds = ("plain", "joined", "left")
    for size in args.sizes:
        array = nn.NdArray.from_numpy_array(np.ones(size, np.float32))
        calls = max(20, min(2000, (64 << 20) // (size * 4 * 16)))
        times = {k: [] for k in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                seconds = one_round(comm, array, calls, kind)
                if comm.rank == 0:
                    times[kind].append(seconds)
        if comm.rank == 0:
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{size * 4:>9} B: plain {med['plain'] * 1e6:9.1f} us   "
                  f"joined {med['joined'] * 1e6:9.1f} us   "
                  f"left {med['left'] * 1e6:9.1f} us   "
                  f"joined/plain {med['joined'] / med['plain']:5.2f}   "
                  f"left/plain {med['left'] / med['plain']:5.2f}",
                  flush=True)


if __name__ == "__main__":
    main()

"""Per-call cost of nncomm's small host collectives, against mpi4py's own
Allreduce of one float in the same run.

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python \\
        bench/small_collectives_bench.py [--iters 20000] [--rounds 9]

Each collective runs `iters` times back to back on one-element NdArrays
(all_reduce also on a list of 16), after a barrier; a round's time is the
slowest rank's; the best of `rounds` rounds is printed, in microseconds per
call and as a ratio to mpi4py's Allreduce, the floor the binding adds to.
Only the public API is used, so the script times any build of nncomm that
PYTHONPATH puts first (e.g. an older commit built in a worktree).
"""
import argparse
import time

import nnabla as nn
import numpy as np
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    world = MPI.COMM_WORLD

    def one():
        return nn.NdArray.from_numpy_array(np.ones(1, np.float32))

    x, many = one(), [one() for _ in range(16)]
    blocks = [one() for _ in range(comm.size)]
    raw = np.ones(1, np.float32)
    calls = {
        "mpi4py Allreduce": lambda: world.Allreduce(MPI.IN_PLACE, raw),
        "all_reduce": lambda: comm.all_reduce(x),
        "all_reduce 16 arrays": lambda: comm.all_reduce(many),
        "bcast": lambda: comm.bcast(x, 0),
        "reduce": lambda: comm.reduce(x, 0),
        "all_gather": lambda: comm.all_gather(x, blocks),
        "reduce_scatter": lambda: comm.reduce_scatter(blocks, x),
    }
    best = dict.fromkeys(calls, float("inf"))
    for call in calls.values():
        for _ in range(100):
            call()
    for _ in range(args.rounds):
        for name, call in calls.items():
            world.Barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                call()
            seconds = (time.perf_counter() - start) / args.iters
            best[name] = min(best[name],
                             world.allreduce(seconds, op=MPI.MAX))
    if world.rank == 0:
        floor = best["mpi4py Allreduce"]
        for name, seconds in best.items():
            print(f"{name:<22} {seconds * 1e6:7.2f} us  "
                  f"{seconds / floor:5.2f} x mpi4py")


if __name__ == "__main__":
    main()

"""What ``async_op=True`` buys: an all-reduce started before a computation
that does not touch its arrays and waited for after it, against the same
computation followed by the blocking all-reduce, in the same run.

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python \\
        bench/async_bench.py [--mib 16] [--width 1024] [--layers 4] \\
        [--rounds 15] [--small-iters 3000]

The computation is the forward and backward of an MLP (`layers` affine
layers of `width`, batch 64), which nnabla runs without the GIL; the
all-reduce is of `mib` MiB of float32 in one array. Each round times, one
after another, the computation alone (T_c), the blocking all-reduce alone
(T_ar), the two in turn (T_serial), and the all-reduce started
asynchronously, the computation, then wait() (T_async); a time is the
slowest rank's, and the medians over the rounds are printed, with
T_async / T_serial and T_async / max(T_c, T_ar) (1.0: perfect overlap).
Then a one-float all-reduce's cost, blocking and started-then-waited at
once (the hop to the queue's thread), best of 5 rounds of `small-iters`.
"""
import argparse
import statistics
import time

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import numpy as np
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C


def mlp(width, layers):
    x = nn.Variable((64, width))
    x.d = np.random.RandomState(0).randn(*x.shape)
    h = x
    for i in range(layers):
        h = F.tanh(PF.affine(h, width, name=f"l{i}"))
    loss = F.mean(h)

    def step():
        loss.forward(clear_no_need_grad=True)
        loss.backward(clear_buffer=True)
    return step


def timed(world, fn):
    world.Barrier()
    start = time.perf_counter()
    fn()
    return world.allreduce(time.perf_counter() - start, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--small-iters", type=int, default=3000)
    args = parser.parse_args()
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    world = MPI.COMM_WORLD
    compute = mlp(args.width, args.layers)
    elements = int(args.mib * (1 << 20)) // 4
    buffer = nn.NdArray.from_numpy_array(np.ones(elements, np.float32))

    def serial():
        compute()
        comm.all_reduce(buffer)

    def overlapped():
        pending = comm.all_reduce(buffer, async_op=True)
        compute()
        pending.wait()

    modes = {"T_c": compute, "T_ar": lambda: comm.all_reduce(buffer),
             "T_serial": serial, "T_async": overlapped}
    for fn in modes.values():
        fn()
    times = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, fn in modes.items():
            times[name].append(timed(world, fn))
    median = {name: statistics.median(t) for name, t in times.items()}

    one = nn.NdArray.from_numpy_array(np.ones(1, np.float32))
    small = {"blocking": lambda: comm.all_reduce(one),
             "async + wait": lambda: comm.all_reduce(
                 one, async_op=True).wait()}
    best = dict.fromkeys(small, float("inf"))
    for _ in range(5):
        for name, fn in small.items():
            def loop():
                for _ in range(args.small_iters):
                    fn()
            best[name] = min(best[name],
                             timed(world, loop) / args.small_iters)
    if world.rank == 0:
        print(f"{comm.size} ranks, {args.mib:g} MiB all-reduce, MLP "
              f"{args.layers} x {args.width}; medians of {args.rounds}")
        for name, seconds in median.items():
            print(f"  {name:<9} {seconds * 1e3:8.2f} ms")
        print(f"  T_async / T_serial            "
              f"{median['T_async'] / median['T_serial']:.3f}")
        print(f"  T_async / max(T_c, T_ar)      "
              f"{median['T_async'] / max(median['T_c'], median['T_ar']):.3f}")
        print(f"one-float all-reduce, best of 5 x {args.small_iters}:")
        for name, seconds in best.items():
            print(f"  {name:<13} {seconds * 1e6:7.2f} us")


if __name__ == "__main__":
    main()

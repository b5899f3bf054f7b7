"""Timing shared by the benchmarks that run several ranks on a GPU
(gpu_engine_bench.py, gpu_torch_bench.py): wall clock per iteration, the
device synchronised at its end, the slowest rank's time, and methods taking
turns iteration by iteration so that noise hits all of them alike."""
import statistics
import time

from mpi4py import MPI

world = MPI.COMM_WORLD


def slowest(seconds):
    return world.allreduce(seconds, op=MPI.MAX)


def timed(run, synchronize):
    """The wall-clock time of `run()` until `synchronize()` returns, the
    slowest rank's; the ranks start together."""
    world.Barrier()
    start = time.perf_counter()
    run()
    synchronize()
    return slowest(time.perf_counter() - start)


def median(xs):
    return statistics.median(xs)


def take_turns(methods, args, synchronize):
    """Each method's median time over `args.iters` iterations after
    `args.warmup`, the methods taking turns iteration by iteration."""
    times = {name: [] for name in methods}
    for i in range(args.warmup + args.iters):
        for name, run in methods.items():
            t = timed(run, synchronize)
            if i >= args.warmup:
                times[name].append(t)
    return {name: median(ts) for name, ts in times.items()}

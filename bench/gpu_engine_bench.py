"""The engine on one GPU: overlap of gradient reduction with a backward, and
the transport's all-reduce against host staging done by hand.

Needs an NVIDIA GPU, CuPy, mpi4py and nncomm built with nvcc; nnabla is not
needed. Two ranks share the GPU (NCCL refuses two ranks on one device), so
the host-staged MPI transport runs, or CUDA IPC (``NNCOMM_GPU_TRANSPORT=ipc``,
what ``auto`` chooses there). From the repository root:

    NNCOMM_GPU_TRANSPORT=mpi mpiexec -n 2 python3 bench/gpu_engine_bench.py
    NNCOMM_GPU_TRANSPORT=ipc mpiexec -n 2 python3 bench/gpu_engine_bench.py

Two measurements, each against its baseline in the same run, taking turns
iteration by iteration so that noise hits both alike; figures are medians
of ``--iters`` iterations after ``--warmup``:

``overlap``: ResNet-50's 161 gradient arrays (25.6 M float32 values, the
shapes of bench/pack_bench.py) written by a "backward" on a stream of its
own: for each gradient, last layer first, ``--gemms`` products of two
1024 x 1024 matrices, then the gradient filled. Calibrated so that the
backward's compute takes about as long as the all-reduce of the gradients
(the case where overlap matters most), unless ``--gemms`` is given.

- ``compute``: the backward alone;
- ``comm``: ``comm.all_reduce(grads)`` alone (fused);
- ``serial``: the backward, then ``all_reduce``: the no-overlap baseline;
- ``engine``: the backward with ``gradient_reducer``: each gradient made
  ready as its work is enqueued, ``finish()`` at the end.

Goal: engine <= 1.1 x max(compute, comm).

``staged``: one all-reduce of ``--mib`` MiB of float32 (100 by default):
``comm.all_reduce`` on the CuPy array against its steps done by hand back
to back: copy to pinned host memory, ``MPI.COMM_WORLD.Allreduce`` (mpi4py,
in place), copy back. Goal: within 1.2 x.

Every iteration ends with the device synchronised; times are wall-clock on
rank 0, the slowest rank's for each iteration.
"""
import argparse
import os
import sys
import types

import cupy as cp
import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import median, take_turns, timed, world  # noqa: E402
from pack_bench import gpu_info, resnet50_shapes  # noqa: E402

import nncomm  # noqa: E402

GOAL_OVERLAP = 1.1
GOAL_STAGED = 1.2


def synchronize():
    cp.cuda.Device().synchronize()


class Backward:
    """A backward over `grads`, `gemms` matrix products per gradient."""

    def __init__(self, grads, gemms, stream):
        self.grads, self.gemms, self.stream = grads, gemms, stream
        with stream:
            self.a = cp.random.standard_normal((1024, 1024), cp.float32)
            self.b = cp.random.standard_normal((1024, 1024), cp.float32)
            self.c = cp.empty((1024, 1024), cp.float32)

    def run(self, ready=None):
        with self.stream:
            for k in reversed(range(len(self.grads))):
                for _ in range(self.gemms):
                    cp.matmul(self.a, self.b, out=self.c)
                self.grads[k].fill(k % 7)
                if ready is not None:
                    ready(k)


def overlap(comm, args):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        grads = [cp.zeros(shape, cp.float32) for shape in resnet50_shapes()]
        # The arrays name the current stream: the reducer orders with it.
        reducer = comm.gradient_reducer(grads, args.pack_size,
                                        division=True)

    def all_reduce():
        with stream:
            comm.all_reduce(grads, division=True)

    comm_time = median([timed(all_reduce, synchronize)
                        for _ in range(args.warmup + 3)])
    gemms = args.gemms
    if gemms is None:
        one = Backward(grads, 1, stream)
        per_gemm = median([timed(one.run, synchronize) for _ in range(3)])
        gemms = max(1, round(comm_time / per_gemm))
        gemms = world.bcast(gemms)
    backward = Backward(grads, gemms, stream)

    def engine():
        reducer.begin()
        backward.run(reducer.ready)
        reducer.finish()

    def serial():
        backward.run()
        all_reduce()

    return gemms, take_turns({"compute": backward.run, "comm": all_reduce,
                              "serial": serial, "engine": engine}, args,
                              synchronize)


def staged(comm, args):
    n = args.mib << 18
    x = cp.ones(n, cp.float32)
    pinned = cp.cuda.alloc_pinned_memory(n * 4)
    host = np.frombuffer(pinned, np.float32, n)

    def nncomm_all_reduce():
        comm.all_reduce(x)

    def by_hand():
        x.get(out=host)
        world.Allreduce(MPI.IN_PLACE, host)
        x.set(host)

    return take_turns({"by hand": by_hand, "nncomm": nncomm_all_reduce},
                      args, synchronize)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gemms", type=int, default=None,
                        help="matrix products per gradient (default: "
                             "calibrated to the all-reduce's time)")
    parser.add_argument("--pack-size", type=int, default=2 << 20)
    parser.add_argument("--mib", type=int, default=100)
    args = parser.parse_args()

    comm = nncomm.Communicator(types.SimpleNamespace(backend=["cpu:float"]))
    comm.init()
    cp.cuda.Device(comm.local_rank % cp.cuda.runtime.getDeviceCount()).use()
    gemms, t = overlap(comm, args)
    s = staged(comm, args)
    if world.rank == 0:
        print(f"{gpu_info(cp)}, {world.size} ranks, transport "
              f"{os.environ.get('NNCOMM_GPU_TRANSPORT', 'auto')}")
        print(f"overlap: 161 gradients, 25.6 M float32, {gemms} GEMMs of "
              f"1024^3 per gradient")
        for name, seconds in t.items():
            print(f"  {name:8s} {seconds * 1e3:9.2f} ms")
        bound = max(t["compute"], t["comm"])
        ratio = t["engine"] / bound
        print(f"  engine / max(compute, comm) = {ratio:.3f} "
              f"(goal <= {GOAL_OVERLAP}: "
              f"{'met' if ratio <= GOAL_OVERLAP else 'NOT met'}); "
              f"engine / serial = {t['engine'] / t['serial']:.3f}")
        print(f"staged: all-reduce of {args.mib} MiB float32")
        for name, seconds in s.items():
            print(f"  {name:8s} {seconds * 1e3:9.2f} ms")
        ratio = s["nncomm"] / s["by hand"]
        print(f"  nncomm / by hand = {ratio:.3f} (goal <= {GOAL_STAGED}: "
              f"{'met' if ratio <= GOAL_STAGED else 'NOT met'})")


main()

"""Step time and bytes on the wire of the training layer's schemes:
plain data parallel against gradient compression and block momentum.

Run over the emulated 10 Gbit/s link (the case compression is for):

    BENCH=bench/compression_bench.py bench/run_emulated_link.sh

or on shared memory (bytes then not counted):

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python \
        bench/compression_bench.py

The model is callback_bench.py's: 8 affine layers 2048x2048 with bias and
ReLU (33.6 M float32 parameters), batch 16 per rank, Momentum SGD. Each
scheme trains ``--steps`` full steps (zero_grad, forward, backward, update)
after ``--warmup`` untimed ones, every step after a barrier, its time the
slowest rank's; the schemes take turns round by round (``--rounds``, median
kept) so that the machine's noise hits all alike:

- ``plain``: ``DistributedSolver`` (all-reduce during backward, float32);
- ``fp16``: the same with ``Compression.fp16``;
- ``8-bit``, ``1-bit``: ``data_parallel_solver(num_quantization_bits=8|1)``
  (CNTK's quantization with error feedback, one all-gather per step);
- ``BMUF k``: ``block_momentum_solver`` synchronising every k steps (its
  timed steps rounded up to a multiple of k, so each window holds whole
  blocks);
- ``local``: the wrapped solver alone, no communication (the floor).

Bytes on the wire: inside run_emulated_link.sh's private network namespace
every byte between the ranks crosses the loopback, so rank 0 reads its
counter (in ``/proc/net/dev``) around each scheme's
steps and prints MB per step per rank; elsewhere the loopback carries
other traffic and the column says ``-``.
"""
import argparse
import os
import statistics
import time

import nnabla as nn
import nnabla.solvers as S
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

import nncomm
import nncomm.communicators as C
from callback_bench import build_mlp, slowest

# /proc/net, unlike /sys, shows the reader's own network namespace.
NET_DEV = "/proc/net/dev"


def lo_bytes():
    """Bytes the loopback has sent."""
    with open(NET_DEV) as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    raise RuntimeError(f"no lo in {NET_DEV}")


def schemes(comm, args):
    """name -> a function making the scheme's solver."""
    def momentum():
        return S.Momentum(1e-4, 0.9)
    samples = args.batch  # per rank and step
    made = {
        "local": momentum,
        "plain": lambda: nncomm.DistributedSolver(momentum(), comm),
        "fp16": lambda: nncomm.DistributedSolver(
            momentum(), comm, compression=nncomm.Compression.fp16),
        "8-bit": lambda: nncomm.data_parallel_solver(
            momentum(), comm, num_quantization_bits=8),
        "1-bit": lambda: nncomm.data_parallel_solver(
            momentum(), comm, num_quantization_bits=1),
    }
    for k in args.blocks:
        made[f"BMUF {k}"] = lambda k=k: nncomm.block_momentum_solver(
            momentum(), comm, block_size=k * samples * comm.size)
    return made


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, nargs="*", default=[1, 4, 16])
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = C.MultiProcessDataParallelCommunicator(
        get_extension_context("cpu"))
    comm.init()
    counting = os.environ.get("MPIR_CVAR_NOLOCAL") == "1"

    def say(*a):
        if world.rank == 0:
            print(*a, flush=True)

    loss, params = build_mlp(args.batch, args.width, args.layers, world.rank)
    solvers = {}
    for name, make in schemes(comm, args).items():
        solver = make()
        solver.set_parameters(params, reset=True)
        solvers[name] = solver
    times = {name: [] for name in solvers}
    wire = {name: [] for name in solvers}
    say(f"# {world.size} ranks, "
        f"{sum(p.size for p in params.values()) / 1e6:.1f} M parameters, "
        f"batch {args.batch} per rank; per round and scheme: ms per step, "
        f"MB per step per rank")

    def step(solver, local):
        loss.forward()
        solver.zero_grad()
        if local:
            loss.backward(clear_buffer=True)
        else:
            solver.backward(loss, clear_buffer=True)
        solver.update()

    for r in range(args.rounds):
        for name, solver in solvers.items():
            local = name == "local"
            block = int(name.split()[1]) if name.startswith("BMUF") else 1
            steps = -(-args.steps // block) * block
            for _ in range(args.warmup):
                step(solver, local)
            world.Barrier()
            sent = lo_bytes() if counting else 0
            start = time.perf_counter()
            for _ in range(steps):
                step(solver, local)
            seconds = slowest(time.perf_counter() - start, world)
            world.Barrier()
            times[name].append(seconds / steps)
            if counting:
                wire[name].append((lo_bytes() - sent) / steps / world.size)
            say(f"# round {r}: {name}: {times[name][-1] * 1e3:.1f} ms" + (
                f", {wire[name][-1] / 1e6:.1f} MB" if counting else ""))
    plain = statistics.median(times["plain"])
    say(f"# medians of {args.rounds} rounds of {args.steps} steps")
    say("| scheme | step ms | step / plain | MB per step per rank |")
    say("|---|---:|---:|---:|")
    for name in solvers:
        t = statistics.median(times[name])
        mb = f"{statistics.median(wire[name]) / 1e6:.1f}" if counting \
            else "-"
        say(f"| {name} | {t * 1e3:.1f} | {t / plain:.2f} | {mb} |")


if __name__ == "__main__":
    main()

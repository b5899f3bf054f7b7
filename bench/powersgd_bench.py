"""PowerSGD (a bucket hook) against dense, fp16 and 1-bit gradients: bytes
per step per rank, step time, and accuracy on digits after the same steps.

Run over the emulated 10 Gbit/s link (the case compression is for):

    BENCH=bench/powersgd_bench.py bench/run_emulated_link.sh

Two parts, in one run:

1. Step time and bytes on the wire on compression_bench.py's model (8
   affine layers 2048x2048 with ReLU, 33.6 M float32 parameters, batch 16
   per rank, Momentum SGD): ``dense`` (``DistributedSolver``), ``fp16``
   (``Compression.fp16``), ``1-bit`` (``Compression.quantized(1)``) and
   ``PowerSGD r`` for ``--ranks`` (``hook=nncomm.hooks.PowerSGD(rank=r,
   start_iter=0)``: compressed from the first timed step on, the warm-up
   steps included), and ``unreduced`` (a hook that sends nothing: the
   floor of the step, the engine's own costs included, no compression
   goes below; timed only). The schemes take turns round by round; each step's
   time is the slowest rank's; the table gives the median over the
   rounds of the time and of the ratio to dense in the same round.
2. Accuracy: every scheme trains the same digits MLP (64-128-128-10, ReLU,
   scikit-learn's digits, batch 32 per rank, Momentum SGD) from the same
   initial parameters (the first scheme's, copied) on the same batches for ``--epochs`` (0: this part
   is skipped); test accuracy, and its difference from dense, in points.
   PowerSGD starts at ``--start-iter``.

``RATE=1gbit`` (run_emulated_link.sh's) shapes a slower link.

Bytes: inside run_emulated_link.sh's namespace every byte between the ranks
crosses the loopback; rank 0 reads its counter around each scheme's steps.
"""
import argparse
import statistics
import time

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import numpy as np
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context
from sklearn.datasets import load_digits

import nncomm
import nncomm.communicators as C
from callback_bench import build_mlp, slowest
from compression_bench import lo_bytes


# The step with the same engine and nothing sent: what no compression can
# go below.
FLOOR = "unreduced"


def schemes(comm, ranks, start_iter):
    """name -> a function making a solver of the scheme around `inner`."""
    made = {
        "dense": lambda inner: nncomm.DistributedSolver(inner, comm),
        "fp16": lambda inner: nncomm.DistributedSolver(
            inner, comm, compression=nncomm.Compression.fp16),
        "1-bit": lambda inner: nncomm.DistributedSolver(
            inner, comm, compression=nncomm.Compression.quantized(1)),
    }
    for r in ranks:
        made[f"PowerSGD {r}"] = lambda inner, r=r: nncomm.DistributedSolver(
            inner, comm, hook=nncomm.hooks.PowerSGD(rank=r,
                                                    start_iter=start_iter))
    return made


def unreduced(bucket):
    """A bucket hook that leaves its bucket as it is: nothing is sent."""


def timing(comm, args, say):
    world = MPI.COMM_WORLD
    loss, params = build_mlp(args.batch, 2048, 8, world.rank)
    solvers = {}
    made = schemes(comm, args.ranks, 0)
    made[FLOOR] = lambda inner: nncomm.DistributedSolver(inner, comm,
                                                         hook=unreduced)
    for name, make in made.items():
        solvers[name] = make(S.Momentum(1e-4, 0.9))
        solvers[name].set_parameters(params, reset=True)
    times = {name: [] for name in solvers}
    wire = {name: [] for name in solvers}

    def step(solver):
        loss.forward()
        solver.zero_grad()
        solver.backward(loss, clear_buffer=True)
        solver.update()

    for r in range(args.rounds):
        for name, solver in solvers.items():
            for _ in range(args.warmup):
                step(solver)
            world.Barrier()
            sent = lo_bytes()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(solver)
            seconds = slowest(time.perf_counter() - start, world)
            world.Barrier()
            times[name].append(seconds / args.steps)
            wire[name].append((lo_bytes() - sent) / args.steps / world.size)
            say(f"# round {r}: {name}: {times[name][-1] * 1e3:.1f} ms, "
                f"{wire[name][-1] / 1e6:.2f} MB")
    # Each round's ratio to dense in that round: the machine's load drifts
    # between rounds more than within one.
    return ({n: statistics.median(t) for n, t in times.items()},
            {n: statistics.median(a / d for a, d in zip(t, times["dense"]))
             for n, t in times.items()},
            {n: statistics.median(b) for n, b in wire.items()})


def digits_mlp(x):
    h = F.relu(PF.affine(x, 128, name="fc1"))
    h = F.relu(PF.affine(h, 128, name="fc2"))
    return PF.affine(h, 10, name="fc3")


def accuracy(comm, args):
    """Test accuracy per scheme after the same steps on digits."""
    world = MPI.COMM_WORLD
    digits = load_digits()
    images = (digits.data / 16).astype(np.float32)
    labels = digits.target.reshape(-1, 1)
    train, test = slice(0, 1440), slice(1440, None)
    batch = 32
    found = {}
    initial = None  # the first scheme's initial parameters, for all
    for name, make in schemes(comm, args.ranks, args.start_iter).items():
        with nn.parameter_scope(name):
            x, t = nn.Variable((batch, 64)), nn.Variable((batch, 1))
            loss = F.mean(F.softmax_cross_entropy(digits_mlp(x), t))
            params = nn.get_parameters()
            if initial is None:
                initial = {k: v.d.copy() for k, v in params.items()}
            for k, v in params.items():
                v.d = initial[k]
            solver = make(S.Momentum(0.05, 0.9))
            solver.set_parameters(params)
            rng = np.random.RandomState(0)  # the same batches
            for _ in range(args.epochs):
                order = rng.permutation(1440)[world.rank::world.size]
                for i in range(len(order) // batch):
                    chosen = order[i * batch:(i + 1) * batch]
                    x.d, t.d = images[train][chosen], labels[train][chosen]
                    loss.forward(clear_no_need_grad=True)
                    solver.zero_grad()
                    solver.backward(loss, clear_buffer=True)
                    solver.update()
            x_test = nn.Variable.from_numpy_array(images[test])
            with nn.auto_forward():
                logits = digits_mlp(x_test)
            found[name] = float(np.mean(logits.d.argmax(axis=1) ==
                                        labels[test][:, 0]))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--start-iter", type=int, default=10)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = C.MultiProcessDataParallelCommunicator(
        get_extension_context("cpu"))
    comm.init()

    def say(*a):
        if world.rank == 0:
            print(*a, flush=True)

    say(f"# {world.size} ranks; step time and MB per step per rank on "
        f"33.6 M parameters, batch {args.batch} per rank")
    times, ratios, wire = timing(comm, args, say)
    found = accuracy(comm, args) if args.epochs else {}
    say(f"# medians of {args.rounds} rounds of {args.steps} steps; digits "
        f"accuracy after {args.epochs} epochs")
    say("| scheme | step ms | step / dense | MB per step per rank | "
        "digits accuracy | points from dense |")
    say("|---|---:|---:|---:|---:|---:|")
    for name in times:
        points = (f"{found[name] * 100:.1f} % | "
                  f"{(found[name] - found['dense']) * 100:+.1f}"
                  if name in found else "- | -")
        say(f"| {name} | {times[name] * 1e3:.1f} | "
            f"{ratios[name]:.2f} | {wire[name] / 1e6:.2f} | "
            f"{points} |")


if __name__ == "__main__":
    main()

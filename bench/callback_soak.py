"""Soak test of ``all_reduce_callback``: 10,000 training steps with resident
memory, threads and file descriptors flat.

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 2 .venv/bin/python \
        bench/callback_soak.py

A small MLP (32 -> 64 -> 64 -> 10, affine with bias, tanh; 6,922 float32
parameters) trains with ``nnabla.solvers.Momentum`` on a CPU context, each
rank on its own inputs, in the nnabla-examples loop:

    loss.forward(clear_no_need_grad=True)
    solver.zero_grad()
    cb = comm.all_reduce_callback(grads, 2 << 20, division=True)
    loss.backward(clear_buffer=True, function_post_hook=cb)
    solver.update()

with a new callback every step (``--mode new``, the default, what
nnabla-examples do) or one made once and reused (``--mode once``).

Every ``--report-every`` steps rank 0 prints, for each rank, the resident
memory (VmRSS, KiB), the thread count (both from /proc/self/status) and the
number of open file descriptors (entries of /proc/self/fd). At the end it
prints their growth from the first report at or after ``--warmup`` steps to
the last report, and PASS or FAIL against these limits, per rank:

- RSS growth <= 8 MiB: a leak of 1 KiB per step (a few objects kept per
  callback or per backward) would exceed it over the 9,000 measured steps;
  the allowance is for the allocator's and Python's caches, which go on
  settling after warm-up. RSS counts touched pages only, so a buffer leaked
  without ever being written would not show.
- Thread and descriptor growth 0: the engine is one C++ thread per set of
  gradients, made once and kept on the communicator; a thread or a
  descriptor leaked per callback, per backward or per plan would add
  thousands.

The warm-up covers what is made once: the engine and its staging buffer, the
bucket plan, the graph analysis and the launch-schedule tuning of the
engine's first iterations.

Last, every rank hashes all its parameters' data and rank 0 compares the
hashes: the ranks start from the same parameters (broadcast) but see
different inputs, so the parameters stay bit-identical only if every step's
gradients were all-reduced before the solver read them.

Exits with status 1 on FAIL.
"""
import argparse
import hashlib
import os
import sys
import time

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import numpy as np
from mpi4py import MPI
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C

RSS_LIMIT_KIB = 8 * 1024
PACK_SIZE = 2 << 20
# Distinct batches per rank, cycled: the inputs change from step to step
# without the loop allocating new numpy arrays.
BATCHES = 7


def proc_usage():
    """(VmRSS in KiB, threads, open file descriptors) of this process."""
    rss = threads = None
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    # The listing includes the descriptor of the directory being read: a
    # constant offset of one.
    return rss, threads, len(os.listdir("/proc/self/fd"))


def build_mlp(batch, rank):
    x, t = nn.Variable((batch, 32)), nn.Variable((batch, 10))
    h = x
    for i, width in enumerate((64, 64)):
        h = F.tanh(PF.affine(h, width, name=f"fc{i}"))
    loss = F.mean(F.squared_error(PF.affine(h, 10, name="out"), t))
    rng = np.random.RandomState(1000 + rank)            # inputs differ by rank
    batches = [(rng.randn(*x.shape).astype(np.float32),
                rng.randn(*t.shape).astype(np.float32))
               for _ in range(BATCHES)]
    return x, t, loss, batches


def params_hash(params):
    h = hashlib.sha256()
    for name, p in params.items():
        h.update(name.encode())
        h.update(p.d.tobytes())
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--report-every", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=1000,
                        help="growth is measured from the first report at "
                             "or after this step")
    parser.add_argument("--mode", choices=("new", "once"), default="new",
                        help="a new callback every step, or one reused")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    world = MPI.COMM_WORLD
    rank = comm.rank

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    np.random.seed(0)
    x, t, loss, batches = build_mlp(args.batch, rank)
    params = nn.get_parameters()
    comm.bcast([p.data for p in params.values()], src=0)
    solver = S.Momentum(0.01, 0.9)
    solver.set_parameters(params)
    grads = [p.grad for p in params.values()]
    once = (comm.all_reduce_callback(grads, PACK_SIZE, division=True)
            if args.mode == "once" else None)

    nparams = sum(p.size for p in params.values())
    say(f"# {comm.size} ranks, nnabla {nn.__version__}, MLP 32-64-64-10, "
        f"{nparams} float32 params, batch {args.batch}/rank, pack_size "
        f"{PACK_SIZE}, callback: {args.mode}, {args.steps} steps, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        "load average %.2f %.2f %.2f" % os.getloadavg())
    say(f"# {'step':>6} {'elapsed_s':>9} {'steps/s':>8}   per rank: "
        f"rss_KiB threads fds")

    reports = []                   # (step, usage of every rank), on rank 0
    start = last = time.perf_counter()
    for step in range(1, args.steps + 1):
        x.d, t.d = batches[step % BATCHES]
        loss.forward(clear_no_need_grad=True)
        solver.zero_grad()
        cb = once if once is not None else comm.all_reduce_callback(
            grads, PACK_SIZE, division=True)
        loss.backward(clear_buffer=True, function_post_hook=cb)
        solver.update()
        # Without this, the report would see the step's callback still
        # alive; what is measured is what outlives it.
        del cb
        if step % args.report_every and step != args.steps:
            continue
        usage = world.gather(proc_usage(), root=0)
        now = time.perf_counter()
        if rank == 0:
            since = reports[-1][0] if reports else 0
            reports.append((step, usage))
            say(f"{step:8d} {now - start:9.1f} "
                f"{(step - since) / (now - last):8.1f}   "
                + "   ".join(f"r{r}: {u[0]} {u[1]} {u[2]}"
                             for r, u in enumerate(usage)))
        last = now

    hashes = world.gather(params_hash(params), root=0)
    failed = False
    if rank == 0:
        base_step, base = next(r for r in reports if r[0] >= args.warmup)
        end_step, end = reports[-1]
        say(f"# growth from step {base_step} to step {end_step}, limits: "
            f"RSS <= {RSS_LIMIT_KIB} KiB, threads 0, fds 0")
        for r, (b, e) in enumerate(zip(base, end)):
            grown = [ev - bv for bv, ev in zip(b, e)]
            ok = (grown[0] <= RSS_LIMIT_KIB and grown[1] <= 0
                  and grown[2] <= 0)
            failed |= not ok
            say(f"rank {r}: rss {b[0]} -> {e[0]} KiB ({grown[0]:+d}), "
                f"threads {b[1]} -> {e[1]} ({grown[1]:+d}), "
                f"fds {b[2]} -> {e[2]} ({grown[2]:+d}): "
                f"{'PASS' if ok else 'FAIL'}")
        same = len(set(hashes)) == 1
        failed |= not same
        say(f"parameters after {args.steps} steps: sha256 "
            + " ".join(f"r{r}={h[:16]}" for r, h in enumerate(hashes))
            + f": {'identical, PASS' if same else 'DIFFER, FAIL'}")
        say(f"{'FAIL' if failed else 'PASS'}: {args.steps} steps, callback "
            f"{args.mode}, {time.perf_counter() - start:.0f} s")
    if world.bcast(failed, root=0):
        sys.exit(1)


if __name__ == "__main__":
    main()

"""What sharded solver state (``DistributedSolver(shard="state")``, ZeRO
stage 1) and sharded gradients (``shard="gradients"``, stage 2) save and
cost: Adam on a 1024-1024-1024-1024-10 MLP (3.16 M parameters), against
the unsharded DistributedSolver.

Run it without mpiexec; it starts the jobs itself:

    OMP_NUM_THREADS=1 .venv/bin/python bench/zero_bench.py --ranks 2 4

For each rank count:

- memory, one job per kind (``none``, ``state``, ``gradients``),
  alternating, ``--jobs``
  of each: per rank, the solver-state bytes (``get_states()``'s arrays)
  and the peak resident memory the training added: VmHWM after
  ``--steps`` steps minus VmRSS before the model was made (nnabla, MPI and
  the communicator loaded), so that imports do not hide the difference.
  A peak only grows, hence separate processes.
- time, one job: the unsharded and the sharded solvers on copies of the
  model, in alternating rounds of ``--steps`` steps, and a fourth kind,
  ``rs``: stage 1 with the gradients reduce-scattered after backward
  (nnabla's plain backward, the gradients packed into one padded buffer,
  ``comm.reduce_scatter``, this rank's range written back) instead of
  all-reduced during it, as the alternative the design had to weigh.
  Median seconds per step on world rank 0 and the ratios to ``none``.

With ``--primitives``, only the MPI calls stage 2 could reduce a bucket
with are timed instead (mpi4py, a 4 MiB float32 bucket, 20 times each, in
turn): a reduce onto each rank in turn (a bucket of one owner), the
reduce-scatter in equal blocks, and the all-reduce; ratios to the
all-reduce.

With ``--link``, only the time job runs, its ranks talking over a shaped
link (``RATE``, default 10gbit): ``--link emulated``, 2 ranks through
bench/run_emulated_link.sh's loopback (every byte over the link);
``--link two-hosts``, bench/run_two_hosts.sh's two emulated hosts of
``--ranks`` / 2 ranks each (shared memory within a host), where rank 0 also
reads the bytes the link between the hosts carried during each kind's
rounds, printed per step.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from two_hosts import TWO_HOSTS, job_results, link_bytes

EMULATED_LINK = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "run_emulated_link.sh")

HIDDEN = 1024
LAYERS = 3
BATCH = 32  # per rank


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def model(scope):
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    x, t = nn.Variable((BATCH, HIDDEN)), nn.Variable((BATCH, 1))
    with nn.parameter_scope(scope):
        h = x
        for i in range(LAYERS):
            h = F.relu(PF.affine(h, HIDDEN, name=f"fc{i}"))
        loss = F.mean(F.softmax_cross_entropy(PF.affine(h, 10, name="out"),
                                              t))
        params = nn.get_parameters()
    return x, t, loss, params


def data(rng):
    return (rng.standard_normal((BATCH, HIDDEN)).astype(np.float32),
            rng.integers(0, 10, (BATCH, 1)).astype(np.int32))


def distributed_step(x, t, loss, solver, batch):
    x.d, t.d = batch
    loss.forward(clear_no_need_grad=True)
    solver.zero_grad()
    solver.backward(loss, clear_buffer=True)
    solver.update()


class ReduceScattered:
    """Stage 1 with the gradients reduce-scattered after a plain backward:
    the alternative to the callback's all-reduce during backward."""

    def __init__(self, comm, params):
        import nnabla as nn
        import nnabla.solvers as S
        from nncomm.sharded_state import ShardedSolver, element_ranges
        self.comm, self.params = comm, params
        self.solver = ShardedSolver(S.Adam(1e-4), comm, "world")
        self.solver.set_parameters(params)
        total = sum(v.size for v in params.values())
        self.ranges = element_ranges(total, comm.size)
        self.block = max(b - a for a, b in self.ranges)
        self.send = nn.NdArray((self.block * comm.size,))
        self.mine = nn.NdArray((self.block,))

    def step(self, x, t, loss, batch):
        x.d, t.d = batch
        loss.forward(clear_no_need_grad=True)
        self.solver.zero_grad()
        loss.backward(clear_buffer=True)
        flat = np.concatenate([v.g.reshape(-1) for v in
                               self.params.values()])
        send = self.send.data.reshape(self.comm.size, self.block)
        for r, (a, b) in enumerate(self.ranges):
            send[r, :b - a] = flat[a:b]
        self.comm.reduce_scatter(self.send, self.mine, division=True)
        a, b = self.ranges[self.comm.rank]
        reduced = np.array(self.mine.data[:b - a])
        at = 0
        for v in self.params.values():  # this rank's range back in place
            g = v.g.reshape(-1)
            lo, hi = max(a, at), min(b, at + v.size)
            if lo < hi:
                g[lo - at:hi - at] = reduced[lo - a:hi - a]
                v.g = g.reshape(v.shape)
            at += v.size
        self.solver.update()


def state_bytes(solver):
    return sum(v.size * np.dtype(v.data.dtype).itemsize
               for st in solver.get_states().values()
               for v in st.pstate.values())


def primitives():
    """Seconds of the MPI calls per bucket, on every rank; printed by rank
    0 as ratios to the all-reduce."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    n = 1 << 20
    a = np.ones(n, np.float32)
    out = np.empty(n // world.size, np.float32)

    def reduce_onto_owner(root):
        if world.rank == root:
            world.Ireduce(MPI.IN_PLACE, a, op=MPI.SUM, root=root).Wait()
        else:
            world.Ireduce(a, None, op=MPI.SUM, root=root).Wait()
    calls = {
        "Iallreduce": lambda r: world.Iallreduce(MPI.IN_PLACE, a,
                                                 op=MPI.SUM).Wait(),
        "Ireduce onto one rank": reduce_onto_owner,
        "Ireduce_scatter_block": lambda r: world.Ireduce_scatter_block(
            a, out, op=MPI.SUM).Wait()}
    seconds = {}
    for name, call in calls.items():
        call(0)
        world.Barrier()
        start = time.perf_counter()
        for i in range(20):
            call(i % world.size)
        world.Barrier()
        seconds[name] = time.perf_counter() - start
    if world.rank == 0:
        for name, s in seconds.items():
            print(f"  {name:22s} {s / 20 * 1e3:7.2f} ms  ratio "
                  f"{s / seconds['Iallreduce']:.2f}", flush=True)


def worker(args):
    import nnabla as nn
    import nnabla.solvers as S
    from nnabla.ext_utils import get_extension_context
    import nncomm
    import nncomm.communicators as C
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    rng = np.random.default_rng(comm.rank)
    if args.worker.startswith("memory-"):
        kind = args.worker.split("-", 1)[1]
        before = rss_kib("VmRSS")
        x, t, loss, params = model("m")
        solver = nncomm.DistributedSolver(
            S.Adam(1e-4), comm, shard=None if kind == "none" else kind)
        solver.set_parameters(params)
        for _ in range(args.steps):
            distributed_step(x, t, loss, solver, data(rng))
        mine = {"rank": comm.rank, "state_bytes": state_bytes(solver),
                "peak_added_kib": rss_kib("VmHWM") - before,
                "parameters": sum(v.size for v in params.values())}
    else:
        kinds = {}
        for kind in ("none", "state", "gradients"):
            x, t, loss, params = model(kind)
            solver = nncomm.DistributedSolver(
                S.Adam(1e-4), comm, shard=None if kind == "none" else kind)
            solver.set_parameters(params)
            kinds[kind] = lambda b, m=(x, t, loss, solver): \
                distributed_step(*m, b)
        x, t, loss, params = model("rs")
        rs = ReduceScattered(comm, params)
        kinds["rs"] = lambda b, m=(x, t, loss): rs.step(*m, b)
        times = {k: [] for k in kinds}
        sent = {k: 0 for k in kinds}
        counted = args.link == "two-hosts" and comm.rank == 0
        for step in kinds.values():  # warm-up
            step(data(rng))
        for _ in range(args.rounds):
            for kind, step in kinds.items():
                comm.barrier()
                before = link_bytes() if counted else 0
                comm.barrier()
                start = time.perf_counter()
                for _ in range(args.steps):
                    step(data(rng))
                times[kind].append((time.perf_counter() - start) /
                                   args.steps)
                comm.barrier()
                sent[kind] += link_bytes() - before if counted else 0
        mine = {"rank": comm.rank, "times": times,
                "link_bytes_per_step": {k: b / (args.rounds * args.steps)
                                        for k, b in sent.items()}}
    everyone = nncomm.allgather_object(comm, mine)
    if comm.rank == 0:
        print("RESULTS " + json.dumps(everyone), flush=True)


def launch(ranks, worker, args):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker,
           "--steps", str(args.steps), "--rounds", str(args.rounds)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get(
        "OMP_NUM_THREADS", "1"))
    if args.link == "two-hosts":
        cmd = [TWO_HOSTS] + cmd + ["--link", args.link]
        env.update(MPIEXEC=mpiexec, RANKS_PER_HOST=str(ranks // 2))
    elif args.link == "emulated":
        if ranks != 2:
            raise SystemExit("--link emulated runs 2 ranks")
        cmd = [EMULATED_LINK] + cmd[2:]
        env.update(BENCH=os.path.abspath(__file__))
    else:
        cmd = [mpiexec, "-n", str(ranks)] + cmd
    return job_results(cmd, env, 900, f"{worker} on {ranks} ranks")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2,
                        help="memory jobs of each kind")
    parser.add_argument("--link", choices=["emulated", "two-hosts"],
                        help="time over a shaped link (see above)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--primitives", action="store_true",
                        help="time the MPI calls a bucket could use")
    args = parser.parse_args()
    if args.worker == "primitives":
        return primitives()
    if args.worker:
        return worker(args)
    if args.primitives:
        for n in args.ranks:
            print(f"== {n} ranks, 4 MiB float32 bucket", flush=True)
            subprocess.run([os.path.join(os.path.dirname(sys.executable),
                                         "mpiexec"), "-n", str(n),
                            sys.executable, os.path.abspath(__file__),
                            "--worker", "primitives"], check=True)
        return
    for n in args.ranks:
        if args.link:
            times(n, args)
            continue
        memory = {"none": [], "state": [], "gradients": []}
        for _ in range(args.jobs):
            for kind in memory:
                memory[kind].append(launch(n, f"memory-{kind}", args))
        print(f"== {n} ranks, Adam, "
              f"{memory['none'][0][0]['parameters'] / 1e6:.2f} M parameters")
        for kind, jobs in memory.items():
            state = [r["state_bytes"] for r in jobs[0]]
            peak = [statistics.median(job[r]["peak_added_kib"]
                                      for job in jobs) / 1024
                    for r in range(n)]
            print(f"  {kind:9s} state MiB per rank "
                  f"{[round(s / 2**20, 2) for s in state]}; peak RSS added "
                  f"MiB per rank (median of {args.jobs} jobs) "
                  f"{[round(p, 1) for p in peak]}")
        none = memory["none"][0][0]["state_bytes"]
        for kind in ("state", "gradients"):
            ratios = [round(r["state_bytes"] / none, 4)
                      for r in memory[kind][0]]
            print(f"  state ratio {kind}/none per rank: {ratios}")
        times(n, args)


def times(n, args):
    """Runs the time job on `n` ranks and prints its table."""
    rank0 = launch(n, "time", args)[0]
    if args.link:
        print(f"== {n} ranks, link {args.link} at "
              f"{os.environ.get('RATE', '10gbit')}")
    base = statistics.median(rank0["times"]["none"])
    sent = rank0["link_bytes_per_step"]
    for kind, ts in rank0["times"].items():
        link = (f"  link MB/step {sent[kind] / 1e6:6.1f} ratio "
                f"{sent[kind] / sent['none']:.3f}"
                if args.link == "two-hosts" else "")
        print(f"  {kind:9s} {statistics.median(ts) * 1e3:8.1f} ms/step "
              f"(rank 0, median of {args.rounds} rounds of {args.steps})"
              f"  ratio {statistics.median(ts) / base:.3f}{link}")


if __name__ == "__main__":
    main()

"""The two-level all-reduce (NNCOMM_HIERARCHICAL) against the flat one on
two emulated hosts of two ranks each: bytes over the link between the
hosts per all-reduce, and time.

    python bench/hierarchical_bench.py [--sizes-mb 1 16 64] [--rounds 2]

It runs bench/run_two_hosts.sh (root or user namespaces; 10 Gbit/s link)
once per placement of the ranks (``--placements``: in blocks, 0 and 1 on
the first host, or alternating, 0 and 2 there), setting and round,
NNCOMM_HIERARCHICAL=0 and 1 alternating, each
job timing in turn, size by size, ``comm.all_reduce(x)`` of one float32
NdArray (nncomm, on the path its setting gives) and mpi4py's
``Allreduce(MPI.IN_PLACE, a)`` on numpy (raw: MPICH's own, the same in
both jobs, the yardstick between the jobs). For each size, rank 0 reads
the link's counters (bytes sent both ways, bench/run_two_hosts.sh --sent)
around ``--iters`` calls of each. Printed per size: link bytes per
all-reduce of each path, in multiples of the array's size, their ratio
(goal: 1 / ranks per host = 0.5), and the best time of each path (over
the rounds), with two-level over flat, each also over raw of its own job.
"""
import argparse
import json
import os
import sys
import time

from two_hosts import TWO_HOSTS, job_results, link_bytes


def measure(sizes_mb, iters):
    """On every rank of the job: per size, (link bytes, best seconds) per
    all-reduce for nncomm and raw; printed as JSON by rank 0."""
    import numpy as np
    import nnabla as nn
    from mpi4py import MPI
    from nnabla.ext_utils import get_extension_context

    import nncomm.communicators as C

    world = MPI.COMM_WORLD
    comm = C.MultiProcessDataParallelCommunicator(
        get_extension_context("cpu"))
    comm.init()
    results = {}
    for mb in sizes_mb:
        n = (mb << 20) // 4
        x = nn.NdArray.from_numpy_array(np.ones(n, np.float32))
        a = np.ones(n, np.float32)
        calls = {"nncomm": lambda: comm.all_reduce(x),
                 "raw": lambda: world.Allreduce(MPI.IN_PLACE, a)}
        for name, call in calls.items():
            call()  # warm: connections, huge pages
            world.Barrier()
            before = link_bytes() if world.rank == 0 else 0
            best = float("inf")
            for _ in range(iters):
                world.Barrier()
                start = time.perf_counter()
                call()
                best = min(best, world.allreduce(time.perf_counter() - start,
                                                 MPI.MAX))
            world.Barrier()
            if world.rank == 0:
                # The barriers' few bytes are in it too: negligible.
                results[f"{mb}/{name}"] = (
                    (link_bytes() - before) / iters, best)
    if world.rank == 0:
        print("RESULTS " + json.dumps(results), flush=True)


def job(placement, setting, sizes_mb, iters):
    """One job on the two hosts, ranks placed as `placement` says, under
    NNCOMM_HIERARCHICAL=`setting`."""
    env = dict(os.environ, NNCOMM_HIERARCHICAL=setting, PLACEMENT=placement,
               MPIEXEC=os.path.join(os.path.dirname(sys.executable),
                                    "mpiexec"))
    return job_results(
        [TWO_HOSTS, sys.executable, os.path.abspath(__file__), "--job",
         "--iters", str(iters), "--sizes-mb", *map(str, sizes_mb)],
        env, 600, f"the job under NNCOMM_HIERARCHICAL={setting}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--placements", nargs="+", default=["block", "cyclic"],
                   choices=["block", "cyclic"],
                   help="ranks in blocks per host, or alternating")
    p.add_argument("--job", action="store_true",
                   help="(internal) measure on this job's ranks")
    args = p.parse_args()
    if args.job:
        measure(args.sizes_mb, args.iters)
        return
    for placement in args.placements:
        table(placement, args)


def table(placement, args):
    """Runs the jobs of `placement` and prints its table."""
    best = {}  # (setting, key) -> [bytes, seconds]
    for _ in range(args.rounds):
        for setting in ("0", "1"):
            for key, (sent, seconds) in job(placement, setting,
                                            args.sizes_mb,
                                            args.iters).items():
                got = best.setdefault((setting, key), [sent, seconds])
                got[1] = min(got[1], seconds)
    print(f"# 2 hosts x 2 ranks placed {placement}, link "
          f"{os.environ.get('RATE', '10gbit')}; best of {args.rounds} "
          f"rounds x {args.iters} calls; B/x: link bytes per all-reduce "
          f"over the array's")
    print(f"{'size':>6} {'raw B/x':>8} {'flat B/x':>9} {'2lvl B/x':>9} "
          f"{'B ratio':>8} {'flat ms':>8} {'2lvl ms':>8} {'t ratio':>8} "
          f"{'flat/raw':>9} {'2lvl/raw':>9}")
    for mb in args.sizes_mb:
        size = mb << 20
        flat_b, flat_t = best[("0", f"{mb}/nncomm")]
        two_b, two_t = best[("1", f"{mb}/nncomm")]
        raw_b, raw0 = best[("0", f"{mb}/raw")]
        raw1 = best[("1", f"{mb}/raw")][1]
        print(f"{mb:>4}MB {raw_b / size:>8.2f} {flat_b / size:>9.2f} "
              f"{two_b / size:>9.2f} {two_b / flat_b:>8.2f} "
              f"{flat_t * 1e3:>8.1f} {two_t * 1e3:>8.1f} "
              f"{two_t / flat_t:>8.2f} {flat_t / raw0:>9.2f} "
              f"{two_t / raw1:>9.2f}")

if __name__ == "__main__":
    main()

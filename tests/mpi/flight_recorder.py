"""The flight recorder: what each rank writes, and when.

Run by tests/test_mpi.py as ``flight_recorder.py MODE`` with
NNCOMM_FLIGHT_RECORDER_DIR set; every rank makes the same all_reduces
except where MODE says:

- request: no rank misbehaves (one all_reduce is nonblocking: the
  world's duplicate for its queue is complete, its record names its line);
  each writes its record on request (dump_flight_record), then on SIGUSR1,
  and checks both files (with NNCOMM_FLIGHT_RECORDER=0, that
  dump_flight_record writes nothing).
- skip: world rank 1 skips the second of three all_reduces, then all
  ranks make an all_reduce of another size: rank 1's comes where the
  others' second one is (found from the stall reports within seconds).
- differ: the last rank makes a bcast where the others make an
  all_reduce (found by the comparison of new calls).
- stop: the last rank stops itself (SIGSTOP) before the second
  all_reduce, as a rank that died would, but without mpiexec ending the
  job at once, as it does when a rank is killed: the others time out (run
  with a small NNCOMM_TIMEOUT) and abort the job, the stopped rank with
  it, which leaves no record.
- kill: the last rank kills itself (SIGKILL) there. The test starts it
  under a shell that outlives it, holding its connections to mpiexec, so
  that mpiexec does not learn of the death (as a launcher that leaves the
  others running, or a host that is gone): the others time out as in
  'stop'.

In the last three each rank prints what it raised (``rank R: ...``) and
re-raises, which ends the job; the test then reads the records.
"""
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from _harness import Checker, make_comm, nd

MODE = sys.argv[1]
DIRECTORY = os.environ.get("NNCOMM_FLIGHT_RECORDER_DIR", "")


def steps(comm):
    """Three all_reduces, then one of another size, as MODE has them."""
    last = comm.rank == comm.size - 1
    x = nd(np.ones(5, np.float32))
    for step in range(3):
        if MODE == "skip" and comm.rank == 1 and step == 1:
            continue
        if MODE == "differ" and last and step == 1:
            comm.bcast(x, src=0)
            continue
        if MODE in ("stop", "kill") and last and step == 1:
            os.kill(os.getpid(), getattr(signal, "SIG" + MODE.upper()))
        comm.all_reduce(x)
    comm.all_reduce(nd(np.ones(7, np.float32)))


def started(comm):
    """An all_reduce started with async_op=True, then waited for."""
    comm.all_reduce(nd(np.ones(3, np.float32)), async_op=True).wait()


def wait_for_file(path, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def check_requested(comm, ck):
    asked = os.path.join(DIRECTORY, "asked")
    path = comm.dump_flight_record(asked)
    if os.environ.get("NNCOMM_FLIGHT_RECORDER") == "0":
        # Nothing recorded, nothing written; SIGUSR1 is left alone.
        ck.equal(path, None, "dump_flight_record with the recorder off")
        return
    ck.equal(path, os.path.join(asked, f"nncomm-flight-{comm.rank}.json"),
             "the file dump_flight_record names")
    if path is None:
        return
    with open(path) as f:
        dump = json.load(f)
    ck.equal((dump["rank"], dump["world_size"], dump["pid"]),
             (comm.rank, comm.size, os.getpid()), "rank, size, pid")
    # The job's name: one on every rank (python -m nncomm.flight leaves
    # out the files of other jobs by it).
    jobs = MPI.COMM_WORLD.allgather(dump.get("job"))
    ck.true(len(set(jobs)) == 1 and len(jobs[0] or "") == 16, "the job",
            str(jobs))
    ck.true("dump_flight_record" in dump["reason"], "the reason",
            dump["reason"])
    world = [g for g in dump["groups"]
             if g["world_ranks"] == list(range(comm.size))
             and g["channel"] == 0]
    ck.equal(len(world), 1, "the world group's ring")
    records = [r for g in world for r in g["records"]
               if r["call"] == "all_reduce of 1 arrays"
               and r["op"] == "allreduce"]
    ck.equal(len(records), 4, "the four all_reduces")
    for r in records:
        # The arrays' zeroing flags may travel with them.
        ck.equal((r["dtype"], r["bytes"], r["state"]),
                 ("float32", 4 * r["count"], "completed"),
                 "an all_reduce's record")
        ck.true(r["count"] >= 5, "its elements", str(r))
        ck.true(os.path.basename(__file__) + ":" in r["site"]
                and r["site"].endswith(" in steps"), "its Python line",
                r["site"])
        ck.true(r["ended"] >= r["enqueued"] > 0, "its times", str(r))
    duplicates = [r for g in world for r in g["records"]
                  if r["op"] == "duplicate"]
    ck.true(duplicates and all(r["state"] == "completed"
                               for r in duplicates),
            "the world's duplicate for the queue: completed", str(duplicates))
    queued = [r for g in dump["groups"] for r in g["records"]
              if g["world_ranks"] == list(range(comm.size))
              and g["channel"] != 0 and r["op"] == "allreduce"]
    ck.true(queued and all(r["site"].endswith(" in started")
                           and r["state"] == "completed" for r in queued),
            "the nonblocking all_reduce, at its line", str(queued))
    os.kill(os.getpid(), signal.SIGUSR1)
    mine = os.path.join(DIRECTORY, f"nncomm-flight-{comm.rank}.json")
    ck.true(wait_for_file(mine), "the record SIGUSR1 writes", mine)
    if os.path.exists(mine):
        with open(mine) as f:
            ck.equal(json.load(f)["reason"], "SIGUSR1", "its reason")


def main():
    ck = Checker("flight_recorder")
    comm, _ = make_comm()
    if MODE == "request":
        steps(comm)
        started(comm)
        check_requested(comm, ck)
        MPI.COMM_WORLD.Barrier()
        ck.finish()
        return
    try:
        steps(comm)
    except Exception as e:
        # One write per line, then time for the others to write theirs
        # before the mpi4py runner's abort ends the job.
        sys.stdout.write(f"rank {comm.rank}: {type(e).__name__}: {e}\n")
        sys.stdout.flush()
        time.sleep(1)
        raise
    raise AssertionError(f"{MODE}: every call completed")


main()

"""The timeline: a small MLP trained with all_reduce_callback (buckets of 20
elements: several; the callback reused, then one with priority="forward",
its plan sorted), then list collectives on the world and on a group (and
one nonblocking, on the async track), and
with NNCOMM_STALL_WARNING=1 a collective that ranks other than 0 reach 3 s
late. The file is read back with json and checked: the trace format (every
event has ph, ts, pid, tid and name; complete events a duration >= 0; the
ranks' processes and tracks named by metadata; pids are the ranks); per
rank and iteration, each bucket packed, reduced and unpacked in that order
inside its backward (from the callback's first hook call to the return of
its finish), every gradient's ready instant inside it, the buckets in plan
order, the closing round; the engine's events one after another; the
collectives in order with their bytes, dtype and group; the stall report;
no event dropped.

Modes (first argument):
- ``record DIR``: comm.start_timeline(DIR/trace.json), train, stop, check;
  then the refusals (a second start, ranks naming different files, a
  directory that does not exist, a part one rank cannot write), a second
  timeline replacing the first, and finalize() stopping a third.
- ``env DIR``: NNCOMM_TIMELINE is set (the test sets it): train and exit
  without stopping; the exit merges (the test checks that with ``check``).
- ``check FILE RANKS`` (one rank): checks a timeline recorded on RANKS
  ranks.
- ``die DIR``: start, train, and end every rank with os._exit, leaving
  incomplete parts (the test merges them with python -m nncomm.timeline).
- ``off DIR``: no timeline: train and communicate in DIR as the working
  directory; nothing is written there.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import nnabla as nn
import nnabla.solvers as S
from nncomm.timeline import is_complete, load, part_path

from _harness import Checker, make_comm, mlp, nd

PACK = 20
ITERATIONS = 4           # callback reused, in plan order
PRIORITY_ITERATIONS = 2  # priority="forward": its own plan
GRADIENTS = 6            # the MLP's weights and biases
GROUP = "reversed"
TRACKS = {1: "backward", 2: "gradients", 3: "engine", 4: "collectives",
          5: "stalls", 6: "device", 7: "async"}
# The engine's events follow one another; their times are printed to
# 1 ns.
ROUNDING = 0.002


def train(comm):
    """The MLP's parameters broadcast, then its training steps; returns
    the number of gradients and of buckets."""
    x, t, loss, params = mlp("timeline", 4, seed=1)
    grads = [p.grad for p in params.values()]
    comm.bcast([p.data for p in params.values()], src=0)
    solver = S.Sgd(0.01)
    solver.set_parameters(params)
    plain = comm.all_reduce_callback(grads, PACK, division=True)
    first = comm.all_reduce_callback(grads, PACK, division=True,
                                     priority="forward")
    rng = np.random.RandomState(comm.rank)
    for hook in [plain] * ITERATIONS + [first] * PRIORITY_ITERATIONS:
        x.d = rng.randn(*x.shape)
        t.d = rng.randn(*t.shape)
        loss.forward()
        solver.zero_grad()
        loss.backward(function_post_hook=hook)
        solver.update()
    return len(grads), len(plain.launch_order)


def parameter_bytes():
    """What the broadcast of the MLP's parameters sends: 6-9-8-2 affine."""
    return 4 * (6 * 9 + 9 + 9 * 8 + 8 + 8 * 2 + 2)


def communicate(comm, stall):
    """List collectives whose records `expected_collectives` lists; with
    `stall`, the last one reached 3 s late by every rank but 0."""
    n, r = comm.size, comm.rank
    f32 = np.float32
    comm.new_group((GROUP, list(reversed(range(n)))))
    comm.all_reduce([nd(np.ones(10, f32)), nd(np.ones(5, f32))])
    comm.all_reduce([nd(np.ones(4, f32)), nd(np.ones(2, np.float64))],
                    group=GROUP)
    comm.bcast(nd(np.ones(3, np.float64)), src=0)
    comm.reduce(nd(np.ones(10, f32)), dst=0)
    comm.all_gather(nd(np.ones(4, f32)),
                    [nd(np.zeros(4, f32)) for _ in range(n)])
    comm.reduce_scatter([nd(np.ones(3, f32)) for _ in range(n)],
                        nd(np.zeros(3, f32)))
    comm.alltoall(nd(np.ones((n, 2), f32)))
    comm.all_gather(nd(np.ones((r + 1, 2), f32)))
    comm.all_reduce(nd(np.ones(6, f32)), async_op=True).wait()
    if stall:
        if r != 0:
            time.sleep(3)
        comm.all_reduce(nd(np.ones(1, f32)))


def expected_collectives(n, r, stall):
    """(name, bytes, dtype, group) of what rank r of n records, in order
    (the ranks' exchanges of sizes before alltoall and all_gather of sizes
    that differ come in between)."""
    calls = [("bcast", parameter_bytes(), "float32", "world"),
             ("all_reduce", 60, "float32", "world"),
             ("all_reduce", 32, "mixed", GROUP),
             ("bcast", 24, "float64", "world"),
             ("reduce", 40, "float32", "world"),
             ("all_gather", 16, "float32", "world"),
             ("reduce_scatter", 12 * n, "float32", "world"),
             ("alltoall", 8 * n, "float32", "world"),
             ("all_gather", 8 * (r + 1), "float32", "world")]
    if stall:
        calls.append(("all_reduce", 4, "float32", "world"))
    return calls


# What the queue of async_op=True calls records, on its own track.
ASYNC = [("all_reduce", 24, "float32", "world")]


def check_format(ck, events, n):
    """The Trace Event Format as the viewers read it; returns the events
    by pid."""
    for e in events:
        missing = [k for k in ("ph", "ts", "pid", "tid", "name")
                   if k not in e]
        if not ck.true(not missing, "every event has ph, ts, pid, tid and "
                       "name", f"{e} lacks {missing}"):
            return {}
        if e["ph"] == "X":
            ck.true(e.get("dur", -1) >= 0, "complete events last >= 0",
                    str(e))
        if e["ph"] != "M":
            ck.true("cat" in e and "args" in e,
                    "events have a category and args", str(e))
    ck.equal(sorted({e["pid"] for e in events}), list(range(n)),
             "one process per rank, pid = rank")
    by_pid = {p: [e for e in events if e["pid"] == p] for p in range(n)}
    for pid, mine in by_pid.items():
        meta = {(e["name"], e["tid"]): e["args"] for e in mine
                if e["ph"] == "M"}
        ck.equal(meta.get(("process_name", 0)), {"name": f"rank {pid}"},
                 f"rank {pid}'s process is named")
        for tid, track in TRACKS.items():
            ck.equal(meta.get(("thread_name", tid)), {"name": track},
                     f"rank {pid}'s track {tid} is named {track}")
        for e in mine:
            if e["ph"] != "M" and e["tid"] in TRACKS:
                ck.equal(e["cat"], TRACKS[e["tid"]],
                         f"rank {pid}: {e['name']} is in its track's "
                         f"category")
        stopped = [e for e in mine if e["name"] == "timeline stopped"]
        ck.equal([e["args"] for e in stopped], [{"dropped_events": 0}],
                 f"rank {pid}'s timeline stopped, nothing dropped")
    return by_pid


def end(e):
    return e["ts"] + e["dur"]


def inside(e, span):
    last = end(e) if e["ph"] == "X" else e["ts"]
    return span["ts"] - ROUNDING <= e["ts"] and last <= end(span) + ROUNDING


def check_iterations(ck, pid, mine, gradients, buckets):
    """Rank `pid`'s backwards, gradients, buckets and closing rounds."""
    backwards = [e for e in mine if e["name"] == "backward"]
    ck.equal(len(backwards), ITERATIONS + PRIORITY_ITERATIONS,
             f"rank {pid}: one backward per iteration")
    iterations = [b["args"]["iteration"] for b in backwards]
    ck.equal(len(set(iterations)), len(iterations),
             f"rank {pid}: iterations numbered apart")
    engine = [e for e in mine if e["cat"] == "engine" and e["ph"] == "X"]
    for bw in backwards:
        it = bw["args"]["iteration"]
        of = [e for e in mine if e.get("args", {}).get("iteration") == it]
        what = f"rank {pid}, iteration {it}"
        ready = sorted(int(e["name"]) for e in of if e["cat"] == "gradients")
        ck.equal(ready, list(range(gradients)),
                 f"{what}: every gradient's ready instant")
        ck.true(all(e["args"]["tensor"] == int(e["name"]) and
                    inside(e, bw) for e in of if e["cat"] == "gradients"),
                f"{what}: the gradients' instants inside the backward")
        steps = {}
        for e in of:
            if e["name"] in ("pack", "reduce", "unpack"):
                steps.setdefault(e["args"]["bucket"], {})[e["name"]] = e
        ck.equal(sorted(steps), list(range(buckets)),
                 f"{what}: every bucket recorded")
        for b, s in sorted(steps.items()):
            if not ck.equal(sorted(s), ["pack", "reduce", "unpack"],
                            f"{what}, bucket {b}: each step once"):
                continue
            ck.true(bw["ts"] - ROUNDING <= s["pack"]["ts"] and
                    end(s["pack"]) <= s["reduce"]["ts"] + ROUNDING and
                    end(s["reduce"]) <= s["unpack"]["ts"] + ROUNDING and
                    end(s["unpack"]) <= end(bw) + ROUNDING,
                    f"{what}, bucket {b}: pack <= reduce <= unpack inside "
                    f"the backward", str(s))
            ck.true(s["pack"]["args"]["bytes"] > 0 and
                    s["pack"]["args"]["dtype"] == "float32",
                    f"{what}, bucket {b}: its bytes and dtype",
                    str(s["pack"]["args"]))
        for name, count in (("close", 1), ("wait_engine", 1)):
            spans = [e for e in of if e["name"] == name]
            ck.equal(len(spans), count, f"{what}: one {name}")
            ck.true(all(inside(e, bw) for e in spans),
                    f"{what}: {name} inside the backward")
        packs = sorted((e for e in of if e["name"] == "pack"),
                       key=lambda e: e["ts"])
        packed = [e["args"]["bucket"] for e in packs]
        ck.equal(packed, list(range(buckets)),
                 f"{what}: the buckets packed in plan order")
    ends = [(e["ts"], end(e)) for e in sorted(engine, key=lambda e: e["ts"])]
    ck.true(all(a[1] <= b[0] + ROUNDING for a, b in zip(ends, ends[1:])),
            f"rank {pid}: the engine's events follow one another")


def check_collectives(ck, pid, mine, n, stall):
    recorded = [(e["name"], e["args"].get("bytes"), e["args"].get("dtype"),
                 e["args"].get("group")) for e in mine
                if e.get("cat") == "collectives"]
    expected = expected_collectives(n, pid, stall)
    left = iter(recorded)
    ck.true(all(call in left for call in expected),
            f"rank {pid}: the collectives in order, with their bytes, "
            f"dtype and group", f"{expected} not in {recorded}")
    ck.true(all(e["ph"] == "X" for e in mine if e["cat"] == "collectives"),
            f"rank {pid}: collectives are complete events")
    started = [(e["name"], e["args"].get("bytes"), e["args"].get("dtype"),
                e["args"].get("group")) for e in mine
               if e.get("cat") == "async" and e["ph"] == "X"]
    ck.equal(started, ASYNC, f"rank {pid}: the nonblocking all_reduce")
    stalls = [e["args"]["message"] for e in mine if e["cat"] == "stalls"]
    if stall and pid == 0:
        ck.true(any("all_reduce of 1 arrays" in m and "waiting for world "
                    "ranks" in m for m in stalls),
                "rank 0 recorded the stall", str(stalls))


def check(ck, path, n, stall=False, buckets=None):
    """Checks the timeline file at `path` of a job of `n` ranks."""
    events = load(path)
    by_pid = check_format(ck, events, n)
    for pid, mine in by_pid.items():
        mine = [e for e in mine if e["ph"] != "M"]
        seen = len({e["args"]["bucket"] for e in mine if e["name"] == "pack"})
        ck.true(seen >= 3, f"rank {pid}: several buckets", str(seen))
        check_iterations(ck, pid, mine, GRADIENTS, buckets or seen)
        check_collectives(ck, pid, mine, n, stall)


def record(ck, comm, folder):
    path = os.path.join(folder, "trace.json")
    stall = comm.size > 1 and os.environ.get("NNCOMM_STALL_WARNING") == "1"
    comm.start_timeline(path)
    if comm.rank == 0:
        ck.true(os.path.exists(part_path(path, 0)),
                "the rank's part is written while recording")
    gradients, buckets = train(comm)
    ck.equal(gradients, GRADIENTS, "the MLP's gradients")
    communicate(comm, stall)
    ck.equal(comm.stop_timeline(), path, "stop_timeline returns the path")
    ck.equal(sorted(os.listdir(folder)), ["trace.json"],
             "the parts were merged into one file and removed")
    check(ck, path, comm.size, stall, buckets)
    ck.equal(comm.stop_timeline(), None, "a second stop does nothing")

    comm.start_timeline(path)
    ck.raises(RuntimeError, "already", "a second start is refused",
              comm.start_timeline, path)
    comm.stop_timeline()
    missing = os.path.join(folder, "no", "such", "dir", "t.json")
    ck.raises(ValueError, "no/such/dir", "a directory that does not exist "
              "is refused", comm.start_timeline, missing)
    if comm.size > 1:
        ck.raises(ValueError, "different files", "ranks naming different "
                  "files are refused", comm.start_timeline,
                  os.path.join(folder, f"{comm.rank}.json"))
        # Rank 1 alone cannot write its part.
        blocked = os.path.join(folder, "blocked.json")
        if comm.rank == 0:
            os.mkdir(part_path(blocked, 1))
        comm.barrier()
        if comm.rank == 1:
            ck.raises(ValueError, "blocked.json.rank1", "the rank that cannot "
                      "write its part raises why", comm.start_timeline,
                      blocked)
        else:
            ck.raises(RuntimeError, "every rank", "the other ranks raise too",
                      comm.start_timeline, blocked)
        comm.barrier()
        if comm.rank == 0:
            os.rmdir(part_path(blocked, 1))
        comm.barrier()
    ck.equal(sorted(os.listdir(folder)), ["trace.json"],
             "refused starts leave no file")

    comm.start_timeline(path)
    comm.all_reduce(nd(np.ones(2, np.float32)))
    comm.stop_timeline()
    events = [e for e in load(path) if e["ph"] != "M"]
    ck.equal(sorted({(e["pid"], e["name"]) for e in events}),
             sorted({(r, n) for r in range(comm.size)
                     for n in ("all_reduce", "timeline stopped")}),
             "a second timeline replaces the first")

    comm.start_timeline(path)
    comm.finalize()
    ck.true(is_complete(path) and not os.path.exists(
        part_path(path, MPI.COMM_WORLD.rank)),
        "finalize() stops the timeline and merges it")


def main():
    mode = sys.argv[1]
    ck = Checker("timeline")
    if mode == "check":
        check(ck, sys.argv[2], int(sys.argv[3]))
        ck.finish()
        return
    folder = sys.argv[2]
    if mode == "off":
        # Where a timeline started unasked with a relative path would land.
        os.chdir(folder)
    comm, _ = make_comm()
    if mode == "record":
        record(ck, comm, folder)
    elif mode == "env":
        path = os.environ["NNCOMM_TIMELINE"]
        ck.true(os.path.exists(part_path(path, comm.rank)),
                "NNCOMM_TIMELINE started the timeline at init()")
        train(comm)
        communicate(comm, False)
    elif mode == "die":
        comm.start_timeline(os.path.join(folder, "died.json"))
        train(comm)
        # The writer flushes every 100 ms; a dying rank keeps that much.
        time.sleep(0.5)
        MPI.COMM_WORLD.Barrier()
        sys.stdout.flush()
        os._exit(0)
    elif mode == "off":
        train(comm)
        communicate(comm, False)
        comm.barrier()
        ck.equal(os.listdir(folder), [], "no timeline, no file")
    ck.finish()


main()

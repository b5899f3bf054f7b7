"""Nonblocking collectives (async_op=True): every collective that takes it,
on every standard group, against numpy; blocking calls and other
nonblocking ones made while one is in flight, waited for out of order;
arrays still zeroing; a Pending dropped unwaited (its call still runs); a
call that differs between ranks (ValueError from wait() on every rank, and
a RuntimeWarning where nothing waits); a wait ended by a signal handler
while a rank is late, waited for again; calls in comm.join() after a
rank's data ended (its zeros count); and a Pending collected in a
reference cycle after finalize().
"""
import gc
import signal
import time
import warnings

import numpy as np

import nnabla as nn

from _harness import big_count, contribution, expected_sum, nd, start


def all_reduce_cases(ck, comm, group, ranks):
    specs = [(np.float32, (7,)), (np.int64, (3, 5)),
             (np.float16, (big_count(np.float16),)), (np.float64, ())]
    for division in (False, True):
        key = f"async/{group}/{division}"
        kept = [(dt, shape) for dt, shape in specs
                if not division or dt != np.int64]
        mine = [nd(contribution(f"{key}/{i}", comm.rank, shape, dt))
                for i, (dt, shape) in enumerate(kept)]
        pending = comm.all_reduce(mine, division=division, group=group,
                                  async_op=True)
        ck.true(isinstance(pending, nncomm_pending()), "returns a Pending")
        ck.equal(pending.wait(), None, "wait() returns None")
        ck.true(pending.is_completed(), "completed after wait()")
        for i, (dt, shape) in enumerate(kept):
            ref, tol = expected_sum(f"{key}/{i}", ranks, shape, dt, division)
            ck.array(mine[i], ref, f"all_reduce {group} division="
                     f"{division} [{i}]", dt, tol)


def rooted_and_gather_cases(ck, comm, group, ranks):
    n, me = len(ranks), ranks.index(comm.rank)
    root = n - 1
    x = nd(np.full((5,), comm.rank + 1, np.float32))
    comm.bcast(x, root, group=group, async_op=True).wait()
    ck.array(x, np.full((5,), ranks[root] + 1, np.float32),
             f"bcast {group}")
    y = nd(np.full((4,), comm.rank + 1, np.float64))
    before = np.array(y.data)
    comm.reduce(y, root, division=True, group=group, async_op=True).wait()
    ck.array(y, np.full((4,), np.mean([r + 1 for r in ranks]))
             if me == root else before, f"reduce {group}")
    send = nd(np.full((3,), comm.rank, np.int32))
    recv = [nd(np.zeros((3,), np.int32)) for _ in range(n)]
    comm.all_gather(send, recv, group=group, async_op=True).wait()
    for k in range(n):
        ck.array(recv[k], np.full((3,), ranks[k], np.int32),
                 f"all_gather {group} [{k}]")
    blocks = [nd(np.full((2,), 10 * comm.rank + k, np.float32))
              for k in range(n)]
    out = nd(np.zeros((2,), np.float32))
    comm.reduce_scatter(blocks, out, group=group, async_op=True).wait()
    ck.array(out, np.full((2,), sum(10 * r + me for r in ranks),
                          np.float32), f"reduce_scatter {group}")


def interleaved(ck, comm):
    """Nonblocking calls in flight while blocking ones run on the same
    group, waited for in another order than started."""
    n = comm.size
    first = [nd(np.full((1000,), comm.rank + k, np.float32))
             for k in range(3)]
    started = comm.all_reduce(first, async_op=True)
    blocking = nd(np.full((3,), comm.rank, np.float32))
    comm.all_reduce(blocking)
    many = [nd(np.full((10,), comm.rank * k, np.float32)) for k in range(16)]
    pendings = [comm.all_reduce(x, async_op=True) for x in many]
    for p in reversed(pendings):
        p.wait()
    started.wait()
    started.wait()  # again: nothing more happens
    total = sum(range(n))
    for k, x in enumerate(first):
        ck.array(x, np.full((1000,), total + n * k, np.float32),
                 f"interleaved: first [{k}]")
    ck.array(blocking, np.full((3,), total, np.float32),
             "interleaved: the blocking call")
    for k, x in enumerate(many):
        ck.array(x, np.full((10,), total * k, np.float32),
                 f"interleaved: many [{k}]")


def zeroing_and_dropped(ck, comm):
    """Arrays still zeroing are reduced as zeros; a Pending dropped without
    a wait still completes before its arrays could be freed."""
    a = nn.NdArray((6,))
    a.zero()
    b = nn.NdArray((6,))
    b.zero()
    if comm.rank == 0:
        b.data = np.full((6,), 2.0, np.float32)
    comm.all_reduce([a, b], async_op=True).wait()
    ck.array(a, np.zeros((6,), np.float32), "zeroing everywhere: zeros")
    ck.array(b, np.full((6,), 2.0, np.float32), "written on rank 0 only")
    x = nd(np.full((8,), comm.rank + 1, np.float32))
    comm.all_reduce(x, async_op=True)  # the Pending dropped at once
    ck.array(x, np.full((8,), sum(r + 1 for r in range(comm.size)),
                        np.float32), "a Pending dropped unwaited ran")


def differing(ck, comm):
    """One rank's call differs: wait() raises ValueError on every rank;
    unwaited, the failure is a RuntimeWarning; the group still works."""
    size = 3 if comm.rank == 0 else 4
    x = nd(np.ones((size,), np.float32))
    ck.raises(ValueError, "different calls", "different calls: wait()",
              comm.all_reduce(x, async_op=True).wait)
    y = nd(np.ones((size + 10,), np.float32))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pending = comm.all_reduce(y, async_op=True)
        del pending
        gc.collect()
    ck.true(any(issubclass(w.category, RuntimeWarning) and
                "nothing waited" in str(w.message) for w in seen),
            "an unwaited failure warns", [str(w.message) for w in seen])
    z = nd(np.ones((2,), np.float32))
    comm.all_reduce(z, async_op=True).wait()
    ck.array(z, np.full((2,), comm.size, np.float32),
             "after a failed call, the next one")


def interrupted(ck, comm):
    """A signal handler that raises ends rank 0's wait for a late rank; the
    call goes on, and a second wait() sees it through."""
    x = nd(np.full((4,), comm.rank + 1, np.float32))
    if comm.rank == 0:
        def ring(signum, frame):
            raise TimeoutError("alarm")
        previous = signal.signal(signal.SIGALRM, ring)
        pending = comm.all_reduce(x, async_op=True)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        ck.raises(TimeoutError, "alarm", "a signal handler ends wait()",
                  pending.wait)
        signal.signal(signal.SIGALRM, previous)
        pending.wait()
    else:
        time.sleep(1.0)
        comm.all_reduce(x, async_op=True).wait()
    ck.array(x, np.full((4,), sum(r + 1 for r in range(comm.size)),
                        np.float32), "waited again after an interruption")


def joined(ck, comm):
    """World rank r has r + 1 steps in a join: the ranks that left add
    zeros to the others' nonblocking all-reduces."""
    x = nd(np.zeros((4,), np.float32))
    got = []
    with comm.join():
        for step in range(comm.rank + 1):
            x.data = np.full((4,), step + 1, np.float32)
            comm.all_reduce(x, async_op=True).wait()
            got.append(float(x.data[0]))
    training = [comm.size - step for step in range(comm.rank + 1)]
    ck.equal(got, [float((step + 1) * t) for step, t in enumerate(training)],
             "async all_reduce in a join")
    # Started in the scope and waited for after it: the scope is left and
    # closed only once they have run.
    started = []
    with comm.join():
        for step in range(comm.rank + 1):
            y = nd(np.full((4,), step + 1, np.float32))
            started.append((y, comm.all_reduce(y, async_op=True)))
    for step, (y, pending) in enumerate(started):
        pending.wait()
        ck.array(y, np.full((4,), (step + 1) * training[step], np.float32),
                 f"async all_reduce in a join, waited for after it [{step}]")


def collected_in_a_cycle(ck, comm):
    """A Pending in a reference cycle, its communicator finalized while
    its call waits for a late rank: the collector leaves it its group (and
    the group's queue) until the call has run."""
    x = nd(np.full((4,), comm.rank + 1, np.float32))
    total = sum(r + 1 for r in range(comm.size))
    if comm.rank != 0:
        time.sleep(0.5)
    cycle = [comm.all_reduce(x, async_op=True)]
    cycle.append(cycle)
    comm.finalize()
    del cycle
    gc.collect()
    ck.array(x, np.full((4,), total, np.float32),
             "a Pending collected in a cycle")


def nncomm_pending():
    import nncomm
    return nncomm.Pending


def main():
    ck, comm, groups = start("async_ops")
    for group, ranks in groups:
        all_reduce_cases(ck, comm, group, ranks)
        rooted_and_gather_cases(ck, comm, group, ranks)
    interleaved(ck, comm)
    zeroing_and_dropped(ck, comm)
    if comm.size > 1:
        differing(ck, comm)
        interrupted(ck, comm)
        joined(ck, comm)
        collected_in_a_cycle(ck, comm)  # last: it finalizes
    ck.finish()


if __name__ == "__main__":
    main()

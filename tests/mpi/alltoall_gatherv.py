"""alltoall and all_gather of sizes that differ between ranks (Horovod's
alltoall and allgather) against numpy, and their bad arguments.

alltoall: even splits and uneven ones, with no rows to some ranks and none
from one rank, in every dtype and row shape, into a new array or a
passed-in one (stale dtype, another shape of the right size). all_gather:
rows concatenated into a new array (ndarray_list=None), or one array per
rank of that rank's size. Bad arguments, on every rank or on one alone,
raise on every rank of the group; a correct all_reduce right after each
shows that no rank was left inside a collective.
"""
import numpy as np

import nnabla as nn

from _harness import DTYPES, contribution, dtype_name, nd, start

ROW_SHAPES = [(), (3,), (2, 4)]


def stale(size):
    """A receive array of `size` elements whose dtype and contents must not
    matter."""
    return nd(np.full(size, 77, np.uint8))


def alltoall_cases(ck, comm, group, ranks):
    k = len(ranks)
    me = ranks.index(comm.rank)
    dtypes = DTYPES if group == "world" else (np.float32, np.int64)
    # Rows group rank q sends group rank r: as many for each, or uneven
    # with none to some ranks, or none at all from group rank 0.
    splits = {
        "even": lambda q, r: 2,
        "uneven": lambda q, r: (q + 2 * r + 1) % 3,
        "silent0": lambda q, r: 0 if q == 0 else q + r,
    }
    for dt in dtypes:
        for row in ROW_SHAPES:
            for name, count in splits.items():
                key = f"a2a/{group}/{dtype_name(dt)}/{row}/{name}"
                sends = []
                for q in range(k):
                    rows = sum(count(q, r) for r in range(k))
                    sends.append(contribution(key, ranks[q], (rows,) + row,
                                              dt, "rand"))
                blocks = []
                for q in range(k):
                    at = sum(count(q, r) for r in range(me))
                    blocks.append(sends[q][at:at + count(q, me)])
                expected = np.concatenate(blocks)
                received = [count(q, me) for q in range(k)]
                label = (f"alltoall group={group}{ranks} {dtype_name(dt)} "
                         f"rows {row} {name} (group rank {me})")
                send = nd(sends[me])
                mine = [count(me, r) for r in range(k)]
                for given in (False, True):
                    recv = stale(expected.size) if given else None
                    got, splits_got = comm.alltoall(
                        send, recv,
                        splits=None if name == "even" else mine, group=group)
                    what = f"{label} recv={'given' if given else 'new'}"
                    ck.true(got is recv or not given, f"{what}: returns recv")
                    ck.equal(splits_got, received, f"{what}: received")
                    ck.array(got, expected.reshape(got.shape), what, dt)
                    ck.array(send, sends[me], f"{what}: send unchanged", dt)


def gather_cases(ck, comm, group, ranks):
    k = len(ranks)
    dtypes = DTYPES if group == "world" else (np.float16,)
    for dt in dtypes:
        for row in ROW_SHAPES:
            # Group rank q has q % 3 rows (none at group rank 0).
            key = f"agv/{group}/{dtype_name(dt)}/{row}"
            parts = [contribution(key, ranks[q], (q % 3,) + row, dt, "rand")
                     for q in range(k)]
            me = ranks.index(comm.rank)
            label = (f"all_gather group={group}{ranks} {dtype_name(dt)} "
                     f"rows {row} (group rank {me})")
            got = comm.all_gather(nd(parts[me]), group=group)
            ck.array(got, np.concatenate(parts), f"{label} into a new array",
                     dt)
            if k == 1:
                continue  # one size: nnabla's all_gather (gather_scatter)
            recv = [stale(p.size) for p in parts]
            ck.true(comm.all_gather(nd(parts[me]), recv, group) is None,
                    f"{label} into a list returns None")
            for q in range(k):
                ck.array(recv[q], parts[q].reshape(-1),
                         f"{label} into a list: [{q}]", dt)


class Errors:
    """Bad calls on the world group, on every rank or on the last alone."""

    def __init__(self, ck, comm):
        self.ck, self.comm = ck, comm
        self.n, self.rank = comm.size, comm.rank
        self.step = 0

    def healthy(self, what):
        self.step += 1
        x = nd(np.full(3, self.rank + self.step, np.int64))
        self.comm.all_reduce(x)
        total = sum(range(self.n)) + self.n * self.step
        self.ck.array(x, np.full(3, total, np.int64),
                      f"all_reduce right after: {what}")

    def expect(self, what, exc, words, fn, others=None):
        """`fn` raises `exc` mentioning `words` here; with `others`, the
        (exception, words) the other ranks raise, the last rank having
        made the bad call alone."""
        if others is not None and self.rank != self.n - 1:
            exc, words = others
        self.ck.raises(exc, words, what, fn)
        self.healthy(what)

    def alone(self, what, exc, words, bad, good, others_words):
        """The last rank calls `bad`, the others `good`: it raises `exc`
        mentioning `words`, they ValueError mentioning `others_words`."""
        last = self.rank == self.n - 1
        self.expect(f"{what} (the last rank alone)", exc, words,
                    bad if last else good, (ValueError, others_words))


def errors_with_paths_that_differ(ck, comm):
    """The first world all_gathers of the worker: rank 0 passes a list of
    its ndarray's size (nnabla's form), the others one whose sizes differ
    (as if the ranks' sizes did). Their first calls differ, so the ranks
    compare them and every rank raises."""
    n = comm.size
    if n < 2:
        return
    sizes = [3] * n if comm.rank == 0 else [3] * (n - 1) + [4]
    recv = [stale(s) for s in sizes]
    ck.raises(ValueError, "different calls",
              "all_gather, one rank nnabla's form, another Horovod's",
              comm.all_gather, nd(np.ones(3, np.float32)), recv)


def error_cases(ck, comm):
    e = Errors(ck, comm)
    n, r = comm.size, comm.rank
    ones = nd(np.ones((n, 2), np.float32))
    invalid = "invalid arguments"

    # alltoall: splits and send, bad on every rank.
    e.expect("splits of the wrong length", ValueError, "entries",
             lambda: comm.alltoall(ones, splits=[1] * (n + 1)))
    e.expect("splits that are not ints", TypeError, "sequence of ints",
             lambda: comm.alltoall(ones, splits=[0.5] * n))
    e.expect("0-d send", ValueError, "0-d",
             lambda: comm.alltoall(nd(np.float32(1))))
    e.expect("send not an array", TypeError, "NdArray",
             lambda: comm.alltoall(np.ones((n, 2), np.float32)))
    e.expect("recv is send", ValueError, "array of their own",
             lambda: comm.alltoall(ones, ones))
    e.expect("unknown group", ValueError, "unknown group",
             lambda: comm.alltoall(ones, group="nope"))

    # ... and on the last rank alone.
    good = lambda: comm.alltoall(nd(np.ones((n, 2), np.float32)))
    e.alone("splits of the wrong length", ValueError, "entries",
            lambda: comm.alltoall(ones, splits=[1] * (n + 1)), good, invalid)
    e.alone("a negative split", ValueError, "negative",
            lambda: comm.alltoall(ones, splits=[-1] + [1] * (n - 2) + [2]
                                  if n > 1 else [-1]), good, invalid)
    e.alone("splits summing to more rows than send has", ValueError,
            "sum to", lambda: comm.alltoall(ones, splits=[2] * n), good,
            invalid)
    if n > 1:
        e.alone("rows that do not split equally", ValueError,
                "split equally",
                lambda: comm.alltoall(nd(np.ones((n + 1, 2), np.float32))),
                good, invalid)
    e.alone("a uint8 send", TypeError, "dtype",
            lambda: comm.alltoall(nd(np.ones((n, 2), np.uint8))), good,
            invalid)
    e.alone("recv of the wrong size", ValueError, "recv has",
            lambda: comm.alltoall(ones, stale(2 * n + 1)),
            lambda: comm.alltoall(ones, stale(2 * n)), "wrong size")
    e.alone("recv not an array", TypeError, "recv[0]",
            lambda: comm.alltoall(ones, [1, 2]), good, invalid)

    # Rows that differ between ranks: every rank raises.
    if n > 1:
        e.expect("rows of another shape on rank 0", ValueError,
                 "different kinds of arrays",
                 lambda: comm.alltoall(nd(np.ones((n, 2 + (r == 0)),
                                                  np.float32))))
        e.expect("another dtype on the last rank", ValueError,
                 "different kinds of arrays",
                 lambda: comm.alltoall(nd(np.ones(
                     (n, 2), np.float64 if r == n - 1 else np.float32))))

    # all_gather of sizes that differ between ranks.
    mine = nd(np.ones(r + 1, np.float32))
    e.expect("all_gather of a 0-d array into a new one", ValueError, "0-d",
             lambda: comm.all_gather(nd(np.float32(1))))
    if n > 1:
        sizes = [q + 1 for q in range(n)]
        wrong = sizes[:-1] + [sizes[-1] + 1]
        e.alone("all_gather into a list of the wrong sizes", ValueError,
                f"ndarray_list[{n - 1}] has {n + 1} elements",
                lambda: comm.all_gather(mine, [stale(s) for s in wrong]),
                lambda: comm.all_gather(mine, [stale(s) for s in sizes]),
                f"group ranks [{n - 1}] of group 'world' does not have the "
                f"sizes")
        e.expect("all_gather of rows of another shape on rank 0",
                 ValueError, "different kinds of arrays",
                 lambda: comm.all_gather(nd(np.ones((r, 2 + (r == 0)),
                                                    np.float32))))
        e.expect("all_gather into a new array on the last rank, a list "
                 "elsewhere", ValueError, "different kinds of arrays",
                 lambda: comm.all_gather(
                     mine, None if r == n - 1 else
                     [stale(s) for s in sizes]))
        e.alone("all_gather of a 0-d array", ValueError, "0-d",
                lambda: comm.all_gather(nd(np.float32(1))),
                lambda: comm.all_gather(nd(np.ones((1, 2), np.float32))),
                invalid)


def main():
    ck, comm, groups = start("alltoall_gatherv")
    errors_with_paths_that_differ(ck, comm)
    for group, ranks in groups:
        alltoall_cases(ck, comm, group, ranks)
        gather_cases(ck, comm, group, ranks)
    # A list of nnabla's form still gathers blocks of one size.
    recv = [nn.NdArray((2,)) for _ in range(comm.size)]
    comm.all_gather(nd(np.full(2, comm.rank, np.int32)), recv)
    for q in range(comm.size):
        ck.array(recv[q], np.full(2, q, np.int32), f"all_gather [{q}]",
                 np.int32)
    error_cases(ck, comm)
    ck.finish()


main()

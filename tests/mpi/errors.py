"""Bad arguments raise a clear Python exception on every rank that passed
them, change nothing, and leave no rank inside a collective.

After every error a correct world all_reduce runs: had any rank entered a
collective for the bad call, it would now be matched against the wrong
call, and the job would hang (killed by the test's timeout) or abort.
"""
import numpy as np

import nnabla as nn

import nncomm.communicators as C

from _harness import (Checker, ErrorChecks, contribution, make_comm, nd,
                      reference)


class Errors(ErrorChecks):
    def __init__(self, ck, comm, ctx):
        self.ck, self.comm, self.ctx = ck, comm, ctx
        self.step = 0

    def healthy(self, what):
        """A correct world collective right after the error."""
        self.step += 1
        key = f"healthy/{self.step}"
        x = nd(contribution(key, self.comm.rank, (5,), np.int32))
        self.comm.all_reduce(x)
        ref, _ = reference([contribution(key, r, (5,), np.int32)
                            for r in range(self.comm.size)], np.int32)
        self.ck.array(x, ref, f"all_reduce right after: {what}", np.int32)



def f32(n, value=1.0):
    return nd(np.full(n, value, np.float32))


def before_init(e):
    """A second communicator, not yet initialised: everything but init()
    raises; init() then works once."""
    ck, comm = e.ck, C.MultiProcessDataParallelCommunicator(e.ctx)
    x = f32(3)
    uses = [
        ("rank", lambda: comm.rank), ("size", lambda: comm.size),
        ("local_rank", lambda: comm.local_rank),
        ("barrier()", comm.barrier),
        ("all_reduce", lambda: comm.all_reduce(x)),
        ("reduce", lambda: comm.reduce(x, 0)),
        ("bcast", lambda: comm.bcast(x, 0)),
        ("all_gather", lambda: comm.all_gather(x, [f32(3)])),
        ("reduce_scatter", lambda: comm.reduce_scatter([f32(3)], x)),
        ("new_group", lambda: comm.new_group(("g", [0]))),
        ("list_groups()", comm.list_groups),
        ("find_group", lambda: comm.find_group("world")),
    ]
    for what, fn in uses:
        e.expect(RuntimeError, "init", f"{what} before init()", fn,
                 untouched=[x])
    comm.init()
    ck.equal(comm.size, e.comm.size, "second communicator's size after init")
    e.expect(RuntimeError, "already initialized", "second init()", comm.init)
    y = nd(np.full(4, comm.rank, np.int64))
    comm.all_reduce(y)
    ck.array(y, np.full(4, sum(range(comm.size)), np.int64),
             "second communicator works after init()")


def groups(e):
    comm, n = e.comm, e.comm.size
    comm.new_group(("existing", [0]))
    state = comm.list_groups()
    bad = [
        ("rank == size", ValueError, "out of range", ("g_hi", [0, n])),
        ("negative rank", ValueError, "out of range", ("g_neg", [-1])),
        ("duplicated rank", ValueError, "twice", ("g_dup", [0, 0])),
        ("empty ranks", ValueError, "no ranks", ("g_empty", [])),
        ("float rank", TypeError, "int", ("g_float", [0.0])),
        ("str rank", TypeError, "int", ("g_str", ["0"])),
        ("None ranks", TypeError, "int", ("g_none", None)),
        ("duplicate name 'world'", ValueError, "already exists",
         ("world", [0])),
        ("duplicate name of a new group", ValueError, "already exists",
         ("existing", [0])),
        ("non-str name", TypeError, "name", (7, [0])),
        ("a 3-tuple", TypeError, "tuple", ("g3", [0], None)),
        ("a bare name", TypeError, "tuple", "g_bare"),
    ]
    for what, exc, text, arg in bad:
        e.expect(exc, text, f"new_group {what}: {arg!r}", comm.new_group,
                 arg)
        e.ck.equal(comm.list_groups(), state,
                   f"new_group {what}: no group registered")
    if n >= 2:
        # Members that differ across ranks (computed from the rank, or
        # groups made in another order) raise on every rank, where MPI
        # would wait in MPI_Comm_create_group for a rank that never comes.
        differing = [
            ("members from the rank",
             [("pair", [comm.rank, (comm.rank + 1) % n])]),
            ("groups in another order",
             [("a", [0, 1]), ("b", [n - 1, 0])][::1 if comm.rank else -1]),
            ("groups of the same members in another order",
             [("a", [0, 1]), ("b", [0, 1])][::1 if comm.rank else -1]),
        ]
        for what, calls in differing:
            name, ranks = calls[0]
            e.expect(ValueError, "different groups", f"new_group: {what}",
                     comm.new_group, (name, ranks))
            e.ck.equal(comm.list_groups(), state,
                       f"new_group {what}: no group registered")
        # Arguments refused on rank 0 alone: it names its problem, and the
        # others, already agreeing on their group, raise at once instead of
        # waiting for it.
        e.expect(ValueError, "out of range" if comm.rank == 0 else
                 "arguments were refused", "new_group refused on rank 0",
                 comm.new_group, ("solo", [0, n if comm.rank == 0 else 1]))
        e.ck.equal(comm.list_groups(), state,
                   "new_group refused on rank 0: no group registered")
    # Unknown groups, for every collective.
    x, lst = f32(3), [f32(3) for _ in range(n)]
    calls = collectives(comm, x, lst)
    for name, fn in calls:
        e.expect(ValueError, "unknown group", f"{name} on an unknown group",
                 fn, group="nope", untouched=[x] + lst)
    # A group this rank is not in: only the outsiders call; rank 0 (the
    # only member) runs a correct call on it at the same time.
    if n >= 2:
        for name, fn in calls:
            if comm.rank == 0:
                y = nd(np.arange(3, dtype=np.float32))
                comm.all_reduce(y, division=True, group="existing")
                e.ck.array(y, np.arange(3, dtype=np.float32),
                           "all_reduce on the one-rank group 'existing'")
                e.healthy(f"{name} by non-members")
            else:
                e.expect(ValueError, "is not included",
                         f"{name} on a group without rank {comm.rank}", fn,
                         group="existing", untouched=[x] + lst)


def collectives(comm, x, lst):
    """One well-formed call of each collective, its group left open."""
    return [
        ("all_reduce", lambda group: comm.all_reduce(x, group=group)),
        ("reduce", lambda group: comm.reduce(x, 0, group=group)),
        ("bcast", lambda group: comm.bcast([x], 0, group=group)),
        ("all_gather", lambda group: comm.all_gather(x, lst, group=group)),
        ("reduce_scatter",
         lambda group: comm.reduce_scatter(lst, x, group=group)),
    ]


def roots(e):
    comm, n = e.comm, e.comm.size
    x = f32(3)
    for what, value, exc, text in [
            ("== size", n, ValueError, "out of range"),
            ("negative", -1, ValueError, "out of range"),
            ("a float", 0.0, TypeError, "int"),
            ("a str", "0", TypeError, "int"),
            ("None", None, TypeError, "int")]:
        e.expect(exc, text, f"reduce dst {what}", comm.reduce, x, value,
                 untouched=[x])
        e.expect(exc, text, f"bcast src {what}", comm.bcast, [x], value,
                 untouched=[x])
        if exc is ValueError:
            e.expect(exc, "dst", f"reduce dst {what}: names dst",
                     comm.reduce, x, value, untouched=[x])
            e.expect(exc, "src", f"bcast src {what}: names src", comm.bcast,
                     x, value, untouched=[x])
    # Group-local: the one-rank group only has root 0, even where world
    # rank 1 exists.
    comm.new_group(("mine", [comm.size - 1]))
    if comm.rank == comm.size - 1:
        e.expect(ValueError, "out of range",
                 "reduce dst=1 on a one-rank group", comm.reduce, x, 1,
                 group="mine", untouched=[x])
        e.expect(ValueError, "out of range",
                 "bcast src=1 on a one-rank group", comm.bcast, x, 1,
                 group="mine", untouched=[x])
    else:
        e.healthy("reduce dst=1 on a one-rank group (non-member)")
        e.healthy("bcast src=1 on a one-rank group (non-member)")


def blocks(e):
    """all_gather / reduce_scatter shapes that do not fit the group."""
    comm, n = e.comm, e.comm.size
    x = f32(3)
    too_many = [f32(3) for _ in range(n + 1)]
    e.expect(ValueError, f"has {n + 1} arrays", "all_gather list of n+1",
             comm.all_gather, x, too_many, untouched=[x] + too_many)
    e.expect(ValueError, f"has {n + 1} arrays", "reduce_scatter list of n+1",
             comm.reduce_scatter, too_many, x, untouched=[x] + too_many)
    wrong = [f32(3) for _ in range(n)]
    wrong[-1] = f32(4)
    e.expect(ValueError, f"[{n - 1}] has 4 elements",
             "all_gather element of the wrong size", comm.all_gather, x,
             wrong, untouched=[x] + wrong)
    e.expect(ValueError, f"[{n - 1}] has 4 elements",
             "reduce_scatter element of the wrong size", comm.reduce_scatter,
             wrong, x, untouched=[x] + wrong)
    one = f32(3 * n + 1)
    # With one rank, one array is the one-per-rank list of one array.
    text = "is one array of" if n > 1 else "has 4 elements"
    e.expect(ValueError, text, "all_gather one array of the wrong size",
             comm.all_gather, x, one, untouched=[x, one])
    e.expect(ValueError, text, "reduce_scatter one array of the wrong size",
             comm.reduce_scatter, one, x, untouched=[x, one])
    if n > 1:
        e.expect(ValueError, "arrays", "all_gather empty list",
                 comm.all_gather, x, [], untouched=[x])
        e.expect(ValueError, "arrays", "reduce_scatter empty list",
                 comm.reduce_scatter, [], x, untouched=[x])
        mixed = [f32(3) for _ in range(n)]
        mixed[1] = nd(np.ones(3, np.float64))
        e.expect(TypeError, "mixes dtypes", "reduce_scatter mixing dtypes",
                 comm.reduce_scatter, mixed, x, untouched=[x] + mixed)


def bad_data(e):
    """Things that are not NdArrays, and NdArrays of unsupported dtypes."""
    comm, n = e.comm, e.comm.size
    x = f32(3)
    lst = [f32(3) for _ in range(n)]
    not_arrays = [("a numpy array", np.ones(3, np.float32)),
                  ("a Variable", nn.Variable((3,))), ("None", None),
                  ("an int", 3)]
    for what, obj in not_arrays:
        for name, call in [("all_reduce", lambda d: comm.all_reduce(d)),
                           ("reduce", lambda d: comm.reduce(d, 0)),
                           ("bcast", lambda d: comm.bcast(d, 0))]:
            e.expect(TypeError, "NdArray", f"{name} of {what}", call, obj)
            e.expect(TypeError, "data[1]", f"{name} of a list holding "
                     f"{what} at [1]", call, [x, obj], untouched=[x])
            e.expect(TypeError, "data[1]", f"{name} of a tuple holding "
                     f"{what} at [1]", call, (x, obj), untouched=[x])
        e.expect(TypeError, "ndarray", f"all_gather send {what}",
                 comm.all_gather, obj, lst, untouched=lst)
        e.expect(TypeError, "ndarray", f"reduce_scatter receive {what}",
                 comm.reduce_scatter, lst, obj, untouched=lst)
        if obj is not None:  # None gathers into a new array (Horovod's)
            e.expect(TypeError, "ndarray_list",
                     f"all_gather receive {what}", comm.all_gather, x, obj,
                     untouched=[x])
        e.expect(TypeError, "ndarray_list", f"reduce_scatter send {what}",
                 comm.reduce_scatter, obj, x, untouched=[x])
        bad_list = list(lst)
        bad_list[-1] = obj
        e.expect(TypeError, f"ndarray_list[{n - 1}]",
                 f"all_gather receive list holding {what}", comm.all_gather,
                 x, bad_list, untouched=[x])
        e.expect(TypeError, f"ndarray_list[{n - 1}]",
                 f"reduce_scatter send list holding {what}",
                 comm.reduce_scatter, bad_list, x, untouched=[x])

    for dt in (np.uint8, np.int8, np.int16, np.bool_):
        name = np.dtype(dt).name
        bad = nd(np.ones(3, dt))
        for what, fn in [
                ("all_reduce", lambda: comm.all_reduce([x, bad])),
                ("all_reduce inplace",
                 lambda: comm.all_reduce([x, bad], inplace=True)),
                ("reduce", lambda: comm.reduce([x, bad], 0)),
                ("bcast", lambda: comm.bcast([x, bad], 0)),
                ("all_gather send", lambda: comm.all_gather(bad, lst)),
                ("reduce_scatter send",
                 lambda: comm.reduce_scatter([bad] * n, x))]:
            e.expect(TypeError, name, f"{what} of {name}", fn,
                     untouched=[x, bad])
    # One array twice in a reduction would be counted twice when fused and
    # overwritten when reduced where it lies; both reductions refuse it.
    y = f32(3)
    for what, fn in [("all_reduce", lambda: comm.all_reduce([x, y, x])),
                     ("all_reduce inplace",
                      lambda: comm.all_reduce([x, y, x], inplace=True)),
                     ("reduce", lambda: comm.reduce((y, x, y), 0))]:
        e.expect(ValueError, "same array", f"{what} of one array twice", fn,
                 untouched=[x, y])
    # Two NdArrays over one memory (a view, a narrow) are told apart by
    # their memory in a reduction; narrows that do not overlap are two
    # arrays, and a bcast writes the same bytes twice.
    base = nd(np.arange(6, dtype=np.float32) + comm.rank)
    for what, fn in [
            ("all_reduce of an array and its view",
             lambda: comm.all_reduce([base, base.view((2, 3))])),
            ("all_reduce inplace of an array and a narrow of it",
             lambda: comm.all_reduce([base.narrow(0, 2, 2), base],
                                     inplace=True)),
            ("reduce of an array and its view",
             lambda: comm.reduce([base.view((3, 2)), base], 0))]:
        e.expect(ValueError, "share memory", what, fn, untouched=[base])
    comm.all_reduce([base.narrow(0, 0, 3), base.narrow(0, 3, 3)])
    n = comm.size
    e.ck.array(base, n * np.arange(6, dtype=np.float32) + n * (n - 1) / 2,
               "all_reduce of two narrows of one array that do not overlap")
    mine = nd(np.arange(6, dtype=np.float32) + comm.rank)
    comm.bcast([mine.view((3, 2)), mine], 0)
    e.ck.array(mine, np.arange(6, dtype=np.float32),
               "bcast of an array and its view")
    # Cast after creation: the dtype nnabla holds now is what counts.
    cast = f32(3)
    cast.cast(np.uint8)
    e.expect(TypeError, "uint8", "all_reduce of an NdArray cast to uint8",
             comm.all_reduce, cast, untouched=[cast])


def division(e):
    """division=True averages, so integer data is refused."""
    comm, n = e.comm, e.comm.size
    for dt in (np.int32, np.int64):
        name = np.dtype(dt).name
        ints = nd(np.arange(3, dtype=dt))
        x = f32(3)
        for inplace in (False, True):
            e.expect(TypeError, name, f"all_reduce {name} division=True "
                     f"inplace={inplace}", comm.all_reduce, [x, ints],
                     division=True, inplace=inplace, untouched=[x, ints])
            e.expect(TypeError, name, f"reduce {name} division=True "
                     f"inplace={inplace}", comm.reduce, [ints, x], 0,
                     division=True, inplace=inplace, untouched=[x, ints])
        e.expect(TypeError, "division", f"reduce_scatter {name} "
                 f"division=True", comm.reduce_scatter,
                 [nd(np.arange(3, dtype=dt)) for _ in range(n)],
                 nd(np.zeros(3, dt)), division=True)


def main():
    ck = Checker("errors")
    comm, ctx = make_comm()
    e = Errors(ck, comm, ctx)
    before_init(e)
    groups(e)
    roots(e)
    blocks(e)
    bad_data(e)
    division(e)
    ck.finish()


main()

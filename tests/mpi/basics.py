"""Properties, init, barrier and group bookkeeping, checked against mpi4py.

Group semantics: new_group returns the name; every rank (member or not)
sees every group in list_groups; find_group gives the ranks or []; group
rank i is world rank ranks[i], which the rooted collectives and the block
order of all_gather / reduce_scatter must follow.
"""
import time

import numpy as np
from mpi4py import MPI

import nnabla as nn

from _harness import Checker, contribution, make_comm, nd, reference


def properties(ck, comm):
    world = MPI.COMM_WORLD
    ck.equal(comm.rank, world.Get_rank(), "rank is MPI.COMM_WORLD's rank")
    ck.equal(comm.size, world.Get_size(), "size is MPI.COMM_WORLD's size")
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    ck.equal(comm.local_rank, node.Get_rank(),
             "local_rank is the rank within Split_type(COMM_TYPE_SHARED)")
    node.Free()
    ck.true(isinstance(comm.name, str) and comm.name,
            "name is a non-empty str", repr(comm.name))
    ck.raises(RuntimeError, "already initialized", "init() a second time",
              comm.init)
    ck.equal(comm.size, world.Get_size(), "size after a second init()")


def barrier(ck, comm):
    """Rank 0 arrives late; nobody may leave the barrier before it has
    entered. CLOCK_MONOTONIC is one clock for all processes of a host."""
    world = MPI.COMM_WORLD
    for _ in range(3):
        world.Barrier()
        if comm.rank == 0:
            time.sleep(0.2)
        entered = time.monotonic()
        comm.barrier()
        left = time.monotonic()
        times = world.allgather((entered, left))
        latest_entry = max(e for e, _ in times)
        earliest_exit = min(x for _, x in times)
        ck.true(earliest_exit >= latest_entry,
                "barrier: no rank leaves before the last one enters",
                f"(entered, left) per rank: {times}")


def groups(ck, comm):
    n = comm.size
    expected = {"world": list(range(n))}
    ck.equal(comm.list_groups(), expected, "list_groups() after init")
    specs = [("solo0", [0]), ("all_rev", list(range(n))[::-1]),
             ("last", [n - 1])]
    if n >= 2:
        specs += [("not0", list(range(1, n))), ("pair", [1, 0])]
    if n >= 3:
        specs += [("skip0", [2, 1])]
    if n >= 4:
        specs += [("gapped", [3, 0, 2])]
    for name, ranks in specs:
        ck.equal(comm.new_group((name, ranks)), name,
                 f"new_group(({name!r}, {ranks})) returns the name")
        expected[name] = list(ranks)
        ck.equal(comm.list_groups(), expected,
                 f"list_groups() after creating {name!r}")
    # Ranks as a tuple of numpy integers are still a list of ints.
    ck.equal(comm.new_group(("np_ranks", tuple(np.arange(n, dtype=np.int64)))),
             "np_ranks", "new_group with numpy int ranks returns the name")
    expected["np_ranks"] = list(range(n))
    ck.equal(comm.new_group(("np_array", np.arange(n)[::-1])), "np_array",
             "new_group with a numpy array of ranks returns the name")
    expected["np_array"] = list(range(n))[::-1]
    groups_now = comm.list_groups()
    ck.equal(groups_now, expected, "list_groups() with every group")
    ck.true(all(type(r) is int for r in groups_now["np_ranks"]),
            "list_groups() gives plain int ranks", repr(groups_now))
    for name, ranks in expected.items():
        ck.equal(comm.find_group(name), ranks, f"find_group({name!r})")
    ck.equal(comm.find_group("no such group"), [],
             "find_group of an unknown group is []")
    # The returned structures are copies: mutating them changes nothing.
    comm.list_groups()["world"].append(99)
    comm.find_group("world").append(99)
    ck.equal(comm.find_group("world"), list(range(n)),
             "find_group('world') unaffected by mutating returned lists")
    return expected


def rank_order(ck, comm, groups):
    """Group-local ranks on every group this rank belongs to."""
    for name, ranks in groups.items():
        if comm.rank not in ranks:
            continue
        k = len(ranks)
        me = ranks.index(comm.rank)
        for root in range(k):
            x = nd(contribution(f"{name}/b{root}", comm.rank, (4,),
                                np.float32))
            comm.bcast(x, root, group=name)
            ck.array(x, contribution(f"{name}/b{root}", ranks[root], (4,),
                                     np.float32),
                     f"bcast on {name}{ranks} src={root} comes from world "
                     f"rank {ranks[root]}")
            mine = contribution(f"{name}/r{root}", comm.rank, (4,), np.int32)
            x = nd(mine)
            comm.reduce(x, root, group=name)
            if comm.rank == ranks[root]:
                ref, _ = reference([contribution(f"{name}/r{root}", r, (4,),
                                                 np.int32) for r in ranks],
                                   np.int32)
                ck.array(x, ref, f"reduce on {name}{ranks} dst={root} lands "
                                 f"on world rank {ranks[root]}", np.int32)
            else:
                ck.array(x, mine, f"reduce on {name}{ranks} dst={root}: "
                                  f"world rank {comm.rank} unchanged")
        send = nd(np.full(3, comm.rank, np.int64))
        recv = nn.NdArray((k * 3,))
        comm.all_gather(send, recv, group=name)
        ck.array(recv, np.repeat(np.array(ranks, np.int64), 3),
                 f"all_gather on {name}{ranks}: block i from ranks[i]")
        blocks = np.arange(k * 2, dtype=np.float64).reshape(k, 2) \
            + 100 * comm.rank
        out = nn.NdArray((2,))
        comm.reduce_scatter([nd(b) for b in blocks], out, group=name)
        ck.array(out, np.arange(me * 2, me * 2 + 2, dtype=np.float64) * k
                 + 100 * sum(ranks),
                 f"reduce_scatter on {name}{ranks}: group rank {me} gets "
                 f"block {me}")
        x = nd(np.full(5, comm.rank + 1.0, np.float32))
        comm.all_reduce(x, division=True, group=name)
        ck.array(x, np.full(5, sum(ranks) / k + 1.0, np.float32),
                 f"all_reduce division=True on {name}{ranks} divides by "
                 f"the group's size {k}")


def main():
    ck = Checker("basics")
    comm, _ = make_comm()
    properties(ck, comm)
    barrier(ck, comm)
    rank_order(ck, comm, groups(ck, comm))
    ck.finish()


main()

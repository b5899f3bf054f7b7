"""all_gather and reduce_scatter against numpy.

Receive arrays come in other dtypes (uint8, another float), uninitialised
or with other shapes of the right size: they must end up in the sender's
dtype with their own shape. The receive (all_gather) or send
(reduce_scatter) side is a list or tuple of one array per group rank, or
ONE array of group size x count elements (nnabla's SyncBN relies on that).
"""
import numpy as np

import nnabla as nn

from _harness import (DTYPES, big_count, contribution, dtype_name, is_float,
                      nd, reference, start)

SHAPES = [(), (1,), (7,), (3, 5), (0,)]


def fresh(shape, variant):
    """A receive array whose current dtype and contents must not matter."""
    if variant == 0:
        return nn.NdArray(shape)  # never written: no dtype yet
    if variant == 1:
        return nd(np.full(shape, 77, np.uint8))
    return nd(np.full(shape, -3.5, np.float64))


def gather_cases(ck, comm, group, ranks):
    k = len(ranks)
    for dt in DTYPES:
        for shape in SHAPES + [(big_count(dt),)]:
            key = f"{group}/{dt}/{shape}/g"
            count = int(np.prod(shape))
            send_np = contribution(key, comm.rank, shape, dt, "rand")
            send = nd(send_np)
            blocks = [contribution(key, r, shape, dt, "rand") for r in ranks]
            label = f"all_gather group={group}{ranks} {dtype_name(dt)}{shape}"
            for variant in (0, 2):
                recv = [fresh(shape if (i + variant) % 2 else (count,),
                              (i + variant) % 3) for i in range(k)]
                form = "tuple" if variant == 2 else "list"
                comm.all_gather(send, tuple(recv) if form == "tuple"
                                else recv, group=group)
                for i in range(k):
                    ck.array(recv[i], blocks[i].reshape(recv[i].shape),
                             f"{label} {form} recv[{i}] (from world rank "
                             f"{ranks[i]}) variant={variant}", dt)
                ck.array(send, send_np, f"{label} send unchanged", dt)
            for variant, one_shape in ((1, (k * count,)),
                                       (0, (k,) + tuple(shape))):
                one = fresh(one_shape, variant)
                comm.all_gather(send, one, group=group)
                expected = np.concatenate(
                    [b.reshape(-1) for b in blocks]).reshape(one_shape)
                ck.array(one, expected,
                         f"{label} into one array {one_shape} "
                         f"variant={variant}", dt)


def scatter_cases(ck, comm, group, ranks):
    k = len(ranks)
    me = ranks.index(comm.rank)
    for dt in DTYPES:
        for shape in SHAPES + [(big_count(dt),)]:
            key = f"{group}/{dt}/{shape}/s"
            full_shape = (k,) + tuple(shape)
            for kind in ("int", "rand"):
                mine_np = contribution(key, comm.rank, full_shape, dt, kind)
                everyone = [contribution(key, r, full_shape, dt, kind)
                            for r in ranks]
                for division in ((False, True) if is_float(dt)
                                 else (False,)):
                    ref, tol = reference([e[me] for e in everyone], dt,
                                         division, exact=kind == "int")
                    label = (f"reduce_scatter group={group}{ranks} "
                             f"{dtype_name(dt)}{shape} kind={kind} "
                             f"division={division} (group rank {me})")
                    # Fewer collectives keep 4 ranks on 2 cores fast.
                    forms = ("list", "one") if kind == "int" else ("tuple",)
                    for form in forms:
                        if form == "one":
                            send = [nd(mine_np.reshape(-1) if k > 1
                                       else mine_np)]
                            data = send[0]
                        else:
                            send = [nd(mine_np[i]) for i in range(k)]
                            data = tuple(send) if form == "tuple" else send
                        # Each kind of stale receive array, in turn.
                        variant = (("list", "one", "tuple").index(form)
                                   + division) % 3
                        recv = fresh(shape, variant)
                        comm.reduce_scatter(data, recv, division=division,
                                            group=group)
                        ck.array(recv, ref, f"{label} {form}", dt, tol)
                        got_send = np.concatenate(
                            [np.array(s.data).reshape(-1) for s in send])
                        ck.true(np.array_equal(got_send, mine_np.reshape(-1)),
                                f"{label} {form}: send arrays unchanged")


def main():
    ck, comm, groups = start("gather_scatter")
    for group, ranks in groups:
        gather_cases(ck, comm, group, ranks)
        scatter_cases(ck, comm, group, ranks)
    ck.finish()


main()

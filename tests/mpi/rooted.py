"""reduce and bcast: the collectives with a root, given as a GROUP-local
rank (group rank i is world rank ranks[i]).

reduce must leave every non-root array bit for bit as it was; bcast must
copy the source's arrays bit for bit. Every dtype, every root of every
group, division x inplace, odd, empty and >1 MiB arrays, one NdArray, a
list or a tuple, and lists mixing dtypes.
"""
import numpy as np

from _harness import (DTYPES, big_count, contribution, dtype_name,
                      expected_sum, is_float, nd, start)

SHAPES = [(), (1,), (7,), (3, 5), (0,), (13, 17)]


def pack(mine, form):
    if form == "single":
        return mine[0]
    return tuple(mine) if form == "tuple" else list(mine)


def reduce_case(ck, comm, group, ranks, specs, dst, division, inplace, form,
                kind, key):
    keys = [f"{key}/{i}" for i in range(len(specs))]
    before = [contribution(k, comm.rank, shape, dt, kind)
              for k, (dt, shape) in zip(keys, specs)]
    mine = [nd(a) for a in before]
    comm.reduce(pack(mine, form), dst, division=division, inplace=inplace,
                group=group)
    root = ranks[dst]
    for i, (k, (dt, shape)) in enumerate(zip(keys, specs)):
        what = (f"reduce group={group}{ranks} dst={dst} form={form} "
                f"division={division} inplace={inplace} kind={kind} "
                f"[{i}] {dtype_name(dt)}{shape}")
        if comm.rank == root:
            ref, tol = expected_sum(k, ranks, shape, dt, division, kind)
            ck.array(mine[i], ref, what + " (root)", dt, tol)
        else:
            ck.array(mine[i], before[i], what + " (non-root unchanged)", dt)


def bcast_case(ck, comm, group, ranks, specs, src, inplace, form, key):
    keys = [f"{key}/{i}" for i in range(len(specs))]
    mine = [nd(contribution(k, comm.rank, shape, dt, "rand"))
            for k, (dt, shape) in zip(keys, specs)]
    comm.bcast(pack(mine, form), src, inplace=inplace, group=group)
    for i, (k, (dt, shape)) in enumerate(zip(keys, specs)):
        ck.array(mine[i], contribution(k, ranks[src], shape, dt, "rand"),
                 f"bcast group={group}{ranks} src={src} form={form} "
                 f"inplace={inplace} [{i}] {dtype_name(dt)}{shape}", dt)


def main():
    ck, comm, groups = start("rooted")
    f16, f32, f64 = np.float16, np.float32, np.float64
    i32, i64 = np.int32, np.int64
    mixed = [(f32, (7,)), (i32, (3, 5)), (f16, (big_count(f16),)),
             (f64, (0,)), (i64, (13, 17)), (f32, (big_count(f32),)),
             (f16, (1,)), (f64, ()), (i64, (5,))]
    floats = [(f16, (9,)), (f64, (4, 4)), (f32, (big_count(f32),)),
              (f32, ()), (f16, (0,)), (f64, (big_count(f64),))]
    for group, ranks in groups:
        # Every dtype on its own at the world's first and last roots; every
        # root of every group with the lists mixing all dtypes (fewer
        # collectives keep 4 ranks on 2 cores fast).
        for root in range(len(ranks)):
            full = group == "world" and root in (0, len(ranks) - 1)
            for dt in DTYPES if full else ():
                shapes = list(SHAPES)
                shapes.insert(2, (big_count(dt),))
                specs = [(dt, s) for s in shapes]
                for division in ((False, True) if is_float(dt)
                                 else (False,)):
                    for inplace in (False, True):
                        reduce_case(ck, comm, group, ranks, specs, root,
                                    division, inplace, "list", "int",
                                    f"{group}/{dt}/r")
                        if root == 0:
                            reduce_case(ck, comm, group, ranks, specs, root,
                                        division, inplace, "tuple", "rand",
                                        f"{group}/{dt}/r")
                            reduce_case(ck, comm, group, ranks,
                                        [(dt, (3, 5))], root, division,
                                        inplace, "single", "int",
                                        f"{group}/{dt}/r1")
                for inplace in (False, True):
                    bcast_case(ck, comm, group, ranks, specs, root, inplace,
                               "list", f"{group}/{dt}/b")
                    if root == 0:
                        bcast_case(ck, comm, group, ranks, specs, root,
                                   inplace, "tuple", f"{group}/{dt}/b")
                        bcast_case(ck, comm, group, ranks, [(dt, (3, 5))],
                                   root, inplace, "single", f"{group}/{dt}/b1")
            for inplace in (False, True):
                reduce_case(ck, comm, group, ranks, mixed, root, False,
                            inplace, "list", "int", f"{group}/mixed")
                reduce_case(ck, comm, group, ranks, floats, root, True,
                            inplace, "tuple", "rand", f"{group}/floats")
                bcast_case(ck, comm, group, ranks, mixed, root, inplace,
                           "tuple", f"{group}/mixed")

        # Any integer type names a root, as with nnabla's int conversion.
        last = len(ranks) - 1
        bcast_case(ck, comm, group, ranks, [(f32, (6,))], np.int64(last),
                   False, "single", f"{group}/npint")
        reduce_case(ck, comm, group, ranks, [(i32, (6,))], np.int32(last),
                    False, False, "single", "int", f"{group}/npint")
        # Empty lists are no-ops on every rank.
        comm.reduce([], 0, group=group)
        comm.bcast((), 0, inplace=True, group=group)
        bcast_case(ck, comm, group, ranks, [(f64, (2,))], 0, True, "single",
                   f"{group}/after_empty")
    ck.finish()


main()

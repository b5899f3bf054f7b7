"""The zeroing rule of all_reduce, and zeroing arrays in reduce and bcast.

An NdArray that was zero()'d and never written since is "zeroing". In
all_reduce, an array zeroing on every rank of the group is skipped and stays
zeroing (frozen parameters cost nothing); an array written on any rank is
reduced everywhere, the zeroing ranks contributing zeros, and is no longer
zeroing. Zeroing arrays are made from stale data first, so that reading the
old memory instead of zeros would show; their dtype is set before zero()
(the dtype a zeroing array keeps) and is the same on every rank.
"""
import numpy as np

import nnabla as nn

from _harness import (DTYPES, big_count, contribution, dtype_name, is_float,
                      nd, reference, start)


def make_array(key, rank, shape, dt, writers, typed=True):
    """The array rank `rank` passes: its contribution if it writes the
    array, else a zeroing array over stale values (or, not `typed`, a
    zeroing array that never had a dtype, read as nnabla's float32)."""
    if rank in writers:
        return nd(contribution(key, rank, shape, dt))
    if not typed:
        x = nn.NdArray(shape)
        x.zero()
        return x
    x = nd((contribution(key + "/stale", rank, shape, dt) + 50).astype(dt))
    x.zero()
    return x


def expected(key, ranks, shape, dt, writers, division):
    contribs = [contribution(key, r, shape, dt) if r in writers
                else np.zeros(shape, dt) for r in ranks]
    return reference(contribs, dt, division, exact=True)


def all_reduce_case(ck, comm, group, ranks, specs, division, inplace, form,
                    key, typed=True):
    """specs: [(dtype, shape, writers)]; writers are world ranks."""
    keys = [f"{key}/{i}" for i in range(len(specs))]
    mine = [make_array(k, comm.rank, shape, dt, writers, typed)
            for k, (dt, shape, writers) in zip(keys, specs)]
    data = mine[0] if form == "single" else (
        tuple(mine) if form == "tuple" else list(mine))
    comm.all_reduce(data, division=division, inplace=inplace, group=group)
    for i, (k, (dt, shape, writers)) in enumerate(zip(keys, specs)):
        written = [r for r in ranks if r in writers]
        what = (f"all_reduce group={group}{ranks} division={division} "
                f"inplace={inplace} form={form} [{i}] {dtype_name(dt)}"
                f"{shape} written by {written}")
        x = mine[i]
        if not written:
            # The flag first: reading .data would clear it.
            ck.true(x.zeroing, what + ": still zeroing")
            if typed:
                ck.array(x, np.zeros(shape, dt), what + ": zeros", dt)
            else:
                # Never given a dtype, so none to compare; reads as zeros.
                got = np.array(x.data)
                ck.true(got.shape == shape and not np.any(got),
                        what + ": zeros", f"{got.shape} {got.ravel()[:5]}")
        else:
            ck.true(not x.zeroing, what + ": no longer zeroing")
            ref, tol = expected(k, ranks, shape, dt, writers, division)
            ck.array(x, ref, what, dt, tol)


def all_reduce_cases(ck, comm, group, ranks):
    first, last = {ranks[0]}, {ranks[-1]}
    every, nobody, some = set(ranks), set(), set(ranks[::2])
    # Every dtype carrying the flags on the world; sub-groups, where only
    # the set of ranks differs, with three (fewer collectives keep 4 ranks
    # on 2 cores fast).
    dtypes = DTYPES if group == "world" else (np.float16, np.int64,
                                               np.float32)
    for dt in dtypes:
        other = np.float64 if is_float(dt) else np.int64
        big = (big_count(dt),)
        # The first array's dtype carries the "written" flags of the whole
        # list; it is zeroing here and in the next list, written in others.
        mixed = [(dt, (5,), nobody), (dt, (3, 4), first), (other, (7,), every),
                 (dt, big, last), (dt, big, nobody), (other, (0,), nobody),
                 (dt, (2, 2), some), (dt, big, every), (dt, (), last),
                 (other, (big_count(other),), first), (dt, (6,), nobody)]
        untouched = [(dt, (5,), nobody), (dt, big, nobody), (other, (3,),
                                                             nobody)]
        leading = [(dt, (4,), last), (dt, big, first), (dt, (1,), nobody)]
        for division in ((False, True) if is_float(dt) else (False,)):
            for inplace in (False, True):
                args = (division, inplace)
                all_reduce_case(ck, comm, group, ranks, mixed, *args, "list",
                                f"{group}/{dt}/mixed")
                all_reduce_case(ck, comm, group, ranks, untouched, *args,
                                "tuple", f"{group}/{dt}/untouched")
                all_reduce_case(ck, comm, group, ranks, leading, *args,
                                "list", f"{group}/{dt}/leading")
                for writers in (nobody, last):
                    all_reduce_case(ck, comm, group, ranks,
                                    [(dt, (3, 3), writers)], *args, "single",
                                    f"{group}/{dt}/single")
    untyped = [(np.float32, (4,), nobody), (np.float32, (3,), last),
               (np.float32, (big_count(np.float32),), first),
               (np.float32, (big_count(np.float32),), nobody)]
    for inplace in (False, True):
        all_reduce_case(ck, comm, group, ranks, untyped, True, inplace,
                        "list", f"{group}/untyped", typed=False)


def many_arrays(ck, comm, group, ranks):
    """A thousand tiny arrays: each one's written flag must stay with it
    (flags travel in the first array's dtype, float16 here)."""
    patterns = [set(), {ranks[0]}, {ranks[-1]}, set(ranks), set(ranks[1::2])]
    dts = [np.float16, np.float32, np.int32, np.float64, np.int64]
    specs = [(dts[i % 5 if i % 7 else 0], (i % 4,), patterns[i % 5 if i % 3
                                                            else (i // 3) % 5])
             for i in range(1000)]
    for inplace in (False, True):
        all_reduce_case(ck, comm, group, ranks, specs, False, inplace, "list",
                        f"{group}/many")


def rooted_cases(ck, comm, group, ranks):
    """reduce and bcast read a zeroing array as zeros."""
    for dt in (np.float32, np.float16, np.int64):
        for root in range(len(ranks)):
            for shape in ((6,), (big_count(dt),)):
                key = f"{group}/{dt}/{root}/{shape}"
                root_world = ranks[root]
                # bcast from a zeroing root: every rank gets zeros.
                x = make_array(key + "/b", comm.rank, shape, dt,
                               set(ranks) - {root_world})
                comm.bcast(x, root, group=group)
                ck.array(x, np.zeros(shape, dt),
                         f"bcast group={group}{ranks} src={root} from a "
                         f"zeroing root {dtype_name(dt)}{shape}", dt)
                # bcast into zeroing arrays: they get the root's values.
                x = make_array(key + "/c", comm.rank, shape, dt, {root_world})
                comm.bcast([x], root, group=group)
                ck.array(x, contribution(key + "/c", root_world, shape, dt),
                         f"bcast group={group}{ranks} src={root} into "
                         f"zeroing arrays {dtype_name(dt)}{shape}", dt)
                # reduce with a zeroing root: the others' sum.
                writers = set(ranks) - {root_world}
                x = make_array(key + "/r", comm.rank, shape, dt, writers)
                comm.reduce([x], root, group=group)
                if comm.rank == root_world:
                    ref, _ = expected(key + "/r", ranks, shape, dt, writers,
                                      False)
                    ck.array(x, ref, f"reduce group={group}{ranks} dst={root}"
                                     f" with a zeroing root "
                                     f"{dtype_name(dt)}{shape}", dt)


def main():
    ck, comm, groups = start("zeroing")
    for group, ranks in groups:
        all_reduce_cases(ck, comm, group, ranks)
        if group in ("world", "skip0"):
            many_arrays(ck, comm, group, ranks)
        rooted_cases(ck, comm, group, ranks)
    ck.finish()


main()

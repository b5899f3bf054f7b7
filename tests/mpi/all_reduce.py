"""all_reduce against numpy sums and means.

Every dtype, division x inplace, data as one NdArray, a list or a tuple, on
the world and on sub-groups (division is the mean over the GROUP's size).
Lists mix odd and empty shapes with a >1 MiB array, which takes the direct
path instead of the fusion buffer; lists mixing dtypes are fused into one
message per dtype. Run again with NNCOMM_DIRECT_BYTES / NNCOMM_CHUNK_BYTES
set to push small arrays through the direct and chunked paths.
"""
import numpy as np

from _harness import (DTYPES, big_count, contribution, dtype_name,
                      expected_sum, is_float, nd, start)

SHAPES = [(), (1,), (7,), (3, 5), (0,), (2, 0, 3), (13, 17)]


def run_case(ck, comm, group, ranks, specs, division, inplace, form, kind,
             key):
    """all_reduce of arrays `specs` = [(dtype, shape)] given as `form`."""
    keys = [f"{key}/{i}" for i in range(len(specs))]
    mine = [nd(contribution(k, comm.rank, shape, dt, kind))
            for k, (dt, shape) in zip(keys, specs)]
    if form == "single":
        data = mine[0]
    elif form == "tuple":
        data = tuple(mine)
    else:
        data = list(mine)
    comm.all_reduce(data, division=division, inplace=inplace, group=group)
    for i, (k, (dt, shape)) in enumerate(zip(keys, specs)):
        ref, tol = expected_sum(k, ranks, shape, dt, division, kind)
        ck.array(mine[i], ref,
                 f"all_reduce group={group}{ranks} form={form} "
                 f"division={division} inplace={inplace} kind={kind} "
                 f"[{i}] {dtype_name(dt)}{shape}", dt, tol)


def main():
    ck, comm, groups = start("all_reduce")
    f16, f32, f64 = np.float16, np.float32, np.float64
    i32, i64 = np.int32, np.int64
    for group, ranks in groups:
        # The full set of forms on the world; sub-groups get the list with
        # every shape (fewer collectives keep 4 ranks on 2 cores fast: each
        # call is a point where ranks wait for each other).
        full = group == "world"
        for dt in DTYPES:
            shapes = list(SHAPES)
            shapes.insert(3, (big_count(dt),))
            specs = [(dt, s) for s in shapes]
            for division in ((False, True) if is_float(dt) else (False,)):
                for inplace in (False, True):
                    args = (division, inplace)
                    run_case(ck, comm, group, ranks, specs, *args, "list",
                             "int", f"{group}/{dt}/many")
                    if not full:
                        continue
                    run_case(ck, comm, group, ranks, [(dt, (3, 5))], *args,
                             "single", "int", f"{group}/{dt}/single")
                    run_case(ck, comm, group, ranks, specs, *args, "tuple",
                             "rand", f"{group}/{dt}/many")

        # One message per dtype, interleaved with direct arrays: every
        # array must land back in its own slot.
        mixed = [(f32, (7,)), (i32, (3, 5)), (f16, (big_count(f16),)),
                 (f64, (0,)), (i64, (13, 17)), (f32, (big_count(f32),)),
                 (f16, (1,)), (f64, ()), (i32, (big_count(i32),)),
                 (f16, (5,)), (i64, ()), (f32, (2, 3))]
        floats = [(f16, (9,)), (f64, (4, 4)), (f32, (big_count(f32),)),
                  (f16, (big_count(f16),)), (f32, ()), (f64, (0,)),
                  (f32, (3,))]
        for inplace in (False, True):
            for kind, form in (("int", "list"), ("rand", "tuple")):
                run_case(ck, comm, group, ranks, mixed, False, inplace,
                         form, kind, f"{group}/mixed")
                run_case(ck, comm, group, ranks, floats, True, inplace,
                         form, kind, f"{group}/floats")

        # An empty list is a no-op, not an error; the next call checks
        # that it left no rank behind.
        comm.all_reduce([], group=group)
        comm.all_reduce((), division=True, inplace=True, group=group)
        run_case(ck, comm, group, ranks, [(f32, (4,))], True, False,
                 "single", "int", f"{group}/after_empty")
    ck.finish()


main()

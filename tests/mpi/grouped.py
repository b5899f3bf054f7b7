"""grouped_all_reduce: each list reduced as all_reduce reduces it, against
numpy, on the world and a sub-group; bad input raises before anything is
communicated (an array in two lists, a list that is not one)."""
import numpy as np

from _harness import Checker, contribution, expected_sum, make_comm, nd

SHAPES = [[((3,), np.float32), ((5, 2), np.float16)],
          [((300000,), np.float32)],
          [((4,), np.int32), ((1,), np.float64), ((7,), np.float32)]]


def run(ck, comm, group, ranks, division):
    # Per list, the positions in SHAPES of the arrays it holds (division
    # takes floating arrays only).
    chosen = [[k for k, (_, dt) in enumerate(specs)
               if not division or np.dtype(dt).kind == "f"]
              for specs in SHAPES]
    lists = [[nd(contribution(f"g{i}-{k}", comm.rank, *SHAPES[i][k]))
              for k in ks] for i, ks in enumerate(chosen)]
    comm.grouped_all_reduce(lists, division=division, group=group)
    for i, ks in enumerate(chosen):
        for k, x in zip(ks, lists[i]):
            shape, dt = SHAPES[i][k]
            expected, tol = expected_sum(f"g{i}-{k}", ranks, shape, dt,
                                         division)
            ck.array(x, expected, f"group={group} division={division} "
                     f"[{i}][{k}]", dt, tol)


def main():
    ck = Checker("grouped")
    comm, _ = make_comm()
    groups = {"world": list(range(comm.size))}
    if comm.size >= 2:
        groups["tail"] = list(range(1, comm.size))
        comm.new_group(("tail", groups["tail"]))
    for group, ranks in groups.items():
        if comm.rank in ranks:
            for division in (False, True):
                run(ck, comm, group, ranks, division)
    x = nd(np.ones(3, np.float32))
    ck.raises(ValueError, "same array", "an array in two lists",
              comm.grouped_all_reduce, [[x], [x]])
    ck.raises(TypeError, "list of lists", "not a list",
              comm.grouped_all_reduce, x)
    ck.raises(TypeError, "data_lists[1]", "a list holding a number",
              comm.grouped_all_reduce, [[x], [3]])
    ck.finish()


main()

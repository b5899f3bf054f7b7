"""Ranks that make different calls of the same collective get a ValueError
on every rank, instead of MPI failing or aborting; matching calls still give
correct results. By default a call is compared across the ranks the first
time its signature comes (each mismatch here is a call never made before);
with NNCOMM_CHECK_CALLS=1 every call is, and arrays are named by their
parameters, so same-shaped gradients passed in another order are caught.

Run on 2 or more ranks: rank 0 and the others disagree in each case.
"""
import os

import numpy as np

import nnabla as nn

from _harness import Checker, make_comm, nd


def full(n, value, dtype=np.float32):
    return nd(np.full(n, value, dtype))


def main():
    ck = Checker("check_calls")
    comm, _ = make_comm()
    r, n = comm.rank, comm.size
    every_call = os.environ.get("NNCOMM_CHECK_CALLS") == "1"
    odd = r != 0  # rank 0 against the rest
    mismatches = [
        ("all_reduce of different sizes",
         lambda: comm.all_reduce(full(3 + odd, 1.0))),
        ("all_reduce of different dtypes",
         lambda: comm.all_reduce(full(3, 1.0, [np.float32, np.float64][odd]))),
        ("all_reduce of lists of different lengths",
         lambda: comm.all_reduce([full(3, 1.0) for _ in range(1 + odd)])),
        ("all_reduce with different inplace",
         lambda: comm.all_reduce(full(3, 1.0), inplace=odd)),
        ("all_reduce with different division",
         lambda: comm.all_reduce(full(3, 1.0), division=odd)),
        ("reduce to different roots",
         lambda: comm.reduce(full(3, 1.0), dst=int(odd))),
        ("bcast from different roots",
         lambda: comm.bcast(full(3, 1.0), src=int(odd))),
        ("all_gather of different sizes",
         lambda: comm.all_gather(full(2 + odd, 1.0),
                                 full(n * (2 + odd), 0.0))),
        ("reduce_scatter of different sizes",
         lambda: comm.reduce_scatter(full(n * (2 + odd), 1.0),
                                     full(2 + odd, 0.0))),
    ]
    if every_call:
        a, b = (nn.parameter.get_parameter_or_create(
            f"check_calls/{name}", (6,), np.full(6, 1.0, np.float32))
            for name in "ab")
        mismatches.append(
            ("all_reduce of same-shaped gradients in another order",
             lambda: comm.all_reduce([a.grad, b.grad][::1 - 2 * odd])))
    for what, fn in mismatches:
        ck.raises(ValueError, "different calls", what, fn)
        # Every rank left the failed call: a matching one works right after.
        x = full(4, r + 1.0)
        comm.all_reduce(x)
        ck.array(x, np.full(4, n * (n + 1) / 2, np.float32),
                 f"all_reduce right after: {what}")
    # Matching calls of every collective pass the check and stay correct.
    y = [full(5, r, np.int64), full(2, 1.0, np.float16)]
    comm.all_reduce(y)
    ck.array(y[0], np.full(5, n * (n - 1) // 2, np.int64), "checked all_reduce")
    ck.array(y[1], np.full(2, n, np.float16), "checked all_reduce float16")
    z = full(3, r)
    comm.bcast(z, src=n - 1)
    ck.array(z, np.full(3, n - 1, np.float32), "checked bcast")
    gathered = full(n * 2, -1.0)
    comm.all_gather(full(2, r), gathered)
    ck.array(gathered, np.repeat(np.arange(n, dtype=np.float32), 2),
             "checked all_gather")
    ck.finish()


main()

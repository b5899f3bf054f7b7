"""Exercises the launcher itself: the suite is only worth something if a
wrong value, a rank that raises alone and a hang all fail the test.

Usage: selftest.py pass | mismatch | raise-one | hang
"""
import sys
import time

import numpy as np

from _harness import Checker, make_comm, nd


def main(mode):
    ck = Checker("selftest")
    comm, _ = make_comm()
    x = nd(np.ones(4, np.float32))
    comm.all_reduce(x)
    expected = np.full(4, comm.size, np.float32)
    if mode == "mismatch":
        expected = expected + 1
    ck.array(x, expected, "all_reduce of ones")
    if mode == "raise-one" and comm.rank == comm.size - 1:
        raise RuntimeError("selftest: the last rank fails alone")
    if mode == "hang" and comm.rank == 0:
        time.sleep(3600)
    # The other ranks wait here for the one that raised or sleeps.
    comm.barrier()
    ck.finish()


main(sys.argv[1])

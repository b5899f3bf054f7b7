"""Two Python threads using one group take turns.

On rank 0, thread A starts an all_reduce that has to wait (the other ranks
come 0.5 s late) and thread B starts a larger one on the same group while
A waits: B's fused message needs a larger fusion buffer, which must not be
reallocated under A's reduction. The other ranks make the same two calls
one after the other, so every rank issues them in the same order, as MPI
requires; both results must be exact.
"""
import threading
import time

import numpy as np

from _harness import Checker, make_comm, nd


def main():
    ck = Checker("threads")
    comm, _ = make_comm()
    n, r = comm.size, comm.rank
    total = n * (n + 1) / 2
    for it in range(3):
        small = [nd(np.full(64, r + 1.0, np.float32)) for _ in range(4)]
        large = [nd(np.full(4096 * (it + 2), r + 1.0, np.float32))
                 for _ in range(8)]
        errors = []

        def reduce(arrays):
            try:
                comm.all_reduce(arrays)
            except Exception as e:  # reported below, on this rank
                errors.append(repr(e))

        if r == 0:
            a = threading.Thread(target=reduce, args=(small,))
            a.start()
            time.sleep(0.1)  # A is waiting in MPI now
            b = threading.Thread(target=reduce, args=(large,))
            b.start()
            a.join()
            b.join()
        else:
            time.sleep(0.5)
            reduce(small)
            reduce(large)
        ck.true(not errors, f"iteration {it}: both threads' all_reduce",
                str(errors))
        for name, arrays in (("A", small), ("B", large)):
            for k, x in enumerate(arrays):
                ck.array(x, np.full(x.shape, total, np.float32),
                         f"iteration {it}: thread {name} array {k}")
    ck.finish()


main()
